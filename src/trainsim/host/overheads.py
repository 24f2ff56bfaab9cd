"""Host-side overheads T1–T5 (002 §4.3.3, Fig. 4.6) and the overhead database.

- T1: gap between two consecutive top-level ops on one CPU thread (attributed to the later op);
- T2: from an op's start to its first runtime call (kernel launch, memcpy, sync);
- T3: from the end of its last runtime call to the op's end;
- T4: duration of one runtime call (cudaLaunchKernel, cudaMemcpyAsync, ...);
- T5: gap between two consecutive runtime calls of one op.
Ops without runtime calls contribute their whole CPU duration as ``cpu`` (a CPU-only op); so do
``c10d::*`` ops that enqueue gloo collectives (their "kernel" runs on a gloo worker thread).

Statistics follow 002 §4.4.2: per (op name, type), remove outliers outside the whiskers
[Q1 − 1.5·IQR, Q3 + 1.5·IQR], then keep mean/median/std/count. Blocking sync calls and blocking copies are not T4
samples (their duration is waiting, which the simulator derives), so they are excluded.
The database is JSON: it can be built from one workload ("stats" mode) or merged from many
traces and shipped ("shared" mode).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.errors import ConfigError, read_utf8
from trainsim.ir.graph import Kernel, Op, RankGraph
from trainsim.ir.kinds import KernelFamily
from trainsim.ir.serialize import write_json_atomic

SCHEMA_VERSION = "1.1"  # 1.1: sampled as the simulator replays (trainsim.sim.program.workload_overhead_db)

# The largest value a database may hold per op, in seconds. T1–T5 are host dispatch: a gap
# between two ops or two runtime calls, or one runtime call. In every shipped trace and CPU
# capture the largest per-op T1–T5 mean is 3.9 ms (alexnet's aten::rand T2; MI250's first launch,
# which loads a code module, 3.3 ms; 002 Fig. 4.6's are tens of µs); a second is 250x that, and
# an op that spends more before, between or in its calls is a stall (data loading, a
# checkpoint), not an overhead the next workload shares. ``cpu`` is an op's whole CPU time when
# it makes no runtime call, which on a CPU-only capture is its compute (a large CPU GEMM takes
# seconds): only an hour is refused, longer than any one op of a training step.
MAX_DISPATCH_S = 1.0
MAX_CPU_OP_S = 3600.0


class Overhead(StrEnum):
    T1 = "T1"
    T2 = "T2"
    T3 = "T3"
    T4 = "T4"
    T5 = "T5"
    CPU = "cpu"  # whole CPU duration of an op that makes no runtime call


@dataclass(frozen=True, slots=True)
class Stat:
    """Outlier-filtered statistics of one overhead type, in seconds."""

    mean_s: float
    median_s: float
    std_s: float
    count: int  # samples kept after IQR filtering
    raw_count: int

    def to_dict(self) -> dict[str, float | int]:
        return {
            "mean_s": self.mean_s, "median_s": self.median_s, "std_s": self.std_s,
            "count": self.count, "raw_count": self.raw_count,
        }  # fmt: skip


def iqr_filter(values: np.ndarray) -> np.ndarray:
    """Keep values inside [Q1 − 1.5·IQR, Q3 + 1.5·IQR] (002 §4.4.2)."""
    if values.size < 4:
        return values
    q1, q3 = np.percentile(values, [25, 75])
    iqr = q3 - q1
    keep = (values >= q1 - 1.5 * iqr) & (values <= q3 + 1.5 * iqr)
    return values[keep]


def summarize(values: Iterable[float]) -> Stat:
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        raise ValueError("no samples")
    kept = iqr_filter(arr)
    return Stat(
        mean_s=float(kept.mean()), median_s=float(np.median(kept)),
        std_s=float(kept.std()), count=int(kept.size), raw_count=int(arr.size),
    )  # fmt: skip


def _blocking_copy(k: Kernel) -> bool:
    """A memcpy whose runtime call returns only after the copy finished blocked the CPU."""
    if k.family is not KernelFamily.MEMCPY or k.end_s is None:
        return False
    assert k.launch_start_s is not None and k.launch_duration_s is not None
    return k.launch_start_s + k.launch_duration_s >= k.end_s


def _calls(op: Op) -> list[tuple[float, float]]:
    """(start, duration) of the op's non-blocking runtime calls, in issue order, deduplicated."""
    seen: dict[float, float] = {}
    for k in op.kernels:
        if k.features.get("backend") == "gloo":
            continue  # enqueued by the op's own CPU work, no runtime call: not a T2–T5 event
        if k.launch_start_s is not None and k.launch_duration_s is not None:
            if _blocking_copy(k):
                continue  # a synchronous copy (e.g. to pageable memory): waiting, not launch cost
            seen[k.launch_start_s] = k.launch_duration_s
    for s in op.syncs:
        if s.start_s is not None and s.duration_s is not None and not s.kind.blocks_cpu:
            seen.setdefault(s.start_s, s.duration_s)
    return sorted(seen.items())


def _all_calls(op: Op) -> list[tuple[float, float]]:
    """Like _calls but including blocking syncs (for T2/T3/T5 boundaries)."""
    seen = dict(_calls(op))
    for s in op.syncs:
        if s.start_s is not None and s.duration_s is not None:
            seen.setdefault(s.start_s, s.duration_s)
    return sorted(seen.items())


