"""Measure how much slower compute kernels run while a NCCL kernel runs beside them: the
calibration behind the LLM predictor's compute/communication contention
(``src/trainsim/builders/data/comm_contention.json``; docs/llm.md, "Contention").

For every Kineto trace under ``../shared/data/traces`` (``.json``, ``.json.gz`` and the
``.json`` members of ``.tar.gz`` archives) whose GPU ran NCCL kernels: each compute kernel
(``cat`` ``kernel``, not NCCL) is given the fraction of its duration that a NCCL kernel on
another stream of the same device overlaps. Kernels of one identity — name, grid, block and
the launching CPU operator's name and input dims (``External id``) — are compared: a group
with at least one kernel overlapped for at least ``--overlapped`` of its duration and at least
one with no overlap gives the ratio ``median(overlapped) / median(alone)``. Per trace and per
GPU (the trace's ``deviceProperties``) it reports the groups' median ratio, its quartiles,
and the time-weighted factor ``Σ overlapped durations / Σ (each one's group median alone)``:
how much longer the overlapped compute took in all than it would have alone (the quantity the
predictor's factor stands for), with a bootstrap interval over the groups (seed 0).

    python scripts/comm_contention.py            # prints the table
    python scripts/comm_contention.py --write    # and rewrites the JSON

Stated limits: a NCCL kernel's span includes the time it waits for its peers (it then holds a
few SMs but moves no data), so the measured slow-down per overlapped second is diluted towards
1 where ranks arrive apart; kernels of one identity overlapped and alone may also differ in
cache state (a backward kernel beside the gradient all-reduce, its forward twin not).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
import tarfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "data" / "traces"
OUT = ROOT / "src" / "trainsim" / "builders" / "data" / "comm_contention.json"
BOOTSTRAP = 2000
# NCCL kernels that only send and receive (pipeline p2p, all-to-all as send/recv): mostly waiting
# for the peer in the shipped traces; the predictor overlaps collectives, not these
SEND_RECV = frozenset({"SendRecv", "Send", "Recv"})


def traces(root: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name relative to ``root``, decoded document) of every Kineto JSON under ``root``."""
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.name.endswith(".tar.gz") or p.name.endswith(".tgz"):
            with tarfile.open(p) as tar:
                for m in sorted(tar.getmembers(), key=lambda m: m.name):
                    if m.isfile() and m.name.endswith(".json"):
                        f = tar.extractfile(m)
                        doc = _decoded(f.read()) if f else None
                        if isinstance(doc, dict) and "traceEvents" in doc:
                            yield f"{rel}:{m.name}", doc
        elif p.name.endswith((".json", ".json.gz")):
            raw = p.read_bytes()
            doc = _decoded(gzip.decompress(raw) if p.name.endswith(".gz") else raw)
            if isinstance(doc, dict) and "traceEvents" in doc:
                yield rel, doc


