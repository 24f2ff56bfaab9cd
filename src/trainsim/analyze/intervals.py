"""Interval arithmetic on sorted numpy arrays (busy time = length of a union of intervals)."""

from __future__ import annotations

import numpy as np


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals [s, e) into disjoint sorted intervals."""
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    out_s = s[idx]
    out_e = np.maximum.reduceat(e, idx)
    # reduceat over the run gives the max end of each merged group
    return out_s, np.maximum(out_e, run_end[np.r_[idx[1:] - 1, s.size - 1]])


def length(starts: np.ndarray, ends: np.ndarray) -> float:
    s, e = union(starts, ends)
    return float((e - s).sum())


def intersect_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of (∪a) ∩ (∪b)."""
    a_s, a_e = union(*a)
    b_s, b_e = union(*b)
    i = j = 0
    total = 0.0
    while i < a_s.size and j < b_s.size:
        lo = max(a_s[i], b_s[j])
        hi = min(a_e[i], b_e[j])
        if hi > lo:
            total += hi - lo
        if a_e[i] < b_e[j]:
            i += 1
        else:
            j += 1
    return float(total)
