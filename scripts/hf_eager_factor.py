"""Measure how much slower HuggingFace's eager memory-bound kernels run than the census predicts:
the factor behind ``trainsim predict --impl hf`` on a device with captures
(``src/trainsim/builders/data/hf_eager_calibration.json``; docs/gpu.md).

For each capture of a calibration set (by default the ten ``h100-llama`` captures shipped in
``validate/data/gpu_e2e_h100.tar.xz``), from its Kineto trace: the GPU time per step of every
kernel that is not a GEMM (cuBLAS ``nvjet``/``gemm``/``cutlass``/``xmma``), attention (``sdpa``,
``flash``, ``fmha``) or the optimizer (``multi_tensor_apply``); less the builder's own
memory-bound operators for that step (embedding, loss gather: timed by their bench models);
divided by the census's time (the ``hf_eager_*`` operators without a factor). The factor is
the median over the captures. Other capture sets are printed beside it (``--check TAG``), and
are not used.

    python scripts/hf_eager_factor.py                 # prints; --write rewrites the JSON
    python scripts/hf_eager_factor.py --check h100-gpt2 --check h100-llama13 --check h100-llama70
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "trainsim" / "builders" / "data" / "hf_eager_calibration.json"
SHIPPED = ROOT / "src" / "trainsim" / "validate" / "data" / "gpu_e2e_h100.tar.xz"
HELD_OUT = ROOT / "docs" / "results" / "h100_llama_heldout_kineto.tar.xz"
KERNEL_CLASSES = (("attention", re.compile(r"sdpa|flash|fmha", re.I)),
                  ("gemm", re.compile(r"nvjet|gemm|cutlass|xmma", re.I)),
                  ("optimizer", re.compile(r"multi_tensor_apply")))  # fmt: skip


def kernel_split(trace: Path) -> dict[str, float]:
    """GPU milliseconds per profiled step of a Kineto trace, by kernel class (the rest: memory)."""
    if not trace.is_file():
        raise SystemExit(f"{trace}: no such Kineto trace (captures: the gpu_e2e archive holds h100-llama and "
                         f"h100-gpt2, docs/results/{HELD_OUT.name} the llama13 and llama70 ones)")  # fmt: skip
    events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
    steps = sum(1 for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep"))
    if steps == 0:
        raise SystemExit(f"{trace}: no ProfilerStep annotations")
    out: Counter[str] = Counter()
    for e in events:
        if e.get("cat") == "kernel":
            cls = next((c for c, pat in KERNEL_CLASSES if pat.search(e["name"])), "memory")
            out[cls] += e["dur"] / 1e3 / steps
    return dict(out)


def capture_factors(tag: str, captures: Path) -> list[tuple[str, float, float, float, float]]:
    """(capture, measured memory ms, builder's other memory ms, census ms, factor) per case of ``tag``."""
    from trainsim.builders.eager import eager_factor
    from trainsim.builders.llm import resolve_system, stage_costs
    from trainsim.hardware import get_device
    from trainsim.validate.llm_cases import SHIPPED_TAGS

    rows = []
    for case in SHIPPED_TAGS[tag]():
        name = case.id.split(":", 1)[1]
        name = name if name.startswith("llama") else f"gpt2_{name.replace('-r', '_t1_s5_r')}"
        measured = kernel_split(captures / name / "rank0.kineto.json")["memory"]
        system = resolve_system(case.system)
        dev = get_device(system.device)
        applied, _ = eager_factor((dev.name, *dev.aliases))
        st = stage_costs(case.model, case.plan, system)[0]
        census = other = 0.0
        for op, times in [(o, st.layers) for o in st.layer_ops] + [(o, 1) for o in st.ops]:
            if op.name.startswith("hf_eager"):
                census += op.seconds * times * 1e3 / applied
            elif op.category == "memory":
                other += op.seconds * times * 1e3
        rows.append((name, measured, other, census, (measured - other) / census))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tag", default="h100-llama", help="calibration set (validate llm shipped tag)")
    ap.add_argument("--captures", type=Path, help="folder of its captures (default: the shipped archives)")
    ap.add_argument("--check", action="append", default=[], help="another tag to print (held out)")
    ap.add_argument("--check-captures", type=Path, help="folder of the --check tags' captures (default: the shipped archives)")
    ap.add_argument("--write", action="store_true", help="rewrite the calibration JSON")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        caps = args.captures
        if caps is None or (args.check and args.check_captures is None):
            for archive in (SHIPPED, HELD_OUT):  # Kineto traces only (the execution traces are not read)
                with tarfile.open(archive, "r:xz") as tar:
                    tar.extractall(tmp, filter="data", members=[m for m in tar.getmembers()
                                                                if m.name.endswith("kineto.json")])  # fmt: skip
        caps = caps or Path(tmp) / "captures"
        rows = capture_factors(args.tag, caps)
        for tag in args.check:
            for r in capture_factors(tag, args.check_captures or Path(tmp) / "captures"):
                print(f"  held out {tag:14s} {r[0]:22s} measured {r[1]:7.2f} ms  other {r[2]:6.2f}  census {r[3]:6.2f}  factor {r[4]:.3f}")
    for r in rows:
        print(f"  {args.tag:14s} {r[0]:22s} measured {r[1]:7.2f} ms  other {r[2]:6.2f}  census {r[3]:6.2f}  factor {r[4]:.3f}")
    factor = statistics.median(r[4] for r in rows)
    print(f"median factor over {len(rows)} captures of {args.tag}: {factor:.4f}")
    if args.write:
        doc = {
            "what": "per device: how many times the census's time (trainsim.builders.eager; each eager kernel timed as a "
                    "contiguous element-wise add of the bench) the HuggingFace steps' memory-bound kernels took, "
                    "median over a calibration set's captures (Kineto traces)",
            "command": "python scripts/hf_eager_factor.py --write",
            "devices": {"h100-sxm5-80gb": {
                "factor": round(factor, 4), "calibration_set": args.tag,
                "captures": {r[0]: round(r[4], 4) for r in rows},
                "note": "kernels that are not GEMM, attention or optimizer, less the builder's own memory-bound "
                        "operators, over the census's time; held-out sets are reported in docs/gpu.md"}},
        }  # fmt: skip
        tmp_out = OUT.with_suffix(".json.tmp")
        tmp_out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp_out, OUT)
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
