"""Review findings of 2026-11-25 (a second CLI review): each was a traceback, a silent wrong
answer or a misleading exit code. One line per bad input, exit 1; usage errors exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import _register, app
from trainsim.errors import ConfigError, TrainsimError

LINEAR = Path("traces") / "param_linear_2080ti" / "linear_kineto.json.gz"


def _run(*args: str):
    _register()
    return CliRunner().invoke(app, list(args))


def _error(res) -> str:
    assert res.exit_code == 1 and isinstance(res.exception, TrainsimError), res.output
    return str(res.exception)


def _usage(res) -> str:
    """The one line of a usage error: an option's value outside its own domain, exit 2."""
    assert res.exit_code == 2, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainsim: error: "), res.stderr
    return lines[0].removeprefix("trainsim: error: ")


def test_non_utf8_inputs_name_the_file(tmp_path, shared_data):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff\xfe")
    assert "bad.yaml: not UTF-8 text (byte 0)" in _error(_run("hw", "show", str(bad)))
    log = shared_data / "comm" / "nccl_tests_allreduce_a100_40gb_azure" / "nccl_8.log"
    assert "not UTF-8" in _error(_run("fit-comm", str(log), "--system", str(bad)))
    db = tmp_path / "db.json"
    db.write_bytes(b"\xff")
    assert "db.json: not UTF-8" in _error(_run("replay", str(shared_data / LINEAR), "--overhead-db", str(db)))
    csv = shared_data / "calibration" / "a100-sxm4-80gb_perlmutter" / "operator" / "NVIDIAA100-SXM4-80GB_softmax_fp16.csv"
    copy = tmp_path / "x_softmax_fp16.csv"
    copy.write_bytes(b"\xff\xfe" + csv.read_bytes())
    assert "x_softmax_fp16.csv: not UTF-8" in _error(_run("fit", str(copy)))
    jsonl = tmp_path / "bench.jsonl"
    jsonl.write_bytes(b"\xff\n")
    from trainsim.bench.dataset import iter_rows

    with pytest.raises(TrainsimError, match="line 1: not UTF-8"):
        list(iter_rows(jsonl))


@pytest.mark.parametrize("arg", [["--network-speedup", "inf"], ["--straggler", "0:inf"],
                                 ["--scale-family", "gemm:inf"], ["--scale-family", "gemm:-1"]])  # fmt: skip
def test_what_if_factors_are_positive_and_finite(shared_data, arg):
    msg = _usage(_run("replay", str(shared_data / LINEAR), *arg))
    assert "the factor must be a positive finite number" in msg