def _decoded(raw: bytes) -> Any:
    """A JSON document, or None for a member that is not one (resource forks, empty files)."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None


def _is_nccl(e: dict[str, Any]) -> bool:
    return "nccl" in str(e.get("name", "")).lower()


def nccl_kind(name: str) -> str:
    """``AllReduce`` of ``ncclKernel_AllReduce_RING_LL_Sum_float(...)`` (``ncclDevKernel_`` too)."""
    parts = name.split("(", maxsplit=1)[0].split("_")
    return parts[1] if len(parts) > 1 else name


def _overlap(starts: np.ndarray, ends: np.ndarray, a: float, b: float) -> float:
    """Length of ``[a, b]`` covered by the union of the sorted, merged intervals."""
    lo, hi = np.searchsorted(ends, a, "right"), np.searchsorted(starts, b, "left")
    if hi <= lo:
        return 0.0
    s, t = np.maximum(starts[lo:hi], a), np.minimum(ends[lo:hi], b)
    return float(np.sum(np.clip(t - s, 0.0, None)))


def _merged(iv: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    out: list[list[float]] = []
    for s, t in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], t)
        else:
            out.append([s, t])
    arr = np.asarray(out, dtype=float).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def groups_of(doc: dict[str, Any], threshold: float, min_us: float = 0.0) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Per kernel identity with both overlapped and alone instances: their durations (µs)."""
    ev = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    ops = {e["args"]["External id"]: e for e in ev
           if e.get("cat") == "cpu_op" and isinstance(e.get("args"), dict) and "External id" in e["args"]}  # fmt: skip
    kernels = [e for e in ev if e.get("cat") in ("kernel", "Kernel") and float(e.get("dur", 0)) > 0]
    by_dev: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for k in kernels:
        by_dev[k.get("args", {}).get("device", k.get("pid"))].append(k)
    samples: dict[tuple[Any, ...], dict[str, list[float]]] = defaultdict(lambda: {"over": [], "alone": []})
    counts: dict[str, Any] = {"compute": 0, "nccl": 0, "overlapped": 0, "alone": 0, "partial": 0}
    counts["nccl_kinds"] = sorted({nccl_kind(k["name"]) for k in kernels if _is_nccl(k)})
    for ks in by_dev.values():
        nccl = [k for k in ks if _is_nccl(k)]
        counts["nccl"] += len(nccl)
        if not nccl:
            continue
        for k in ks:
            if _is_nccl(k):
                continue
            a = k["args"]
            others = [(float(n["ts"]), float(n["ts"]) + float(n["dur"])) for n in nccl if n["args"].get("stream") != a.get("stream")]
            if not others:
                continue
            counts["compute"] += 1
            starts, ends = _merged(others)
            t0, d = float(k["ts"]), float(k["dur"])
            frac = _overlap(starts, ends, t0, t0 + d) / d
            op = ops.get(a.get("External id"), {})
            key = (k["name"], json.dumps(a.get("grid")), json.dumps(a.get("block")), op.get("name"),
                   json.dumps(op.get("args", {}).get("Input Dims")))  # fmt: skip
            if frac >= threshold:
                samples[key]["over"].append(d)
                counts["overlapped"] += 1
            elif frac == 0.0:
                samples[key]["alone"].append(d)
                counts["alone"] += 1
            else:
                counts["partial"] += 1
    out = []
    for key, s in samples.items():
        if s["over"] and s["alone"] and statistics.median(s["alone"]) >= min_us:
            alone = statistics.median(s["alone"])
            out.append({"kernel": key[0], "ratio": statistics.median(s["over"]) / alone,
                        "overlapped_us": sum(s["over"]), "alone_equiv_us": alone * len(s["over"]),
                        "n_over": len(s["over"]), "n_alone": len(s["alone"])})  # fmt: skip
    return out, counts


