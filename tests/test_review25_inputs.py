"""Review findings of 2026-11-27 (rev25b): malformed artifacts, specs and catalog files gave
tracebacks, silent NaN/inf answers or messages that did not name the file. One line naming
the file and field, exit 1."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

# the quick_deadlines fixture and the TCP server of the scheduler tests
from tests.test_search import _serve, _stop, quick_deadlines  # noqa: F401
from trainsim.cli.main import _register, app
from trainsim.errors import ConfigError, TrainsimError

HW = resources.files("trainsim.hardware").joinpath("data")
KERNEL_ARTIFACT = Path(str(resources.files("trainsim.kernels").joinpath("data", "a100-sxm4-80gb_perlmutter-operator.npz")))
COMM_ARTIFACT = Path(str(resources.files("trainsim.comm").joinpath("data", "azure_nd_a100_v4_allreduce.json")))


def _run(*args: str):
    _register()
    return CliRunner().invoke(app, list(args))


def _error(res) -> str:
    assert res.exit_code == 1 and isinstance(res.exception, TrainsimError), res.output
    msg = str(res.exception)
    assert "\n" not in msg
    return msg


def _usage(res) -> str:
    """The one line of a usage error (exit 2)."""
    assert res.exit_code == 2, res.output
    line = res.stderr.removeprefix("trainsim: error: ")
    assert line.count("\n") == 1 and line.endswith("\n"), res.stderr
    return line.rstrip("\n")


def _system_yaml(tmp_path: Path, name: str = "sys.yaml", **replace: str) -> Path:
    """The catalog's dgx-a100 file with some lines replaced (old text -> new text)."""
    text = HW.joinpath("system_dgx_a100.yaml").read_text(encoding="utf-8")
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# --- 1, 9: kernel model artifacts ----------------------------------------------------------------


def test_a_truncated_kernel_artifact_names_the_file(tmp_path):
    trunc = tmp_path / "km_trunc.npz"
    trunc.write_bytes(KERNEL_ARTIFACT.read_bytes()[:2000])
    msg = _error(_run("predict", "llama2-7b", "--gpus", "8", "--tp", "8", "--kernel-models", str(trunc)))
    assert "km_trunc.npz: not a kernel model artifact" in msg


def test_a_kernel_artifact_with_nan_values_is_refused_on_load(tmp_path):
    from trainsim.kernels.registry import read_artifact

    with np.load(KERNEL_ARTIFACT, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    name = next(k for k, a in arrays.items() if a.dtype.kind == "f")
    arrays[name] = np.full_like(arrays[name], np.nan)
    bad = tmp_path / "km_nan.npz"
    np.savez_compressed(bad, **arrays)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=rf"km_nan.npz: array '{name}' holds NaN or infinite values"):
        read_artifact(bad)


# --- 7: artifact paths holding ':' ---------------------------------------------------------------


def test_path_lists_round_trip_through_one_variable():
    from trainsim.envvars import joined_paths, split_paths

    plain = ["/a/b.npz", "/c/d.npz"]
    assert joined_paths(plain) == os.pathsep.join(plain)  # unchanged where nothing is ambiguous
    odd = ["/a/km:colon.npz", "/c/d.npz"]
    assert split_paths(joined_paths(odd)) == odd
    assert split_paths(os.pathsep.join(plain)) == plain  # a variable set by hand, as before
    assert split_paths("") == []


def test_a_kernel_artifact_path_with_a_colon_is_not_split(tmp_path):
    colon = tmp_path / "km:colon.npz"  # a copy: a link would resolve to the packaged file's name
    colon.write_bytes(KERNEL_ARTIFACT.read_bytes())
    res = _run("predict", "llama2-7b", "--gpus", "8", "--tp", "8", "--kernel-models", str(colon), "--format", "json")
    assert res.exit_code == 0, res.output


