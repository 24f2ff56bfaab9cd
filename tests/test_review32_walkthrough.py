"""Findings of the session-32 walkthroughs, each pinned by the check that would have caught it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _cli(*args: str) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, timeout=300,
                       check=False)  # fmt: skip
    return p.returncode, p.stdout + p.stderr


def test_flags_show_no_value_type_in_help() -> None:
    """typer 0.29 printed ``--debug <bool>``, as if the flag took a value; value options keep
    their type."""
    rc, out = _cli("--help")
    assert rc == 0
    assert "--debug" in out and "<bool>" not in out
    rc, out = _cli("predict", "--help")
    assert rc == 0
    assert "<bool>" not in out and "<int" in out


def test_ctrl_c_inside_a_command_says_so(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """typer turns a KeyboardInterrupt into a silent exit 130; the CLI says it was interrupted."""
    from trainsim.builders import models
    from trainsim.cli import main

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "list_models", interrupted)
    monkeypatch.setattr(sys, "argv", ["trainsim", "models"])
    with pytest.raises(SystemExit) as e:
        main.app_entry()
    assert e.value.code == 130
    assert "trainsim: interrupted" in capsys.readouterr().err


def test_a_resume_file_that_is_not_ours_is_left_alone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A user's notes given as --resume lost their last line to the torn-tail repair."""
    from trainsim.bench.dataset import check_appendable
    from trainsim.errors import ConfigError
    from trainsim.validate import shard_suite

    notes = tmp_path / "notes.txt"
    notes.write_text('{"keep":1}\nlast line no newline')
    before = notes.read_bytes()
    with pytest.raises(
        ConfigError,
        match=r"notes\.txt: not a shard-suite results file: its first line is JSON without",
    ):
        shard_suite.run_shard_suite(
            tmp_path, sets=1, resume=str(notes), kernel_models=None, backend="torch"
        )
    assert notes.read_bytes() == before
    with pytest.raises(ConfigError, match="a folder; the shard suite resumes from a JSONL file"):
        shard_suite.run_shard_suite(
            tmp_path, sets=1, resume=str(tmp_path), kernel_models=None, backend="torch"
        )
    for kw, flag in (({"sets": 0}, "--sets 0"), ({"repeats": 0}, "--repeats 0")):
        with pytest.raises(ConfigError, match=flag):
            shard_suite.run_shard_suite(tmp_path, resume=str(tmp_path / "r.jsonl"), kernel_models=None,
                                        backend="torch", **kw)  # fmt: skip
    ours = tmp_path / "ours.jsonl"
    ours.write_text(
        '{"schema":"trainsim.shard-suite/1","set":0}\n{"schema":"trainsim.shard-su'
    )  # torn tail
    check_appendable(ours, shard_suite.SCHEMA, "a shard-suite results file")
    torn_only = tmp_path / "torn.jsonl"
    torn_only.write_text('{"schema":"trainsim.shard-suite/1","se')  # the first write, cut
    check_appendable(torn_only, shard_suite.SCHEMA, "a shard-suite results file")
    check_appendable(tmp_path / "new.jsonl", shard_suite.SCHEMA, "a shard-suite results file")


def test_embedding_backward_ops_carry_the_backward_family() -> None:
    """Builders pass the phase as a string, and ``"bwd" is Phase.BWD`` is False."""
    from trainsim.kernels import op_spec

    spec = op_spec("embedding_bag")
    assert spec.family_for("bwd") == spec.bwd_family != spec.family
    assert spec.family_for("fwd") == spec.family


def test_a_table_named_null_gets_the_default_name() -> None:
    from trainsim.builders.dlrm import dlrm_spec_from_dict

    spec = dlrm_spec_from_dict(
        {"batch": 8, "tables": [{"name": None, "rows": 10, "dim": 4, "pooling": 1}]},
        origin="x.json",
    )
    assert spec.tables[0].name == "t0"


