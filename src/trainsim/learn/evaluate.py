"""003 Tables V/VI on this machine: MRE against the training fraction, per model family.

For a family's stages (one dataset folder), a fixed permutation per ``seed`` gives the split:
the first 10 % validate (early stopping), the next ``fraction`` train, the rest test (003
§VIII-A: "10 % to 80 % … separate 10 % samples for validation and the remaining samples for
testing"); training sets of larger fractions contain those of smaller ones. Every
(family, fraction, model, seed) case is one trained predictor; its test MRE (Eq. 5), median and
90th-percentile relative error, training time and epochs are one row of ``cases.jsonl`` in the
results folder, appended as it finishes, so an interrupted evaluation resumes where it stopped.

The operator vocabulary is the union of the operators in the folder's graphs — graph structure
only, no latencies — so all cases of a family share the same features.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.bench.dataset import append_row, repair_tail
from trainsim.errors import ConfigError
from trainsim.learn.dataset import StageRow, iter_graphs, read_rows
from trainsim.learn.graphs import op_vocabulary
from trainsim.learn.models import MODEL_KINDS, GraphTensors, ModelConfig
from trainsim.learn.train import (
    Predictor,
    TrainConfig,
    featurize,
    mre_pct,
    train_members,
    train_predictor,
)

FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
VAL_FRACTION = 0.1
CASE_SCHEMA = "trainsim.predtop-case/1"


def split(n: int, fraction: float, *, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, val, test) indices: val = first 10 % of a seeded permutation, train = next ``fraction``."""
    if not 0.0 < fraction < 1.0 - VAL_FRACTION:  # at 0.9 no stage is left to test on
        raise ConfigError(f"training fraction must be in (0, {1 - VAL_FRACTION:g}): {VAL_FRACTION:g} validates "
                          f"and the rest tests; got {fraction:g}")  # fmt: skip
    perm = np.random.default_rng([seed, 7]).permutation(n)
    n_val = max(1, round(VAL_FRACTION * n))
    n_train = max(2, round(fraction * n))
    return perm[n_val : n_val + n_train], perm[:n_val], perm[n_val + n_train :]


class FamilyData:
    """A dataset folder's rows, graphs and featurized tensors (built once, per model layout)."""

    def __init__(self, folder: Path | str, vocab: Sequence[str] | None = None, *, part: str = "train",
                 input_features: bool = False, select: Callable[[StageRow], bool] | None = None,
                 what: str = "") -> None:  # fmt: skip
        """``select`` keeps only the rows it accepts (``what`` names that subset in errors)."""
        self.folder = Path(folder)
        self.part = part
        self.input_features = input_features
        self.rows: list[StageRow] = read_rows(self.folder)
        if select is not None:
            self.rows = [r for r in self.rows if select(r)]
        if not self.rows:
            raise ConfigError(
                f"{self.folder}: no measured stages{' ' + what if what else ''} (stages.jsonl is missing or empty)"
            )
        self.graphs = list(iter_graphs(self.folder, self.rows, part))
        self.vocab = list(vocab) if vocab is not None else op_vocabulary(self.graphs)
        self.latency_s = np.array([r.latency_s for r in self.rows])
        self._tensors: dict[bool, list[GraphTensors]] = {}

    def tensors(self, *, reach: bool) -> list[GraphTensors]:
        if reach not in self._tensors:
            self._tensors[reach] = featurize(
                self.graphs, self.vocab, reach=reach, inputs=self.input_features
            )
        return self._tensors[reach]


def heldout_errors(pred_s: np.ndarray, true_s: np.ndarray) -> dict[str, float]:
    """A case's test errors: MRE (003 Eq. 5), median, 90th percentile and max relative error (%)."""
    rel = np.abs(pred_s - true_s) / true_s * 100.0
    return {"mre_pct": mre_pct(pred_s, true_s), "median_re_pct": float(np.median(rel)),
            "p90_re_pct": float(np.percentile(rel, 90)), "max_re_pct": float(rel.max())}  # fmt: skip


