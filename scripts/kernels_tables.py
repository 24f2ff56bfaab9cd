"""Regenerate docs/kernels.md's per-operator tables from `trainsim validate kernels --format json`.

    trainsim validate kernels --device all --format json > /tmp/kernels.json
    python scripts/kernels_tables.py /tmp/kernels.json

Writes between ``<!-- kernels:start -->`` and ``<!-- kernels:end -->`` in docs/kernels.md.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "kernels.md"
TITLES = {"a100": "A100-SXM4-80GB (Perlmutter)", "gh200": "GH200 (Vista)"}


def _f(v: float | None, nd: int = 2) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def section(device: str, cases: list[dict]) -> list[str]:
    out = [f"### {TITLES[device]}", "",
           "| operator | phase | family | ours: kind | ours MAPE % | GMAE % | max % | paper: model | paper MAPE % "
           "| calibrated roofline MAPE % | held-out rows |",
           "|---|---|---|---|---:|---:|---:|---|---:|---:|---:|"]  # fmt: skip
    for c in sorted(cases, key=lambda c: (c["op"], c["phase"])):
        mark = "" if c["mape_pct"] <= 5.0 else " ✗"
        out.append(f"| {c['op']} | {c['phase']} | {c['family']} | {c['kind']} | {_f(c['mape_pct'])}{mark} | "
                   f"{_f(c['gmae_pct'])} | {_f(c['max_abs_err_pct'], 1)} | {c.get('paper_model') or '—'} | "
                   f"{_f(c.get('paper_mape_pct'), 1)} | {_f(c.get('roofline_mape_pct'))} | {c['heldout_rows']} |")  # fmt: skip
    m = [c["mape_pct"] for c in cases]
    both = [c for c in cases if c.get("paper_mape_pct") is not None]
    paper = [c["paper_mape_pct"] for c in both]
    ours_b = [c["mape_pct"] for c in both]
    out += ["", f"**{TITLES[device]}**: ours mean **{statistics.fmean(m):.2f} %** over {len(m)} cases, median "
            f"{statistics.median(m):.2f} %, max {max(m):.2f} %, {sum(x <= 5.0 for x in m)}/{len(m)} within 5 %. "
            f"On the {len(both)} cases 001 reports: ours mean {statistics.fmean(ours_b):.2f} %, max {max(ours_b):.2f} %; "
            f"001's mean {statistics.fmean(paper):.2f} %, max {max(paper):.2f} %; ours lower on "
            f"{sum(o < p for o, p in zip(ours_b, paper, strict=True))} of {len(both)}.", ""]  # fmt: skip
    return out


def main(path: str) -> None:
    doc = json.loads(Path(path).read_text())
    body: list[str] = []
    for dev in TITLES:
        cases = [c for c in doc["cases"] if c["device"] == dev]
        if cases:
            body += section(dev, cases)
    text = DOC.read_text()
    a, b = text.index("<!-- kernels:start -->"), text.index("<!-- kernels:end -->")
    DOC.write_text(text[: a + len("<!-- kernels:start -->")] + "\n" + "\n".join(body) + text[b:])


if __name__ == "__main__":
    main(sys.argv[1])