def collect_samples(rank: RankGraph) -> dict[str, dict[Overhead, list[float]]]:
    """Raw T1–T5 samples per op name for one rank (seconds)."""
    out: dict[str, dict[Overhead, list[float]]] = defaultdict(lambda: defaultdict(list))
    prev_end: dict[int, float] = {}
    for op in rank.ops:
        if op.start_s is None or op.duration_s is None:
            continue
        d = out[op.name]
        end = op.start_s + op.duration_s
        if op.thread in prev_end:
            d[Overhead.T1].append(max(0.0, op.start_s - prev_end[op.thread]))
        prev_end[op.thread] = max(end, prev_end.get(op.thread, end))
        calls = _all_calls(op)
        if not calls:
            d[Overhead.CPU].append(op.duration_s)
            continue
        d[Overhead.T2].append(max(0.0, calls[0][0] - op.start_s))
        last_end = calls[-1][0] + calls[-1][1]
        d[Overhead.T3].append(max(0.0, end - last_end))
        d[Overhead.T4].extend(dur for _start, dur in _calls(op))
        for (s0, d0), (s1, _d1) in pairwise(calls):
            d[Overhead.T5].append(max(0.0, s1 - (s0 + d0)))
    return out


@dataclass(slots=True)
class OverheadDB:
    """Per-op-name and global T1–T5 statistics, with lookup fallbacks."""

    per_op: dict[str, dict[Overhead, Stat]] = field(default_factory=dict)
    global_: dict[Overhead, Stat] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    def lookup(self, op_name: str, kind: Overhead, *, default_s: float = 0.0) -> float:
        """Mean of ``kind`` for ``op_name``; falls back to the global mean, then ``default_s``."""
        st = self.per_op.get(op_name, {}).get(kind)
        if st is None:
            st = self.global_.get(kind)
        return st.mean_s if st is not None else default_s

    def has(self, op_name: str) -> bool:
        return op_name in self.per_op

    def implausible(self) -> list[str]:
        """Where a mean or median exceeds what :meth:`load` accepts (``per_op.NAME.T1``, ...):
        a trace whose stall between two ops gives a T1 of seconds."""
        groups = [("global", self.global_), *((f"per_op.{n}", s) for n, s in sorted(self.per_op.items()))]
        return [f"{where}.{k.value}" for where, stats in groups for k, st in stats.items()
                if max(st.mean_s, st.median_s, st.std_s) > max_overhead_s(k)]  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "unit": "s",
            "sources": self.sources,
            "global": {k.value: v.to_dict() for k, v in self.global_.items()},
            "per_op": {
                name: {k.value: v.to_dict() for k, v in stats.items()}
                for name, stats in sorted(self.per_op.items())
            },
        }

    def save(self, path: str | Path) -> None:
        write_json_atomic(Path(path), self.to_dict(), indent=1)

    @classmethod
    def load(cls, path: str | Path) -> OverheadDB:
        p = Path(path)
        try:
            doc = json.loads(read_utf8(p, "overhead database"))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}: cannot read overhead database: {e}") from None
        if isinstance(doc, dict) and doc.get("schema_version") == "1.0":
            raise ConfigError(f"{p}: an overhead database of an older trainsim (its T1 counts waiting the "
                              "simulator derives itself: +40–56 %); write it again with `trainsim analyze --overhead-db`")  # fmt: skip
        if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
            got = (f"a JSON {type(doc).__name__}" if not isinstance(doc, dict) else "no schema_version"
                   if "schema_version" not in doc else f"schema_version {doc['schema_version']!r}")  # fmt: skip
            raise ConfigError(f"{p}: not an overhead database of this trainsim (expected schema_version "
                              f"{SCHEMA_VERSION!r}, got {got}); write one with `trainsim analyze --overhead-db`")  # fmt: skip
        if doc.get("unit", "s") != "s":
            raise ConfigError(f"{p}: unit {doc.get('unit')!r}; an overhead database holds seconds (unit \"s\")")
        for key in ("per_op", "global"):
            if not isinstance(doc.get(key), dict):
                got = "missing" if key not in doc else f"a {type(doc[key]).__name__}"
                raise ConfigError(f"{p}: {key} must be an object of overhead statistics, got {got}")
        try:
            return cls(
                per_op={n: _stats(p, f"per_op.{n}", s) for n, s in doc["per_op"].items()},
                global_=_stats(p, "global", doc["global"]),
                sources=list(doc.get("sources", [])),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{p}: malformed overhead database ({type(e).__name__}: {e})") from e


def max_overhead_s(kind: Overhead) -> float:
    """The largest per-op value of ``kind`` a database may hold (see :data:`MAX_DISPATCH_S`)."""
    return MAX_CPU_OP_S if kind is Overhead.CPU else MAX_DISPATCH_S


def _stats(path: Path, where: str, doc: Any) -> dict[Overhead, Stat]:
    """One ``{T1: {mean_s, ...}, ...}`` object of a saved database, checked value by value."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: {where} must be an object of T1-T5 statistics, got a {type(doc).__name__}")
    out = {}
    for k, v in doc.items():
        try:
            kind = Overhead(k)
        except ValueError:
            raise ConfigError(f"{path}: {where}: unknown overhead {k!r} (expected {', '.join(o.value for o in Overhead)})") from None
        if not isinstance(v, dict):
            raise ConfigError(f"{path}: {where}.{k} must be an object (mean_s, median_s, ...), got a {type(v).__name__}")
        top = max_overhead_s(kind)
        for f in ("mean_s", "median_s", "std_s"):
            x = v.get(f)
            if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or not 0 <= x <= top:
                raise ConfigError(f"{path}: {where}.{k}.{f} must be a number of seconds from 0 to {top:g} "
                                  f"(a host overhead of one op; see docs/simulator.md), got {x!r}")  # fmt: skip
        for f in ("count", "raw_count"):
            x = v.get(f)
            if isinstance(x, bool) or not isinstance(x, int) or x < 0:
                raise ConfigError(f"{path}: {where}.{k}.{f} must be a non-negative integer, got {x!r}")
        out[kind] = Stat(**v)
    return out