def train_case(data: FamilyData, *, kind: str, fraction: float, seed: int = 0,
               train_config: TrainConfig = TrainConfig(), readout: str = "logsumexp",
               per_work: bool = True, parts: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
               log: Callable[[str], None] | None = None) -> tuple[Predictor, dict[str, Any]]:  # fmt: skip
    """Train one predictor of ``kind`` on ``fraction`` of ``data`` and test it (one case).

    ``parts`` gives the (train, validate, test) row indices instead of :func:`split`'s (the
    protocol's per-mesh predictors split each configuration's stages on their own)."""
    tr, va, te = parts if parts is not None else split(len(data.rows), fraction, seed=seed)
    if len(tr) < 2 or not len(va) or not len(te):
        raise ConfigError(
            f"{len(data.rows)} stages split {len(tr)}/{len(va)}/{len(te)} (train/validate/test at fraction "
            f"{fraction:g}): each part needs stages (train at least 2); measure more or change --fraction"
        )
    tensors = data.tensors(reach=kind == "dag_transformer")
    cfg = model_config(kind, tensors[0].x.shape[1], readout=readout, input_features=data.input_features)
    if train_config.members > 1:  # a bag over the labelled stages: validation first, then training
        lab = np.concatenate([va, tr])
        pred = train_members([tensors[i] for i in lab], data.latency_s[lab], len(va), model_config=cfg,
                             op_vocab=data.vocab, config=replace(train_config, seed=seed), part=data.part,
                             input_features=data.input_features, per_work=per_work, log=log)  # fmt: skip
    else:
        pred = train_predictor([tensors[i] for i in tr], data.latency_s[tr], [tensors[i] for i in va],
                               data.latency_s[va], model_config=cfg, op_vocab=data.vocab,
                               config=replace(train_config, seed=seed), part=data.part,
                               input_features=data.input_features, per_work=per_work, log=log)  # fmt: skip
    t0 = time.perf_counter()
    p = pred.predict_tensors([tensors[i] for i in te])
    infer_s = time.perf_counter() - t0
    # which stages it learned from: `stages predict` scores the held-out ones apart
    named = (("train", tr), ("val", va), ("test", te))
    pred.meta |= {"split_ids": {name: [data.rows[i].id for i in idx] for name, idx in named},
                  # by the stage itself, so a copied or moved folder, or another holding the same stages,
                  # is scored by what the predictor learned from (ids repeat across datasets, specs do not)
                  "split_specs": {name: [data.rows[i].spec.digest() for i in idx] for name, idx in named}}  # fmt: skip
    hist = pred.history
    assert hist is not None
    case = {
        "schema": CASE_SCHEMA, "family": data.rows[0].family, "fraction": fraction, "model": kind, "seed": seed,
        "readout": readout, "part": data.part, "features": _features(data.input_features), "target": _target(per_work), **heldout_errors(p, data.latency_s[te]),
        "train": len(tr), "val": len(va), "test": len(te), "train_s": hist.train_s, "infer_s": infer_s,
        "epochs": hist.epochs_run, "best_epoch": hist.best_epoch, "stopped": hist.stopped,
        "best_val_loss": hist.best_val_loss, "params": sum(q.numel() for q in pred.model.parameters()),
        "members": train_config.members, "stop": stop_of(train_config), "member_history": pred.meta.get("members"),
        "train_config": asdict(replace(train_config, seed=seed)),
    }  # fmt: skip
    return pred, case


