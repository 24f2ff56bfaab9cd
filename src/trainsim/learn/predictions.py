"""What a trained stage predictor says of stages: a dataset's, stages described by their spec,
and a pipeline search's candidates (``trainsim stages predict`` and ``stages search``).

:func:`predict_dataset` predicts every stage of a dataset folder and scores it against the
measurement, marking each stage by the split of the predictor's training that held it
(``train``, ``val``, ``test``, ``unseen``, or ``unknown`` for a predictor that does not record
its split); :func:`predict_stages` predicts stages no dataset holds (their graphs traced, nothing
run); :func:`search_provider` gives a search its stage latencies, predicted or measured, with the
checks that the predictor or dataset is of the search's family. Every answer carries its
provenance (:func:`predictor_provenance`). The results are JSON-ready dicts; rendering them is
the CLI's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainsim.errors import ConfigError
from trainsim.learn.stages import StageSpec

Warn = Callable[[str], None]
_SPLITS = ("train", "val", "test", "unseen", "unknown")


def predictor_families(meta: dict[str, Any]) -> list[str] | None:
    """The families a predictor was trained on (``stages train`` writes ``families``, a
    predictor ``validate predtop`` saved before 2026-12-02 only ``family``)."""
    fams = meta.get("families")
    if fams:
        return list(fams)
    return [meta["family"]] if meta.get("family") else None


def predictor_provenance(pred: Any) -> str:
    """What a stage predictor's answers rest on (DESIGN: every prediction states its provenance)."""
    host = (pred.meta.get("host") or {}).get("cpu")
    where = f"on {host}" if host else "on one CPU core"
    test = pred.meta.get("test_mre_pct")  # `stages train` records its held-out error
    held = len((pred.meta.get("split_specs") or {}).get("test", ()))
    err = (f"; test MRE {test:.2f} %{f' over {held} held-out stages' if held else ''} when trained"
           if isinstance(test, (int, float)) else "; no test error recorded")  # fmt: skip
    return f"calibrated: {pred.config.kind} learned from stage latencies measured {where}{err}"


def _host_difference(pred: Any, predictor: Path, dataset: Path) -> str | None:
    """The warning for a dataset measured on another host than the predictor's training stages."""
    from trainsim.learn.dataset import dataset_host

    trained_host, host = pred.meta.get("host") or {}, dataset_host(dataset) or {}
    if not (trained_host.get("id") and host.get("id") and trained_host["id"] != host["id"]):
        return None
    # the id hashes the host and the software versions: say which of them differs
    what = (f"another CPU ({host.get('cpu')}, the training stages' {trained_host.get('cpu')})"
            if host.get("cpu") != trained_host.get("cpu") else "the same CPU model but another host or software versions")
    return (f"warning: {dataset} was measured on {what} than {predictor}'s training stages: "
            "the errors include that difference")  # fmt: skip


def _dataset_splits(pred: Any, dataset: Path, rows: Sequence[Any]) -> list[str]:
    """Each row's split in the predictor's training (``train``, ``val``, ``test``, ``unseen`` or
    ``unknown``)."""
    trained_on = pred.meta.get("dataset")
    same = trained_on is not None and Path(trained_on).resolve() == Path(dataset).resolve()
    by_spec = pred.meta.get("split_specs")
    if by_spec and not (same and "split_ids" in pred.meta):
        # another folder (a copy, a move, another set): matched by the stage itself, since ids repeat
        # across sets; a stage it both trained on and tested (one spec measured twice) counts as trained
        spec_split: dict[str, str] = {}
        for part in ("test", "val", "train"):
            spec_split |= dict.fromkeys(by_spec.get(part, ()), part)
        return [spec_split.get(r.spec.digest(), "unseen") for r in rows]
    # its own folder: by id (exact); an older predictor records ids only
    split_of = {i: part for part, ids in (pred.meta.get("split_ids") or {}).items() for i in ids} if same else {}
    recorded = "split_ids" in pred.meta  # a predictor saved before 2026-12-02 does not say
    # the stages it trained or validated on, or held out from training (test)
    return [split_of.get(r.id, "unseen") if recorded or not same else "unknown" for r in rows]


def predict_dataset(pred: Any, predictor: Path, dataset: Path, *, warn: Warn | None = None) -> dict[str, Any]:
    """Every stage of ``dataset`` predicted by ``pred`` (loaded from ``predictor``), with its error
    and split, the MRE (003 Eq. 5) over all and per split, and the provenance (JSON-ready).

    ``warn`` is told when the dataset was measured on another host than the training stages."""
    import numpy as np

    from trainsim.learn.dataset import iter_graphs, read_rows
    from trainsim.learn.train import mre_pct

    if not dataset.exists():
        raise ConfigError(f"{dataset}: no such dataset folder (one `trainsim stages collect` writes)")
    rows = read_rows(dataset)
    if not rows:
        raise ConfigError(f"{dataset}: no stages (stages.jsonl missing or empty)")
    said = _host_difference(pred, predictor, dataset)
    if said and warn is not None:
        warn(said)
    fams, held = predictor_families(pred.meta), sorted({r.family for r in rows})
    if fams and not set(held) <= set(fams):
        raise ConfigError(f"{predictor}: trained on {', '.join(fams)} stages, {dataset} holds {', '.join(held)}; "
                          "predict with a predictor of that family")  # fmt: skip
    p = pred.predict(list(iter_graphs(dataset, rows, pred.part)))
    y = np.array([r.latency_s for r in rows])
    cases: list[dict[str, Any]] = [{"id": r.id, "spec": r.spec.to_dict(), "measured_s": r.latency_s, "predicted_s": float(v),
              "err_pct": 100.0 * (float(v) - r.latency_s) / r.latency_s} for r, v in zip(rows, p, strict=True)]  # fmt: skip
    for c, split in zip(cases, _dataset_splits(pred, dataset, rows), strict=True):
        c["split"] = split
    doc = {"predictor": str(predictor), "dataset": str(dataset), "stages": cases,
           "mre_pct": mre_pct(p, y), "provenance": predictor_provenance(pred)}  # fmt: skip
    by_split = {}
    for part in _SPLITS:
        sel = [i for i, c in enumerate(cases) if c["split"] == part]
        if sel:
            by_split[part] = {"stages": len(sel), "mre_pct": mre_pct(p[sel], y[sel])}
    doc["by_split"] = by_split
    return doc


