"""An edited YAML copy of a catalog device (same name, other peaks or bandwidth): calibrated
kernel answers are carried to its roofline (trainsim.kernels.rescaled); its system keeps the
network's calibrated collectives when only compute or memory changed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainsim.hardware import get_device, get_system
from trainsim.kernels import predict_query, query
from trainsim.kernels.registry import models_for
from trainsim.kernels.rescaled import (
    RescaledKernelModel,
    edited_catalog_device,
    measured_on,
    rescaled_note,
)

DATA = Path(__file__).resolve().parents[1] / "src/trainsim/hardware/data"
A100 = "a100-sxm4-80gb"
GEMM = {"b": 8, "l": 2048, "dim": 4096, "mp": 1}  # linear1: compute-bound on the A100
NORM = {"b": 8, "l": 2048, "dim": 4096}  # layernorm: memory-bound


def _device(tmp_path: Path, src: str, **edits: object) -> Path:
    doc = yaml.safe_load((DATA / src).read_text(encoding="utf-8"))
    doc.update(edits)
    doc["aliases"] = []
    path = tmp_path / f"dev_{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _system(tmp_path: Path, src: str, device: Path) -> Path:
    doc = yaml.safe_load((DATA / src).read_text(encoding="utf-8"))
    doc["device"] = str(device)
    doc["aliases"] = []
    path = tmp_path / f"sys_{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _twice_the_peaks(tmp_path: Path) -> Path:
    return _device(tmp_path, "device_a100_sxm4_80gb.yaml",
                   peak_tflops={"fp32": 39, "tf32": 312, "fp16": 624, "bf16": 624})  # fmt: skip


def test_compute_edit_moves_compute_bound_answers_by_the_peak_ratio(tmp_path: Path) -> None:
    edited = get_device(_twice_the_peaks(tmp_path))
    assert edited_catalog_device(edited) == get_device(A100)
    gemm, norm = query("linear1", dtype="fp16", **GEMM), query("layernorm", dtype="fp16", **NORM)
    base_g, base_n = predict_query(gemm, A100), predict_query(norm, A100)
    new_g, new_n = predict_query(gemm, edited), predict_query(norm, edited)
    assert base_g.calibrated and new_g.calibrated  # still the measurements, carried
    assert new_g.duration_s == pytest.approx(base_g.duration_s / 2, rel=1e-9)
    assert "spec-rescaled" in new_g.provenance and "spec-rescaled" not in base_g.provenance
    assert new_n.duration_s == base_n.duration_s  # memory-bound: the bandwidth did not change
    assert "spec-rescaled" not in new_n.provenance


def test_bandwidth_edit_moves_memory_bound_answers(tmp_path: Path) -> None:
    edited = get_device(_device(tmp_path, "device_a100_sxm4_80gb.yaml", memory_bandwidth_GBps=4078))
    norm, gemm = query("layernorm", dtype="fp16", **NORM), query("linear1", dtype="fp16", **GEMM)
    assert predict_query(norm, edited).duration_s == pytest.approx(
        predict_query(norm, A100).duration_s / 2
    )
    assert predict_query(gemm, edited).duration_s == predict_query(gemm, A100).duration_s


def test_an_edit_the_roofline_does_not_read_changes_nothing(tmp_path: Path) -> None:
    edited = get_device(_device(tmp_path, "device_a100_sxm4_80gb.yaml", memory_GB=40))
    assert edited_catalog_device(edited) is None and rescaled_note(edited) is None
    assert not any(isinstance(m, RescaledKernelModel) for m in models_for(edited))
    q = query("linear1", dtype="fp16", **GEMM)
    assert predict_query(q, edited) == predict_query(q, A100)


def test_a_model_measured_on_the_edited_spec_answers_unscaled(tmp_path: Path) -> None:
    edited = get_device(_twice_the_peaks(tmp_path))
    learned = next(m for m in models_for(A100) if hasattr(m, "spec"))
    assert not measured_on(learned, edited) and measured_on(learned, get_device(A100))
    learned_on_edited = type(learned).from_artifact(*learned.to_artifact())
    learned_on_edited.spec = edited  # as an artifact fitted on that device file records it
    assert measured_on(learned_on_edited, edited)


def test_predict_on_an_edited_device_is_faster_notes_it_and_keeps_the_networks_measurements(
    tmp_path: Path,
) -> None:
    from trainsim.builders.models import get_model
    from trainsim.builders.plan import Plan
    from trainsim.builders.predict import predict_llm

    plan = Plan(dp=8, tp=1, micro_batch=2, global_batch=16)
    base = predict_llm(get_model("gpt3-1.3b"), plan, "perlmutter")
    system = get_system(_system(tmp_path, "system_perlmutter.yaml", _twice_the_peaks(tmp_path)))
    edited = predict_llm(get_model("gpt3-1.3b"), plan, system)
    assert edited.breakdown["forward_s"] < 0.7 * base.breakdown["forward_s"]
    assert any(
        "edited copy of the catalog" in n and "fp16 peak 312 TFLOP/s -> 624 TFLOP/s" in n
        for n in edited.warnings
    )
    assert not any("edited copy" in n for n in base.warnings)
    # the network did not change: its calibrated collectives still answer (a compute edit
    # had dropped them: "its device differ from theirs")
    assert (
        edited.breakdown["exposed_dp_communication_s"]
        == base.breakdown["exposed_dp_communication_s"]
    )
    assert not any("do not answer for this system" in n for n in edited.warnings)


def test_a_system_naming_an_unedited_device_copy_by_path_is_that_system(tmp_path: Path) -> None:
    from trainsim.comm.registry import same_system, shadowed_note

    copy = _device(tmp_path, "device_a100_sxm4_80gb.yaml")
    system = get_system(_system(tmp_path, "system_perlmutter.yaml", copy))
    assert same_system(system, get_system("perlmutter")) and shadowed_note(system) is None
    other = get_system(
        _system(tmp_path, "system_perlmutter.yaml", _device(tmp_path, "device_h100_sxm5.yaml"))
    )
    note = shadowed_note(other)
    assert (
        not same_system(other, get_system("perlmutter"))
        and note is not None
        and "differs from theirs in device" in note
    )


def test_edited_h100_moves_its_bench_sample_answers(tmp_path: Path) -> None:
    from trainsim.builders.costs import OpCoster

    edited = get_device(_device(tmp_path, "device_h100_sxm5.yaml", memory_bandwidth_GBps=6700))
    base, new = OpCoster("h100-sxm5-80gb"), OpCoster(edited)
    t0, p0 = base.time("layernorm", "fwd", "bf16", **NORM)
    t1, p1 = new.time("layernorm", "fwd", "bf16", **NORM)
    assert "bench-as" in p0 and "spec-rescaled" in p1 and "spec-rescaled" not in p0
    assert t1 == pytest.approx(t0 / 2)


def test_hw_show_notes_an_edited_copy(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from trainsim.cli.main import _register, app

    _register()
    path = _twice_the_peaks(tmp_path)
    table = CliRunner().invoke(app, ["hw", "show", str(path)])
    assert table.exit_code == 0 and "edited copy of the catalog" in table.output
    doc = json.loads(CliRunner().invoke(app, ["hw", "show", str(path), "--format", "json"]).stdout)
    assert len(doc["notes"]) == 1 and "fp16 peak 312 TFLOP/s -> 624 TFLOP/s" in doc["notes"][0]
    catalog = json.loads(CliRunner().invoke(app, ["hw", "show", A100, "--format", "json"]).stdout)
    assert "notes" not in catalog


def test_predict_table_says_answers_were_carried_to_an_edited_spec(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trainsim.cli.main import _register, app

    _register()
    system = _system(tmp_path, "system_perlmutter.yaml", _twice_the_peaks(tmp_path))
    args = ["predict", "gpt3-1.3b", "--gpus", "8", "--tp", "1", "--global-batch", "16", "--micro-batch", "2"]
    edited = CliRunner().invoke(app, [*args, "--system", str(system)])
    catalog = CliRunner().invoke(app, [*args, "--system", "perlmutter"])
    assert edited.exit_code == 0 and catalog.exit_code == 0
    flat = " ".join(edited.stdout.split())
    assert "edited device" in flat and "edited device" not in " ".join(catalog.stdout.split())


@pytest.mark.parametrize("name", ["NVIDIA A100-SXM4-80GB", "a100", "A100 SXM4 80GB"])
def test_a_copy_named_by_an_alias_of_its_part_is_that_part(tmp_path: Path, name: str) -> None:
    """A device YAML named by one of its part's aliases (the name nvidia-smi prints, the short
    one) is the part, as ``--system``'s catalog lookups have it: edited, its calibrated answers
    are carried to the edit (they had fallen to the spec-based roofline, 586 of gpt3-1.3b's
    operators, 196 ms against 283 ms with the catalog name); its system keeps the network's
    collectives (they had been dropped: 'differs from theirs in device')."""
    from trainsim.comm.registry import same_system, shadowed_note

    doubled = get_device(_twice_the_peaks(tmp_path))
    aliased = get_device(_device(tmp_path, "device_a100_sxm4_80gb.yaml", name=name,
                                 peak_tflops={"fp32": 39, "tf32": 312, "fp16": 624, "bf16": 624}))  # fmt: skip
    assert edited_catalog_device(aliased) == get_device(A100)
    gemm = query("linear1", dtype="fp16", **GEMM)
    want, got = predict_query(gemm, doubled), predict_query(gemm, aliased)
    assert got.calibrated and "spec-rescaled" in got.provenance
    assert got.duration_s == pytest.approx(want.duration_s, rel=1e-12)
    note = rescaled_note(aliased)
    assert note is not None and note.startswith(f"device {name} is an edited copy")
    copy = get_device(_device(tmp_path, "device_a100_sxm4_80gb.yaml", name=name))  # unedited
    assert edited_catalog_device(copy) is None
    assert predict_query(gemm, copy) == predict_query(gemm, A100)
    system = get_system(_system(tmp_path, "system_perlmutter.yaml", _device(tmp_path, "device_a100_sxm4_80gb.yaml", name=name)))
    assert same_system(system, get_system("perlmutter")) and shadowed_note(system) is None


def test_a_user_artifact_naming_its_device_by_an_alias_answers_for_it(tmp_path: Path) -> None:
    """A `trainsim fit` artifact whose device is an alias of a catalog part answers for that
    part (kernel models and devices meet by catalog name)."""
    learned = next(m for m in models_for(A100) if hasattr(m, "spec"))
    art = type(learned).from_artifact(*learned.to_artifact())
    art.device = "NVIDIA A100-SXM4-80GB"
    from trainsim.kernels import registry

    registry._user_models.cache_clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "user_models", lambda: (art,))
        assert any(m is art for m in models_for(A100))
        assert not any(m is art for m in models_for("h100-sxm5-80gb"))


def test_the_note_names_a_removed_or_added_peak_as_none(tmp_path: Path) -> None:
    """A precision the copy drops (or adds) reads 'none', not Python's None with a unit."""
    doc = yaml.safe_load((DATA / "device_a100_sxm4_80gb.yaml").read_text(encoding="utf-8"))
    peaks = {k: v for k, v in doc["peak_tflops"].items() if k != "bf16"}
    note = rescaled_note(get_device(_device(tmp_path, "device_a100_sxm4_80gb.yaml", peak_tflops={**peaks, "fp8": 624})))
    assert note is not None and "bf16 peak 312 TFLOP/s -> none" in note and "fp8 peak none -> 624 TFLOP/s" in note
    assert "None" not in note