def train_to_folder(dataset: Path, out: Path, *, kind: str, fraction: float, seed: int, readout: str,
                    per_work: bool, features: str, train_config: TrainConfig, what: str = "",
                    log: Callable[[str], None] | None = None, part: str = "train") -> dict[str, Any]:  # fmt: skip
    """``stages train``: one predictor trained on the dataset folder ``dataset`` and tested
    (:func:`train_case`), saved to ``out`` with what it rests on (the dataset, its families,
    spec ranges and host, the held-out MRE); returns the case, with ``predictor``.

    ``out`` is checked before training (``what`` names it in errors, as
    :func:`~trainsim.learn.train.predictor_folder` takes it); a failed or interrupted training
    leaves no folder it created behind. ``part``: the stage graph it learns from
    (:data:`~trainsim.learn.stages.PARTS`: the training step, or its forward). ``log`` is told the training's progress, a held-out set
    too small to trust, and, on Ctrl-C, that nothing was saved."""
    from trainsim.ir.serialize import remove_if_created_empty
    from trainsim.learn.dataset import dataset_host
    from trainsim.learn.provider import spec_ranges
    from trainsim.learn.train import predictor_folder

    say = log or (lambda _: None)
    existed = out.exists()
    predictor_folder(out, what)  # before training: a wrong --out should not cost the training time
    try:
        data = FamilyData(dataset, input_features=features_flag(features), part=part)
        pred, case = train_case(data, kind=kind, fraction=fraction, seed=seed, train_config=train_config,
                                readout=readout, per_work=per_work, log=log)  # fmt: skip
    except KeyboardInterrupt:
        say(f"nothing saved to {out}: the predictor is written when training ends")
        remove_if_created_empty(out, existed=existed)
        raise
    except Exception:
        remove_if_created_empty(out, existed=existed)  # no empty predictor folder left behind by a failed run
        raise
    if case["test"] < 10:
        say(f"warning: only {case['test']} stages were held out to test: their MRE is a rough figure "
            "(measure more stages, or train on a smaller --fraction)")  # fmt: skip
    pred.meta |= {"dataset": str(Path(dataset).resolve()), "fraction": fraction, "test_mre_pct": case["mre_pct"],
                  "families": sorted({r.family for r in data.rows}), "spec_ranges": spec_ranges(data.rows),
                  "host": dataset_host(dataset)}  # fmt: skip
    pred.save(out)
    case["predictor"] = str(out)
    return case


FEATURE_SETS = ("table1", "table1+work")


def model_config(kind: str, in_dim: int, *, readout: str, input_features: bool) -> ModelConfig:
    """003's settings for ``kind``; readouts ``work`` and ``sum`` read the FLOPs column of table1+work."""
    if readout == "sum" and input_features:
        return ModelConfig.for_kind(kind, in_dim, readout=readout, work_col=in_dim - 2)
    if readout == "work":
        if not input_features:
            raise ConfigError("readout 'work' needs the table1+work features")
        return ModelConfig.for_kind(kind, in_dim, readout=readout, work_col=in_dim - 2)
    return ModelConfig.for_kind(kind, in_dim, readout=readout)


def _target(per_work: bool) -> str:
    return "log-per-flop" if per_work else "log"


def _features(inputs: bool) -> str:
    return "table1+work" if inputs else "table1"


def features_flag(name: str) -> bool:
    """``table1`` (003 Table I) -> False; ``table1+work`` (plus graphs.INPUT_FEATURES) -> True."""
    if name not in FEATURE_SETS:
        raise ConfigError(f"features must be one of {', '.join(FEATURE_SETS)}, got {name!r}")
    return name == "table1+work"


def row_stop(c: Mapping[str, Any]) -> str:
    """A case row's bag early stopping (``TrainConfig.stop``): one model, or a row written before
    the choice existed, is ``each``."""
    if int(c.get("members", 1)) == 1:
        return "each"
    return str(c.get("stop") or (c.get("train_config") or {}).get("stop") or "each")


def stop_of(config: TrainConfig) -> str:
    """What a row trained with ``config`` records as its stop (see :func:`row_stop`)."""
    return config.stop if config.members > 1 else "each"


def _case_key(c: dict[str, Any]) -> tuple[str, float, str, int, str, str, str, str, int, str]:
    return (c["family"], round(float(c["fraction"]), 3), c["model"], int(c["seed"]),
            c.get("readout", "logsumexp"), c.get("part", "train"), c.get("features", "table1"),
            c.get("target", "log"), int(c.get("members", 1)), row_stop(c))  # fmt: skip


