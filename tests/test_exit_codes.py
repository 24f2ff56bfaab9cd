"""The CLI contract's exit codes (DESIGN.md "CLI contract"): 0 success, 1 a user-facing error,
2 a usage error.

A value of an option or argument outside that option's own domain (a choice not in its list, a
number out of its range, a malformed list or format, options that conflict or one that is
missing) is a usage error: exit 2 and one line naming the option. Every case of ``USAGE`` exited
1 before (our own checks raised ConfigError, as for a bad input). What depends on the content of
an input (the model, the system, a file) stays 1 (``CONTENT``), and so do the same library checks
reached from a file's fields (a CSV of runs given to ``validate llm --files``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import _register, app
from trainsim.errors import ConfigError, TrainsimError, UsageError

ROOT = Path(__file__).resolve().parents[1]
TABLES = str(ROOT / "examples" / "dlrm_tables.json")
SHARED = ROOT.parent / "shared" / "data"
LINEAR = str(SHARED / "traces" / "param_linear_2080ti" / "linear_kineto.json.gz")
NCCL = str(SHARED / "comm" / "nccl_tests_allreduce_a100_40gb_azure" / "nccl_8.log")
SOFTMAX = str(SHARED / "calibration" / "a100-sxm4-80gb_perlmutter" / "operator" / "NVIDIAA100-SXM4-80GB_softmax_fp16.csv")
MISSING = "/dev/null/trainsim-exit-codes"  # no such path, and none can be made there (root too): the usage error comes first

P = ["predict", "gpt2"]
S = ["search", "gpt2", "--gpus", "8", "--global-batch", "64", "--workers", "1"]
SH = ["shard", TABLES, "--device", "a100-sxm4-80gb"]
R = ["replay", LINEAR]
FIT = ["fit", SOFTMAX, "--kinds", "poly"]
CAP = ["capture", "--model", "gpt2", "--out", MISSING]

# (argv, the option the one line names)
USAGE = [
    # the examples of the task: a choice outside its list, a number out of its range
    ([*P, "--dtype", "fp7"], "--dtype"), ([*P, "--schedule", "foo"], "--schedule"),
    ([*P, "--recompute", "bogus"], "--recompute"), (["shard", "--world", "0", "x"], "--world"),
    # predict: choices, ranges, formats, options that go together
    ([*P, "--attention", "foo"], "--attention"), ([*P, "--partition", "foo"], "--partition"),
    ([*P, "--optimizer", "foo"], "--optimizer"), ([*P, "--impl", "foo"], "--impl"),
    ([*P, "--hf-experts", "foo"], "--hf-experts"), ([*P, "--cp-comm-type", "foo"], "--cp-comm-type"),
    ([*P, "--attention-dropout", "1"], "--attention-dropout"), ([*P, "--hidden-dropout", "nan"], "--hidden-dropout"),
    ([*P, "--moe-imbalance", "0.5"], "--moe-imbalance"), ([*P, "--memory-headroom", "ten"], "--memory-headroom"),
    ([*P, "--memory-headroom", "-1GiB"], "--memory-headroom"), ([*P, "--dist-optimizer"], "--dist-optimizer"),
    ([*P, "--vpp", "2"], "--vpp"), ([*P, "--sp"], "--sp"), ([*P, "--impl", "hf", "--tp", "2"], "--impl hf"),
    ([*P, "--hf-experts", "eager"], "--hf-experts"), ([*P, "--overlap-param-gather"], "--overlap-param-gather"),
    ([*P, "--partition", "001", "--schedule", "interleaved", "--pp", "2", "--vpp", "2"], "--partition"),
    ([*P, "--first-stage-layers", "2", "--pp", "2", "--partition", "001"], "--first-stage-layers"),
    ([*P, "--closed-form", "--timeline", f"{MISSING}/t.json"], "--timeline"),
    # search: malformed lists, choices, options that go together
    ([*S, "--tp", "x"], "--tp"), ([*S, "--pp", "0"], "--pp"), ([*S, "--zero", "4"], "--zero"),
    ([*S, "--recompute", ""], "--recompute"), ([*S, "--schedule", "foo"], "--schedule"), ([*S, "--sp", "maybe"], "--sp"),
    ([*S, "--dtype", "fp7"], "--dtype"), ([*S, "--framework", "foo"], "--framework"),
    ([*S, "--objective", "foo"], "objective"), ([*S, "--objective", "time-to-train"], "--train-tokens"),
    ([*S, "--train-tokens", "1e9"], "--train-tokens"), ([*S, "--gpu-hour-price", "nan", "--objective", "cost"], "--gpu-hour-price"),
    ([*S, "--moe-imbalance", "0.5"], "--moe-imbalance"), ([*S, "--memory-headroom", "2"], "--memory-headroom"),
    ([*S, "--scheduler", "foo"], "--scheduler"), ([*S, "--dist-optimizer", "--zero", "0"], "--dist-optimizer"),
    ([*S, "--moe-grouped-gemm", "--framework", "deepspeed"], "--moe-grouped-gemm"),
    # shard
    ([*SH, "--capacity-gb", "nan"], "--capacity-gb"), ([*SH, "--sharders", ","], "--sharders"),
    ([*SH, "--sharders", "nosuch"], "--sharders"), (["shard", TABLES], "--device"),
    # analyze, replay
    (["analyze", MISSING, "--step", "-1"], "--step"), (["analyze", MISSING, "--time-unit", "ms"], "--time-unit"),
    (["analyze", LINEAR, "--export-kernels", f"{MISSING}/k.txt"], "--export-kernels"),
    ([*R, "--straggler", "x"], "--straggler"), ([*R, "--network-speedup", "0"], "--network-speedup"),
    ([*R, "--scale-family", "foo:2"], "--scale-family"), ([*R, "--batch", "0"], "--batch"),
    ([*R, "--old-batch", "4"], "--old-batch"), ([*R, "--batch", "4", "--seq-len", "8"], "--batch"),
    ([*R, "--overheads", "shared"], "--overheads"), ([*R, "--system", "dgx-a100"], "--system"),
    ([*R, "--stats-iqr", "--overheads", "trace"], "--stats-iqr"),
    # validate
    (["validate", "nosuch"], "suite"), (["validate", "replay", "--overheads", "foo"], "--overheads"),
    (["validate", "replay", "--fractions", "0.3"], "--fractions"), (["validate", "kernels", "--device", "foo"], "--device"),
    (["validate", "predtop", "--readout", "foo"], "--readout"), (["validate", "predtop", "--per", "mesh"], "--per"),
    (["validate", "predtop", "--fractions", "1.5"], "--fractions"), (["validate", "predtop", "--models", "foo"], "model"),
    # fit, fit-comm, bench
    ([*FIT, "--family", "nosuch"], "--family"), ([*FIT, "--kinds", "foo"], "kind"), ([*FIT, "--grid", "foo"], "--grid"),
    ([*FIT, "--holdout", "1"], "--holdout"), ([*FIT, "--max-spread", "0"], "--max-spread"),
    ([*FIT, "--output", f"{MISSING}/m.txt"], "--output"),
    (["fit-comm", NCCL, "--holdout", "nan"], "--holdout"), (["fit-comm", NCCL, "--timing", "foo"], "--timing"),
    (["fit-comm", NCCL, "--kind", "foo"], "collective"),
    (["bench", "nosuch"], "suite"), (["bench", "gemm", "--device", "tpu"], "--device"),
    (["bench", "gemm", "--threads", "0"], "--threads"), (["bench", "gemm", "--nproc", "2"], "--nproc"),
    (["bench", "comm", "gemm"], "comm suite"), (["bench", "gemm", "--quick", "--op", "nosuch"], "op(s)"),
    # capture
    (["capture", "--model", "nosuch", "--out", MISSING], "--model"), ([*CAP, "--device", "tpu"], "--device"),
    ([*CAP, "--timeout", "nan"], "--timeout"),
    # stages
    (["stages", "collect", MISSING, "--family", "foo"], "--family"),
    (["stages", "collect", MISSING, "--family", "gpt", "--layers", "3"], "--search-set"),
    (["stages", "train", MISSING, "--out", MISSING, "--part", "foo"], "--part"),
    (["stages", "train", MISSING, "--out", MISSING, "--fraction", "0"], "--fraction"),
    (["stages", "train", MISSING, "--out", MISSING, "--model", "foo"], "model"),
    (["stages", "predict", MISSING], "--stage"), (["stages", "predict", MISSING, "--stage", "garbage"], "--stage"),
    (["stages", "search"], "--predictor"), (["stages", "search", "--measured", MISSING, "--shards", "0"], "--shards"),
]  # fmt: skip

# what typer checks itself (min=1 on the option) since these options took 0 (our own checks said 1)
TYPER_RANGES = [
    [*CAP, "--nproc", "0"], [*CAP, "--steps", "0"], [*CAP, "--warmup", "0"], [*CAP, "--threads", "0"],
    ["validate", "llm", "--limit", "0"], ["validate", "shard", "--sets", "0"], ["validate", "predtop", "--members", "0"],
    [*FIT, "--folds", "0"],
]  # fmt: skip

# depends on what an input holds: stays exit 1
CONTENT = [
    ([*P, "--tp", "5"], "does not divide gpt2's 12 attention heads"),
    ([*P, "--gpus", "8", "--tp", "3"], "--gpus 8 is not a multiple of tp×cp×pp"),
    ([*P, "--moe-imbalance", "2"], "gpt2 is dense"),
    ([*P, "--memory-headroom", "500GiB"], "below the GPU's"),
    (["predict", "nosuch-model"], "unknown model"), ([*P, "--system", "nosuch"], "unknown system"),
    ([*SH, "--world", str(10**6)], "more ranks than"), ([*R, "--straggler", "99:1.5"], "is not in the trace"),
    (["hw", "show", "nosuch"], "unknown device or system"), (["analyze", str(ROOT / "no-such-trace.json")], "no such file or folder"),
]  # fmt: skip


def _run(*args: str):
    _register()
    return CliRunner().invoke(app, list(args))


def _usage_line(res) -> str:
    """The one stderr line of a usage error (exit 2), nothing on stdout, no traceback."""
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert isinstance(res.exception, SystemExit), res.exception
    assert res.stdout == "", res.stdout  # --format json or not: nothing there
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainsim: error: "), res.stderr
    return lines[0].removeprefix("trainsim: error: ")


@pytest.mark.parametrize(("argv", "option"), USAGE, ids=[f"{a[0]} {o}" for a, o in USAGE])
def test_an_option_outside_its_domain_exits_2_in_one_line(argv, option):
    assert option in _usage_line(_run(*argv, "--format", "json"))


@pytest.mark.parametrize("argv", TYPER_RANGES, ids=[f"{a[0]} {a[-2]} {a[-1]}" for a in TYPER_RANGES])
def test_integer_ranges_are_typers_own_checks(argv):
    res = _run(*argv)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert argv[-2] in res.output  # typer's panel names the option


@pytest.mark.parametrize(("argv", "message"), CONTENT, ids=[f"{a[0]} {m[:24]}" for a, m in CONTENT])
def test_what_an_input_holds_stays_exit_1(argv, message):
    res = _run(*argv)
    assert res.exit_code == 1 and type(res.exception) is not UsageError, res.output
    assert isinstance(res.exception, TrainsimError) and message in str(res.exception)


@pytest.mark.parametrize(("column", "value", "message"), [
    ("dtype", "fp7", "column 'dtype': 'fp7' is not one of"),  # the CSV reader's own check
    ("vpp", "2", "plan: vpp > 1 needs --schedule interleaved"),  # Plan.validate's: predict --vpp 2 is a usage error
    ("sp", "true", "plan: sequence parallelism"),  # and predict --sp with --tp 1
])  # fmt: skip
def test_a_bad_field_of_a_csv_of_runs_stays_exit_1_naming_the_file(tmp_path, column, value, message):
    """The checks predict's options map to usage errors are the library's: reached from a file's
    field they name the file and row and exit 1."""
    runs = tmp_path / "runs.csv"
    tp = 1 if column == "sp" else 2
    runs.write_text(f"model,system,gpus,tp,pp,micro_batch,global_batch,iteration_ms,{column}\n"
                    f"llama2-7b,dgx-a100,16,{tp},2,2,256,15000,{value}\n", encoding="utf-8")  # fmt: skip
    res = _run("validate", "llm", "--files", str(runs), "--data", str(tmp_path))
    assert res.exit_code == 1 and isinstance(res.exception, TrainsimError), res.output
    assert not isinstance(res.exception, UsageError)
    assert f"{runs}: row 1 (line 2)" in str(res.exception) and message in str(res.exception)


def test_the_library_raises_no_usage_error():
    """The Python API keeps its ConfigError: the usage error is the command line's."""
    from trainsim.builders.models import get_model
    from trainsim.builders.plan import Plan

    with pytest.raises(ConfigError) as e:
        Plan(dtype="fp7").validate(get_model("gpt2"))  # type: ignore[arg-type]
    assert type(e.value) is ConfigError


def test_debug_shows_the_traceback_and_still_exits_2():
    res = _run("--debug", "shard", "--world", "0", "x")
    assert res.exit_code == 2
    assert "Traceback" in res.stderr and res.stderr.rstrip().endswith("trainsim: error: --world must be >= 1, got 0")


def test_the_console_script_exits_2_with_one_line():
    p = subprocess.run([sys.executable, "-m", "trainsim", "predict", "gpt3-175b", "--dtype", "fp7"],
                       capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "trainsim: error: --dtype must be one of fp16, bf16, fp32, got 'fp7'\n"