def test_a_renamed_system_copy_with_an_edited_gpu_is_still_the_networks_twin(tmp_path: Path) -> None:
    """A system copy under another name keeps its tiers: its collectives are the measured
    network's (a twin), with the GPU copy edited in FLOP/s as with the copy unedited; the edit
    had made the GPUs no siblings (fp16 peaks differ), so the collectives fell to the spec-based
    model (gpt3-1.3b on 8 Perlmutter GPUs, 2x peaks: 507.4 ms, 368 ms exposed DP, against
    2,227.7 ms and 2,089 ms under Perlmutter's own name)."""
    from trainsim.comm.registry import models_for, network_twins

    def renamed(device: Path) -> Path:
        doc = yaml.safe_load(_system(tmp_path, "system_perlmutter.yaml", device).read_text(encoding="utf-8"))
        doc["name"] = "my-perlmutter"
        path = tmp_path / f"renamed_{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        return path

    edited = get_system(renamed(_twice_the_peaks(tmp_path)))
    plain = get_system(renamed(_device(tmp_path, "device_a100_sxm4_80gb.yaml")))
    assert network_twins(get_system("perlmutter"), edited) and network_twins(get_system("perlmutter"), plain)
    twins = [m for m in models_for(edited) if "twin-system:perlmutter" in getattr(m, "dataset", "")]
    assert twins and len(twins) == len([m for m in models_for(plain) if "twin-system" in getattr(m, "dataset", "")])
    # another GPU is still another network
    h100 = get_system(renamed(_device(tmp_path, "device_h100_sxm5.yaml")))
    assert not network_twins(get_system("perlmutter"), h100)


