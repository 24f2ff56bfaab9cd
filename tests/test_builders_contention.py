"""Compute/communication contention (builders/contention.py): overlapped collectives stretch the
compute beside them by the factor measured on the shipped traces."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainsim.builders import contention
from trainsim.builders.llm import _with_ring, stage_costs
from trainsim.builders.llm_comm import CommCost
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.errors import ConfigError
from trainsim.hardware import get_system

ROOT = Path(__file__).resolve().parents[1]
ZERO3 = Plan(dp=8, zero=3, micro_batch=1, global_batch=32)
OGR = Plan(dp=8, micro_batch=1, global_batch=32, overlap_grad_reduce=True)
CP = Plan(cp=4, micro_batch=1, global_batch=1, seq_len=16384)


def _t(plan: Plan, model: str = "llama2-7b", system: str = "dgx-a100") -> float:
    return predict_llm(model, plan, system).iteration_time_s


def test_hidden_cost_is_the_stretch_of_the_overlapped_compute() -> None:
    assert contention.hidden_cost_s(2.0, 5.0, 1.1) == pytest.approx(0.2)  # comm shorter: all of it overlaps
    assert contention.hidden_cost_s(5.0, 2.0, 1.1) == pytest.approx(0.2)  # compute shorter: all of it stretched
    assert contention.hidden_cost_s(0.0, 5.0, 1.1) == 0.0 == contention.hidden_cost_s(2.0, 0.0, 1.1)
    assert contention.hidden_cost_s(2.0, 5.0, 1.0) == 0.0


@pytest.mark.parametrize("plan", [ZERO3, OGR, CP, replace(ZERO3, recompute="full")], ids=lambda p: p.label())
def test_overlapped_communication_costs_time(plan: Plan) -> None:
    """ZeRO-3's prefetched collectives, the DP reduction during the backward and the CP ring all
    slow the compute they hide behind: the plan is slower with contention than without."""
    on, off = _t(plan), _t(replace(plan, contention=False))
    k = contention.measured_factor()
    assert k > 1.0
    assert off < on < off * k  # only the overlapped part is stretched


def test_zero3_pass_takes_the_stretch_of_its_hidden_gathers() -> None:
    """The forward pass: ag + max(f + (k-1)·min((n-1)·ag, f), (n-1)·ag), checked against the
    pass without contention (compute-bound here: the gathers hide behind the layers)."""
    model, system = get_model("llama2-7b"), get_system("dgx-a100")
    on, off = stage_costs(model, ZERO3, system)[0], stage_costs(model, replace(ZERO3, contention=False), system)[0]
    assert on.zero3_exposed_fwd_s > off.zero3_exposed_fwd_s >= 0.0
    assert on.fwd_s - off.fwd_s == pytest.approx(on.zero3_exposed_fwd_s - off.zero3_exposed_fwd_s, rel=1e-9)


@pytest.mark.parametrize("plan", [Plan(tp=8, micro_batch=1, global_batch=4, overlap_grad_reduce=True),
                                  Plan(dp=8, micro_batch=1, global_batch=32), Plan(dp=8, zero=1, micro_batch=1, global_batch=32)],
                         ids=lambda p: p.label())  # fmt: skip
def test_nothing_overlapped_nothing_changes(plan: Plan) -> None:
    """No hidden communication (TP's and an unoverlapped reduction are exposed): the same time."""
    assert _t(plan) == _t(replace(plan, contention=False))


@pytest.mark.parametrize("plan", [ZERO3, OGR, CP], ids=lambda p: p.label())
def test_factor_one_is_bit_identical(monkeypatch: pytest.MonkeyPatch, plan: Plan) -> None:
    monkeypatch.setattr(contention, "measured_factor", lambda: 1.0)
    assert _t(plan) == _t(replace(plan, contention=False))


def test_ring_stretches_the_attention_it_hides_behind() -> None:
    from trainsim.builders.costs import OpCost

    ops = [OpCost("qkv", "fwd", 1.0, "x", 0.0, "gemm"), OpCost("core", "fwd", 4.0, "x", 0.0, "attention"),
           OpCost("out", "fwd", 1.0, "x", 0.0, "gemm")]  # fmt: skip
    ring = CommCost("cp_ring", "send_recv", 1e6, 4, 4, 2.0, "x")
    assert _with_ring(ops, ring, 1.0) is ops  # hidden and free
    core = _with_ring(ops, ring, 1.1)[1].seconds
    assert core == pytest.approx(4.0 + 0.1 * 2.0)
    long = replace(ring, seconds=10.0)
    assert _with_ring(ops, long, 1.1)[1].seconds == pytest.approx(10.0)  # the ring still ends it
    assert _with_ring(ops, replace(ring, seconds=4.3), 1.1)[1].seconds == pytest.approx(4.4)  # 1.1 x attention


def test_provenance_names_the_calibration() -> None:
    doc = json.loads(contention.CALIBRATION.read_text(encoding="utf-8"))
    assert contention.measured_factor() == doc["factor"]
    r = predict_llm("llama2-7b", ZERO3, "dgx-a100")
    assert r.provenance["contention"].startswith(f"x{doc['factor']:g} on overlapped compute")
    assert "hta_resnet50_ddp_a100" in r.provenance["contention"]
    off = predict_llm("llama2-7b", replace(ZERO3, contention=False), "dgx-a100")
    assert off.provenance["contention"].startswith("off") and off.plan.label().endswith("nocontention")


def test_bad_calibration_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bad = tmp_path / "comm_contention.json"
    bad.write_text('{"factor": 0.5, "factor_source": "x"}', encoding="utf-8")
    monkeypatch.setattr(contention, "CALIBRATION", bad)
    contention._calibration.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"comm_contention.json: factor must be a number in \[1, 10\), got 0.5"):
            contention.measured_factor()
    finally:
        contention._calibration.cache_clear()


