"""Findings of the session-34 fuzzing review of the comm readers, registry and ``fit-comm``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainsim.comm import predict_collective
from trainsim.hardware import get_system

CATALOG_AZURE = Path(__file__).resolve().parents[1] / "src/trainsim/hardware/data/system_azure_nd_a100_v4.yaml"


def _azure_copy(tmp_path: Path, file: str, **edits: object) -> Path:
    doc = yaml.safe_load(CATALOG_AZURE.read_text(encoding="utf-8"))
    doc.update(edits)
    path = tmp_path / file
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_an_edited_catalog_system_keeping_its_name_is_not_answered_by_its_measurements(tmp_path) -> None:
    """A YAML copy of azure-nd-a100-v4 with 30 and 1 GB/s tiers predicted the catalog's 1.4 s
    (its calibrated models matched by name alone); a renamed copy 7.3 s. The YAML's tiers are
    what is modelled, with a note saying why the calibrated models stand aside."""
    slow = [{"name": "nvswitch", "kind": "nvswitch", "scope": "node", "bandwidth_per_gpu_GBps": 30, "latency_us": 1.9},
            {"name": "infiniband-hdr", "kind": "infiniband", "scope": "cluster", "bandwidth_per_gpu_GBps": 1,
             "latency_us": 8.5}]  # fmt: skip
    same = get_system(_azure_copy(tmp_path, "shadow_same_name.yaml", tiers=slow))
    renamed = get_system(_azure_copy(tmp_path, "shadow_renamed.yaml", tiers=slow, name="my-slow-azure", aliases=[]))
    catalog = predict_collective("all_reduce", 2**30, 16, system="azure-nd-a100-v4")
    shadow = predict_collective("all_reduce", 2**30, 16, system=same)
    assert catalog.calibrated and not shadow.calibrated
    assert shadow.provenance == "spec-based:azure-nd-a100-v4"
    assert shadow.duration_s == predict_collective("all_reduce", 2**30, 16, system=renamed).duration_s
    from trainsim.comm.registry import shadowed_note

    note = shadowed_note(same)
    assert note is not None and "nccl_tests_allreduce_a100_40gb_azure" in note and "tiers" in note
    assert shadowed_note(renamed) is None and shadowed_note(get_system("azure-nd-a100-v4")) is None
    # its documentation edited only, a copy is the catalog's system still: measured
    doc_only = get_system(_azure_copy(tmp_path, "doc_only.yaml", description="mine", aliases=[]))
    assert predict_collective("all_reduce", 2**30, 16, system=doc_only).provenance == catalog.provenance
    assert shadowed_note(doc_only) is None


def _with_nan(src: Path, dest: Path, line: int, column: int, sep: str | None = ",") -> Path:
    """A copy of ``src`` whose ``line`` (1-based) has ``nan`` in field ``column``."""
    lines = src.read_text(encoding="utf-8").splitlines()
    fields = lines[line - 1].split(sep)
    fields[column] = "nan"
    lines[line - 1] = (sep or " ").join(fields)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dest


@pytest.mark.parametrize(("rel", "column", "why"), [
    ("comm/nccl_tests_allreduce_a100_40gb_azure/nccl_16.log", 4, "time is not a finite number"),
    ("calibration/a100-sxm4-80gb_perlmutter/nccl/NVIDIAA100-SXM4-80GB_allgather_large_fp16_1_2.csv", 3,
     "expected 4 finite numbers"),
    ("calibration/a100-sxm4-80gb_perlmutter/nccl/NVIDIAA100-SXM4-80GB_allgather_large_fp16_1_2.csv", 0,
     "expected 4 finite numbers"),
    ("comm/vtrain_allreduce_lut_a100/AR_GPU4_1M_1024M_LUT", 3, "expected finite numbers"),
])  # fmt: skip
def test_a_nan_measurement_is_refused_with_its_line(shared_data, tmp_path, rel, column, why) -> None:
    """NaN passed the readers' ``<= 0`` checks: the fit said ``samples 25, dropped 0`` and the
    fitter dropped the row silently. Now the reader names the file and line."""
    from trainsim.comm import read_comm_dataset
    from trainsim.errors import TraceFormatError

    src = shared_data / rel
    lines = src.read_text(encoding="utf-8").splitlines()
    # the second data row (nccl-tests: a line starting with a size after its MPI prefix)
    line = next(i for i, x in enumerate(lines, 1) if x.split(">:")[-1].strip()[:1].isdigit()) + 1
    sep = None if src.suffix == ".log" else ","
    if sep is None:  # nccl-tests: drop the MPI prefix so the columns split on blanks
        lines[line - 1] = lines[line - 1].split(">:")[-1]
        src = tmp_path / "plain" / src.name
        src.parent.mkdir()
        src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    bad = _with_nan(src, tmp_path / "bad" / src.name, line, column, sep)
    with pytest.raises(TraceFormatError, match=rf"{bad.name}: line {line}: {why}"):
        read_comm_dataset([bad])


def test_a_nan_in_bench_jsonl_is_refused(tmp_path) -> None:
    from trainsim.comm import read_comm_dataset
    from trainsim.errors import TraceFormatError

    row = {"schema": "trainsim.comm-bench/1", "kind": "all_reduce", "nbytes": 1024, "nodes": 1,
           "gpus_per_node": 2, "duration_s": float("nan")}  # fmt: skip
    path = tmp_path / "bench.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(TraceFormatError, match=r"line 1: .*duration_s nan is not a finite number"):
        read_comm_dataset([path])


def test_two_concatenated_nccl_tests_logs_read_as_their_two_runs(shared_data, tmp_path) -> None:
    """``cat nccl_16.log nccl_8.log`` became one 2x8 case of 48 samples, the 8-GPU rows mixed in.
    A header after results starts the next run: the two cases, as the two files give them."""
    from trainsim.comm import read_comm_dataset
    from trainsim.comm.samples import CaseKey
    from trainsim.ir.kinds import CollectiveKind as C

    azure = shared_data / "comm/nccl_tests_allreduce_a100_40gb_azure"
    two = tmp_path / "two.log"
    two.write_bytes((azure / "nccl_16.log").read_bytes() + (azure / "nccl_8.log").read_bytes())
    ds, apart = read_comm_dataset([two]), read_comm_dataset([azure / "nccl_16.log", azure / "nccl_8.log"])
    assert ds.cases() == apart.cases() == [CaseKey(C.ALL_REDUCE, 1, 8), CaseKey(C.ALL_REDUCE, 2, 8)]
    for key in ds.cases():
        assert all((a == b).all() for a, b in zip(ds.arrays(key), apart.arrays(key), strict=True))
    assert not ds.warnings


def test_a_log_whose_results_failed_validation_warns(shared_data, tmp_path) -> None:
    """``# Out of bounds values : 5 FAILED`` was ignored: its times are fitted, with a warning."""
    from trainsim.comm import read_comm_dataset

    log = (shared_data / "comm/nccl_tests_allreduce_a100_40gb_azure/nccl_16.log").read_text(encoding="utf-8")
    failed = tmp_path / "nccl_16.log"
    failed.write_text(log.replace("# Avg bus bandwidth", "# Out of bounds values : 5 FAILED\n[1,0]<stdout>:# Avg bus bandwidth"),
                      encoding="utf-8")  # fmt: skip
    ds = read_comm_dataset([failed])
    assert len(ds) == 25
    (w,) = ds.warnings
    assert str(failed) in w and "Out of bounds values : 5 FAILED" in w
    p = subprocess.run([sys.executable, "-m", "trainsim", "fit-comm", str(failed), "--format", "json"],
                       capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert p.returncode == 0 and f"warning: {failed}: nccl-tests' check of the results failed" in p.stderr


@pytest.mark.parametrize(("field", "value"), [("log_s", 1e300), ("log_s", -1e3), ("log2_bytes", 1e6)])
def test_a_comm_artifact_with_implausible_knots_is_refused_at_load(tmp_path, field, value) -> None:
    """An artifact edited so every ``log_s`` was 1e300 loaded, and predict said ``iteration time
    inf ms`` after a numpy overflow warning. Its knots are checked at load, naming file and field."""
    from trainsim.comm.registry import load_model
    from trainsim.errors import ConfigError

    doc = json.loads((Path(__file__).resolve().parents[1] / "src/trainsim/comm/data/azure_nd_a100_v4_allreduce.json")
                     .read_text(encoding="utf-8"))  # fmt: skip
    case = next(c for c in doc["cases"] if c["family"] == "monotone")
    case["params"][field] = [value] * len(case["params"][field])
    path = tmp_path / "x.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    label = f"{case['kind']} {case['nodes']}x{case['gpus_per_node']}"
    with pytest.raises(ConfigError, match=rf"x\.json: comm model artifact: {label} case: monotone curve: field {field}: "):
        load_model(path)


def test_fit_comm_never_replaces_a_file_that_is_not_a_comm_model(shared_data, tmp_path) -> None:
    """``fit-comm nccl_16.log -o ow/config.json`` replaced a HuggingFace config.json: only the
    inputs were guarded. An existing file must be empty or a comm model a fit wrote (the
    documented ``-o src/trainsim/comm/data/...json`` refit replaces the shipped artifact)."""
    log = shared_data / "comm/nccl_tests_allreduce_a100_40gb_azure/nccl_16.log"
    config = tmp_path / "config.json"
    config.write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}\n', encoding="utf-8")
    before = config.read_bytes()

    def fit(out: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "trainsim", "fit-comm", str(log), "-o", str(out), "--format", "json"],
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip

    p = fit(config)
    assert p.returncode == 1 and config.read_bytes() == before
    assert p.stderr.strip() == (f"trainsim: error: --output {config}: exists and is not a comm model trainsim wrote; "
                                "remove it or write elsewhere")  # fmt: skip
    model = tmp_path / "model.json"
    assert fit(model).returncode == 0
    p = fit(model)  # a previous fit's artifact is replaced
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["artifact"] == str(model)
