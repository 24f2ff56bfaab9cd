"""The ``predtop`` validation suite: stage-latency prediction on stages measured on this machine.

Data: the stage datasets shipped in ``trainsim/learn/data/predtop/`` (``gpt/``, ``moe/``: random
stages; ``gpt-search/``, ``moe-search/``: every candidate stage of the search-integration models),
or ``dataset=PATH`` holding the same folders (e.g. a fresh collection on another host). For every
family, training fraction and model (DAG Transformer, GCN, GAT) one predictor is trained and
tested (:mod:`trainsim.learn.evaluate`, 003 Tables V/VI); then, when the ``*-search`` folders
exist, the pipeline search is run with full profiling, with the 30 %-trained family predictors
and with 003 §VI's sampled-candidates workflow (:func:`trainsim.learn.provider.run_search_integration`).

Per case: the test MRE (``abs_err_pct``). Summary: the DAG Transformer's MREs, how often it beats
both baselines, the issue's acceptance (MRE ≤ 4 % at 30 % training on both families; better than
GCN and GAT in ≥ 75 % of the (family, fraction) cases; training ≤ 15 min), and the search figures.
Defaults: fraction 0.3 only (six predictors, ~1 hour on this 2-core machine: the DAG
Transformer trains up to its 15-minute budget); ``fractions=all`` runs Tables V/VI's
full sweep (10 %–80 %), ``resume=PATH`` (``--resume``) makes it resumable and keeps the predictors.

``protocol=True`` (``--protocol``) runs 003's own protocol instead (:mod:`trainsim.learn.protocol`):
the ``gpt-003/`` and ``moe-003/`` sets (one model, every stage of 1–5 / 1–3 layers under each of
003 Table III's six configurations), a predictor per configuration, fractions 10, 30 and 80 %.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainsim.errors import ConfigError

FAMILIES = ("gpt", "moe")


def _log(msg: str) -> None:  # per case: the suite trains for minutes to an hour
    print(f"[predtop] {msg}", file=sys.stderr, flush=True)


def packaged_dataset() -> Path:
    return Path(__file__).resolve().parent / "data" / "predtop"


def _parse_fractions(text: str | None) -> tuple[float, ...]:
    from trainsim.learn.evaluate import FRACTIONS, VAL_FRACTION

    if text is None:
        return (0.3,)
    if text == "all":
        return FRACTIONS
    try:
        out = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(
            f"fractions must be 'all' or comma-separated numbers, got {text!r}"
        ) from None
    bad = [f for f in out if not 0.0 < f < 1.0 - VAL_FRACTION]  # refused before the first training
    if bad:
        raise ConfigError(f"--fractions {text}: each training fraction must be in (0, {1 - VAL_FRACTION:g}) "
                          f"({VAL_FRACTION:g} validates, the rest tests), got {bad[0]:g}")  # fmt: skip
    return out


def check_predtop_options(*, resume: str | None = None, fractions: str | None = None, models: str | None = None,
                          epochs: int | None = None, features: str = "table1+work", protocol: bool = False,
                          readout: str = "logsumexp", members: int = 1, per: str | None = None,
                          stop: str = "each") -> None:  # fmt: skip
    """:func:`run_predtop_suite`'s options on their own, before any dataset is read or any
    training: a ConfigError naming the option (the command maps it to a usage error)."""
    from trainsim.learn.evaluate import check_kinds, features_flag
    from trainsim.learn.protocol import PER, PROTOCOL_EPOCHS, target_of
    from trainsim.learn.train import TrainConfig, check_stop

    target_of(readout)  # an unknown readout fails here, before any training
    default_epochs = PROTOCOL_EPOCHS if protocol else TrainConfig().epochs
    if epochs is not None and epochs != default_epochs and resume:
        # a results folder keys its cases without the epoch count: a quick check's would be read
        # back as the suite's figures (and overwrite its saved predictors)
        raise ConfigError(f"--epochs {epochs} with --resume would mix a quick check into {resume}'s results "
                          f"(the suite trains {default_epochs} epochs): drop one of them")  # fmt: skip
    if members < 1:
        raise ConfigError(f"--members must be at least 1, got {members}")
    check_stop(stop, members)
    if per is not None and not protocol:
        raise ConfigError("--per applies to --protocol (003's per-configuration or per-mesh predictors)")
    if per is not None and per not in PER:
        raise ConfigError(f"--per must be one of {', '.join(PER)}, got {per!r}")
    features_flag(features)
    if protocol and features != "table1+work":
        raise ConfigError("--protocol trains on the table1+work features only")
    if models:
        check_kinds(models.split(","))
    if fractions is not None:
        _parse_fractions(fractions)


def run_predtop_suite(data_dir: Path, *, dataset: str | None = None, resume: str | None = None,
                      fractions: str | None = None, models: str | None = None, seed: int = 0,
                      search: bool = True, epochs: int | None = None,
                      features: str = "table1+work", protocol: bool = False,
                      readout: str = "logsumexp", members: int = 1, per: str | None = None,
                      stop: str = "each") -> dict[str, Any]:  # fmt: skip
    """Train and test the stage-latency predictors; run the search integration (module docstring).

    ``data_dir`` (the shared data folder) is not read: the stages are this machine's own
    measurements (``dataset``, default: the packaged ones). ``protocol`` runs 003's own protocol
    instead (:func:`run_protocol`). ``readout`` is the models' pooling (``sum`` trains on the log
    target, the others on the per-FLOP one: :func:`trainsim.learn.protocol.target_of`);
    ``members`` > 1 trains each predictor as a cross-validated bag (:func:`trainsim.learn.train.train_members`).
    ``per`` (protocol only): a predictor per ``config`` (default) or per ``mesh`` (003 §VI).
    ``stop``: a bag's early stopping, ``each`` member on its own fold or one ``common`` epoch
    (:class:`trainsim.learn.train.TrainConfig`).
    """
    from trainsim.learn.protocol import target_of

    check_predtop_options(resume=resume, fractions=fractions, models=models, epochs=epochs, features=features,
                          protocol=protocol, readout=readout, members=members, per=per, stop=stop)  # fmt: skip
    if protocol:
        return run_protocol(dataset=dataset, resume=resume, fractions=fractions, models=models, seed=seed,
                            epochs=epochs, readout=readout, members=members, per=per or "config", stop=stop)  # fmt: skip
    from trainsim.learn.evaluate import (
        evaluate,
        features_flag,
        predictor_dir,
        predictor_setting,
        read_cases,
        results_folder,
        row_stop,
        stop_of,
    )
    from trainsim.learn.models import MODEL_KINDS
    from trainsim.learn.train import Predictor, TrainConfig
    from trainsim.validate.registry import error_summary

    root = Path(dataset) if dataset else packaged_dataset()
    folders = {f: root / f for f in FAMILIES if (root / f / "stages.jsonl").exists()}
    if not folders:
        raise ConfigError(f"no stage datasets under {root} (expected gpt/ and moe/ with stages.jsonl); "
                          "collect them with `trainsim stages collect DIR/gpt --family gpt` (and DIR/moe --family moe)")  # fmt: skip
    kinds = tuple(dict.fromkeys(models.split(","))) if models else MODEL_KINDS
    inputs = features_flag(features)
    fr = tuple(dict.fromkeys(_parse_fractions(fractions)))
    tc = TrainConfig(epochs=epochs, members=members, stop=stop) if epochs else TrainConfig(members=members, stop=stop)
    setting = predictor_setting(readout=readout, part="train", features=features, target=target_of(readout),
                                members=members, stop=stop_of(tc))  # fmt: skip
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="predtop-") as tmp:
        out = results_folder(resume) if resume else Path(tmp)
        per_work = target_of(readout) == "log-per-flop"
        table = evaluate(folders, out, fractions=fr, kinds=kinds, seeds=(seed,), train_config=tc,
                         input_features=inputs, save_fraction=0.3 if 0.3 in fr else None, readout=readout,
                         per_work=per_work, log=_log)  # fmt: skip
        cases = []
        for c in read_cases(out):
            if (
                c["family"] in folders
                and c["model"] in kinds
                and c["seed"] == seed
                and any(abs(c["fraction"] - f) < 1e-9 for f in fr)
                and c.get("features", "table1") == features
                and c.get("target", "log") == target_of(readout)
                and c.get("readout", "logsumexp") == readout
                and int(c.get("members", 1)) == members
                and row_stop(c) == stop_of(tc)
            ):
                cases.append({"case": f"{c['family']}/{c['fraction']:.0%}/{c['model']}", "family": c["family"],
                              "fraction": c["fraction"], "model": c["model"], "mre_pct": c["mre_pct"],
                              "median_re_pct": c["median_re_pct"], "p90_re_pct": c["p90_re_pct"],
                              "train": c["train"], "test": c["test"], "train_s": c["train_s"],
                              "epochs": c["epochs"], "abs_err_pct": c["mre_pct"]})  # fmt: skip
        searches = {}
        if search:

            for fam in folders:
                sf = root / f"{fam}-search"
                if not (sf / "stages.jsonl").exists():
                    continue
                preds, digests = {}, {}
                for kind in kinds:
                    p = predictor_dir(out, fam, kind, seed, setting)
                    if (p / "predictor.json").exists():
                        pred = Predictor.load(p)
                        if _same_setting(pred, setting):
                            preds[kind] = pred
                            digests[kind] = _digest(*sorted(p.iterdir()))
                # 003 §VI trains its own predictor on the sampled candidates: the DAG Transformer
                # (003's model settings: --readout and --members shape the family predictors only)
                sampled = ("dag_transformer",) if "dag_transformer" in kinds else kinds[:1]
                searches[fam] = _search(out if resume else None, sf, fam=fam, preds=preds, sampled=sampled,
                                        seed=seed, tc=tc, inputs=inputs, setting=setting,
                                        digests=digests)  # fmt: skip
    dag = [c["mre_pct"] for c in cases if c["model"] == "dag_transformer"]  # --models gcn: the GCN's
    summary = {**error_summary(dag or [c["mre_pct"] for c in cases]), **{k: v for k, v in table.items() if k != "mre_pct"},
               # what median/mape/max_abs_err_pct are taken over (the contract's keys)
               "errors_of": "the DAG Transformer's MRE per case" if dag else "every case's MRE",
               "wall_s": time.perf_counter() - t0}  # fmt: skip
    for fam, s in searches.items():
        for name, a in s["approaches"].items():
            summary[f"search_{fam}_{name}_mean_regret_pct"] = a["mean_regret_pct"]
            summary[f"search_{fam}_{name}_saved_pct"] = a["saved_pct"]
    return {"suite": "predtop", "params": {"dataset": str(root), "fractions": list(fr), "models": list(kinds),
            "seed": seed, "features": features, "readout": readout, "members": members, "stop": stop_of(tc),
            "epochs": tc.epochs},
            "cases": cases, "mre_table": table["mre_pct"], "search": searches,
            "summary": summary}  # fmt: skip


def _digest(*files: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for f in files:
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _same_setting(pred: Any, setting: dict[str, Any]) -> bool:
    """Whether a saved predictor was trained under ``setting``: its recorded setting, or, for a
    folder written before predictors recorded it, what its model says (readout, bag, features,
    target) — such a folder held one predictor per (family, model, seed) whatever the setting."""
    if "setting" in pred.meta:
        return bool(pred.meta["setting"] == setting)
    target = "log-per-flop" if pred.per_work else "log"
    features = "table1+work" if pred.input_features else "table1"
    return bool((pred.config.readout, int(pred.config.members or 1), features, target, pred.part)
                == (setting["readout"], setting["members"], setting["features"], setting["target"], setting["part"]))  # fmt: skip


def _search(out: Path | None, folder: Path, *, fam: str, preds: dict[str, Any], sampled: tuple[str, ...],
            seed: int, tc: Any, inputs: bool, setting: dict[str, Any],
            digests: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """The search integration of one family, kept in ``out`` (``--resume``) under the settings
    that made it: it trains 003 §VI's sampled predictor, and its cost counts that training's
    wall time, so a rerun would otherwise retrain and report another cost each time."""
    from dataclasses import asdict

    from trainsim.ir.serialize import write_json_atomic
    from trainsim.learn.provider import run_search_integration

    key = {"family": fam, "seed": seed, "family_predictors": dict(sorted((digests or dict.fromkeys(preds, "")).items())),
           "sampled": list(sampled), "setting": setting, "train_config": asdict(tc), "features": inputs,
           # the candidate set itself: another folder, or re-measured stages, is another search
           "search_set": str(folder.resolve()), "search_rows": _digest(folder / "stages.jsonl")}  # fmt: skip
    path = out / f"search-{fam}-s{seed}.json" if out is not None else None
    if path is not None and path.exists():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            doc = {}
        if isinstance(doc, dict) and doc.get("key") == key and isinstance(doc.get("result"), dict):
            return dict(doc["result"])
    result = run_search_integration(folder, family=fam, family_predictors=preds, kinds=sampled, seed=seed,
                                    train_config=tc, input_features=inputs)  # fmt: skip
    if path is not None:
        write_json_atomic(path, {"key": key, "result": result})
    return result


def run_protocol(*, dataset: str | None = None, resume: str | None = None, fractions: str | None = None,
                 models: str | None = None, seed: int = 0, epochs: int | None = None,
                 readout: str = "logsumexp", members: int = 1, per: str = "config",
                 stop: str = "each") -> dict[str, Any]:  # fmt: skip
    """003 Table V on the protocol sets ``gpt-003/`` and ``moe-003/`` (:mod:`trainsim.learn.protocol`).

    A predictor per (family, Table III configuration, fraction, model) — or per mesh with
    ``per="mesh"`` — with 003's training schedule; the acceptance figures are the means over the
    six configurations (003 Fig. 8).
    """
    from trainsim.learn.models import MODEL_KINDS
    from trainsim.learn.protocol import (
        PROTOCOL_EPOCHS,
        PROTOCOL_FRACTIONS,
        PROTOCOL_PATIENCE,
        RUNTIME_CONFIGS,
        evaluate_protocol,
        read_protocol_cases,
        summarize_protocol,
        target_of,
    )
    from trainsim.learn.train import TrainConfig
    from trainsim.validate.registry import error_summary

    root = Path(dataset) if dataset else packaged_dataset()
    folders = {f: root / f"{f}-003" for f in FAMILIES if (root / f"{f}-003" / "stages.jsonl").exists()}
    if not folders:
        raise ConfigError(f"no protocol stage sets under {root} (expected gpt-003/ and moe-003/); collect them "
                          "with trainsim stages collect DIR --family gpt --protocol")  # fmt: skip
    kinds = tuple(models.split(",")) if models else MODEL_KINDS
    fr = PROTOCOL_FRACTIONS if fractions is None else _parse_fractions(fractions)
    tc = TrainConfig(epochs=epochs or PROTOCOL_EPOCHS, patience=PROTOCOL_PATIENCE, members=members, stop=stop)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="predtop-003-") as tmp:
        out = Path(resume) if resume else Path(tmp)
        evaluate_protocol(folders, out, fractions=fr, kinds=kinds, seed=seed, train_config=tc, readout=readout,
                          per=per, log=_log)  # fmt: skip
        wanted = {f"{float(f):.1f}" for f in fr}  # the summary covers what was asked, not all of DIR
        table = summarize_protocol([c for c in read_protocol_cases(out) if c["family"] in folders
                                    and c["model"] in kinds and f"{float(c['fraction']):.1f}" in wanted],
                                   seed=seed, readout=readout, members=members, per=per,
                                   expected_rows=len(folders) * len(fr), stop=stop)  # fmt: skip
    by = table["mre_pct"]  # family -> fraction -> model -> configuration -> MRE, of the asked cases only
    cases = [{"case": f"{fam}/{cfg}/{float(f):.0%}/{k}", "family": fam, "config": cfg, "fraction": float(f),
              "model": k, "mre_pct": v, "abs_err_pct": v}
             for fam, rows in by.items() for f, cell in rows.items() for k, per in cell.items()
             for cfg, v in per.items()]  # fmt: skip
    dag = [c["mre_pct"] for c in cases if c["model"] == "dag_transformer"]  # the figures of interest
    summary = {**error_summary(dag or [c["mre_pct"] for c in cases]),
               "errors_of": "the DAG Transformer's MRE per (configuration, fraction)" if dag else "every case's MRE",
               **{k: v for k, v in table.items() if k not in ("mre_pct", "mean_mre_pct")},
               "wall_s": time.perf_counter() - t0}  # fmt: skip
    for fam, v in table["dag_transformer_mre_at_30pct"].items():  # flat, for the printed summary line
        summary[f"{fam}_dag_transformer_mre_at_30pct"] = v
    summary |= {f"acceptance_{k}": v for k, v in table["acceptance"].items()}
    return {"suite": "predtop", "params": {"dataset": str(root), "protocol": "003", "fractions": list(fr),
            "models": list(kinds), "seed": seed, "epochs": tc.epochs, "patience": tc.patience,
            "readout": readout, "target": target_of(readout), "members": members, "per": per,
            "stop": stop if members > 1 else "each"},
            "configs": [c.label for c in RUNTIME_CONFIGS], "cases": cases, "mre_table": table["mean_mre_pct"],
            "protocol_table": by, "summary": summary}  # fmt: skip


__all__ = ["packaged_dataset", "run_predtop_suite", "run_protocol"]