def test_a_trace_replayed_with_its_own_database_is_not_double_counted(shared_data, tmp_path):
    """The database `analyze --overhead-db` writes is sampled as the simulator replays it: the
    trace's own database replays it within a few per cent (002's trace-level T1 counted the
    waiting a second time: +56 %). --overhead-db alone means --overheads shared."""
    import json

    db = tmp_path / "ov.json"
    assert _run("analyze", str(shared_data / LINEAR), "--overhead-db", str(db)).exit_code == 0
    res = _run("replay", str(shared_data / LINEAR), "--overhead-db", str(db), "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["options"]["overheads"] == "shared"
    assert abs(doc["error_pct"]) < 6.0
    assert "--stats-iqr applies" in _usage(_run("replay", str(shared_data / LINEAR), "--overhead-db", str(db),
                                                 "--stats-iqr"))  # fmt: skip


def test_old_or_misused_overhead_databases_are_refused(shared_data, tmp_path):
    import json

    db = tmp_path / "ov.json"
    assert _run("analyze", str(shared_data / LINEAR), "--overhead-db", str(db)).exit_code == 0
    assert "read by --overheads shared, not stats" in _usage(
        _run("replay", str(shared_data / LINEAR), "--overheads", "stats", "--overhead-db", str(db))
    )
    doc = json.loads(db.read_text())
    doc["schema_version"] = "1.0"
    db.write_text(json.dumps(doc))
    assert "of an older trainsim" in _error(_run("replay", str(shared_data / LINEAR), "--overhead-db", str(db)))


def test_a_timeline_is_not_written_into_a_trace_folder(shared_data, tmp_path):
    import shutil

    folder = tmp_path / "tf"
    shutil.copytree(shared_data / "traces" / "param_linear_2080ti", folder)
    assert "take it for a trace" in _error(_run("replay", str(folder), "--timeline", str(folder / "t.json")))


def test_validate_fails_when_it_validated_nothing(tmp_path):
    # comm names the folders it looked for (a partial folder: it warns which it skipped)
    assert "none of the suite's measurement folders" in _error(_run("validate", "comm", "--data", str(tmp_path)))
    assert "validated no case" in _error(_run("validate", "replay", "--data", str(tmp_path), "--format", "json"))
    msg = _usage(_run("validate", "replay", "--limit", "3", "--data", str(tmp_path)))
    assert "it takes: --overheads, --kernels" in msg


def test_a_trace_given_twice_says_so(shared_data):
    assert "given twice" in _error(_run("replay", str(shared_data / LINEAR), str(shared_data / LINEAR)))


def test_device_and_system_must_agree_with_the_data(shared_data):
    csv = shared_data / "calibration" / "a100-sxm4-80gb_perlmutter" / "operator" / "NVIDIAA100-SXM4-80GB_softmax_fp16.csv"
    assert "contradicts the data" in _error(_run("fit", str(csv), "--kinds", "poly", "--device", "h100"))
    log = shared_data / "comm" / "nccl_tests_allreduce_a100_40gb_azure" / "nccl_8.log"
    assert "contradicts the data" in _error(_run("fit-comm", str(log), "--system", "dgx-h100"))


def test_bench_options_that_do_not_apply_are_errors():
    assert "apply to the kernel suites" in _usage(_run("bench", "comm", "--quick", "--op", "mm"))
    assert "--nproc applies to the comm suite only" in _usage(_run("bench", "softmax", "--quick", "--nproc", "7"))
    assert "--threads must be at least 1" in _usage(_run("bench", "softmax", "--threads", "0"))
    assert "their dtypes: fp32" in _usage(_run("bench", "softmax", "--quick", "--dtype", "bogus"))


def test_shard_sharders_list_must_name_one(tmp_path):
    spec = Path(__file__).resolve().parents[1] / "examples" / "dlrm_tables.json"
    assert "--sharders names no sharder" in _usage(_run("shard", str(spec), "--device", "a100", "--sharders", ","))


def test_output_paths_are_checked_before_the_work(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    res = _run("bench", "softmax", "--quick", "--no-progress", "--dataset", str(tmp_path))
    assert "is a folder" in _error(res)
    res = _run("bench", "softmax", "--quick", "--no-progress", "--dataset", str(afile / "x.jsonl"))
    assert "cannot create its folder" in _error(res)
    with pytest.raises(ConfigError):
        from trainsim.ir.serialize import output_path

        output_path(afile / "y.json")


def test_fit_accepts_a_measured_device_file(shared_data, tmp_path):
    """Review finding: the contradiction check refused the device file `bench roofline` writes
    (architecture 'gpu', measured peaks below the datasheet's)."""
    import yaml

    from trainsim.hardware import get_device

    doc = get_device("a100-sxm4-80gb").model_dump(mode="json", exclude_none=True)
    doc.update(name="nvidia-a100-sxm4-80gb-0123abcd", architecture="gpu", aliases=[])
    doc["peak_tflops"] = {"fp32": 18.0, "fp16": 250.0}
    dev = tmp_path / "measured.device.yaml"
    dev.write_text(yaml.safe_dump(doc))
    csv = shared_data / "calibration" / "a100-sxm4-80gb_perlmutter" / "operator" / "NVIDIAA100-SXM4-80GB_softmax_fp16.csv"
    res = _run("fit", str(csv), "--kinds", "poly", "--device", str(dev))
    assert res.exit_code == 0, res.output


def test_predict_timeline_never_overwrites_its_inputs_or_other_files(tmp_path):
    """Session 24 review: `predict … --timeline` wrote over the config.json it was given, and
    over any file at that path (a .tar.gz trace). It refuses both; a timeline it wrote before
    may be replaced."""
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "gpt2", "n_embd": 128, "n_layer": 2, "n_head": 4, "vocab_size": 1000, '
                   '"n_positions": 64}')  # fmt: skip
    before = cfg.read_text()
    base = ("predict", str(cfg), "--gpus", "1", "--global-batch", "2", "--timeline")
    assert "would overwrite the input" in _error(_run(*base, str(cfg)))
    assert cfg.read_text() == before
    other = tmp_path / "trace.tar.gz"
    other.write_bytes(b"\x1f\x8b not a timeline")
    assert "exists and is not a timeline trainsim wrote" in _error(_run(*base, str(other)))
    profiler = tmp_path / "rank0.pt.trace.json"  # Chrome-trace JSON too: a measured trace
    profiler.write_text('{"traceEvents": [], "schemaVersion": 1}')
    assert "exists and is not a timeline trainsim wrote" in _error(_run(*base, str(profiler)))
    assert other.read_bytes() == b"\x1f\x8b not a timeline"
    tl = tmp_path / "it.json"
    for _ in range(2):  # written, then replaced
        res = _run(*base, str(tl))
        assert res.exit_code == 0, res.output
    assert '"traceEvents"' in tl.read_text()[:200]


def test_refused_what_ifs_leave_no_timeline_and_model_coverage_is_stated(shared_data, tmp_path):
    """Review 2026-11-27: a straggler rank not in the trace, or an unknown family, was refused
    only after the baseline timeline had been written; `--kernels model` on a GPU without models
    said "kernel models" while every kernel kept its measured time."""
    import json

    trace = str(shared_data / LINEAR)
    for arg, want, code in ((["--straggler", "5:2"], "rank 5 is not in the trace (ranks 0)", 1),
                            (["--scale-family", "foo:2"], "unknown family 'foo'", 2),  # usage errors
                            (["--straggler", "x:2"], "'x' is not a rank", 2)):  # fmt: skip
        tl = tmp_path / "tl.json"
        res = _run("replay", trace, *arg, "--timeline", str(tl))
        assert want in (_error(res) if code == 1 else _usage(res))
        assert not tl.exists()
    # a family the trace lacks scales nothing, and says so (walkthrough 2026-11-27)
    res = _run("replay", trace, "--scale-family", "conv:0.5", "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["whatif"]["applied"] == ["conv kernels ×0.5 (0 kernels)"]
    assert "the trace has no conv kernels: nothing was scaled" in " ".join(res.stderr.split())
    res = _run("replay", trace, "--kernels", "model", "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["provenance"].startswith("measured kernels: no kernel model answered any of the")
    assert doc["diagnostics"]["kernels_model_fallback_measured"] > 0


def test_a_saved_workload_replays_and_a_timeline_is_no_trace(shared_data, tmp_path):
    """Review 2026-11-27: `analyze --save-workload`'s IR could be read by no command (the README
    says "re-simulate later"), and trainsim's own --timeline was analysed as a measured trace
    (a 3.1 ms "step" for a 95.5 ms ResNet-50)."""
    import json

    trace = str(shared_data / LINEAR)
    ir, tl = tmp_path / "w.json", tmp_path / "tl.json"
    assert _run("analyze", trace, "--save-workload", str(ir)).exit_code == 0
    direct = json.loads(_run("replay", trace, "--timeline", str(tl), "--format", "json").stdout)
    again = json.loads(_run("replay", str(ir), "--format", "json").stdout)
    assert again["predicted_step_s"] == pytest.approx(direct["predicted_step_s"], rel=1e-9)
    assert again["measured_step_s"] == pytest.approx(direct["measured_step_s"], rel=1e-12)
    assert "a trainsim workload IR" in _error(_run("analyze", str(ir)))
    # recognised by content, whatever its name; trace-only options refused (review 2026-11-27)
    gz = tmp_path / "w.json.gz"
    gz.write_bytes(ir.read_bytes())
    assert json.loads(_run("replay", str(gz), "--format", "json").stdout)["predicted_step_s"] == again["predicted_step_s"]
    assert "--step applies to traces" in _error(_run("replay", str(ir), "--step", "1"))
    for cmd in ("analyze", "replay"):
        assert "a timeline trainsim wrote" in _error(_run(cmd, str(tl)))


def test_a_trace_without_a_complete_step_has_no_step_idle_or_utilization(shared_data):
    """Review 2026-11-27: a sampled trace's rank said step 0.0, idle 0.0, utilization 0 beside
    a measured 0.27 s of device work; null (— in the table), as the top-level step."""
    import json

    res = _run("analyze", str(shared_data / "traces" / "hta_misc" / "sampled_rank-0.json.gz"), "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    (r,) = doc["ranks"]
    assert doc["measured_step_s"] is None
    assert r["step_time_s"] is None and r["idle_s"] is None and r["gpu_utilization"] is None
    assert r["device_busy_s"] > 0.2


def test_an_operator_or_family_the_data_lack_is_named(shared_data, tmp_path):
    """Review 2026-11-27: `fit --op nosuchop` said "no kernel measurements found", and
    `stages search --measured` on another family's (or an empty) folder said its stages "were
    not measured"."""
    ops = shared_data / "calibration" / "a100-sxm4-80gb_perlmutter" / "operator"
    msg = _error(_run("fit", str(ops), "--op", "nosuchop"))
    assert "no rows of operator(s) nosuchop; the data hold" in msg and "flash_atten" in msg
    moe = Path(__file__).parents[1] / "src" / "trainsim" / "learn" / "data" / "predtop" / "moe-search"
    assert "holds moe stages, not 'gpt'; pass --family moe" in _error(_run("stages", "search", "--measured", str(moe), "--family", "gpt"))
    assert "no measured stages" in _error(_run("stages", "search", "--measured", str(tmp_path), "--family", "gpt"))


def test_hw_show_reads_a_device_file(tmp_path):
    """Review 2026-11-27: `hw show DEVICE.yaml` validated the file as a system."""
    import json

    from trainsim.hardware import get_device

    dev = tmp_path / "dev.yaml"
    dev.write_text(json.dumps(get_device("a100-sxm4-80gb").model_dump(mode="json")))
    res = _run("hw", "show", str(dev), "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["name"] == "a100-sxm4-80gb"
    dev.write_text(dev.read_text().replace('"memory_GB": 80', '"memory_GB": -1'))
    assert "memory_GB" in _error(_run("hw", "show", str(dev)))
