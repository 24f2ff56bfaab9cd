"""CLI contract of ``trainsim fit-comm`` and ``trainsim hw``: JSON alone on stdout, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Until the lead lists trainsim.cli.comm_cmd in COMMAND_MODULES, import it before the entry point.
_ENTRY = "import trainsim.cli.comm_cmd; from trainsim.cli.main import app_entry; app_entry()"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _ENTRY, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.shared_data
def test_fit_comm_json(shared_data, tmp_path):
    out = tmp_path / "v100.json"
    p = _cli(
        "fit-comm",
        str(shared_data / "comm" / "vtrain_allreduce_lut_v100"),
        "--format",
        "json",
        "-o",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert len(doc["models"]) == 7
    for m in doc["models"]:
        assert {"family", "kind", "gmae_pct", "mape_pct", "samples"} <= set(m)
        # the contract's keys as `trainsim fit` fills them (review 2026-11-27: swapped)
        assert m["family"] == m["collective"] == "all_reduce" and m["kind"] == m["curve"] in m["candidates"]
        assert m["samples"] == 1024 and m["gmae_pct"] < 2
    assert json.loads(out.read_text())["model"] == "calibrated"


@pytest.mark.shared_data
def test_fit_comm_without_holdout_writes_standard_json(shared_data, tmp_path):
    """--holdout 0 leaves no error to choose by: the artifact says null (not NaN, which
    standard JSON readers refuse) and loads back; the CLI says how the family was chosen."""
    out = tmp_path / "h0.json"
    p = _cli("fit-comm", str(shared_data / "comm" / "vtrain_allreduce_lut_v100"), "--holdout", "0", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert "--holdout 0: no sizes are held out" in p.stderr
    text = out.read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert "null" in text
    from trainsim.comm.registry import load_model

    load_model(out)


def test_fit_comm_bad_input_is_one_line_exit_1(tmp_path):
    f = tmp_path / "x.log"
    f.write_text("nothing to see\n")
    p = _cli("fit-comm", str(f))
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(f) in lines[0]


def test_hw_list_and_show():
    p = _cli("hw", "list", "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert "dgx-h100" in {s["name"] for s in doc["systems"]} and "mi300x" in {
        d["name"] for d in doc["devices"]
    }
    assert all(isinstance(d["fp32_tflops"], float) for d in doc["devices"])  # the table's columns too
    p = _cli("hw", "show", "perlmutter", "--format", "json")
    assert json.loads(p.stdout)["tiers"][1]["nic_bandwidth_Gbps"] == 50
    p = _cli("hw", "show", "H100")
    assert p.returncode == 0 and "989" in p.stdout
    p = _cli("hw", "show", "tpu-v9")
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1


def test_hw_show_names_what_an_incomplete_file_lacks_as_what_it_is(tmp_path):
    """Walkthrough finding: a system file without tiers was reported as a device missing
    vendor, architecture, memory_GB, ..."""
    sys_file = tmp_path / "cluster.yaml"
    sys_file.write_text("schema_version: 1\nname: c\ndevice: a100-sxm4-80gb\ngpus_per_node: 8\n")
    p = _cli("hw", "show", str(sys_file))
    assert p.returncode == 1 and "tiers" in p.stderr and "vendor" not in p.stderr
    dev_file = tmp_path / "gpu.yaml"
    dev_file.write_text("schema_version: 1\nname: g\nvendor: nvidia\n")
    p = _cli("hw", "show", str(dev_file))
    assert p.returncode == 1 and "memory_GB" in p.stderr and "tiers" not in p.stderr


def test_outputs_never_overwrite_inputs(shared_data, tmp_path):
    """Review finding: `fit-comm my.log -o my.log` replaced the measured log with the model, and
    `replay DIR --timeline DIR/trace.json.gz` / `analyze DIR --save-workload DIR/et.json.gz`
    replaced the traces; all exited 0."""
    import shutil

    log = tmp_path / "my.log"
    shutil.copy(shared_data / "comm" / "nccl_tests_allreduce_a100_40gb_azure" / "nccl_8.log", log)
    before = log.read_bytes()
    p = _cli("fit-comm", str(log), "-o", str(tmp_path / "model.txt"))
    assert p.returncode == 2 and ".json files" in p.stderr  # usage error: --output takes a .json path
    p = _cli("fit-comm", str(tmp_path), "-o", str(log.with_suffix(".json")), "--seed", "-1")
    assert p.returncode == 2  # usage error: a seed is not negative
    log_json = tmp_path / "nccl.json"
    shutil.copy(log, log_json)
    p = _cli("fit-comm", str(log), str(log_json), "-o", str(log_json))
    assert p.returncode == 1 and "would overwrite the input" in p.stderr
    assert log.read_bytes() == before
    traces = tmp_path / "lin"
    shutil.copytree(shared_data / "traces" / "param_linear_2080ti", traces)
    kineto = traces / "linear_kineto.json.gz"
    size = kineto.stat().st_size
    p = _cli("replay", str(traces), "--timeline", str(kineto))
    assert p.returncode == 1 and "would overwrite the input" in p.stderr
    p = _cli("analyze", str(traces), "--save-workload", str(traces / "linear_et.json.gz"))
    assert p.returncode == 1 and "would overwrite the input" in p.stderr
    assert kineto.stat().st_size == size
    p = _cli("replay", str(kineto), "--timeline", str(traces / "new_timeline.json"))
    assert p.returncode == 0, p.stderr  # a new file beside an input file is fine
    p = _cli("replay", str(traces), "--timeline", str(traces / "other_timeline.json"))
    assert p.returncode == 1 and "take it for a trace" in p.stderr  # inside an input folder: not


@pytest.mark.shared_data
def test_fit_comm_refuses_a_kind_the_log_contradicts_and_names_curves(shared_data, tmp_path):
    """Walkthrough findings: ``--kind all_gather`` on an all_reduce log was fitted as all_gather
    (node efficiency 0.350 for 0.699); the table called the curve kind "family" (the JSON's
    family is the collective) and printed nan; one node's log printed a cluster efficiency."""
    log = shared_data / "comm" / "nccl_tests_allreduce_a100_40gb_azure" / "nccl_8.log"
    p = _cli("fit-comm", str(log), "--kind", "all_gather")
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1
    assert "busbw/algbw is 1.75, not all_gather's 0.88 over 8 ranks" in p.stderr
    p = _cli("fit-comm", str(log), "--kind", "all_reduce", "--holdout", "0")
    assert p.returncode == 0, p.stderr
    assert "curve" in p.stdout and "family" not in p.stdout and "nan" not in p.stdout
    assert "cluster 1.000 (not measured: no multi-node case)" in " ".join(p.stdout.split())



