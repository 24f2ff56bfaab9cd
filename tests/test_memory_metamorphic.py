"""What scripts/metamorphic_memory.py found (2026-12-04): ``search`` screened memory against the
capacity less the headroom as a float while ``predict`` took its whole bytes, and predict
compared the fractional peak where its JSON prints whole bytes. On the H200's fractional
capacity (149,479,253,606.4 bytes) a plan whose peak falls inside the capacity's 0.4 byte was
ranked by ``search`` and refused by ``predict`` under the same ``--memory-headroom``, and
predict's JSON then said ``fits_in_memory: false`` beside ``memory_per_gpu_bytes`` equal to
``memory_limit_bytes``. Both now decide with ``memory.memory_limit`` / ``memory.fits_within``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from typer.testing import CliRunner

from trainsim.builders.memory import fits, fits_within, memory_limit, peak_memory
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.cli.main import _register, app
from trainsim.cli.output import _clean
from trainsim.hardware import get_device, get_system
from trainsim.search.llm import MEMORY_REASON, search_llm
from trainsim.search.space import PlanSpace

# a peak with a third of a byte (gemma3-12b's windowed layers' share of the KV all-gather's kept
# outputs under cp 2) on the H200
MODEL, SYSTEM = "gemma3-12b", "dgx-h200"
PLAN = Plan(dp=4, cp=2, zero=1, global_batch=16, seq_len=4096, recompute="full")
SPACE = PlanSpace(gpus=8, global_batch=16, seq_len=4096, tp=(1,), pp=(1,), cp=(2,), zero=(1,), micro_batch=(1,),
                  recompute=("full",), schedule=("1f1b",), sp=(False,))  # fmt: skip


def _edge() -> tuple[float, float, int]:
    """(capacity, peak, a whole-byte headroom leaving the limit inside the capacity's fraction
    just above the peak's whole bytes)."""
    cap = get_device(get_system(SYSTEM).device).memory_bytes
    pk = peak_memory(get_model(MODEL), PLAN).total_bytes
    assert cap != math.floor(cap) and 0 < pk - math.floor(pk) < cap - math.floor(cap)  # the case exists
    return cap, pk, math.floor(cap) - math.floor(pk)


def test_search_and_predict_decide_the_same_plan_alike() -> None:
    model, sysspec = get_model(MODEL), get_system(SYSTEM)
    cap, _, h = _edge()
    for headroom in (h - 1, h, h + 1):
        res = search_llm(model, sysspec, SPACE, workers=1, progress=False, top_k=1, simulate_top=1,
                         memory_headroom_bytes=headroom)  # fmt: skip
        r = predict_llm(model, PLAN, sysspec, simulate=False, memory_headroom_bytes=headroom)
        assert res["memory_limit_bytes"] == r.memory_limit_bytes == math.floor(cap - headroom)
        assert bool(res["feasible"]) == r.fits_in_memory == fits(model, PLAN, r.memory_limit_bytes)[0]
        assert res["infeasible"] == ({} if r.fits_in_memory else {MEMORY_REASON: 1})
    # the headroom one byte larger than leaves room for the peak's whole bytes: out of memory
    assert not predict_llm(model, PLAN, sysspec, simulate=False, memory_headroom_bytes=h + 1).fits_in_memory


def test_predict_json_fits_as_printed() -> None:
    """fits_in_memory is memory_per_gpu_bytes <= memory_limit_bytes as the JSON prints them."""
    _, _, h = _edge()
    for headroom in (h - 1, h, h + 1):
        doc = _clean(predict_llm(MODEL, PLAN, SYSTEM, simulate=False, memory_headroom_bytes=headroom).to_dict())
        assert doc["fits_in_memory"] == (doc["memory_per_gpu_bytes"] <= doc["memory_limit_bytes"])
        assert doc["memory_per_gpu_bytes"] == doc["memory"]["total_bytes"] == max(doc["memory_per_stage_bytes"])


def test_cli_search_lists_only_what_predict_fits() -> None:
    """The same through the CLI: --memory-headroom in MB (56003.473553MB: whole bytes)."""
    _register()
    _, _, h = _edge()
    text = f"{h / 1e6:.6f}MB"
    common = ["--gpus", "8", "--system", SYSTEM, "--global-batch", "16", "--seq-len", "4096", "--cp", "2",
              "--zero", "1", "--recompute", "full", "--memory-headroom", text, "--format", "json"]  # fmt: skip
    pred = CliRunner().invoke(app, ["predict", MODEL, *common, "--closed-form"])
    doc = json.loads(pred.stdout)
    assert doc["fits_in_memory"] == (doc["memory_per_gpu_bytes"] <= doc["memory_limit_bytes"])
    search = CliRunner().invoke(app, ["search", MODEL, *common, "--tp", "1", "--pp", "1", "--micro-batch", "1",
                                      "--schedule", "1f1b", "--sp", "off", "--workers", "1", "--top-k", "1",
                                      "--simulate-top", "1"])  # fmt: skip
    found = json.loads(search.stdout)
    assert found["memory_limit_bytes"] == doc["memory_limit_bytes"]
    assert bool(found["plans"]) == doc["fits_in_memory"]


def test_memory_limit_and_fits_within() -> None:
    assert memory_limit(149479253606.4) == 149479253606 and type(memory_limit(149479253606.4)) is int
    assert memory_limit(84810924032.0, 2**30) == 84810924032 - 2**30
    assert fits_within(10.4, 10) and fits_within(10.0, 10) and not fits_within(10.6, 10)
    assert not fits_within(math.inf, 10) and not fits_within(math.nan, 10)


def test_the_sweep_holds_on_a_few_plans() -> None:
    """scripts/metamorphic_memory.py's relations on one plan per model and impl (no search, CLI)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import metamorphic_memory as sweep
    finally:
        sys.path.pop(0)
    assert sweep.main(["--plans", "1", "--seed", "3", "--no-search", "--no-cli"]) == 0


def test_hf_every_term_sum_is_no_upper_bound() -> None:
    """impl hf: the optimizer step's foreach temporary is in no term of the every-term sum, so
    the peak exceeds it (the docstring called the sum an upper bound until 2026-12-04); it stays
    within the sum plus that temporary."""
    from trainsim.builders.memory import memory_per_gpu

    model, plan = get_model("llama3-8b"), Plan(dp=2, impl="hf", seq_len=1024)
    every, peak = memory_per_gpu(model, plan, at_peak=False)[0], memory_per_gpu(model, plan)[0]
    assert peak.phase == "optimizer-step" and peak.total_bytes > every.total_bytes
    assert peak.total_bytes <= every.total_bytes + every.optimizer_bytes / 2