def summary(groups: list[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """Median and quartiles of the groups' ratios; the time-weighted factor and its interval."""
    if not groups:
        return {"groups": 0}
    r = np.array([g["ratio"] for g in groups])
    over = np.array([g["overlapped_us"] for g in groups])
    alone = np.array([g["alone_equiv_us"] for g in groups])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(groups), size=(BOOTSTRAP, len(groups)))
    boot = over[idx].sum(axis=1) / alone[idx].sum(axis=1)
    q1, med, q3 = np.percentile(r, [25, 50, 75])
    up, down = int(np.sum(r > 1.0)), int(np.sum(r < 1.0))
    return {"groups": len(groups), "overlapped_kernels": int(sum(g["n_over"] for g in groups)),
            "alone_kernels": int(sum(g["n_alone"] for g in groups)),
            "median_ratio": round(float(med), 4), "iqr": [round(float(q1), 4), round(float(q3), 4)],
            "weighted_factor": round(float(over.sum() / alone.sum()), 4),
            "weighted_factor_95ci": [round(float(x), 4) for x in np.percentile(boot, [2.5, 97.5])],
            "overlapped_ms": round(float(over.sum()) / 1e3, 3),
            "slower_faster_groups": [up, down], "sign_test_p": round(sign_test_p(up, down), 6)}  # fmt: skip


def sign_test_p(up: int, down: int) -> float:
    """Two-sided binomial sign test: how likely ``up`` of ``up + down`` or a larger split is at 1/2."""
    n = up + down
    if n == 0:
        return 1.0
    k = max(up, down)
    return min(1.0, 2.0 * sum(math.comb(n, i) for i in range(k, n + 1)) / 2.0**n)


def gpu_of(doc: dict[str, Any]) -> str:
    props = doc.get("deviceProperties") or []
    return str(props[0].get("name")) if props else "unknown"


def measure(root: Path, threshold: float, min_us: float) -> dict[str, Any]:
    per_trace: dict[str, Any] = {}
    per_gpu: dict[str, list[dict[str, Any]]] = defaultdict(list)
    used: list[dict[str, Any]] = []  # the factor's groups: traces with collectives, not only send/recv
    used_names: list[str] = []
    skipped: list[str] = []
    for name, doc in traces(root):
        groups, counts = groups_of(doc, threshold, min_us)
        if counts["nccl"] == 0:
            skipped.append(name)
            continue
        gpu = gpu_of(doc)
        per_trace[name] = {"gpu": gpu, **counts, **summary(groups)}
        per_gpu[gpu].extend(groups)
        if groups and any(k not in SEND_RECV for k in counts["nccl_kinds"]):
            used.extend(groups)
            used_names.append(name)
    every = [g for gs in per_gpu.values() for g in gs]
    fac = summary(used)
    gpus = sorted({per_trace[n]["gpu"] for n in used_names})
    return {"factor": fac.get("weighted_factor", 1.0),
            "factor_source": f"time-weighted over {fac['groups']} kernel identities of {', '.join(used_names)} "
                             f"({', '.join(gpus)}; {fac['slower_faster_groups'][0]} of them slower overlapped, sign "
                             f"test p {fac['sign_test_p']:.1g}; 95% interval {fac['weighted_factor_95ci']})" if used else "none",
            "factor_stats": fac, "per_trace": per_trace, "per_gpu": {k: summary(v) for k, v in sorted(per_gpu.items())},
            "all": summary(every), "skipped_no_nccl": skipped}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--overlapped", type=float, default=0.5,
                    help="a kernel counts as overlapped when a NCCL kernel covers this fraction of it (default 0.5)")
    ap.add_argument("--min-us", type=float, default=10.0,
                    help="leave out identities whose median alone is shorter (µs-resolution traces round them; default 10)")
    ap.add_argument("--write", action="store_true", help=f"rewrite {OUT.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    if not args.traces.is_dir():
        print(f"{args.traces}: no such folder (the project's ../shared/data/traces)", file=sys.stderr)
        return 1
    res = measure(args.traces, args.overlapped, args.min_us)
    for name, t in res["per_trace"].items():
        print(f"{name}  [{t['gpu']}]  nccl {t['nccl']}  compute {t['compute']} (overlapped {t['overlapped']}, "
              f"alone {t['alone']}, partial {t['partial']})  groups {t['groups']}"
              + (f"  median {t['median_ratio']} IQR {t['iqr']}  weighted {t['weighted_factor']} "
                 f"95% {t['weighted_factor_95ci']}" if t["groups"] else ""))  # fmt: skip
    for gpu, s in {**res["per_gpu"], "all": res["all"]}.items():
        print(f"{gpu}: {s}")
    print(f"factor {res['factor']}: {res['factor_source']}")
    if args.write:
        doc = {
            "what": "how many times longer compute kernels run while a NCCL kernel on another stream of the same GPU "
                    "overlaps them, than kernels of the same identity (name, grid, block, CPU operator and input dims) "
                    "with no overlap; measured on the shipped multi-rank Kineto traces",
            "command": "python scripts/comm_contention.py --write",
            "traces": "../shared/data/traces (the project's shared data; see its README)",
            "overlapped_threshold": args.overlapped,
            "min_alone_us": args.min_us,
            "method": "per identity: median(overlapped) / median(alone); weighted_factor = sum of overlapped durations "
                      "/ sum of their identity's median alone duration; 95% interval: bootstrap over identities, "
                      f"{BOOTSTRAP} resamples, seed 0",
            **res,
        }  # fmt: skip
        OUT.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {OUT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
