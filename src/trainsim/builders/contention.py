"""Compute/communication contention: what a collective hidden behind compute still costs it.

NCCL kernels run on the GPU's SMs (one CTA per channel) and move their data through its memory,
so the GEMMs that run beside them on another stream slow down. The LLM predictor hides
communication behind compute in three places: the data-parallel gradient reduction overlapped
with the last backward (``Plan.overlap_grad_reduce``, :func:`trainsim.builders.llm._overlap_reduction`),
ZeRO-3's prefetched all-gathers and reduce-scatters (the passes of
:func:`trainsim.builders.llm.stage_costs`), and the context-parallel ring beside the attention
core (:func:`trainsim.builders.llm._with_ring`). Each applies :func:`hidden_cost_s`: while a
collective of ``comm_s`` seconds overlaps ``compute_s`` seconds of compute, the overlapped compute
is stretched by the factor ``k``, costing ``(k - 1) · min(comm_s, compute_s)`` more. TP
collectives and expert all-to-alls are not overlapped in the model, so they take nothing.

The factor is measured, not fitted to iteration times: ``data/comm_contention.json``, written by
``scripts/comm_contention.py`` from the shipped multi-rank Kineto traces (``../shared/data/traces``):
per kernel identity (name, grid, block, CPU operator and input dims), the durations of the
kernels a NCCL kernel overlaps over those of the same identity with none. Its ``factor`` is the
time-weighted ratio over the traces whose NCCL kernels are collectives (all-reduce,
reduce-scatter, all-gather, broadcast: what the predictor overlaps); traces of only send/recv
kernels (mostly waiting for their peers) are reported and not used. ``Plan.contention = False``
(``--no-contention``) sets the factor to 1: the overlapped communication is free again.

Approximations (stated): one factor for every device (it was measured on A100s; NCCL takes a
similar share of SMs elsewhere); the stretched compute does not move the moments the gradient
buckets become ready; the factor does not depend on the collective's size or protocol.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainsim.errors import ConfigError

if TYPE_CHECKING:
    from trainsim.builders.plan import Plan

CALIBRATION = Path(__file__).parent / "data" / "comm_contention.json"


@cache
def _calibration() -> dict[str, Any]:
    try:
        doc = json.loads(CALIBRATION.read_text(encoding="utf-8"))
        k = doc["factor"]
    except (OSError, ValueError, KeyError, TypeError) as e:  # TypeError: a document that is not an object
        raise ConfigError(f"{CALIBRATION}: unreadable contention calibration ({e!r}); rerun "
                          "scripts/comm_contention.py --write") from e  # fmt: skip
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not 1.0 <= k < 10.0:
        raise ConfigError(f"{CALIBRATION}: factor must be a number in [1, 10), got {k!r}")
    if not isinstance(doc.get("factor_source"), str):  # provenance() and short() name it
        raise ConfigError(f"{CALIBRATION}: factor_source must be a string (where the factor was measured), "
                          f"got {doc.get('factor_source')!r}")  # fmt: skip
    return doc


def measured_factor() -> float:
    """The calibrated stretch of compute that a collective overlaps (>= 1)."""
    return float(_calibration()["factor"])


def factor(plan: Plan) -> float:
    """The factor ``plan`` runs with: :func:`measured_factor`, or 1 with ``plan.contention`` off."""
    return measured_factor() if plan.contention else 1.0


def provenance() -> str:
    """Where the factor comes from, in one line (predict's provenance and notes)."""
    doc = _calibration()
    return f"x{measured_factor():g} on overlapped compute, {doc['factor_source']}"


def short() -> str:
    """:func:`provenance` for a table cell: the factor, its source trace and interval."""
    doc = _calibration()
    st = doc.get("factor_stats")
    ci = st.get("weighted_factor_95ci") if isinstance(st, dict) else None
    band = (f", 95 % interval {ci[0]:.2f}-{ci[1]:.2f}"
            if isinstance(ci, list) and len(ci) == 2 and all(isinstance(v, float) for v in ci) else "")  # fmt: skip
    groups = f"{st['groups']} kernels of " if isinstance(st, dict) and isinstance(st.get("groups"), int) else ""
    src = str(doc["factor_source"]).split(" of ", 1)[-1].split(" (", 1)[0].split("/", 1)[0]  # the trace set
    return f"x{measured_factor():.3f} on overlapped compute ({groups}{src}{band})"


def hidden_cost_s(comm_s: float, compute_s: float, k: float) -> float:
    """What ``comm_s`` seconds of communication hidden behind ``compute_s`` seconds of compute
    add: the overlapped compute, ``min(comm_s, compute_s)``, runs ``k`` times as long. Exactly
    0 for ``k`` 1 or no overlap."""
    if k == 1.0 or comm_s <= 0.0 or compute_s <= 0.0:
        return 0.0
    return (k - 1.0) * min(comm_s, compute_s)