def read_cases(results: Path | str) -> list[dict[str, Any]]:
    from trainsim.bench.dataset import complete_lines
    from trainsim.errors import TraceFormatError

    path = Path(results) / "cases.jsonl"
    if not path.exists():
        return []
    try:
        rows = list(complete_lines(path))
    except TraceFormatError as e:
        raise ConfigError(f"{e} (delete the line to train that case again)") from None
    for n, row in rows:
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: line {n}: expected a JSON object, got {type(row).__name__}")
    return [row for _, row in rows]


def results_folder(results: Path | str, flag: str = "--resume") -> Path:
    """``results`` as a folder to write cases into, created if missing (one-line errors)."""
    from trainsim.ir.serialize import output_folder

    return output_folder(results, f"{flag} ")


# the setting a saved predictor was trained under, beside its family, model and seed; the
# default (the suite's) keeps the plain folder name
_DEFAULT_SETTING = {"readout": "logsumexp", "part": "train", "features": "table1+work", "target": "log-per-flop",
                    "members": 1, "stop": "each"}


def predictor_setting(*, readout: str, part: str, features: str, target: str, members: int,
                      stop: str) -> dict[str, Any]:  # fmt: skip
    return {"readout": readout, "part": part, "features": features, "target": target, "members": int(members),
            "stop": stop if members > 1 else "each"}  # fmt: skip


def predictor_dir(results: Path | str, family: str, kind: str, seed: int, setting: Mapping[str, Any]) -> Path:
    """Where :func:`evaluate` saves (and the suite finds) the predictor of one case: the
    setting is in the name unless it is the default, so predictors trained under different
    readouts, features or bags never replace one another."""
    name = f"{family}-{kind}-s{seed}"
    diff = [f"{k}-{v}" for k, v in setting.items() if _DEFAULT_SETTING.get(k) != v]
    return Path(results) / "predictors" / (name if not diff else name + "-" + "-".join(diff).replace("+", "_"))


def check_kinds(kinds: Sequence[str]) -> None:
    for k in kinds:
        if k not in MODEL_KINDS:
            raise ConfigError(f"unknown model {k!r}; known: {', '.join(MODEL_KINDS)}")


