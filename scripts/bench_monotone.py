"""Where the shipped H100 bench calibration's time per unit of work gets worse as the work grows.

A GEMM over M rows is at least as efficient as M/m GEMMs of m rows (same N, K) up to tile
effects, and one memory-bound pass over 2x the bytes at least as efficient as two passes over
1x. This sweeps the calibration's answers (:func:`trainsim.builders.bench_costs.carried_time`,
what :class:`~trainsim.builders.bench_costs.BenchTranslator` answers paper-001 operators with)
over M for the (N, K) of real models' projections, and over the element count (rows) of the
memory-bound operators, and lists every pair (size s, size s' >= 2s) where the answer's time per
unit of work at s' is worse than at s by more than ``--tol``, with both answers' provenance.

    python scripts/bench_monotone.py               # one row per shape and phase (markdown)
    python scripts/bench_monotone.py --pairs       # also: every such pair
    python scripts/bench_monotone.py --measured    # also: the sample's own GEMM rows that do so

With ``--check``, exit status 1 when some GEMM pair's larger answer is carried beyond the
measured work (the carry must not invent a loss of efficiency). Memory-bound pairs just past
the limit can remain: there the carried time is held at the fitted answer at the limit (time
never falls as the work grows), which keeps a dip the trees have there.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from typing import Any

# (label, N, K) of real models' projections (per GPU at tp 1; SwiGLU up/gate stacked: 2·ffn)
GEMMS: tuple[tuple[str, int, int], ...] = (
    ("mixtral-8x7b up (2x14336, 4096)", 2 * 14336, 4096),
    ("mixtral-8x7b down (4096, 14336)", 4096, 14336),
    ("llama-3-70b up tp4 (2x7168, 8192)", 2 * 7168, 8192),
    ("llama-3-8b qkv (6144, 4096)", 6144, 4096),
    ("qwen3-30b-a3b expert up (2x768, 2048)", 2 * 768, 2048),
    ("qwen3-30b-a3b expert down (2048, 768)", 2048, 768),
    ("deepseek-v3 expert up (2x2048, 7168)", 2 * 2048, 7168),
)
ROWS = tuple(2**i for i in range(7, 19))  # 128 .. 262,144 GEMM rows (tokens)

# memory-bound operators: (label, bench op, inputs at size s (s elements or rows), work key)
MEMORY: tuple[tuple[str, str, Any], ...] = (
    ("elementwise add (numel)", "elementwise", lambda s: {"numel": float(s)}),
    ("dropout (numel)", "dropout", lambda s: {"numel": float(s)}),
    ("gelu [s, 14336]", "gelu", lambda s: {"mp": 1.0, "b": 1.0, "l": s / 14336, "dim": 14336 / 4}),
    ("RMSNorm [s/4096, 4096]", "RMSlayernorm", lambda s: {"b": s / 4096, "l": 1.0, "dim": 4096.0}),
)
ELEMENTS = tuple(2**i for i in range(20, 34))  # 1 Mi .. 8 Gi elements


def _calibration() -> Any:
    from trainsim.builders.bench_costs import bench_calibration
    from trainsim.hardware import get_device

    cal = bench_calibration(get_device("h100-sxm5-80gb"))
    if cal is None:
        sys.exit("no shipped H100 bench calibration")
    return cal


def _answers(cal: Any, op: str, phase: str, dtype: str, *, sizes: tuple[int, ...], inputs: Any) -> list[tuple[int, float, str]]:  # fmt: skip
    from trainsim.builders.bench_costs import carried_time
    from trainsim.kernels.roofline import RooflineModel

    roof = (RooflineModel(cal.device),)
    out = []
    for s in sizes:
        got = carried_time(cal, op, phase, dtype, inputs(s), roofline=roof)
        if got is not None:
            out.append((s, got[0], got[1]))
    return out


def _short(prov: str) -> str:
    notes = [p for p in prov.split(";")[1:] if p]
    return "+".join(notes) or "fitted"


def worse_pairs(answers: list[tuple[int, float, str]], tol: float) -> list[tuple[int, int, float, str, str]]:
    """(s, s', ratio, prov(s), prov(s')) for s' >= 2s whose time per unit of work is worse
    than at s by more than ``tol``: ratio = (t(s')/s') / (t(s)/s)."""
    out = []
    for i, (s, t, p) in enumerate(answers):
        for s2, t2, p2 in answers[i + 1:]:
            if s2 >= 2 * s and (r := (t2 / s2) / (t / s)) > 1 + tol:
                out.append((s, s2, r, _short(p), _short(p2)))
    return out


def measured_pairs(sample: str, tol: float) -> list[str]:
    """The sample's own GEMM rows (bf16) of one (phase, batch, N, K, bias, wt, suite case) whose
    time per row is worse at 2x the rows or more by more than ``tol``."""
    from trainsim.bench.samples import BENCH_DATA

    groups: dict[tuple[Any, ...], dict[float, float]] = defaultdict(dict)
    with gzip.open(BENCH_DATA / f"{sample}.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            if d["op"] != "gemm" or d["dtype"] != "bf16":
                continue
            f = d["features"]
            key = (d["phase"], f["batch"], f["n"], f["k"], f.get("bias"), f.get("wt"), d["bench_op"])
            groups[key][f["m"]] = d["duration_s"]
    out, pairs = [], 0
    for key, by_m in groups.items():
        ms = sorted(by_m)
        for i, a in enumerate(ms):
            for b in ms[i + 1:]:
                if b >= 2 * a:
                    pairs += 1
                    if (r := (by_m[b] / b) / (by_m[a] / a)) > 1 + tol:
                        out.append(f"| {key[0]} | {key[6]} | {key[2]:g} | {key[3]:g} | {a:g} -> {b:g} | "
                                   f"{by_m[a] * 1e6:.1f} -> {by_m[b] * 1e6:.1f} us | {r:.3f} |")  # fmt: skip
    return [f"{len(out)} of {pairs} measured pairs (same N, K, case; rows x2 or more) worse per row by more than {tol:.0%}",  # fmt: skip
            "", "| phase | case | N | K | rows | measured | per-row ratio |", "|---|---|---|---|---|---|---|", *out]


def _row(label: str, phase: str, pairs: list[tuple[int, int, float, str, str]], fmt: Any) -> tuple[str, int]:
    """One summary row: the pairs between fitted answers and those whose larger answer is
    carried beyond the measured work, each with its count and worst pair."""
    cells, carried = [], 0
    for part in (False, True):
        sel = [p for p in pairs if ("beyond-measured-work" in p[4]) == part]
        carried += len(sel) if part else 0
        if not sel:
            cells.append("0")
            continue
        s, s2, r, _, p2 = max(sel, key=lambda x: x[2])
        cells.append(f"{len(sel)}, worst {r:.3f} ({fmt(s)} -> {fmt(s2)}{'; ' + p2 if part else ''})")
    return f"| {label} | {phase} | {cells[0]} | {cells[1]} |", carried


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tol", type=float, default=0.01, help="relative loss of efficiency reported (default 1%%)")
    ap.add_argument("--pairs", action="store_true", help="list every pair, not one summary row per shape")
    ap.add_argument("--measured", action="store_true", help="also list the sample's own such GEMM rows")
    ap.add_argument("--check", action="store_true", help="exit 1 when a carried GEMM answer loses efficiency")
    args = ap.parse_args(argv)
    from trainsim.builders.bench_costs import _dram_roof_s
    from trainsim.kernels import predict_query, query
    from trainsim.kernels.roofline import RooflineModel

    cal = _calibration()
    roof = (RooflineModel(cal.device),)
    print(f"sample {cal.sample}; pairs (s, s' >= 2s) whose time per unit of work at s' is worse than at s "
          f"by more than {args.tol:.0%}; GEMMs over M rows (bias, weight [n, k]), bf16; memory-bound "
          f"operators over element counts streaming from DRAM (roofline above 2x the L2)\n")  # fmt: skip
    head = "| shape | phase | both fitted (count, worst) | larger carried beyond the measured work |"
    print(head + "\n|---|---|---|---|")
    carried_bad, gemm_bad, listed = 0, 0, []
    for phase in ("fwd", "bwd"):
        for label, n, k in GEMMS:
            ans = _answers(cal, "gemm", phase, "bf16", sizes=ROWS, inputs=lambda m, n=n, k=k: {
                "batch": 1.0, "m": float(m), "n": float(n), "k": float(k), "bias": 1.0, "wt": 1.0})  # fmt: skip
            pairs = worse_pairs(ans, args.tol)
            line, bad = _row(label, phase, pairs, lambda m: f"{m:,}")
            carried_bad, gemm_bad = carried_bad + bad, gemm_bad + bad
            print(line)
            listed += [(label, phase, *p) for p in pairs]
    for phase in ("fwd", "bwd"):
        for label, op, inputs in MEMORY:
            dram = [s for s in ELEMENTS
                    if predict_query(query(op, phase=phase, dtype="bf16", **inputs(s)), cal.device,
                                     models=roof).duration_s > _dram_roof_s(cal.device)]  # fmt: skip
            pairs = worse_pairs(_answers(cal, op, phase, "bf16", sizes=tuple(dram), inputs=inputs), args.tol)
            line, bad = _row(label, phase, pairs, lambda s: f"2^{s.bit_length() - 1}")
            carried_bad += bad
            print(line)
            listed += [(label, phase, *p) for p in pairs]
    print(f"\n{carried_bad} pair(s) whose larger answer is carried beyond the measured work")
    if args.pairs:
        print("\n| shape | phase | s -> s' | ratio | answer at s | answer at s' |\n|---|---|---|---|---|---|")
        for label, phase, s, s2, r, p1, p2 in listed:
            print(f"| {label} | {phase} | {s:,} -> {s2:,} | {r:.3f} | {p1} | {p2} |")
    if args.measured:
        print()
        print("\n".join(measured_pairs(cal.sample, max(args.tol, 0.05))))
    return 1 if args.check and gemm_bad else 0


if __name__ == "__main__":
    sys.exit(main())
