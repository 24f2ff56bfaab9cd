"""Micro-benchmarks run on this machine into datasets (``trainsim bench SUITE``)."""
