"""Review 34 (fuzzing ``trainsim stages``): stage datasets and predictors that are damaged or
edited by hand are one-line errors naming the file and field, never NaN answers, tracebacks or
a replaced file of the user's."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.errors import ConfigError, ModelError, TraceFormatError
from trainsim.learn.dataset import STAGE_SCHEMA, collect, load_graph, read_rows
from trainsim.learn.graphs import StageGraph
from trainsim.learn.stages import StageSpec

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")


def _chain(n_ops: int, width: int) -> StageGraph:
    g = StageGraph()
    prev = g.add_node("input", "input", (16, width), "float32")
    for i in range(n_ops):
        node = g.add_node("dot_general" if i % 2 == 0 else "add", "operator", (16, width), "float32", flops=1e6 * width)
        g.add_edge(prev, node)
        prev = node
    g.add_edge(prev, g.add_node("output", "output", (16, width), "float32"))
    return g


def _write_graph(folder, doc) -> str:
    data = json.dumps(doc).encode()
    digest = hashlib.sha256(data).hexdigest()[:16]
    (folder / "graphs").mkdir(parents=True, exist_ok=True)
    (folder / "graphs" / f"{digest}.json.gz").write_bytes(gzip.compress(data))
    return digest


def _row(i: int, digest: str, **over) -> dict:
    spec = StageSpec("gpt", hidden=64, heads=2, seq=16 * (1 + i), micro_batch=1, layers=1 + i % 3, vocab=128)
    return {"schema": STAGE_SCHEMA, "id": f"s-{i}", "family": "gpt", "spec": spec.to_dict(),
            "latency_s": 1e-3 * (1 + i % 4) * (1 + i % 3), "graph": digest, "graph_forward": digest} | over  # fmt: skip


def _dataset(folder: Path, n: int = 10, **first: object) -> Path:
    """``n`` stages of chain graphs (no jax: rows and graph files written as collect writes them);
    ``first`` overrides fields of the first row."""
    rows = [_row(i, _write_graph(folder, _chain(1 + i % 4, 8 * (1 + i % 3)).to_json())) for i in range(n)]
    rows[0] |= first
    (folder / "stages.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _run(*args: str):
    from trainsim.cli.main import _register, app

    _register()
    return CliRunner().invoke(app, ["stages", *args])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A dataset and a GCN predictor trained on it (one epoch)."""
    root = tmp_path_factory.mktemp("r34")
    ds = _dataset(root / "ds")
    res = _run("train", str(ds), "--out", str(root / "pred"), "--model", "gcn", "--epochs", "1", "--fraction", "0.5")
    assert res.exit_code == 0, res.output
    return ds, root / "pred"


# --- finding 1: latencies and stage ids --------------------------------------------------------


@pytest.mark.parametrize("latency", [-1.0, 0.0, math.nan, math.inf, "fast", None, True])
def test_a_stage_latency_must_be_a_positive_number(tmp_path, latency):
    folder = _dataset(tmp_path / "ds", n=3, latency_s=latency)
    with pytest.raises(TraceFormatError, match=r"stages.jsonl: line 1: latency_s must be a positive number, got "):
        read_rows(folder)


def test_train_and_predict_refuse_a_non_positive_latency(trained, tmp_path):
    _, pred = trained
    for value in (-1.0, 0.0, math.nan):  # were: MRE nan and a NaN-scaled predictor; -100 %; ZeroDivisionError
        ds = _dataset(tmp_path / f"ds{value}", latency_s=value)
        for args in (("train", str(ds), "--out", str(tmp_path / "p"), "--model", "gcn", "--epochs", "1"),
                     ("predict", str(pred), str(ds))):  # fmt: skip
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)
                res = _run(*args)
            assert res.exit_code == 1 and isinstance(res.exception, TraceFormatError), (args, res.output)
            assert f"line 1: latency_s must be a positive number, got {value!r}" in str(res.exception)
        assert not (tmp_path / "p").exists()


def test_a_stage_id_twice_is_refused(tmp_path):
    """A resumed collection never writes an id twice; a hand-merged file would have counted the
    stage twice (and a predictor's split by id would be a guess)."""
    folder = _dataset(tmp_path / "ds", n=4)
    lines = (folder / "stages.jsonl").read_text().splitlines(keepends=True)
    again = json.loads(lines[1]) | {"latency_s": 0.5}
    (folder / "stages.jsonl").write_text("".join(lines) + json.dumps(again) + "\n")
    with pytest.raises(TraceFormatError, match=r"line 5: stage s-1 is on line 2 already"):
        read_rows(folder)


