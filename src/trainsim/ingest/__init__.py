"""Readers for the trace formats users have (Kineto, PyTorch execution traces, archives)."""

from trainsim.ingest.multirank import LoadedTraces, load_traces

__all__ = ["LoadedTraces", "load_traces"]