@pytest.mark.shared_data
def test_fit_comm_says_what_it_left_out_and_reads_a_file_once(shared_data, tmp_path):
    """A case whose rows are all implausible disappeared silently (GH200's all_gather 8×1: the
    log said 7 cases, the table held 6); a file given twice was read twice (walkthrough)."""
    p = _cli("fit-comm", str(shared_data / "calibration" / "gh200-120gb_vista" / "nccl"), "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert len(doc["models"]) == 6 and [(x["collective"], x["nodes"], x["gpus_per_node"]) for x in doc["not_fitted"]] == [
        ("all_gather", 8, 1)]
    err = " ".join(p.stderr.split())
    assert "warning: all_gather 8×1 not fitted: 195 of its 195 rows are faster than vista's links allow" in err
    azure = shared_data / "comm" / "nccl_tests_allreduce_a100_40gb_azure"
    once = json.loads(_cli("fit-comm", str(azure / "nccl_8.log"), "--format", "json").stdout)
    twice = json.loads(_cli("fit-comm", str(azure), str(azure / "nccl_8.log"), "--format", "json").stdout)
    assert {m["samples"] for m in once["models"]} == {m["samples"] for m in twice["models"] if m["group_size"] == 8}
    assert twice["dataset"] == "nccl_tests_allreduce_a100_40gb_azure"  # not "...+1"
    p = _cli("fit-comm", str(azure / "nccl_8.log"), "-o", str(tmp_path))
    assert p.returncode == 1 and "is a folder; give a file path" in p.stderr


@pytest.mark.shared_data
def test_validate_comm_says_which_folders_it_skipped(shared_data, tmp_path):
    from trainsim.validate.comm_suite import run_comm_suite

    (tmp_path / "comm").mkdir()
    (tmp_path / "comm" / "vtrain_allreduce_lut_a100").symlink_to(shared_data / "comm" / "vtrain_allreduce_lut_a100")
    doc = run_comm_suite(tmp_path)
    assert len(doc["summary"]["missing_folders"]) == 4 and doc["cases"]
    with pytest.raises(Exception, match="none of the suite's measurement folders"):
        run_comm_suite(tmp_path / "comm")


@pytest.mark.shared_data
def test_fit_comm_warns_of_data_far_below_the_links_and_names_a_bad_csv_header(shared_data, tmp_path):
    """ns written as µs fitted an efficiency of 0.001 silently; a paper-001 CSV missing a column
    was "not a known format" (or, in a folder, skipped) (walkthrough, 2026-12-02)."""
    lines = []
    for line in (shared_data / "comm" / "nccl_tests_allreduce_a100_40gb_azure" / "nccl_8.log").read_text().splitlines():
        t = line.split()
        if t and t[0].isdigit() and len(t) >= 11:
            t[4], t[8] = f"{float(t[4]) * 1000:.1f}", f"{float(t[8]) * 1000:.1f}"  # as if ns were written as µs
            lines.append("  " + " ".join(t))
        else:
            lines.append(line)
    log = tmp_path / "nccl_8.log"
    log.write_text("\n".join(lines) + "\n")
    p = _cli("fit-comm", str(log), "--system", "azure-nd-a100-v4")
    assert p.returncode == 0, p.stderr
    assert "of the system's link bandwidth: times in another unit" in " ".join(p.stderr.split())
    bad = tmp_path / "csvs" / "NVIDIAA100-SXM4-80GB_allreduce_fp16_1_4.csv"
    bad.parent.mkdir()
    bad.write_text("shape,nodes,dur(us)\n1024,1,10.5\n2048,1,11\n")
    for target in (bad, bad.parent):
        p = _cli("fit-comm", str(target))
        assert p.returncode == 1 and "line 1: expected columns shape,nodes,GPUsPerNode,dur(us), got shape,nodes,dur(us)" in p.stderr