# --- an edited copy of a part its siblings' measurements answer for (review finding) ---------


@pytest.mark.parametrize(("src", "part"), [("device_h200.yaml", "h200-sxm-141gb"),
                                           ("device_a100_sxm4_40gb.yaml", "a100-sxm4-40gb")])  # fmt: skip
def test_edited_copy_of_a_sibling_calibrated_part_stays_calibrated(tmp_path: Path, src: str, part: str) -> None:
    """An H200 (the H100's bench sample) or A100-40GB (the 80 GB part's 001 data) copy with
    other peaks matched no sibling, its fp16 peak no longer the sibling's, and went spec-based
    whole (H200 x2: 842 operators, 2,478 -> 1,205 ms, MFU up). The sibling's answers for the
    part are now carried to the copy's roofline: compute-bound ones by the peak ratio,
    memory-bound ones unchanged when the bandwidth is; a bandwidth edit the other way round."""
    from trainsim.builders.costs import OpCoster

    base = get_device(part)
    doc = yaml.safe_load((DATA / src).read_text(encoding="utf-8"))
    twice = get_device(_device(tmp_path, src, peak_tflops={k: 2 * v for k, v in doc["peak_tflops"].items()}))
    wide = get_device(_device(tmp_path, src, memory_bandwidth_GBps=2 * doc["memory_bandwidth_GBps"]))
    c0, c2, cw = OpCoster(base), OpCoster(twice), OpCoster(wide)
    g0, g2, gw = (c.time("linear1", "fwd", "bf16", **GEMM) for c in (c0, c2, cw))
    n0, n2, nw = (c.memory_bound(*c.time("layernorm", "fwd", "bf16", **NORM)) for c in (c0, c2, cw))
    assert ";transferred-from:" in g0[1] or ";bench-as:" in g0[1]  # the part borrows a sibling's
    for _, prov in (g2, n2, gw, nw):
        assert "spec-based" not in prov and ("transferred-from" in prov or "bench-as" in prov), prov
    assert g2[0] < g0[0] and g2[0] == pytest.approx(g0[0] / 2, rel=0.02)  # compute-bound at this shape
    assert n2[0] == pytest.approx(n0[0], rel=1e-9)  # the bandwidth did not change
    assert nw[0] == pytest.approx(n0[0] / 2, rel=0.02) and gw[0] == pytest.approx(g0[0], rel=0.02)
    assert "spec-rescaled" in g2[1]