@pytest.mark.parametrize(("text", "want"), [
    ('{"factor": 1.05}', r"comm_contention.json: factor_source must be a string .*got None"),
    ("[1.05]", r"comm_contention.json: unreadable contention calibration \(TypeError"),
])  # fmt: skip
def test_calibration_without_source_or_not_an_object_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                text: str, want: str) -> None:  # fmt: skip
    """A file without factor_source (which provenance() and short() read) or not a JSON object
    had raised a bare KeyError / TypeError from predict."""
    bad = tmp_path / "comm_contention.json"
    bad.write_text(text, encoding="utf-8")
    monkeypatch.setattr(contention, "CALIBRATION", bad)
    contention._calibration.cache_clear()
    try:
        for f in (contention.measured_factor, contention.provenance):
            with pytest.raises(ConfigError, match=want):
                f()
    finally:
        contention._calibration.cache_clear()


def test_shipped_factor_is_the_scripts_measurement(shared_data: Path, tmp_path: Path) -> None:
    """scripts/comm_contention.py on the one collective trace the factor rests on gives it."""
    spec = importlib.util.spec_from_file_location("comm_contention", ROOT / "scripts" / "comm_contention.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    name = "hta_resnet50_ddp_a100/rank0_of_2.json.gz"
    (tmp_path / "hta_resnet50_ddp_a100").mkdir()
    (tmp_path / name).symlink_to(shared_data / "traces" / name)
    doc = json.loads(contention.CALIBRATION.read_text(encoding="utf-8"))
    got = mod.measure(tmp_path, doc["overlapped_threshold"], doc["min_alone_us"])
    assert got["factor"] == doc["factor"] and got["factor_source"] == doc["factor_source"]
    assert got["factor_stats"]["slower_faster_groups"] == doc["factor_stats"]["slower_faster_groups"]


def test_cli_no_contention() -> None:
    from typer.testing import CliRunner

    from trainsim.cli.main import _register, app

    _register()
    args = ["predict", "llama2-7b", "--gpus", "8", "--zero", "3", "--format", "json"]
    on = CliRunner().invoke(app, args)
    off = CliRunner().invoke(app, [*args, "--no-contention"])
    assert on.exit_code == 0 == off.exit_code, on.output + off.output
    a, b = json.loads(on.stdout), json.loads(off.stdout)
    assert b["plan"].endswith("nocontention") and a["iteration_time_s"] > b["iteration_time_s"]


def test_table_cell_is_short_and_json_keeps_the_whole_source() -> None:
    from trainsim.builders import contention

    cell = contention.short()
    doc = json.loads(contention.CALIBRATION.read_text())
    assert cell.startswith(f"x{doc['factor']:.3f} on overlapped compute (")
    assert "hta_resnet50_ddp_a100" in cell and "95 % interval" in cell and len(cell) < 100
    assert len(contention.provenance()) > len(cell)  # predict's JSON provenance: the whole line
