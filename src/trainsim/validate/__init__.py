"""Accuracy suites against real measurements (``trainsim validate SUITE``)."""