def evaluate(folders: Mapping[str, Path | str], results: Path | str, *, fractions: Sequence[float] = FRACTIONS,
             kinds: Sequence[str] = MODEL_KINDS, seeds: Sequence[int] = (0,), readout: str = "logsumexp",
             part: str = "train", input_features: bool = True, per_work: bool = True,
             train_config: TrainConfig = TrainConfig(), save_fraction: float | None = 0.3,
             log: Callable[[str], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run (or resume) every case; return :func:`summarize`'s tables.

    ``folders`` maps a family name to its dataset folder. Predictors of ``save_fraction`` are
    saved under :func:`predictor_dir` (``results/predictors/<family>-<model>-s<seed>``, the
    setting appended when it is not the default).
    """
    check_kinds(kinds)
    kinds, fractions, seeds = tuple(dict.fromkeys(kinds)), tuple(dict.fromkeys(fractions)), tuple(dict.fromkeys(seeds))
    results = results_folder(results)
    path = results / "cases.jsonl"
    repair_tail(path)
    done = {_case_key(c) for c in read_cases(results)}
    setting = predictor_setting(readout=readout, part=part, features=_features(input_features),
                                target=_target(per_work), members=train_config.members,
                                stop=stop_of(train_config))  # fmt: skip
    for family, folder in folders.items():
        data = FamilyData(folder, part=part, input_features=input_features)
        for seed in seeds:
            for fraction in fractions:
                for kind in kinds:
                    key = _case_key({"family": family, "fraction": fraction, "model": kind, "seed": seed,
                                     "readout": readout, "part": part, "features": _features(input_features),
                                     "target": _target(per_work), "members": train_config.members,
                                     "stop": stop_of(train_config)})  # fmt: skip
                    if key in done:
                        continue
                    if log:
                        log(f"{family} {fraction:.0%} {kind}: training ({len(data.rows)} stages, at most "
                            f"{train_config.epochs} epochs)…")  # fmt: skip
                    pred, case = train_case(data, kind=kind, fraction=fraction, seed=seed,
                                            train_config=train_config, readout=readout, per_work=per_work)  # fmt: skip
                    case["family"] = family
                    append_row(path, case)
                    done.add(key)
                    if log:
                        log(f"{family} {fraction:.0%} {kind}: MRE {case['mre_pct']:.2f} % "
                            f"({case['train_s']:.0f} s, {case['epochs']} epochs, best epoch {case['best_epoch'] + 1})")  # fmt: skip
                    if save_fraction is not None and abs(fraction - save_fraction) < 1e-9:
                        pred.meta |= {
                            "family": family,
                            "families": [family],  # what stages predict/search check
                            "fraction": fraction,
                            "dataset": str(Path(folder).resolve()),
                            "setting": setting,
                        }
                        pred.save(predictor_dir(results, family, kind, seed, setting))
    return summarize(
        read_cases(results), readout=readout, part=part, features=_features(input_features),
        target=_target(per_work), members=train_config.members, stop=stop_of(train_config),
    )


def summarize(cases: Sequence[dict[str, Any]], *, readout: str = "logsumexp", part: str = "train",
              features: str = "table1+work", target: str = "log-per-flop",
              members: int = 1, stop: str = "each") -> dict[str, Any]:  # fmt: skip
    """Tables V/VI: MRE per (family, fraction) and model (mean over seeds), winners, acceptance."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    times: dict[str, list[float]] = {}
    for c in cases:
        if (c.get("readout", "logsumexp"), c.get("part", "train"), c.get("features", "table1"),
                c.get("target", "log"), int(c.get("members", 1)), row_stop(c)) != (readout, part, features, target,
                                                                                    members, stop):  # fmt: skip
            continue
        cell = table.setdefault(c["family"], {}).setdefault(f"{c['fraction']:.1f}", {})
        cell.setdefault(c["model"], [])  # type: ignore[arg-type]
        cell[c["model"]].append(c["mre_pct"])  # type: ignore[attr-defined]
        times.setdefault(c["model"], []).append(c["train_s"])
    mean_table = {f: {fr: {m: statistics.fmean(v) for m, v in cell.items()} for fr, cell in rows.items()}  # type: ignore[arg-type]
                  for f, rows in table.items()}  # fmt: skip
    wins = total = 0
    for rows in mean_table.values():
        for cell in rows.values():
            if {"dag_transformer", "gcn", "gat"} <= set(cell):
                total += 1
                wins += cell["dag_transformer"] < min(cell["gcn"], cell["gat"])
    at30 = {f: rows.get("0.3", {}).get("dag_transformer") for f, rows in mean_table.items()}
    max_train = {m: max(v) for m, v in times.items()}
    return {
        "mre_pct": mean_table, "dag_transformer_wins": wins, "cases_compared": total,
        "win_rate": wins / total if total else None, "dag_transformer_mre_at_30pct": at30,
        "max_train_s": max_train,
        "acceptance": {
            "mre_at_30pct_le_4": bool(at30) and all(v is not None and v <= 4.0 for v in at30.values()),
            "wins_ge_75pct": bool(total) and wins / total >= 0.75,
            "train_le_15min": bool(max_train) and max(max_train.values()) <= 900.0,
        },
    }  # fmt: skip


__all__ = ["FEATURE_SETS", "FRACTIONS", "FamilyData", "check_kinds", "evaluate", "features_flag", "predictor_dir", "predictor_setting", "read_cases", "results_folder", "split", "summarize", "train_case", "train_to_folder"]