# --- finding 3: a folder where stages.jsonl belongs -------------------------------------------


def test_stages_jsonl_that_is_a_folder_is_a_one_line_error(tmp_path):
    folder = tmp_path / "ds"
    (folder / "stages.jsonl").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"stages.jsonl: is a folder"):
        read_rows(folder)
    with pytest.raises(ConfigError, match=r"stages.jsonl: is a folder"):
        collect(folder, [])


# --- finding 4a: row and graph errors name the file, line and field ----------------------------


@pytest.mark.parametrize(("spec", "message"), [
    ({"evil": 1}, "spec: unknown stage fields ['evil']"),
    ({"hidden": "x"}, "spec: hidden must be an integer, got 'x'"),
    ({"heads": 0}, "spec: heads must be at least 1, got 0"),
    ({"embed": "yes"}, "spec: embed must be true or false, got 'yes'"),
    ({"family": "moe", "experts": 0}, "spec: MoE stages need experts >= 2"),
])  # fmt: skip
def test_a_bad_spec_field_is_named_with_its_file_and_line(tmp_path, spec, message):
    folder = _dataset(tmp_path / "ds", n=2)
    lines = (folder / "stages.jsonl").read_text().splitlines(keepends=True)
    row = json.loads(lines[1])
    row["spec"] |= spec
    (folder / "stages.jsonl").write_text(lines[0] + json.dumps(row) + "\n")
    with pytest.raises(TraceFormatError) as e:
        read_rows(folder)
    assert str(e.value).startswith(f"{folder / 'stages.jsonl'}: line 2: ") and message in str(e.value)


def _damaged(doc: dict, what: str) -> dict:
    if what == "cycle":
        doc["edges"] = [doc["edges"][0] + [doc["edges"][1][-1]], doc["edges"][1] + [doc["edges"][0][0]]]
    elif what == "edge":
        doc["edges"][1][0] = 999
    elif what == "schema":
        doc["schema"] = "x/9"
    elif what == "empty":
        doc |= {"op": [], "kind": [], "shape": [], "dtype": [], "edges": [[], []], "flops": [], "contract": []}
    elif what == "flops":
        doc["flops"][1] = math.nan
    return doc


@pytest.mark.parametrize(("what", "message"), [
    ("cycle", "stage graph has a cycle"), ("edge", "edge refers to a missing node"),
    ("schema", "not a trainsim.stage-graph/1 document (schema 'x/9')"), ("empty", "stage graph has no nodes"),
    ("flops", "stage graph flops must be finite"),
])  # fmt: skip
def test_a_damaged_stage_graph_names_its_file(tmp_path, what, message):
    folder = tmp_path / "ds"
    digest = _write_graph(folder, _damaged(_chain(3, 8).to_json(), what))
    with pytest.raises(TraceFormatError) as e:
        load_graph(folder, digest)
    assert str(e.value).startswith(f"{folder / 'graphs' / digest}.json.gz: ") and message in str(e.value)
    assert "run `trainsim stages collect` on the folder again" in str(e.value)  # which rebuilds it


# --- findings 2, 3, 4b: a predictor's weights and config are checked at load -------------------


def test_predictor_weights_that_are_a_folder_is_a_one_line_error(trained, tmp_path):
    import shutil

    _, pred = trained
    bad = tmp_path / "bad"
    shutil.copytree(pred, bad)
    (bad / "predictor.safetensors").unlink()
    (bad / "predictor.safetensors").mkdir()
    res = _run("predict", str(bad), str(trained[0]))
    assert res.exit_code == 1 and "predictor.safetensors: is a folder" in str(res.exception)


def _edited(pred, tmp_path, name, *, doc=None, tensors=None):
    import shutil

    from safetensors.torch import load_file, save_file

    out = tmp_path / name
    shutil.copytree(pred, out)
    if doc is not None:
        d = json.loads((out / "predictor.json").read_text())
        doc(d)
        (out / "predictor.json").write_text(json.dumps(d))
    if tensors is not None:
        t = load_file(out / "predictor.safetensors")
        tensors(t)
        save_file(t, out / "predictor.safetensors")
    return out


def _set_first(t, value):
    t["convs.0.lin.weight"][0, 0] = value


