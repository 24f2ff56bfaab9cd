"""Workload builders: model specs, plans, and the IR they become (transformer LLMs first)."""
