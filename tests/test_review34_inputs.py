"""Input-robustness review of 2026-12-02 (a fuzzing helper): damaged or odd inputs that gave a
wrong answer or a traceback now give one line naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsim.errors import ConfigError
from trainsim.host.overheads import SCHEMA_VERSION, Overhead, OverheadDB

_STAT = {"mean_s": 1e-5, "median_s": 1e-5, "std_s": 1e-6, "count": 10, "raw_count": 12}


def _db(tmp_path: Path, **edit: object) -> Path:
    doc: dict[str, object] = {"schema_version": SCHEMA_VERSION, "unit": "s", "sources": [],
                              "global": {"T1": dict(_STAT)}, "per_op": {"aten::mm": {"T2": dict(_STAT)}}}  # fmt: skip
    doc.update(edit)
    p = tmp_path / "odb.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    return p


def test_an_overhead_database_is_checked_value_by_value(tmp_path):
    db = OverheadDB.load(_db(tmp_path))
    assert db.lookup("aten::mm", Overhead.T2) == 1e-5 and db.lookup("aten::add", Overhead.T1) == 1e-5
    cases = [
        ({"global": {"T1": {**_STAT, "mean_s": -1.0}}}, "global.T1.mean_s must be a number of seconds from 0 to 1 "),
        ({"global": {"T1": {**_STAT, "mean_s": float("nan")}}}, "global.T1.mean_s must be a number of seconds"),
        ({"per_op": {"aten::mm": {"T2": {**_STAT, "median_s": "x"}}}}, "per_op.aten::mm.T2.median_s must be a number"),
        ({"per_op": []}, "per_op must be an object of overhead statistics, got a list"),
        ({"global": {"T9": dict(_STAT)}}, "global: unknown overhead 'T9'"),
        ({"global": {"T1": {**_STAT, "count": 2.5}}}, "global.T1.count must be a non-negative integer"),
        ({"unit": "ms"}, "unit 'ms'; an overhead database holds seconds"),
    ]
    for edit, said in cases:
        with pytest.raises(ConfigError) as e:
            OverheadDB.load(_db(tmp_path, **edit))
        assert said in str(e.value) and str(tmp_path / "odb.json") in str(e.value), (edit, str(e.value))


@pytest.mark.parametrize(("kind", "value", "ok"), [("T1", 1e6, False), ("T4", 1.5, False), ("T2", 1.0, True),
                                                  ("cpu", 1e6, False), ("cpu", 30.0, True)])  # fmt: skip
def test_a_per_op_overhead_past_what_one_op_can_take_is_refused(tmp_path, kind, value, ok):
    """Dispatch (T1-T5) above a second per op, an op's own CPU time above an hour: a unit slip
    or a hand edit, which replayed as given (a T1 of 1e6 s predicted a 1e9 ms step)."""
    path = _db(tmp_path, per_op={"aten::mm": {kind: {**_STAT, "mean_s": value}}})
    if ok:
        assert OverheadDB.load(path).lookup("aten::mm", Overhead(kind)) == value
        return
    top = "3600" if kind == "cpu" else "1"
    with pytest.raises(ConfigError, match=rf"per_op\.aten::mm\.{kind}\.mean_s must be a number of seconds from 0 "
                                          rf"to {top} \(a host overhead of one op.*got {value!r}"):  # fmt: skip
        OverheadDB.load(path)


@pytest.mark.parametrize("value", [0, 2.7, float("inf"), "8", True])
def test_a_capture_manifest_batch_that_is_not_a_positive_integer_is_named(tmp_path, value):
    import shutil

    from typer.testing import CliRunner

    from trainsim.cli.main import _register, app

    trace = tmp_path / "run" / "linear_kineto.json.gz"
    trace.parent.mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "shared/data/traces/param_linear_2080ti/linear_kineto.json.gz", trace)
    (tmp_path / "run" / "capture.json").write_text(json.dumps({"batch_size": value}), encoding="utf-8")
    _register()
    res = CliRunner().invoke(app, ["replay", str(trace), "--batch", "8"])
    assert res.exit_code == 1, res.output
    assert f"{tmp_path / 'run' / 'capture.json'}: batch_size must be a positive integer, got {value!r}" in str(res.exception)
    res = CliRunner().invoke(app, ["replay", str(trace), "--batch", "8", "--old-batch", "4"])
    assert "batch_size" not in str(res.exception)  # the traced batch given: the manifest's is not needed


def _cli(*args: str):
    from typer.testing import CliRunner

    from trainsim.cli.main import _register, app

    _register()
    return CliRunner().invoke(app, list(args))


LINEAR = Path(__file__).resolve().parents[2] / "shared/data/traces/param_linear_2080ti/linear_kineto.json.gz"


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_export_kernels_replaces_only_an_earlier_export(tmp_path, suffix):
    mine = tmp_path / f"data{suffix}"
    mine.write_text("mp,b,l,dim,F_dur(us)\n1,2,3,4,5\n" if suffix == ".csv" else '{"a": 1}\n', encoding="utf-8")
    res = _cli("analyze", str(LINEAR), "--export-kernels", str(mine))
    assert res.exit_code == 1 and "exists and is not a kernel-samples export trainsim wrote" in str(res.exception)
    assert mine.read_text(encoding="utf-8").startswith(("mp,b", '{"a"'))  # untouched
    out = tmp_path / f"k{suffix}"
    for _ in range(2):  # written, then replaced (an earlier export)
        res = _cli("analyze", str(LINEAR), "--export-kernels", str(out))
        assert res.exit_code == 0, res.output
    res = _cli("analyze", str(LINEAR), "--export-kernels", str(tmp_path))
    assert res.exit_code == 2  # a usage error: a path of none of the three suffixes (a folder here)
    (tmp_path / "dir.csv").mkdir()
    res = _cli("analyze", str(LINEAR), "--export-kernels", str(tmp_path / "dir.csv"))
    assert res.exit_code == 1 and "is a folder" in str(res.exception)  # what is there: exit 1


def test_fit_output_replaces_only_a_kernel_model_artifact(tmp_path):
    from tests.test_fit_review_cli import _data, _device_file

    path = _data(tmp_path)
    _device_file(tmp_path / "b2.device.yaml", ["Review Test CPU"])
    theirs = tmp_path / "mine.npz"
    import numpy as np

    np.savez(theirs, x=np.arange(3))
    res = _cli("fit", str(path), "--kinds", "poly", "-o", str(theirs))
    assert res.exit_code == 1 and "exists and is not a kernel model artifact trainsim wrote" in str(res.exception)
    assert np.load(theirs)["x"].tolist() == [0, 1, 2]
    ours = tmp_path / "ours.npz"
    for _ in range(2):  # written, then replaced
        res = _cli("fit", str(path), "--kinds", "poly", "-o", str(ours))
        assert res.exit_code == 0, res.output


def test_a_damaged_kernel_artifact_is_named_at_load_or_at_its_first_query(tmp_path):
    import io

    import numpy as np

    from trainsim.errors import ModelError
    from trainsim.kernels.model import KernelQuery
    from trainsim.kernels.registry import read_artifact

    packed = sorted((Path(__file__).resolve().parents[1] / "src/trainsim/kernels/data").glob("*.npz"))[0]
    with np.load(packed, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    manifest = json.loads(arrays["manifest.json"].tobytes())

    def save(name: str, arrs: dict) -> Path:
        buf = io.BytesIO()
        np.savez(buf, **arrs)
        p = tmp_path / name
        p.write_bytes(buf.getvalue())
        return p

    split = next(k for k in arrays if k.endswith("/split"))
    bad = save("split2d.npz", {**arrays, split: arrays[split].reshape(-1, 1)})
    with pytest.raises(ConfigError, match=r"split2d.npz: .*array 'split' must be one-dimensional"):
        read_artifact(bad)
    entry = manifest["entries"][0]
    entry["columns"] = ["__import__", *entry["columns"][1:]]
    doc = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
    model = read_artifact(save("cols.npz", {**arrays, "manifest.json": doc}))
    first = next(iter(model.entries.values()))  # the manifest's first entry, the one edited
    q = KernelQuery(first.family, first.key, {k: float(np.sqrt(lo * hi)) for k, (lo, hi) in first.ranges.items()})
    with pytest.raises(ModelError, match=r"cols.npz: entry .* reads column '__import__'"):
        model.predict(q)



def test_a_damaged_saved_workload_is_one_line(tmp_path):
    from trainsim.errors import GraphError
    from trainsim.ir import load_workload

    saved = tmp_path / "wl.json"
    assert _cli("analyze", str(LINEAR), "--save-workload", str(saved)).exit_code == 0
    doc = json.loads(saved.read_text(encoding="utf-8"))
    assert load_workload(saved).ranks
    edits = {"no ranks": (lambda d: d.update(ranks=[]), "no ranks"),
             "string start": (lambda d: d["ranks"][0]["ops"][0].update(start_s="x"), "start_s must be a number of seconds or null, got 'x'"),
             "infinite step": (lambda d: d["ranks"][0].update(step_end_s=float("inf")), "step_end_s must be a number")}  # fmt: skip
    for what, (edit, said) in edits.items():
        d = json.loads(json.dumps(doc))
        edit(d)
        bad = tmp_path / f"{what.replace(' ', '_')}.json"
        bad.write_text(json.dumps(d), encoding="utf-8")
        with pytest.raises(GraphError) as e:
            load_workload(bad)
        assert said in str(e.value) and str(bad) in str(e.value), what
        res = _cli("replay", str(bad))
        assert res.exit_code == 1 and said in str(res.exception), (what, res.output)


def test_a_fit_csv_with_a_bad_input_or_unknown_header_names_the_line_or_the_format(tmp_path):
    from trainsim.errors import TraceFormatError
    from trainsim.kernels.readers import read_kernel_dataset

    good = "b,l,dim,F_dur(us),B_dur(us)\n2,1024,5632,54.8,167.8\n"
    d = tmp_path / "neg"
    d.mkdir()
    (d / "NVIDIAA100-SXM4-80GB_layernorm_fp16.csv").write_text(good + "-2,1024,5632,54.8,167.8\n", encoding="utf-8")
    with pytest.raises(TraceFormatError, match=r"layernorm_fp16.csv: line 3: input 'b' of layernorm must be a positive number, got -2.0"):
        read_kernel_dataset([d])
    d = tmp_path / "hdr"
    d.mkdir()
    (d / "NVIDIAA100-SXM4-80GB_layernorm_fp16.csv").write_text("b,l,dim,Fdur,Bdur\n2,1024,5632,54.8,167.8\n", encoding="utf-8")
    with pytest.raises(TraceFormatError, match=r"1 file\(s\) of no known format skipped, e.g. .*\(header 'b,l,dim,Fdur,Bdur'\); expected paper 001"):
        read_kernel_dataset([d])


def test_analyze_warns_of_the_values_replay_would_refuse():
    from trainsim.host.overheads import Stat

    long, short = Stat(2.0, 2.0, 0.0, 1, 1), Stat(1e-5, 1e-5, 0.0, 9, 9)
    db = OverheadDB(per_op={"aten::to": {Overhead.T1: long, Overhead.T4: short}, "aten::mm": {Overhead.CPU: long}},
                    global_={Overhead.T1: short})  # fmt: skip
    assert db.implausible() == ["per_op.aten::to.T1"]  # 2 s is a stall as T1, a CPU op's compute as cpu