def test_weights_or_scaling_that_are_not_finite_are_refused_at_load(trained, tmp_path):
    """Were: predictions of nan, and a search saying no pipeline fits."""
    from trainsim.learn.train import Predictor

    ds, pred = trained
    for value in (math.nan, math.inf):
        bad = _edited(pred, tmp_path, f"w{value}", tensors=lambda t, v=value: _set_first(t, v))
        with pytest.raises(ModelError, match=r"predictor.safetensors: tensor convs.0.lin.weight holds NaN or infinite"):
            Predictor.load(bad)
    res = _run("predict", str(bad), str(ds))
    assert res.exit_code == 1 and "tensor convs.0.lin.weight holds NaN or infinite" in str(res.exception)
    bad = _edited(pred, tmp_path, "mean", doc=lambda d: d["target"].update(mean=math.nan))
    with pytest.raises(ModelError, match=r"predictor.json: target.mean must be a finite number, got nan"):
        Predictor.load(bad)
    res = _run("search", "--predictor", str(bad))
    assert res.exit_code == 1 and "target.mean must be a finite number" in str(res.exception)


def test_finite_but_absurd_weights_are_an_error_not_an_overflow(trained, tmp_path):
    """Finite weights can still put a prediction past e^709: was inf with numpy's "overflow
    encountered in exp" (and a search that "fits no pipeline"); the check is on the log latency."""
    ds, pred = trained

    def huge(t):
        t["readout.mlp.4.weight"][:] = 1e30

    bad = _edited(pred, tmp_path, "huge", tensors=huge)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        res = _run("predict", str(bad), str(ds))
    assert res.exit_code == 1 and isinstance(res.exception, ModelError), res.output
    assert "outside any float: its weights or target scaling are damaged" in str(res.exception)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(op_vocab=d["op_vocab"][:-1]), "op_vocab's 1 operators make 27 node features, the model reads model.in_dim 28"),
    (lambda d: d.update(op_vocab="dot_general"), "op_vocab must be a list of operator names"),
    (lambda d: d["model"].update(hidden=4096), "tensor convs.0.bias: the weights hold [256], the model config gives [4096]"),
    (lambda d: d["model"].update(layers=50), "model.layers 50 needs more tensors than the"),
    (lambda d: d["model"].update(hidden="x"), "model.hidden must be a positive integer, got 'x'"),
])  # fmt: skip
def test_a_config_that_does_not_match_its_weights_names_what_differs(trained, tmp_path, edit, message):
    """Were: a RuntimeError traceback from the first matmul, or "Error(s) in loading state_dict
    for GNN:" after allocating the edited config's model."""
    from trainsim.learn.train import Predictor

    _, pred = trained
    bad = _edited(pred, tmp_path, "bad", doc=edit)
    with pytest.raises(ModelError) as e:
        Predictor.load(bad)
    assert message in str(e.value)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(schema="trainsim.predtop-predictor/2"), "a trainsim.predtop-predictor/2 predictor (another trainsim version)"),
    (lambda d: d["model"].update(dropout=0.1), "model.dropout is not a model field this version knows"),
    (lambda d: d.update(part="backward"), "part must be one of train, forward, got 'backward'"),
    (lambda d: d["target"].update(transform="sqrt"), "target.transform must be one of log, log-per-flop, got 'sqrt'"),
])  # fmt: skip
def test_a_predictor_another_version_wrote_is_named_as_such(trained, tmp_path, edit, message):
    """Review 2026-12-03: were "predictor.json and its weights do not agree (ModelConfig.__init__()
    got an unexpected keyword argument ...)", a KeyError traceback from the dataset's rows (part),
    and predictions read with the log transform whatever the file said (transform)."""
    ds, pred = trained
    bad = _edited(pred, tmp_path, "bad", doc=edit)
    res = _run("predict", str(bad), str(ds))
    assert res.exit_code == 1 and isinstance(res.exception, ModelError), res.output
    assert message in str(res.exception)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(meta=[1, 2]), "meta must be an object, got list"),
    (lambda d: d["meta"].update(spec_ranges={"layers": 3}), "meta.spec_ranges must map each stage field to its [min, max]"),
    (lambda d: d["meta"].update(families="gpt"), "meta.families must be a list of family names"),
    (lambda d: d["meta"].update(split_specs={"test": "abc"}), "meta.split_ids and split_specs must map each split"),
    (lambda d: d["meta"].update(host="xeon"), "meta.host must be an object"),
])  # fmt: skip
def test_a_predictors_meta_of_another_shape_is_a_one_line_error(trained, tmp_path, edit, message):
    """Review 2026-12-03: were AttributeError/TypeError tracebacks in predict and search, and
    families "gpt" read as the families g, p and t."""
    ds, pred = trained
    bad = _edited(pred, tmp_path, "bad", doc=edit)
    for args in (("predict", str(bad), str(ds)), ("search", "--predictor", str(bad))):
        res = _run(*args)
        assert res.exit_code == 1 and isinstance(res.exception, ModelError), res.output
        assert message in str(res.exception)