def predict_stages(pred: Any, predictor: Path, specs: Sequence[StageSpec], *, progress: Any = None) -> dict[str, Any]:
    """The latency ``pred`` predicts for each described stage, its graph traced as `stages
    collect` builds it (no dataset, nothing measured), with its split (when the predictor trained
    on, validated on or held out that very stage), the training ranges it leaves and the
    operators no training stage had (JSON-ready). ``progress`` as
    :meth:`~trainsim.learn.provider.PredictedStages.latencies_s` takes it."""
    from trainsim.learn.graphs import PRUNED_OPS
    from trainsim.learn.provider import PredictedStages, outside_ranges

    fams = predictor_families(pred.meta)
    other = sorted({s.family for s in specs} - set(fams or {s.family for s in specs}))
    if other:
        raise ConfigError(f"{predictor}: trained on {', '.join(fams or [])} stages, not {', '.join(map(repr, other))}; "
                          "predict with a predictor of that family")  # fmt: skip
    provider = PredictedStages(pred)
    got = provider.latencies_s(specs, progress)
    by_spec = pred.meta.get("split_specs")  # a stage it trained on, validated on or held out is said
    spec_split = {d: part for part in ("test", "val", "train") for d in (by_spec or {}).get(part, ())}
    skip = PRUNED_OPS if pred.pruned else frozenset()
    cases = []
    for s, v in zip(specs, got, strict=True):
        g = provider.graphs[s.key()]
        ops = {o for o, k in zip(g.op, g.kind, strict=True) if k == "operator"} - set(pred.op_vocab) - skip
        cases.append({"id": s.digest(), "spec": s.to_dict(), "predicted_s": v,
                      "split": spec_split.get(s.digest(), "unseen") if by_spec else "unknown",
                      "outside_training": outside_ranges(pred.meta, [s]), "unseen_ops": sorted(ops)})  # fmt: skip
    return {"predictor": str(predictor), "stages": cases, "test_mre_pct": pred.meta.get("test_mre_pct"),
            "provenance": predictor_provenance(pred)}  # fmt: skip


def search_provider(model: Any, *, predictor: Path | None = None, measured: Path | None = None, collect: str = "",
                    warn: Warn | None = None) -> tuple[Any, str]:  # fmt: skip
    """Where a search of ``model`` (a :class:`~trainsim.learn.provider.PipelineModel`) gets its
    stage latencies, and that source's provenance: the predictor at ``predictor`` (``warn`` is
    told when the model's stages leave its training ranges) or the measured dataset ``measured``
    (``collect``: the command that measures the model's stages, for the missing-stage error).
    A predictor or dataset of another family than the model's is a one-line error."""
    from trainsim.learn.provider import MeasuredStages, PredictedStages, outside_ranges
    from trainsim.learn.train import Predictor

    if (predictor is None) == (measured is None):
        raise ConfigError("a search's stage latencies come from a predictor or a measured dataset: give exactly one")
    family = model.family
    if predictor is not None:
        pred = Predictor.load(predictor)
        fams = predictor_families(pred.meta)
        if fams and family not in fams:
            raise ConfigError(f"{predictor}: trained on {', '.join(fams)} stages, not {family!r}; "
                              f"train one on a {family} dataset or pass --family {fams[0]}")  # fmt: skip
        beyond = outside_ranges(pred.meta, [model.stage(*k) for k in model.candidates()])
        if beyond and warn is not None:
            warn(f"warning: {predictor} was trained on stages of {beyond}: the search's stages beyond "
                 "that are extrapolated (collect a larger dataset to cover them)")  # fmt: skip
        return PredictedStages(pred, name=f"predicted ({predictor})"), predictor_provenance(pred)
    assert measured is not None
    if not measured.exists():  # a file is named as one by the dataset reader
        raise ConfigError(f"--measured {measured}: no such dataset folder")
    provider = MeasuredStages(measured, name=f"measured ({measured})", collect=collect)
    held = sorted({r.family for r in provider.rows.values()})
    if not held:
        raise ConfigError(f"--measured {measured}: no measured stages (collect them with `trainsim stages collect`)")
    if family not in held:
        raise ConfigError(f"--measured {measured}: holds {', '.join(held)} stages, not {family!r}; "
                          f"pass --family {held[0]} or collect {family} stages")  # fmt: skip
    return provider, f"measured stage latencies ({measured})"


__all__ = ["predict_dataset", "predict_stages", "predictor_families", "predictor_provenance", "search_provider"]