def test_a_comm_artifact_path_with_a_colon_is_not_split(tmp_path):
    colon = tmp_path / "cm:colon.json"
    colon.write_bytes(COMM_ARTIFACT.read_bytes())
    res = _run("predict", "llama2-7b", "--system", "azure-nd-a100-v4", "--gpus", "32", "--tp", "8",
               "--comm-models", str(colon), "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output


# --- 2: DLRM table specs -------------------------------------------------------------------------

_DLRM = {"batch": 64, "tables": [{"name": "t0", "rows": 1000, "dim": 16, "pooling": 2.0, "reuse": [0.5, 0.5]}]}


@pytest.mark.parametrize(("path", "value", "message"), [
    (("batch",), float("inf"), "field batch: expected a positive integer, got inf"),
    (("batch",), float("nan"), "field batch: expected a positive integer, got nan"),
    (("tables", 0, "rows"), float("nan"), r"field tables\[0\].rows: expected a positive integer, got nan"),
    (("tables", 0, "dim"), float("inf"), r"field tables\[0\].dim: expected a positive integer, got inf"),
    (("bottom_mlp",), [512, float("inf")], r"field bottom_mlp\[1\]: expected a positive integer, got inf"),
    (("dense_features",), float("-inf"), "field dense_features: expected a positive integer"),
    (("tables", 0, "reuse"), [5.0, 5.0], r"field tables\[0\]: table 't0': reuse fractions must sum to 1.*sum of 10"),
    (("tables", 0, "pooling"), 1e300, r"field tables\[0\]: table 't0': pooling 1e\+300 indices per bag is implausible"),
])  # fmt: skip
def test_dlrm_specs_with_non_finite_or_absurd_numbers_name_the_field(tmp_path, path, value, message):
    doc = json.loads(json.dumps(_DLRM))
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    spec = tmp_path / "dlrm.json"
    spec.write_text(json.dumps(doc), encoding="utf-8")  # NaN / Infinity, as Python writes them
    from trainsim.builders.dlrm import load_dlrm_spec

    with pytest.raises(ConfigError, match=rf"dlrm.json: {message}"):
        load_dlrm_spec(spec)


def test_a_dlrm_spec_with_infinite_batch_is_a_one_line_cli_error(tmp_path):
    spec = tmp_path / "dl.json"
    spec.write_text(json.dumps({**_DLRM, "batch": float("inf")}), encoding="utf-8")
    msg = _error(_run("shard", str(spec), "--world", "4", "--device", "a100-sxm4-80gb"))
    assert "dl.json: field batch" in msg


# --- 3: comm model artifacts ---------------------------------------------------------------------


def _comm_artifact(tmp_path: Path, edit) -> Path:
    doc = json.loads(COMM_ARTIFACT.read_text(encoding="utf-8"))
    edit(doc)
    p = tmp_path / "cm.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    return p


@pytest.mark.parametrize(("field", "value"), [("nodes", -1), ("nodes", 0), ("gpus_per_node", 0)])
def test_comm_cases_need_positive_nodes_and_gpus_per_node(tmp_path, field, value):
    p = _comm_artifact(tmp_path, lambda d: d["cases"][0].update({field: value}))
    msg = _error(_run("predict", "llama2-7b", "--system", "azure-nd-a100-v4", "--gpus", "32", "--tp", "8",
                      "--comm-models", str(p)))  # fmt: skip
    assert f"cm.json: comm model artifact: all_reduce case: field {field} must be a positive integer, got {value}" in msg


def test_a_comm_artifact_without_cases_is_refused(tmp_path):
    from trainsim.comm.registry import load_model

    p = _comm_artifact(tmp_path, lambda d: d.update(cases=[]))
    with pytest.raises(ConfigError, match=r"cm.json: .*field cases is empty"):
        load_model(p)


def test_a_comm_artifact_with_a_bad_system_spec_is_one_line(tmp_path):
    def edit(d):
        d["system_spec"]["tiers"][0]["bandwidth_per_gpu_GBps"] = 0

    p = _comm_artifact(tmp_path, edit)
    msg = _error(_run("predict", "llama2-7b", "--system", "azure-nd-a100-v4", "--gpus", "32", "--tp", "8",
                      "--comm-models", str(p)))  # fmt: skip
    assert "cm.json: comm model artifact: field system_spec.tiers.0.bandwidth_per_gpu_GBps: Input should be greater than 0" in msg


def test_a_comm_artifact_naming_an_unknown_system_names_the_file(tmp_path):
    from trainsim.comm.registry import load_model

    p = _comm_artifact(tmp_path, lambda d: d.update(system="nosuch", system_spec=None))
    with pytest.raises(ConfigError, match=r"cm.json: comm model artifact: field system: unknown system 'nosuch'"):
        load_model(p)


# --- 4, 5, 6: system and device files, long names --------------------------------------------------


@pytest.mark.parametrize("old", ["latency_us: 1.9", "bandwidth_per_gpu_GBps: 25"])
def test_infinite_numbers_in_a_system_file_are_refused(tmp_path, old):
    key = old.split(":")[0]
    sys_yaml = _system_yaml(tmp_path, **{old: f"{key}: .inf"})
    msg = _error(_run("predict", "llama2-7b", "--gpus", "16", "--tp", "8", "--system", str(sys_yaml)))
    assert "sys.yaml: field tiers." in msg and f"{key}: Input should be a finite number" in msg


def test_infinite_memory_in_a_device_file_is_refused(tmp_path):
    from trainsim.hardware import get_device

    text = HW.joinpath("device_a100_sxm4_80gb.yaml").read_text(encoding="utf-8")
    dev = tmp_path / "dev.yaml"
    dev.write_text(text.replace("memory_GB: 80", "memory_GB: .inf"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"dev.yaml: field memory_GB: Input should be a finite number"):
        get_device(dev)


def test_a_system_file_with_an_unknown_device_names_the_file(tmp_path):
    sys_yaml = _system_yaml(tmp_path, **{"device: a100-sxm4-80gb": "device: nosuchgpu"})
    msg = _error(_run("predict", "llama2-7b", "--gpus", "16", "--tp", "8", "--system", str(sys_yaml)))
    assert "sys.yaml: field device: unknown device 'nosuchgpu'" in msg


def test_a_relative_device_path_is_read_beside_the_system_file(tmp_path, monkeypatch):
    from trainsim.hardware import get_device, get_system

    folder = tmp_path / "cluster"
    folder.mkdir()
    (folder / "dev_ok.yaml").write_text(HW.joinpath("device_a100_sxm4_80gb.yaml").read_text(encoding="utf-8"),
                                        encoding="utf-8")  # fmt: skip
    sys_yaml = _system_yaml(folder, **{"device: a100-sxm4-80gb": "device: dev_ok.yaml"})
    monkeypatch.chdir(tmp_path)  # not the file's folder
    spec = get_system(Path("cluster") / sys_yaml.name)
    assert get_device(spec.device).name == "a100-sxm4-80gb"
    missing = _system_yaml(folder, "missing.yaml", **{"device: a100-sxm4-80gb": "device: nope.yaml"})
    with pytest.raises(ConfigError, match=r"missing.yaml: field device: device file .*nope.yaml does not exist"):
        get_system(missing)


@pytest.mark.parametrize("where", ["model", "--system"])
def test_names_longer_than_a_file_name_can_be_are_unknown_names(where):
    long = "a" * 300
    args = ["predict", long, "--gpus", "8"] if where == "model" else ["predict", "llama2-7b", "--gpus", "8", "--system", long]
    msg = _error(_run(*args))
    assert msg.startswith("unknown model" if where == "model" else "unknown system")


# --- 8: search list options ----------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--zero", "5", "--zero must be among 0, 1, 2, 3, got '5'"),
    ("--zero", "0,-1", "--zero must be among 0, 1, 2, 3, got '0,-1'"),
    ("--cp", "-2", "--cp values must be >= 1, got '-2'"),
    ("--micro-batch", "", "--micro-batch must be comma-separated integers, got ''"),
])  # fmt: skip
def test_search_list_options_are_checked_up_front(flag, value, message):
    msg = _usage(_run("search", "llama2-7b", "--gpus", "8", "--global-batch", "8", flag, value))
    assert msg == message


# --- 10: a scheduler address held by another service ---------------------------------------------


@pytest.mark.usefixtures("quick_deadlines")
def test_a_service_that_talks_first_did_not_answer_as_a_dask_scheduler():
    pytest.importorskip("distributed")
    from trainsim.builders.models import get_model
    from trainsim.search.llm import search_llm
    from trainsim.search.space import PlanSpace

    srv, conns = _serve(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n")
    try:
        address = f"tcp://127.0.0.1:{srv.getsockname()[1]}"
        with pytest.raises(ConfigError, match="did not answer as a Dask scheduler") as e:
            search_llm(get_model("gpt3-350m"), "dgx-a100", PlanSpace(gpus=8, global_batch=8), scheduler=address,
                       progress=False)  # fmt: skip
        assert "allocate" not in str(e.value)
    finally:
        _stop(srv, conns)