def test_a_shape_mismatch_is_found_before_the_model_is_built(trained, tmp_path, monkeypatch):
    from trainsim.learn import train

    _, pred = trained
    bad = _edited(pred, tmp_path, "bad", doc=lambda d: d["model"].update(hidden=4096))
    built = []
    real = train.build_model
    monkeypatch.setattr(train, "build_model", lambda cfg: built.append(torch.empty(0).device) or real(cfg))
    with pytest.raises(ModelError, match="the model config gives"):
        train.Predictor.load(bad)
    assert [d.type for d in built] == ["meta"]  # shapes only: the edited config's model is never allocated


# --- finding 5: --out never replaces a file that is not a trainsim predictor ---------------------


def test_train_refuses_to_replace_a_foreign_predictor_file_and_replaces_its_own(trained, tmp_path):
    ds, _ = trained
    args = ("--model", "gcn", "--epochs", "1", "--fraction", "0.5")
    for name, content in (("predictor.json", '{"my": "notes"}\n'), ("predictor.safetensors", "weights of mine")):
        out = tmp_path / name
        out.mkdir()
        (out / name).write_text(content)
        res = _run("train", str(ds), "--out", str(out), *args)
        assert res.exit_code == 1 and f"{name} is not a predictor `trainsim stages train` wrote" in str(res.exception)
        assert (out / name).read_text() == content and len(list(out.iterdir())) == 1
    (tmp_path / "dir" / "predictor.safetensors").mkdir(parents=True)  # was found after the training
    res = _run("train", str(ds), "--out", str(tmp_path / "dir"), *args)
    assert res.exit_code == 1 and "predictor.safetensors is not a predictor" in str(res.exception)
    own = tmp_path / "own"
    for _ in range(2):  # a predictor of its own is replaced in place (the documented behaviour)
        assert _run("train", str(ds), "--out", str(own), *args).exit_code == 0
    (own / "predictor.json").unlink()  # a first save interrupted between its two files
    assert _run("train", str(ds), "--out", str(own), *args).exit_code == 0


def test_a_row_naming_a_graph_outside_the_folder_is_refused(tmp_path):
    from trainsim.errors import TraceFormatError
    from trainsim.learn.dataset import load_graph

    with pytest.raises(TraceFormatError, match=r"graph '../../../etc/passwd' is not a graph digest"):
        load_graph(tmp_path, "../../../etc/passwd")


# --- session 35: what still loaded without a word ----------------------------------------------


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["shape"].__setitem__(1, [-4, 8]), "node 1's shape [-4, 8] must be whole numbers >= 0"),
    (lambda d: d["shape"].__setitem__(1, [2.5, 8]), "node 1's shape [2.5, 8] must be whole numbers >= 0"),
    (lambda d: d["contract"].__setitem__(1, -1), "contract sizes must be whole numbers >= 0"),
    (lambda d: d["contract"].__setitem__(1, 2.5), "contract sizes must be whole numbers >= 0"),
])  # fmt: skip
def test_a_stage_graph_with_negative_or_fractional_dimensions_is_refused(tmp_path, edit, message):
    """A negative dimension had read as 1 (the features clamp each dimension at 1 before log2)."""
    doc = _chain(3, 8).to_json()
    edit(doc)
    folder = tmp_path / "ds"
    digest = _write_graph(folder, doc)
    with pytest.raises(TraceFormatError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_graph(folder, digest)


@pytest.mark.parametrize("dtype", ["float16", "int64"])
def test_predictor_weights_of_another_dtype_are_refused_at_load(trained, tmp_path, dtype):
    """float16 or integer weights had been cast to float32 by load_state_dict without a word."""
    from trainsim.learn.train import Predictor

    def cast(t):
        t["convs.0.lin.weight"] = t["convs.0.lin.weight"].to(getattr(torch, dtype))

    bad = _edited(trained[1], tmp_path, f"w-{dtype}", tensors=cast)
    with pytest.raises(ModelError, match=f"tensor convs.0.lin.weight is {dtype}, expected float32"):
        Predictor.load(bad)
