"""``trainsim stages``: black-box stage-latency prediction (paper 003, PredTOP).

    trainsim stages collect DIR --family gpt --count 300     # measure random stages (resumable)
    trainsim stages train DIR --model dag_transformer --out P  # fit a predictor on a dataset
    trainsim stages predict P DIR                              # predict a dataset's stages, with errors
    trainsim stages predict P --stage family=gpt,layers=2,shard=2  # predict one stage you describe
    trainsim stages search --family gpt --devices 8 --microbatches 16 --predictor P

``search`` finds the best pipeline plan (003 Eq. 4, every stage cut and submesh) of a search
model with stage latencies from a trained predictor (``--predictor``: nothing is measured) or
from a measured dataset (``--measured``: Alpa's full profiling).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from trainsim.cli.main import app
from trainsim.cli.output import Format, emit_json, stderr

stages_app = typer.Typer(
    name="stages",
    help="Stage-latency prediction with a DAG Transformer (003): collect, train, predict, search.",
    no_args_is_help=True,
)
app.add_typer(stages_app, name="stages")


# The search model's fields as options (None: the family's fixed model keeps its value), by field
_MODEL_HELP = {"layers": "layers to pipeline", "hidden": "hidden size", "heads": "attention heads",
               "seq": "sequence length", "micro_batch": "sequences per micro-batch", "vocab": "vocabulary",
               "experts": "experts (moe)", "group_size": "tokens per gating group (moe)",
               "max_stage_layers": "most layers one stage holds"}  # fmt: skip


def _model_opt(field: str) -> Any:
    """The option of one search-model field, as `stages collect` and `stages search` take it."""
    flag = f"--{field.replace('_', '-')}"
    if field == "shards":
        return typer.Option(None, flag, help="Search model: devices a stage may use, comma-separated (default 1,2,4)")
    return typer.Option(None, flag, min=1, help=f"Search model: {_MODEL_HELP[field]} (default: the family's fixed model's).")


def _overrides(scope: dict[str, Any]) -> dict[str, Any]:
    """The search-model options given, by field (``--shards`` parsed), from a command's
    ``locals()``."""
    from trainsim.cli.usage import usage
    from trainsim.errors import UsageError
    from trainsim.learn.provider import MODEL_FLAGS, parse_shards

    out = {k: scope[k] for k in MODEL_FLAGS if scope[k] is not None}
    if "shards" in out:
        with usage():
            out["shards"] = parse_shards(out["shards"])
        if any(x < 1 for x in out["shards"]):
            raise UsageError(f"--shards {scope['shards']}: must be at least 1")
    if scope["family"] != "moe" and {"experts", "group_size"} & set(out):
        raise UsageError(f"--experts/--group-size apply to the moe family, not {scope['family']!r}")
    return out


def _flags(overrides: dict[str, Any]) -> list[str]:
    """The options that make these overrides, as argv words."""
    out = []
    for k, v in overrides.items():
        out += [f"--{k.replace('_', '-')}", ",".join(map(str, v)) if k == "shards" else str(v)]
    return out


@stages_app.command("collect")
def collect(
    folder: Path = typer.Argument(..., metavar="DIR", help="Dataset folder (stages.jsonl, graphs/); resumes what is there."),
    family: str = typer.Option(..., "--family", help="gpt or moe."),
    count: int | None = typer.Option(None, "--count", min=1, help="Random stages the folder should hold (default 300; a total: a resumed folder measures what it lacks; not with --search-set or --protocol, which measure fixed sets)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Sampler seed (a folder keeps one sampler)."),
    search_set: bool = typer.Option(False, "--search-set", help="Measure every candidate stage of the family's search model instead."),
    protocol: bool = typer.Option(False, "--protocol", help="Measure 003's protocol sets instead: every stage of one model under each 003 Table III configuration (docs/predtop.md)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table (a summary line) or json (the counts); on stdout either way."),
    layers: int | None = _model_opt("layers"),
    hidden: int | None = _model_opt("hidden"),
    heads: int | None = _model_opt("heads"),
    seq: int | None = _model_opt("seq"),
    micro_batch: int | None = _model_opt("micro_batch"),
    vocab: int | None = _model_opt("vocab"),
    experts: int | None = _model_opt("experts"),
    group_size: int | None = _model_opt("group_size"),
    max_stage_layers: int | None = _model_opt("max_stage_layers"),
    shards: str | None = _model_opt("shards"),
) -> None:  # fmt: skip
    """Measure stage latencies on this CPU (one core, single-threaded XLA; restarts itself with that environment).

    With --search-set, the --layers/--hidden/... options make the search model your own (as
    `stages search` takes them); its candidates go to a folder of their own."""
    from trainsim.cli.main import _state
    from trainsim.errors import UsageError
    from trainsim.learn.dataset import main

    if family not in ("gpt", "moe"):  # argparse in the collector would print its own usage text
        raise UsageError(f"--family must be gpt or moe, got {family!r}")
    if search_set and protocol:
        raise UsageError("--search-set and --protocol are two different stage sets: give one")
    if count is not None and (search_set or protocol):
        raise UsageError(f"--count is for random stages; {'--search-set' if search_set else '--protocol'} "
                         "measures a fixed set (drop --count)")  # fmt: skip
    model = _overrides(locals())
    if model and not search_set:
        raise UsageError(f"--{next(iter(model)).replace('_', '-')} sets the search model: it goes with --search-set")
    if model:  # refused here, before the collector restarts itself, when a candidate stage is invalid
        from trainsim.learn.provider import search_model

        search_model(family, **model)
    argv = [str(folder), "--family", family, "--count", str(count or 300), "--seed", str(seed), "--format", fmt.value]
    argv += ["--search", *_flags(model)] if search_set else ["--protocol"] if protocol else []
    argv += ["--debug"] if _state["debug"] else []  # the collector restarts as its own process
    rc = main(argv)
    if rc == 130:  # interrupted in this process (its environment already single-threaded): it said so
        _state["interrupt_said"] = True
    raise typer.Exit(rc)


@stages_app.command("train")
def train(
    dataset: Path = typer.Argument(..., metavar="DIR", help="A measured stage dataset folder."),
    out: Path = typer.Option(..., "--out", help="Folder for predictor.json + predictor.safetensors."),
    model: str = typer.Option("dag_transformer", "--model", help="dag_transformer, gcn or gat."),
    fraction: float = typer.Option(0.8, "--fraction", help="Share of the stages to train on (10 % more validate; the rest test). 003's protocol, and `validate predtop`, train on 0.3 and less."),
    epochs: int = typer.Option(250, "--epochs", min=1, help="Most epochs; training stops early after --patience epochs without a better validation loss and keeps the best."),
    patience: int | None = typer.Option(None, "--patience", min=1, help="Epochs without a better validation loss before stopping (default: min(80, epochs//3), the suite's 80 at 250 epochs; 003's protocol: --epochs 500 --patience 200)."),
    features: str = typer.Option("table1+work", "--features", help="table1 (003 Table I) or table1+work (plus operand sizes, FLOPs, contraction)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Split and initialisation seed."),
    part: str = typer.Option("train", "--part", help="The stage graph to learn from: train (the training step's jaxpr, default) or forward (its forward alone); `stages predict` reads the same part."),
    readout: str = typer.Option("logsumexp", "--readout", help="Pooling: logsumexp (default), sum (node costs added in seconds), add (003 Eq. 2), work."),
    members: int = typer.Option(1, "--members", min=1, help="Train a cross-validated bag of this many models (each early-stopped on its own validation fold)."),
    stop: str = typer.Option("each", "--stop", help="With --members: stop each member at its own fold's best epoch (each), or all at the epoch of the lowest mean validation loss (common)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
) -> None:  # fmt: skip
    """Train one predictor and report its test error (003 Eq. 5 MRE)."""
    from dataclasses import replace

    from trainsim.cli.usage import one_of, usage
    from trainsim.errors import ConfigError, UsageError
    from trainsim.learn.evaluate import VAL_FRACTION, features_flag, train_to_folder
    from trainsim.learn.models import MODEL_KINDS
    from trainsim.learn.protocol import target_of
    from trainsim.learn.stages import PARTS
    from trainsim.learn.train import TrainConfig, check_stop

    with usage():  # the options alone, before the dataset is read
        check_stop(stop, members)
        features_flag(features)
        per_work = target_of(readout) == "log-per-flop"  # an unknown readout fails before training
    one_of(model, MODEL_KINDS, "--model")
    one_of(part, PARTS, "--part")
    if not 0.0 < fraction < 1.0 - VAL_FRACTION:  # at 0.9 no stage is left to test on
        raise UsageError(f"--fraction must be in (0, {1 - VAL_FRACTION:g}): {VAL_FRACTION:g} validates and the "
                         f"rest tests; got {fraction:g}")  # fmt: skip
    if out.resolve() == dataset.resolve() or dataset.resolve() in out.resolve().parents:
        raise ConfigError(f"--out {out}: inside the dataset folder {dataset}; give a folder of its own")
    if not dataset.exists():  # FamilyData would say "stages.jsonl is missing" of a mistyped folder
        raise ConfigError(f"{dataset}: no such dataset folder (one `trainsim stages collect` writes)")
    wait = patience if patience is not None else max(1, min(TrainConfig().patience, epochs // 3))
    cfg = replace(TrainConfig(), epochs=epochs, patience=wait, members=members, stop=stop)
    case = train_to_folder(dataset, out, kind=model, fraction=fraction, seed=seed, readout=readout, per_work=per_work,
                           features=features, train_config=cfg, what="--out ", log=stderr.print, part=part)  # fmt: skip
    if fmt is Format.JSON:
        emit_json(case)
        return
    Console().print(
        f"{model} on {case['train']} stages ({case['epochs']} epochs"
        + (f" over its {members} members" if members > 1 else "") + f", {case['train_s']:.0f} s): "
        f"test MRE {case['mre_pct']:.2f} % (median {case['median_re_pct']:.2f}, p90 "
        f"{case['p90_re_pct']:.2f}) over {case['test']} stages -> {out}"
    )


@stages_app.command("predict")
def predict(
    predictor: Path = typer.Argument(..., metavar="PREDICTOR", help="A folder written by `trainsim stages train`."),
    dataset: Path | None = typer.Argument(None, metavar="DIR", help="Stage dataset folder whose stages to predict (or --stage)."),
    stage: list[str] | None = typer.Option(None, "--stage", metavar="FIELD=VALUE,...", help="Predict this one stage instead of a dataset (repeatable): family=gpt|moe,layers=N and any other stage field (hidden, heads, seq, micro-batch, shard, first-layer, embed, head, vocab, ffn-mult; moe: experts, group-size, capacity-factor); the shape fields not given are the family's search model's (hidden 512, 8 heads, seq 256, micro-batch 2)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
) -> None:  # fmt: skip
    """Predict every stage of a dataset; where it holds measurements, report the error per stage.

    With --stage instead of DIR: predict stages you describe, e.g. `--stage
    family=gpt,layers=2,hidden=768,heads=12,shard=2`; each stage's graph is traced as `stages
    collect` builds it (nothing runs, nothing is measured)."""
    from trainsim.cli.usage import usage
    from trainsim.errors import UsageError
    from trainsim.learn.predictions import predict_dataset

    if dataset is not None and stage:
        raise UsageError(f"{dataset} and --stage: give a dataset folder or --stage stages, not both")
    if dataset is None and not stage:
        raise UsageError("give a dataset folder DIR, or --stage FIELD=VALUE,... for a stage you describe")
    if stage:
        from trainsim.learn.provider import parse_stage

        with usage():  # a stage described on the command line: its value alone, before the predictor loads
            specs = [parse_stage(t) for t in stage]
        _predict_described(_load_predictor(predictor), predictor, specs, fmt)
        return
    assert dataset is not None
    pred = _load_predictor(predictor)
    doc = predict_dataset(pred, predictor, dataset, warn=stderr.print)
    cases, by_split = doc["stages"], doc["by_split"]
    if fmt is Format.JSON:
        emit_json(doc)
        return
    parts = ", ".join(f"{k} {v['stages']}: {v['mre_pct']:.2f} %" for k, v in by_split.items())
    seen = set(by_split) - {"unseen"}  # "unknown": it may have learned from them
    title = f"{len(cases)} stages, {pred.config.kind}: MRE {doc['mre_pct']:.2f} %"
    if seen:  # some of these stages trained or validated the predictor: the all-stage MRE flatters it
        title += (f" (by split: {parts}; the held-out figure is test's)" if "unknown" not in by_split else
                  " (the predictor does not record which of these stages it trained on: the MRE may count them)")
    t = Table(title=title)
    for col in ("stage", "layers", "h×s×b", "tp", "split", "meas ms", "pred ms", "err %"):
        t.add_column(col, justify="left" if col == "stage" else "right", no_wrap=True)
    shown = cases if len(cases) <= 40 else sorted(cases, key=lambda c: -abs(c["err_pct"]))[:40]
    for c in shown:
        s = c["spec"]
        t.add_row(c["id"], _layers_cell(s), f"{s['hidden']}×{s['seq']}×{s['micro_batch']}", str(s["shard"]), c["split"], f"{c['measured_s'] * 1e3:.2f}", f"{c['predicted_s'] * 1e3:.2f}",
                  f"{c['err_pct']:+.1f}")  # fmt: skip
    Console().print(t)
    if len(cases) > 40:
        stderr.print(f"(the 40 largest errors of {len(cases)} stages; every stage in --format json)")
    stderr.print("layers: e+ with the embedding, +h with the head and loss; h×s×b: hidden, sequence, micro-batch; "
                 "tp: the stage's shard, its tensor/expert-parallel degree")  # fmt: skip
    stderr.print(f"provenance: {doc['provenance']}")


def _load_predictor(folder: Path) -> Any:
    """``Predictor.load(folder)``, a missing or mistyped folder refused first: the learning
    stack it imports (torch) takes seconds to load, 10-20 s on a busy machine, before the
    one-line error would come."""
    from trainsim.errors import ConfigError

    if not folder.exists():
        raise ConfigError(f"{folder}: no such folder; expected a predictor folder (one written by `trainsim stages train`)")
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder}: not a predictor folder (one written by `trainsim stages train`)")
    if not (folder / "predictor.json").exists():
        raise ConfigError(f"{folder}: no predictor.json; train a predictor first")
    from trainsim.learn.train import Predictor

    return Predictor.load(folder)


def _predict_described(pred: Any, predictor: Path, specs: list[Any], fmt: Format) -> None:
    """``stages predict --stage``: the predictor's latency of each described stage, its graph
    traced as `stages collect` builds it (no dataset, nothing measured)."""
    from trainsim.learn.predictions import predict_stages

    with _graph_progress(len(specs) > 1) as progress:
        doc = predict_stages(pred, predictor, specs, progress=progress)
    cases = doc["stages"]
    for c in cases:
        why = [f"the predictor was trained on stages of {c['outside_training']}"] if c["outside_training"] else []
        why += [f"its graph has operators no training stage had ({', '.join(c['unseen_ops'])})"] if c["unseen_ops"] else []
        if why:
            stderr.print(f"warning: stage {c['id']}: {'; '.join(why)}: its latency is extrapolated")
    if fmt is Format.JSON:
        emit_json(doc)
        return
    t = Table(title=f"{len(cases)} stage{'s' * (len(cases) != 1)} predicted by {pred.config.kind} (nothing measured)")
    for col in ("stage", "family", "layers", "h×s×b", "tp", "split", "pred ms"):
        t.add_column(col, justify="left" if col in ("stage", "family") else "right", no_wrap=True)
    for c in cases:
        s = c["spec"]
        t.add_row(c["id"], s["family"], _layers_cell(s), f"{s['hidden']}×{s['seq']}×{s['micro_batch']}", str(s["shard"]),
                  c["split"], f"{c['predicted_s'] * 1e3:.2f}")  # fmt: skip
    Console().print(t)
    for c, s in zip(cases, specs, strict=True):
        stderr.print(f"{c['id']}: {s}")
    stderr.print(f"provenance: {doc['provenance']}")


def _layers_cell(s: dict[str, Any]) -> str:
    """A stage's layers as the predict table shows them: e+ with the embedding, +h with the head."""
    return "e+" * bool(s.get("embed")) + str(s["layers"]) + "+h" * bool(s.get("head"))


@contextlib.contextmanager
def _graph_progress(on: bool) -> Iterator[Any]:
    """A transient bar on stderr while a search traces its stages' graphs (a terminal only)."""
    import sys

    if not on or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import Progress

    with Progress(transient=True, console=stderr) as bar:
        task = bar.add_task("tracing stage graphs", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@stages_app.command("search")
def search(
    family: str = typer.Option("gpt", "--family", help="Search model: gpt or moe (8 layers; stages of 1-4 layers on 1, 2 or 4 devices)."),
    devices: int = typer.Option(8, "--devices", min=1, help="Devices for the whole pipeline (the plan may use fewer)."),
    microbatches: int = typer.Option(16, "--microbatches", min=1, help="Micro-batches per iteration (003 Eq. 4's B)."),
    predictor: Path | None = typer.Option(None, "--predictor", help="Predict stage latencies with this predictor (nothing measured)."),
    measured: Path | None = typer.Option(None, "--measured", help="Look stage latencies up in this measured dataset (full profiling)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
    layers: int | None = _model_opt("layers"),
    hidden: int | None = _model_opt("hidden"),
    heads: int | None = _model_opt("heads"),
    seq: int | None = _model_opt("seq"),
    micro_batch: int | None = _model_opt("micro_batch"),
    vocab: int | None = _model_opt("vocab"),
    experts: int | None = _model_opt("experts"),
    group_size: int | None = _model_opt("group_size"),
    max_stage_layers: int | None = _model_opt("max_stage_layers"),
    shards: str | None = _model_opt("shards"),
) -> None:  # fmt: skip
    """Best pipeline plan (003 Eq. 4) with predicted or measured stage latencies.

    The search model is the family's fixed one unless --layers/--hidden/... change it: then its
    candidate stages are predicted (--predictor; their graphs are traced, nothing runs) or looked
    up in a folder that `stages collect --search-set` with the same options measured."""
    from trainsim.errors import UsageError
    from trainsim.learn.predictions import search_provider
    from trainsim.learn.provider import (
        SEARCH_MODELS,
        PredictedStages,
        is_default,
        search_model,
        search_pipeline,
    )

    if (predictor is None) == (measured is None):
        raise UsageError("give exactly one of --predictor DIR or --measured DIR")
    if family not in SEARCH_MODELS:
        raise UsageError(f"--family must be one of {', '.join(sorted(SEARCH_MODELS))}, got {family!r}")
    given = _overrides(locals())
    m = search_model(family, **given)
    own = not is_default(m)
    collect = " ".join(["trainsim stages collect DIR --family", family, "--search-set", *_flags(given)])
    if predictor is not None and not (predictor / "predictor.json").exists():
        _load_predictor(predictor)  # its one-line error, before the learning stack loads
    provider, provenance = search_provider(m, predictor=predictor, measured=measured, collect=collect, warn=stderr.print)
    with _graph_progress(isinstance(provider, PredictedStages)) as progress:
        res = search_pipeline(m, provider, devices=devices, microbatches=microbatches, progress=progress)
    res["provenance"] = provenance
    if fmt is Format.JSON:
        emit_json(res)
        return
    stderr.print(
        f"{family}: {res['candidates']} candidate stages from {provider.name} in "
        f"{res['timings_s']['latencies']:.2f} s; plan search {res['timings_s']['optimize'] * 1e3:.1f} ms"
    )
    used = sum(d for _, _, d in res["stages"])
    t = Table(title=f"best plan on {devices} devices{f' (uses {used})' if used != devices else ''}, "
                    f"B = {microbatches}: {res['plan']}")  # fmt: skip
    for col in ("stage", "layers", "devices", "latency"):
        t.add_column(col, justify="right")
    for i, ((a, b, d), lat) in enumerate(zip(res["stages"], res["stage_latency_s"], strict=True)):
        t.add_row(str(i), f"{a}-{b - 1}", str(d), f"{lat * 1e3:.2f} ms")
    Console().print(t)
    Console().print(f"iteration time (Eq. 4): {res['iteration_time_s'] * 1e3:.2f} ms ({res['provenance']})")
    which = "your own" if own else "fixed, 003 §VIII-B; --layers/--hidden/... change it"
    moe = f", {m.experts} experts, groups of {m.group_size}" if m.family == "moe" else ""
    stderr.print(f"search model ({which}): {m.family}, {m.layers} layers, hidden {m.hidden}, {m.heads} heads, "
                 f"seq {m.seq}, micro-batch {m.micro_batch}, vocabulary {m.vocab}{moe}; stages of up to "
                 f"{m.max_stage_layers} layers on {', '.join(map(str, m.shards))} devices; a stage's devices are its "
                 "tensor/expert-parallel shards, timed as this CPU core runs one shard; communication between stages "
                 "is not modelled (Eq. 4)")  # fmt: skip
