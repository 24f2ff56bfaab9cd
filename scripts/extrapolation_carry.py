"""How should a learned kernel model answer outside its measured range? A boundary hold-out.

A learned entry answers a query outside the range it was fitted on by clipping the inputs to
the range and carrying the answer at the clipped point to the query. This script compares two
ways of carrying it, on paper 001's own operator data (no end-to-end time is involved):

* ``roofline``: ``t(clip) * roofline(x) / roofline(clip)`` — the efficiency at the nearest
  measured point, kept constant;
* ``curve``: ``t(clip) * curve(x) / curve(clip)`` — the entry's calibrated efficiency curve
  (``log2(t / roofline)`` against ``log2(roofline)``, medians of the measured rows, constant
  beyond its end knots): how efficiency changes with problem size in the entry's own data.

For every entry and every input with at least three measured values, the rows at the lowest
value (``below``) and, separately, at the highest (``above``) are held out; the entry is fitted on
the other rows (XGBoost only, trainsim's selection among its configurations), and the held-out
rows, all outside the fitted range, are predicted both ways. Prints one line per slice and a
summary; ``--json PATH`` writes every slice.

    python scripts/extrapolation_carry.py [--device a100|gh200|all] [--json out.json]

About 15 minutes for both devices on two CPU cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from trainsim.hardware import get_device
from trainsim.kernels.features import op_spec
from trainsim.kernels.fitting import fit_entry
from trainsim.kernels.readers import read_kernel_dataset
from trainsim.kernels.samples import KernelDataset

DATA = {
    "a100": ("a100-sxm4-80gb", "a100-sxm4-80gb_perlmutter"),
    "gh200": ("gh200-120gb", "gh200-120gb_vista"),
}
MIN_TRAIN = 50


def _mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / meas - 1.0)) * 100.0)


def slices(ds: KernelDataset, device: str, data_name: str) -> list[dict]:
    dev = get_device(device)
    out: list[dict] = []
    for key in ds.entry_keys():
        rows = ds.select(key)
        spec = op_spec(key.op)
        for name in spec.inputs:
            values = sorted({r.features[name] for r in rows if name in r.features})
            if len(values) < 3:
                continue
            for side, edge in (("below", values[0]), ("above", values[-1])):
                test = [r for r in rows if r.features.get(name) == edge]
                train = KernelDataset(ds.name, [r for r in rows if r.features.get(name) != edge])
                if len(train.samples) < MIN_TRAIN or not test:
                    continue
                entry, curve, _ = fit_entry(train, key, device=dev, kinds=("xgboost",), holdout=1e-9)
                if entry is None:
                    continue
                cols = [n for n in spec.inputs if any(n in r.features for r in test)]
                feats = {n: np.array([r.features[n] for r in test], dtype=float) for n in cols}
                meas = np.array([r.duration_s for r in test])
                # one regressor both ways: without a curve the entry carries along the roofline,
                # with the curve of its training rows along that (whether or not fitting keeps
                # that curve: it drops one whose carry breaks a monotone claim)
                t_roof, _ = replace(entry, curve=None).predict(feats, dev)
                t_curve, _ = replace(entry, curve=curve).predict(feats, dev)
                ok = meas > 0
                rec = {
                    "device": data_name, "entry": key.label, "input": name, "side": side, "value": edge,
                    "rows": int(ok.sum()), "roofline_mape_pct": _mape(t_roof[ok], meas[ok]),
                    "curve_mape_pct": _mape(t_curve[ok], meas[ok]),
                    "roofline_median_signed_pct": float(np.median(t_roof[ok] / meas[ok] - 1) * 100),
                    "curve_median_signed_pct": float(np.median(t_curve[ok] / meas[ok] - 1) * 100),
                }  # fmt: skip
                out.append(rec)
                print(f"{data_name:28s} {key.label:40s} {name:>5s} {side:5s} {rec['rows']:5d} rows  "
                      f"roofline {rec['roofline_mape_pct']:6.2f} % ({rec['roofline_median_signed_pct']:+6.1f})  "
                      f"curve {rec['curve_mape_pct']:6.2f} % ({rec['curve_median_signed_pct']:+6.1f})", flush=True)  # fmt: skip
    return out


def summary(recs: list[dict]) -> None:
    for side in ("below", "above", "all"):
        rs = [r for r in recs if side in ("all", r["side"])]
        if not rs:
            continue
        roof = np.array([r["roofline_mape_pct"] for r in rs])
        cur = np.array([r["curve_mape_pct"] for r in rs])
        better = int(np.sum(cur < roof - 1e-9))
        worse = int(np.sum(cur > roof + 1e-9))
        print(f"{side:5s}: {len(rs)} slices; mean MAPE roofline {roof.mean():.2f} %, curve {cur.mean():.2f} %; "
              f"median {np.median(roof):.2f} / {np.median(cur):.2f} %; curve better on {better}, worse on {worse}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="all", choices=["a100", "gh200", "all"])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    recs: list[dict] = []
    for d in ("a100", "gh200") if a.device == "all" else (a.device,):
        device, name = DATA[d]
        ds = read_kernel_dataset([Path(a.data) / "calibration" / name / "operator"])
        recs += slices(ds, device, name)
    summary(recs)
    print(f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if a.json:
        Path(a.json).write_text(json.dumps(recs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