def test_gpu_tables_with_dims_off_a_multiple_of_4_are_warned_of(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "t.json"
    spec.write_text(
        '{"batch": 64, "tables": [{"rows": 100, "dim": 15, "pooling": 1}, {"rows": 100, "dim": 8, "pooling": 1}]}'
    )
    rc, out = _cli("shard", str(spec), "--world", "2", "--device", "a100-sxm4-80gb")
    assert rc == 0, out
    assert "tables[0].dim 15 is not a multiple of 4" in " ".join(out.split())
    import json

    p = subprocess.run([sys.executable, "-m", "trainsim", "shard", str(spec), "--world", "2", "--device",
                        "a100-sxm4-80gb", "--format", "json"], capture_output=True, text=True, check=False)  # fmt: skip
    assert p.returncode == 0 and json.loads(p.stdout)["tables"] == 2  # the warning stays off stdout
    assert "tables[0].dim 15" in p.stderr


def test_a_compressed_dataset_is_not_appended_to(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import gzip

    from trainsim.bench.dataset import KERNEL_BENCH_SCHEMA, check_appendable
    from trainsim.errors import ConfigError

    gz = tmp_path / "d.jsonl"  # compressed under a plain name
    gz.write_bytes(gzip.compress(b'{"schema":"trainsim.kernel-bench/1"}\n'))
    with pytest.raises(ConfigError, match="gzip-compressed"):
        check_appendable(gz, KERNEL_BENCH_SCHEMA, "a trainsim bench dataset")


def test_search_states_its_sequence_length_and_moe_assumption() -> None:
    """A config's 32k max_position_embeddings was searched silently; MoE tried only ep 1."""
    import json

    rc, out = _cli("search", "mixtral-8x7b", "--system", "dgx-h100", "--gpus", "16", "--global-batch", "64",
                   "--tp", "1,2", "--pp", "1", "--micro-batch", "1", "--zero", "1", "--recompute", "none,full",
                   "--format", "json")  # fmt: skip
    assert rc == 0, out
    doc = json.loads(out[out.index("{") :])
    assert doc["seq_len"] == 32768 and any("32,768 tokens" in n for n in doc["notes"])
    assert any("balanced" in n for n in doc["notes"])
    eps = {p["plan_fields"]["ep"] for p in doc["plans"]}
    assert eps - {1}, eps  # the default expert degrees of an MoE model go beyond 1


def test_search_refuses_expert_parallelism_on_a_dense_model() -> None:
    rc, out = _cli("search", "llama2-7b", "--gpus", "8", "--global-batch", "8", "--ep", "2")
    assert rc == 1 and "expert parallelism needs a mixture-of-experts model" in out
    assert "Traceback" not in out


def test_default_degrees_that_outgrow_the_gpus_are_not_counted_infeasible() -> None:
    from trainsim.builders.models import get_model
    from trainsim.search.space import PlanSpace

    reasons = [
        why
        for p, why in PlanSpace(gpus=64, global_batch=64).plans(get_model("llama3-70b"), 8)
        if p is None
    ]
    assert not any("not divisible by tp×cp×pp" in w for w in reasons)
    given = [why for p, why in PlanSpace(gpus=64, global_batch=64, tp=(8,), pp=(16,)).plans(get_model("llama3-70b"), 8)
             if p is None]  # fmt: skip
    assert any(
        "not divisible by tp×cp×pp = 128" in w for w in given
    )  # degrees the user asked for are reported


def test_selective_recompute_beside_none_is_not_searched_with_flash_attention() -> None:
    """With flash attention it keeps the none plan's memory and adds time: never the better plan."""
    from trainsim.builders.models import get_model
    from trainsim.search.space import PlanSpace

    m = get_model("llama2-7b")
    flash = {p.recompute for p, _ in PlanSpace(gpus=8, global_batch=8).plans(m, 8) if p is not None}
    assert flash == {"none", "full"}
    fused = {
        p.recompute
        for p, _ in PlanSpace(gpus=8, global_batch=8, attention="fused").plans(m, 8)
        if p is not None
    }
    assert fused == {"none", "selective", "full"}
    alone = {
        p.recompute
        for p, _ in PlanSpace(gpus=8, global_batch=8, recompute=("selective",)).plans(m, 8)
        if p
    }
    assert alone == {"selective"}


def test_the_does_not_fit_hint_does_not_pin_the_search_to_one_replica() -> None:
    rc, out = _cli("predict", "llama3-70b", "--tp", "8", "--gpus", "8")
    text = " ".join(out.split())
    assert rc == 0 and "--global-batch 8 " not in text and "is micro-batch x" in text


def test_hf_overlap_note_does_not_precede_the_plans_error() -> None:
    rc, out = _cli("predict", "llama2-7b", "--gpus", "8", "--tp", "2", "--impl", "hf")
    assert rc == 2 and "reduced during the backward" not in out and "(--tp, --cp and --ep 1)" in out  # a usage error


def test_shard_says_where_each_sharders_step_goes() -> None:
    """On a GPU a small DLRM is ~90 % CPU dispatch, which the table did not show."""
    import json
    from pathlib import Path

    spec = Path(__file__).resolve().parents[1] / "examples" / "dlrm_tables.json"
    rc, out = _cli(
        "shard", str(spec), "--world", "4", "--device", "a100-sxm4-80gb", "--format", "json"
    )
    assert rc == 0, out
    doc = json.loads(out[out.index("{") :])
    for s in doc["sharders"]:
        cp = s["critical_path_s"]
        assert cp["kernel"] > 0 and cp["host_gap"] > 0
        assert sum(cp.values()) == pytest.approx(s["predicted_step_s"], rel=1e-6)
    rc, out = _cli("shard", str(spec), "--world", "4", "--device", "a100-sxm4-80gb")
    assert "host-bound" in out and "critical path is CPU time" in " ".join(out.split())


def test_a_second_comm_sweep_on_one_dataset_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two `bench comm` runs on one file wrote every case twice (no lock, unlike the kernel bench)."""
    from trainsim.bench.comm import run_comm_bench
    from trainsim.bench.dataset import sweep_lock
    from trainsim.errors import ConfigError

    path = tmp_path / "comm.jsonl"
    with sweep_lock(path), pytest.raises(ConfigError, match="another benchmark sweep is writing"):
        run_comm_bench(path, kinds=("all_reduce",), sizes_bytes=(1024,), quick=True)
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"schema": "trainsim.kernel-bench/1"}\n')
    with pytest.raises(ConfigError, match="not a trainsim comm bench dataset"):
        run_comm_bench(notes, kinds=("all_reduce",), sizes_bytes=(1024,), quick=True)


SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.mark.skipif(not (SHARED_DATA / "calibration").is_dir(), reason="needs ../shared/data")
def test_a_device_yaml_of_another_architecture_cannot_claim_the_data(tmp_path: Path) -> None:
    """A100 operator data fitted with --device my-h100.yaml were stamped calibrated for the H100."""
    dev = tmp_path / "h100-pcie.yaml"
    dev.write_text("schema_version: 1\nname: my-h100-pcie\nvendor: nvidia\narchitecture: hopper\nmemory_GB: 80\n"
                   "memory_bandwidth_GBps: 2000\nsm_count: 114\npeak_tflops: {fp32: 51, fp16: 756, bf16: 756}\n"
                   "sources: [{kind: datasheet, title: NVIDIA H100 PCIe datasheet}]\n")  # fmt: skip
    data = SHARED_DATA / "calibration" / "a100-sxm4-80gb_perlmutter" / "operator"
    rc, out = _cli("fit", str(data), "--device", str(dev), "--op", "gelu")
    assert rc == 1 and "contradicts the data" in out and "ampere" in out, out


def test_gloo_measurements_cannot_calibrate_a_gpu_system(tmp_path: Path) -> None:
    import json

    rows = tmp_path / "comm.jsonl"
    with rows.open("w") as fh:
        for n in (1024, 65536, 1 << 20, 1 << 22):
            fh.write(json.dumps({"schema": "trainsim.comm-bench/1", "kind": "all_reduce", "nbytes": n, "nodes": 1,
                                 "gpus_per_node": 2, "duration_s": 1e-4 + n / 1e9, "backend": "gloo",
                                 "device": "AMD EPYC"}) + "\n")  # fmt: skip
    rc, out = _cli("fit-comm", str(rows), "--system", "dgx-h100")
    assert rc == 1 and "measured with gloo between CPU processes" in " ".join(out.split()), out


def test_the_fit_summary_gives_the_mean_with_the_rows_it_left_out(capsys) -> None:  # type: ignore[no-untyped-def]
    """'mean MAPE 43.73 %' left out held-out rows 10x off; the all-rows mean now stands beside it."""
    from rich.console import Console

    from trainsim.cli.fit_cmd import _print_summary

    def m(entry: str, mape: float, every: float, bad: int) -> dict[str, object]:
        return {"entry": entry, "kind": "xgboost", "mape_pct": mape, "mape_all_rows_pct": every,
                "heldout_implausible_rows": bad}  # fmt: skip

    doc = {
        "models": [m("a", 10.0, 10.0, 0), m("b", 87.0, 11936.0, 3)],
        "entries_without_heldout_score": {},
    }
    _print_summary(Console(width=300), doc)
    out = capsys.readouterr().out
    assert "mean MAPE 48.50 %" in out and "with them, mean MAPE 5973.00 %" in out


def test_fit_warns_of_rows_of_two_thread_counts(tmp_path: Path) -> None:
    import json

    rows = tmp_path / "b.jsonl"
    with rows.open("w") as fh:
        for i, threads in enumerate((1, 1, 1, 2, 2, 2)):
            fh.write(json.dumps({"schema": "trainsim.kernel-bench/1", "device": "cpu", "fingerprint": "abc",
                                 "threads": threads, "family": "elementwise", "op": "res_add", "phase": "fwd",
                                 "dtype": "fp32", "features": {"b": 1, "l": 256 * (1 + i % 3), "dim": 1024},
                                 "duration_s": 1e-4 * (1 + i % 3)}) + "\n")  # fmt: skip
    from trainsim.kernels import read_kernel_dataset

    assert read_kernel_dataset([rows]).setups == {("abc", 1), ("abc", 2)}
    _rc, out = _cli("fit", str(rows))
    assert "2 machine/thread setups" in " ".join(out.split()), out


def test_hardware_values_in_the_wrong_unit_and_misspelt_keys_are_named(tmp_path: Path) -> None:
    """25000000000 in a GB/s field ran as a network 1e9x too fast; an unknown key read as a
    missing one."""
    from trainsim.errors import ConfigError
    from trainsim.hardware import get_system

    base = ("schema_version: 1\nname: box\ndescription: d\ndevice: h100-sxm5-80gb\ngpus_per_node: 4\n"
            "sources: [{kind: datasheet, title: t}]\ntiers:\n  - {name: nv, kind: nvswitch, scope: node, ")  # fmt: skip
    bad = tmp_path / "bps.yaml"
    bad.write_text(base + "bandwidth_per_gpu_GBps: 25000000000, latency_us: 2}\n")
    with pytest.raises(
        ConfigError, match=r"tiers\.0\.bandwidth_per_gpu_GBps: 2\.5e\+10 is beyond any hardware"
    ):
        get_system(str(bad))
    typo = tmp_path / "typo.yaml"
    typo.write_text(base + "bandwidth_Gbps: 300, latency_us: 2}\n")
    with pytest.raises(
        ConfigError,
        match=r"tiers\.0\.bandwidth_Gbps: unknown field \(a misspelling of bandwidth_per_gpu_GBps\?\)",
    ):
        get_system(str(typo))
    ok = tmp_path / "ok.yaml"
    ok.write_text(base + "bandwidth_per_gpu_GBps: 450, latency_us: 2}\n")
    assert get_system(str(ok)).tiers[0].bandwidth_per_gpu_GBps == 450


def test_fit_skips_paper_001s_nccl_files_in_a_folder_and_names_one_given(tmp_path: Path) -> None:
    from trainsim.errors import TraceFormatError
    from trainsim.kernels import read_kernel_dataset

    (tmp_path / "nccl").mkdir()
    nccl = tmp_path / "nccl" / "NVIDIAA100-SXM4-80GB_allgather_large_fp16_1_2.csv"
    nccl.write_text("shape,nodes,GPUsPerNode,dur(us)\n134217728.0,1.0,2.0,6294.6\n")
    ops = tmp_path / "b.jsonl"
    ops.write_text('{"schema": "trainsim.kernel-bench/1", "device": "cpu", "op": "res_add", "phase": "fwd", '
                   '"dtype": "fp32", "features": {"b": 1, "l": 256, "dim": 1024}, "duration_s": 0.0001}\n')  # fmt: skip
    assert len(read_kernel_dataset([tmp_path])) == 1
    with pytest.raises(TraceFormatError, match="trainsim fit-comm"):
        read_kernel_dataset([nccl])


def test_replay_resizes_with_the_users_kernel_models_of_the_traces_device(tmp_path: Path) -> None:
    """`replay --batch` took only the shipped calibrations; a user's `trainsim fit` artifact
    now answers first, and one of another kind of device is refused."""
    import json

    from trainsim.validate import gpu_e2e_suite as suite

    data = Path(__file__).resolve().parents[1] / "src" / "trainsim" / "bench" / "data"
    folder = suite._unpack_shipped(tmp_path) / "resnet_b1024_t1_s5_r0"
    gpu_models = data / "cuda_full_03b482ae582e2c80.models.npz"
    rc, out = _cli(
        "replay",
        str(folder),
        "--batch",
        "2048",
        "--kernel-models",
        str(gpu_models),
        "--format",
        "json",
    )
    assert rc == 0, out
    mine = json.loads(out[out.index("{") :])["whatif"]
    assert mine["applied"][0].startswith(
        f"batch 1024 → 2048 (kernel models: {gpu_models.name}, then calibrated"
    )
    rc, out = _cli("replay", str(folder), "--batch", "2048", "--format", "json")
    shipped = json.loads(out[out.index("{") :])["whatif"]
    assert mine["change_pct"] == pytest.approx(
        shipped["change_pct"], rel=1e-12
    )  # the shipped models again: the same carry
    rows = tmp_path / "cpu.jsonl"
    with rows.open("w") as fh:
        for i in range(24):
            fh.write(json.dumps({"schema": "trainsim.kernel-bench/1", "device": "AMD EPYC", "op": "res_add",
                                 "phase": "fwd", "dtype": "fp32", "features": {"b": 1, "l": 256 * (1 + i), "dim": 1024},
                                 "duration_s": 1e-4 * (1 + i)}) + "\n")  # fmt: skip
    cpu_models = tmp_path / "cpu.npz"
    rc, out = _cli("fit", str(rows), "--device", str(data / "cpu_full_97317d12607a0598.device.yaml"),
                   "--kinds", "poly", "-o", str(cpu_models))  # fmt: skip
    assert rc == 0 and cpu_models.is_file(), out
    rc, out = _cli("replay", str(folder), "--batch", "2048", "--kernel-models", str(cpu_models))
    assert rc == 1 and "but the trace ran on" in out and "Traceback" not in out


def test_messages_far_beyond_the_measured_sizes_are_said_so() -> None:
    """Perlmutter's 16.6 s gradient all-reduce moved 30 GB on curves measured to 2.4 GB, unsaid."""
    rc, out = _cli("predict", "llama3-8b", "--system", "perlmutter", "--gpus", "8", "--zero", "1",
                   "--global-batch", "64", "--seq-len", "4096", "--recompute", "full")  # fmt: skip
    text = " ".join(out.split())
    assert (
        rc == 0 and "the largest message their comm models measured (largest: 2,400 MB)" in text
    ), text
    rc, out = _cli(
        "predict",
        "llama2-7b",
        "--system",
        "perlmutter",
        "--gpus",
        "8",
        "--tp",
        "8",
        "--global-batch",
        "8",
    )
    assert rc == 0 and "largest message their comm models measured" not in " ".join(out.split())


def test_files_an_earlier_run_wrote_are_still_appended_to(tmp_path: Path) -> None:
    """Review: a blank first line, and a comm dataset torn in its first write (rows written
    before 2026-12-02 sort their keys, schema near the end), were refused."""
    from trainsim.bench.dataset import KERNEL_BENCH_SCHEMA, check_appendable
    from trainsim.errors import ConfigError

    row = '{"schema":"trainsim.kernel-bench/1","op":"relu"}'
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n" + row + "\n")
    check_appendable(blank, KERNEL_BENCH_SCHEMA, "a trainsim bench dataset")
    torn = tmp_path / "comm.jsonl"
    torn.write_text('{"backend": "gloo", "device": "AMD EPYC", "dtype": "float32", "dur')
    check_appendable(torn, "trainsim.comm-bench/1", "a trainsim comm bench dataset")
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + row.encode() + b"\n")
    with pytest.raises(ConfigError, match="byte-order mark"):
        check_appendable(bom, KERNEL_BENCH_SCHEMA, "a trainsim bench dataset")
    with pytest.raises(ConfigError, match=r"a \.gz name"):
        check_appendable(tmp_path / "new.jsonl.gz", KERNEL_BENCH_SCHEMA, "a trainsim bench dataset")


def test_an_amd_gpus_architecture_is_the_catalogs_name() -> None:
    """On ROCm the capability of an MI300X reads 9.4, which named it hopper."""
    from trainsim.bench.devicespec import _amd_architecture
    from trainsim.hardware import get_device

    assert _amd_architecture("gfx942") == get_device("mi300x").architecture


def test_search_validation_shows_the_plans_apart() -> None:
    """Its cells read `tp1-pp1-dp2-mb2-g…`: the settings every plan of a file shares crowded out
    what told two plans apart."""
    from trainsim.cli.validate_cmd import _plan_cells

    cells, end = _plan_cells(
        [
            "tp4-pp2-dp32-mb2-gb1024-rc-full-fp16-attn-fused",
            "tp8-pp1-dp32-mb8-gb1024-rc-full-fp16-attn-fused",
        ]
    )
    assert cells == ["tp4-pp2-dp32-mb2", "tp8-pp1-dp32-mb8"] and end == "-rc-full-fp16-attn-fused"
    same, end = _plan_cells(
        ["tp4-pp8-dp4-zero1-mb4-gb256-rc-full", "tp4-pp8-dp4-zero1-mb4-gb256-rc-full"]
    )
    assert same == ["tp4-pp8-dp4-zero1-mb4"] * 2 and end == "-rc-full"  # the degrees always stay
    assert _plan_cells(["tp1-pp1-dp2-mb1-gb2", "tp2-pp1-dp1-mb2-gb2-rc-full"]) == (
        ["tp1-pp1-dp2-mb1", "tp2-pp1-dp1-mb2-rc-full"],
        "",
    )


def test_bf16s_fp32_gradients_are_explained_where_they_cost() -> None:
    """bf16 plans moved twice fp16's gradient bytes (Megatron's rule) without a word."""
    rc, out = _cli("predict", "llama3-8b", "--system", "perlmutter", "--gpus", "8", "--zero", "1",
                   "--global-batch", "64", "--seq-len", "4096", "--recompute", "full")  # fmt: skip
    assert rc == 0 and "gradients are kept and reduced in fp32 here" in " ".join(out.split())
    rc, out = _cli("predict", "llama3-8b", "--system", "perlmutter", "--gpus", "8", "--zero", "1", "--dtype", "fp16",
                   "--global-batch", "64", "--seq-len", "4096", "--recompute", "full")  # fmt: skip
    assert rc == 0 and "reduced in fp32" not in " ".join(out.split())
