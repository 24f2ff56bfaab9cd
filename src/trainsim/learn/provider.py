"""Stage-latency providers and the pipeline search that uses them (003 §V, §VI, §VIII-B).

A pipeline plan cuts a model's ``layers`` into consecutive stages, each on a submesh of
``shard`` devices (a tensor/expert-parallel group); with ``microbatches`` micro-batches its
iteration time is 003 Eq. 4, ``T = Σ_i t_i + (B − 1) max_j t_j`` (inter-stage communication
ignored, as 003 does). :func:`best_pipeline` finds the plan minimizing T over every candidate
stage ``(start, end, shard)`` with at most ``devices`` devices in all, exactly: for each
candidate bottleneck ``t_max`` a dynamic program minimizes ``Σ t_i`` over stages no slower than
``t_max`` (Alpa's inter-operator pass), and the best ``Σ + (B − 1) t_max`` wins.

Where the stage latencies come from is a :class:`StageLatencyProvider`:
:class:`MeasuredStages` (a measured dataset: Alpa's "full profiling") or
:class:`PredictedStages` (a trained predictor over the stages' graphs: PredTOP).
:func:`search_pipeline` is the search a CLI calls; :func:`search_experiment` is §VIII-B's
comparison — for every (micro-batches, devices) case, the measured iteration time of the plan
chosen with predicted latencies against the best plan under measured latencies (regret), and
the measurement time each approach spends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from trainsim.errors import ConfigError, ModelError
from trainsim.learn.stages import StageSpec

StageKey = tuple[int, int, int]  # (first layer, end layer exclusive, shard)


@dataclass(frozen=True, slots=True)
class PipelineModel:
    """A model to pipeline: its layers and the per-micro-batch shape of every stage."""

    family: str
    layers: int
    hidden: int
    heads: int
    seq: int
    micro_batch: int
    vocab: int
    experts: int = 0
    group_size: int = 0
    capacity_factor: float = 0.0
    max_stage_layers: int = 4
    shards: tuple[int, ...] = (1, 2, 4)

    def stage(self, start: int, end: int, shard: int) -> StageSpec:
        return StageSpec(family=self.family, hidden=self.hidden, heads=self.heads, seq=self.seq,
                         micro_batch=self.micro_batch, layers=end - start, first_layer=start, shard=shard,
                         embed=start == 0, head=end == self.layers, vocab=self.vocab, experts=self.experts,
                         group_size=self.group_size, capacity_factor=self.capacity_factor)  # fmt: skip

    def candidates(self) -> list[StageKey]:
        return [(i, i + n, t) for i in range(self.layers) for n in range(1, self.max_stage_layers + 1)
                if i + n <= self.layers for t in self.shards]  # fmt: skip


# The search-integration models (8 layers; stages of 1–4 layers on 1, 2 or 4 devices: 78 candidates)
SEARCH_MODELS = {
    "gpt": PipelineModel("gpt", layers=8, hidden=512, heads=8, seq=256, micro_batch=2, vocab=16384),
    "moe": PipelineModel("moe", layers=8, hidden=512, heads=8, seq=256, micro_batch=2, vocab=8192,
                         experts=16, group_size=256, capacity_factor=1.25),
}  # fmt: skip


# The stage fields a predictor records the [min, max] of (`stages train`; before 2026-12-03 the
# first five only): the sampled dimensions, then the rest of the shape, then whether a stage
# carries the embedding or the head (a predictor that never saw an LM head extrapolates one)
_RANGED = ("layers", "shard", "hidden", "seq", "micro_batch", "heads", "vocab", "ffn_mult", "experts",
           "group_size", "capacity_factor", "embed", "head")  # fmt: skip
_PART_WORDS = {"embed": "embedding", "head": "head"}


def spec_ranges(rows: Sequence[Any]) -> dict[str, list[Any]]:
    """The [min, max] of each stage field of :data:`_RANGED` over a dataset's rows (a
    predictor's range; booleans as [false, true])."""
    return {k: [min(getattr(r.spec, k) for r in rows), max(getattr(r.spec, k) for r in rows)] for k in _RANGED}


def _range_words(k: str, lo: Any, hi: Any) -> str:
    if k in _PART_WORDS:  # [false, false]: no stage had it; [true, true]: every one
        return f"{'only with' if lo else 'without'} the {_PART_WORDS[k]}"
    return f"{k.replace('_', '-')} {lo}-{hi}" if lo != hi else f"{k.replace('_', '-')} {lo}"


def outside_ranges(meta: Mapping[str, Any], specs: Sequence[StageSpec]) -> str:
    """The predictor's training ranges that some of ``specs`` leave, in words ("" when none, or
    when the predictor does not record them; a field this version does not know is skipped)."""
    ranges = meta.get("spec_ranges") or {}
    out = []
    for k, (lo, hi) in ranges.items():
        if k not in StageSpec.__dataclass_fields__:
            continue
        vals = [getattr(s, k) for s in specs]
        if min(vals) < lo or max(vals) > hi:
            out.append(_range_words(k, lo, hi))
    return ", ".join(out)


# What `stages search` / `stages collect --search-set` let a user change in the search model,
# by flag (the model's own field names with dashes)
MODEL_FLAGS = ("layers", "hidden", "heads", "seq", "micro_batch", "vocab", "experts", "group_size",
               "max_stage_layers", "shards")  # fmt: skip


def parse_shards(text: str) -> list[int]:
    """``--shards`` as given (``"1,2,4"``): the device counts a stage may use."""
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--shards {text!r}: expected comma-separated integers, e.g. 1,2,4") from None
    if not out:
        raise ConfigError("--shards: give at least one device count, e.g. 1,2,4")
    return out


def parse_stage(text: str) -> StageSpec:
    """One stage as ``stages predict --stage`` takes it: ``FIELD=VALUE,...`` of
    :class:`StageSpec`'s fields (``-`` or ``_`` in a name; the text :meth:`StageSpec.key`
    writes reads back as the same stage). ``family`` and ``layers`` are needed; the shape
    fields not given (hidden, heads, seq, micro_batch, vocab, MoE's experts, group_size,
    capacity_factor) are the family's search model's, as ``stages search`` defaults them, the
    rest :class:`StageSpec`'s (first_layer 0, shard 1, no embedding, no head, ffn_mult 4)."""
    where = f"--stage {text!r}"
    given: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in str(text).split(","))):
        name, eq, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or not name or not value.strip():
            raise ConfigError(f"{where}: {item!r} is not FIELD=VALUE (e.g. family=gpt,layers=2,shard=2)")
        if name not in StageSpec.__dataclass_fields__:
            known = ", ".join(StageSpec.__dataclass_fields__)
            raise ConfigError(f"{where}: unknown field {name!r}; a stage's fields: {known}")
        if name in given:
            raise ConfigError(f"{where}: {name} given twice")
        given[name] = value.strip()
    missing = [k for k in ("family", "layers") if k not in given]
    if missing:
        raise ConfigError(f"{where}: give {' and '.join(f'{k}=' for k in missing)} (e.g. family=gpt,layers=2)")
    if given["family"] not in SEARCH_MODELS:
        raise ConfigError(f"{where}: family must be one of {', '.join(sorted(SEARCH_MODELS))}, got {given['family']!r}")
    m = SEARCH_MODELS[given["family"]]
    spec: dict[str, Any] = {k: getattr(m, k) for k in ("hidden", "heads", "seq", "micro_batch", "vocab", "experts",
                                                         "group_size", "capacity_factor")}  # fmt: skip
    for name, value in given.items():
        want = StageSpec.__dataclass_fields__[name].type
        try:
            if want == "bool":
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                spec[name] = value.lower() in ("true", "1")
            else:
                spec[name] = int(value) if want == "int" else float(value) if want == "float" else value
        except ValueError:
            what = {"bool": "true or false", "int": "an integer"}.get(str(want), "a number")
            raise ConfigError(f"{where}: {name} must be {what}, got {value!r}") from None
    moe_only = [k for k in ("experts", "group_size", "capacity_factor") if k in given and spec[k]]
    if spec["family"] != "moe" and moe_only:  # a gpt stage ignores them: a typo, or the wrong family
        raise ConfigError(f"{where}: {moe_only[0]} applies to the moe family, not {spec['family']!r}")
    try:
        return StageSpec.from_dict(spec)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def search_model(family: str, **overrides: Any) -> PipelineModel:
    """:data:`SEARCH_MODELS`'s ``family`` model with the given fields replaced (None: kept).

    Every candidate stage must be valid; a field that makes one invalid is named by its flag."""
    if family not in SEARCH_MODELS:
        raise ConfigError(f"no search model for family {family!r}; known: {sorted(SEARCH_MODELS)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(given) - set(MODEL_FLAGS))
    if unknown:
        raise ConfigError(f"search model: unknown field {unknown[0]!r}; known: {', '.join(MODEL_FLAGS)}")
    if "shards" in given:
        given["shards"] = tuple(sorted(set(given["shards"])))
    if family != "moe" and ({"experts", "group_size"} & set(given)):
        raise ConfigError(f"--experts/--group-size apply to the moe family, not {family!r}")
    for k, v in given.items():
        if any(x < 1 for x in (v if k == "shards" else (v,))):
            shown = ",".join(map(str, v)) if k == "shards" else v
            raise ConfigError(f"--{k.replace('_', '-')} {shown}: must be at least 1")
    m = replace(SEARCH_MODELS[family], **given)
    if m.max_stage_layers > m.layers:
        m = replace(m, max_stage_layers=m.layers)
    flags = " ".join(f"--{k.replace('_', '-')} {','.join(map(str, v)) if k == 'shards' else v}" for k, v in given.items())
    for shard in m.shards:  # every stage shape occurs at the first layer; embed and head both there
        try:
            m.stage(0, 1, shard)
            m.stage(m.layers - 1, m.layers, shard)
        except ConfigError as e:
            raise ConfigError(f"search model ({flags or 'defaults'}): {e}") from None
    return m


def is_default(model: PipelineModel) -> bool:
    return model == SEARCH_MODELS.get(model.family)


def model_tag(model: PipelineModel) -> str:
    """A short digest of a non-default search model (its candidates' ids carry it)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(asdict(model), sort_keys=True).encode()).hexdigest()[:8]


def candidate_id(family: str, key: StageKey, model: PipelineModel | None = None) -> str:
    tag = "" if model is None or is_default(model) else f"{model_tag(model)}-"
    return f"{family}search-{tag}{key[0]}-{key[1]}-t{key[2]}"


def search_candidates(family: str, model: PipelineModel | None = None) -> list[tuple[str, StageSpec]]:
    """Every candidate stage of a search model as ``(id, spec)``: ``model``, or by default
    :data:`SEARCH_MODELS`'s ``family`` model."""
    if model is None:
        model = search_model(family)
    return [(candidate_id(family, k, model), model.stage(*k)) for k in model.candidates()]


# --- the optimizer ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    stages: tuple[StageKey, ...]
    stage_latency_s: tuple[float, ...]
    microbatches: int

    @property
    def iteration_s(self) -> float:
        return pipeline_time_s(self.stage_latency_s, self.microbatches)

    @property
    def devices(self) -> int:
        return sum(k[2] for k in self.stages)

    def label(self) -> str:
        return " | ".join(f"L{a}-{b - 1}×{t}" for a, b, t in self.stages)


def pipeline_time_s(stage_latency_s: Sequence[float], microbatches: int) -> float:
    """003 Eq. 4: ``Σ t_i + (B − 1) max t_i``."""
    return sum(stage_latency_s) + (microbatches - 1) * max(stage_latency_s)


def best_pipeline(latency_s: Mapping[StageKey, float], *, layers: int, devices: int,
                  microbatches: int) -> PipelinePlan:  # fmt: skip
    """The plan of minimum Eq. 4 time over the candidate stages in ``latency_s`` (exact)."""
    by_start: dict[int, list[tuple[StageKey, float]]] = {}
    for k, v in latency_s.items():
        by_start.setdefault(k[0], []).append((k, v))
    best: tuple[float, list[StageKey]] | None = None
    for t_max in sorted(set(latency_s.values())):
        # f[i][d]: least Σ latency covering layers [0, i) on d devices, stages no slower than t_max
        f = [[math.inf] * (devices + 1) for _ in range(layers + 1)]
        back: dict[tuple[int, int], tuple[int, int, StageKey]] = {}
        f[0][0] = 0.0
        for i in range(layers):
            for d in range(devices + 1):
                if f[i][d] == math.inf:
                    continue
                for k, v in by_start.get(i, ()):
                    nd = d + k[2]
                    if v <= t_max and nd <= devices and f[i][d] + v < f[k[1]][nd]:
                        f[k[1]][nd] = f[i][d] + v
                        back[(k[1], nd)] = (i, d, k)
        d_best = min(range(devices + 1), key=lambda d: f[layers][d])
        if f[layers][d_best] == math.inf:
            continue
        stages: list[StageKey] = []
        i, d = layers, d_best
        while i > 0:
            i, d, k = back[(i, d)]
            stages.append(k)
        stages.reverse()
        total = pipeline_time_s([latency_s[k] for k in stages], microbatches)
        if best is None or total < best[0]:
            best = (total, stages)
    if best is None:
        raise ModelError(
            f"no pipeline of {layers} layers fits on {devices} device{'s' if devices != 1 else ''} with these stages"
            + (f" (the stages hold at most {max(k[1] - k[0] for k in latency_s)} layers each and use "
               f"{min(k[2] for k in latency_s)} or more devices)" if latency_s else " (none given)")
        )
    return PipelinePlan(tuple(best[1]), tuple(latency_s[k] for k in best[1]), microbatches)


# --- providers ----------------------------------------------------------------------------------


class StageLatencyProvider(Protocol):
    """Where a search gets stage latencies from."""

    name: str

    def latencies_s(self, specs: Sequence[StageSpec]) -> list[float]: ...


class MeasuredStages:
    """Latencies looked up in a measured dataset folder (full profiling)."""

    def __init__(self, folder: Path | str, name: str = "measured", collect: str | None = None) -> None:
        from trainsim.learn.dataset import read_rows

        self.name = name
        self.rows = {r.spec.key(): r for r in read_rows(folder)}
        self.collect = collect  # the command that measures a search's stages (for the error)

    def latencies_s(self, specs: Sequence[StageSpec]) -> list[float]:
        missing = [s for s in specs if s.key() not in self.rows]
        if missing:
            how = self.collect or f"trainsim stages collect DIR --family {missing[0].family} --search-set"
            raise ModelError(f"{len(missing)} of {len(specs)} stages were not measured (first: {missing[0]}); a search "
                             "looks up every candidate stage of its model: collect them into a folder of their "
                             f"own with `{how}`")  # fmt: skip
        return [self.rows[s.key()].latency_s for s in specs]


class PredictedStages:
    """Latencies predicted by a trained :class:`~trainsim.learn.train.Predictor` (PredTOP).

    Graphs come from ``graphs`` (spec key → StageGraph) when given, else from the stage's jaxpr
    (needs jax; no compilation, no execution). ``graph_s`` and ``predict_s`` accumulate the time
    spent building graphs and predicting.
    """

    def __init__(
        self, predictor: Any, name: str = "predicted", graphs: Mapping[str, Any] | None = None
    ) -> None:
        self.predictor = predictor
        self.name = name
        self.graphs = dict(graphs or {})
        self.graph_s = 0.0
        self.predict_s = 0.0

    def latencies_s(self, specs: Sequence[StageSpec], progress: Any = None) -> list[float]:
        """``progress``: a callable told ``(done, total)`` after each graph traced (the slow part:
        about a quarter second a stage)."""
        t0 = time.perf_counter()
        gs = []
        todo = sum(s.key() not in self.graphs for s in specs)
        done = 0
        for s in specs:
            g = self.graphs.get(s.key())
            if g is None:
                from trainsim.learn.stages import stage_graph

                part = getattr(self.predictor, "part", "train")  # as `stages collect` stores it:
                g = self.graphs[s.key()] = stage_graph(s, part=part)
                done += 1
                if progress is not None:
                    progress(done, todo)
            gs.append(g)
        t1 = time.perf_counter()
        out = [float(v) for v in self.predictor.predict(gs)]
        self.graph_s += t1 - t0
        self.predict_s += time.perf_counter() - t1
        return out


def search_pipeline(model: PipelineModel, provider: StageLatencyProvider, *, devices: int,
                    microbatches: int, progress: Any = None) -> dict[str, Any]:  # fmt: skip
    """Best Eq. 4 plan of ``model`` with latencies from ``provider`` (JSON-ready); ``progress``
    as :meth:`PredictedStages.latencies_s` takes it (a measured provider ignores it)."""
    t0 = time.perf_counter()
    keys = model.candidates()
    specs = [model.stage(*k) for k in keys]
    got = provider.latencies_s(specs, progress) if isinstance(provider, PredictedStages) else provider.latencies_s(specs)
    lat = dict(zip(keys, got, strict=True))
    t1 = time.perf_counter()
    plan = best_pipeline(lat, layers=model.layers, devices=devices, microbatches=microbatches)
    return {"model": asdict(model), "provider": provider.name, "devices": devices, "microbatches": microbatches,
            "plan": plan.label(), "stages": [list(k) for k in plan.stages],
            "stage_latency_s": list(plan.stage_latency_s), "iteration_time_s": plan.iteration_s,
            "candidates": len(keys), "timings_s": {"latencies": t1 - t0, "optimize": time.perf_counter() - t1}}  # fmt: skip


def search_experiment(model: PipelineModel, measured: Mapping[StageKey, float],
                      predicted: Mapping[str, Mapping[StageKey, float]], *,
                      microbatches: Sequence[int] = (1, 4, 16, 64),
                      devices: Sequence[int] = (2, 4, 8)) -> list[dict[str, Any]]:  # fmt: skip
    """003 §VIII-B: per (B, devices) and approach, the regret of the plan chosen with predictions."""
    cases = []
    for b in microbatches:
        for d in devices:
            best = best_pipeline(measured, layers=model.layers, devices=d, microbatches=b)
            case: dict[str, Any] = {"microbatches": b, "devices": d, "best_plan": best.label(),
                                    "best_iteration_s": best.iteration_s, "approaches": {}}  # fmt: skip
            for name, lat in predicted.items():
                p = best_pipeline(lat, layers=model.layers, devices=d, microbatches=b)
                real = pipeline_time_s([measured[k] for k in p.stages], b)
                case["approaches"][name] = {
                    "plan": p.label(), "iteration_s": real, "predicted_iteration_s": p.iteration_s,
                    "regret_pct": 100.0 * (real - best.iteration_s) / best.iteration_s,
                    "iteration_err_pct": 100.0 * (p.iteration_s - real) / real, "same_plan": p.stages == best.stages,
                }  # fmt: skip
            cases.append(case)
    return cases


def _stage_key(spec: StageSpec) -> StageKey:
    return (spec.first_layer, spec.first_layer + spec.layers, spec.shard)


def run_search_integration(search_folder: Path | str, *, family: str,
                           family_predictors: Mapping[str, Any] | None = None,
                           sample_fraction: float = 0.3, kinds: Sequence[str] = ("dag_transformer", "gcn", "gat"),
                           seed: int = 0, train_config: Any = None, microbatches: Sequence[int] = (1, 4, 16, 64),
                           devices: Sequence[int] = (2, 4, 8), part: str = "train",
                           input_features: bool = True, per_work: bool = True) -> dict[str, Any]:  # fmt: skip
    """003 §VIII-B on a measured candidate set (every stage of :data:`SEARCH_MODELS`[family]).

    Approaches: ``full-profiling`` (every candidate measured: the reference), ``family-<model>``
    (a predictor trained on the family's random-stage dataset: no candidate is measured) and
    ``sampled<k>-<model>`` (003 §VI's workflow: ``sample_fraction`` of the candidates measured,
    a predictor trained on them — 80 % train / 20 % validation — predicts the rest). Cost of an
    approach: the measurement time of the candidates it measures (compile + warm-up + timed
    repeats, as recorded), the graph extraction of the candidates it predicts, its training and
    its inference; ``saved_pct`` is relative to full profiling.
    """
    import numpy as np

    from trainsim.learn.evaluate import FamilyData
    from trainsim.learn.models import ModelConfig
    from trainsim.learn.train import TrainConfig, mre_pct, train_predictor

    model = SEARCH_MODELS[family]
    data = FamilyData(search_folder, part=part, input_features=input_features)
    keys = [_stage_key(r.spec) for r in data.rows]
    if sorted(keys) != sorted(model.candidates()):
        raise ConfigError(f"{search_folder} does not hold exactly the {len(model.candidates())} candidates "
                          f"of the {family} search model; collect them with `trainsim stages collect DIR --family {family} --search-set`")  # fmt: skip
    measured = dict(zip(keys, data.latency_s.tolist(), strict=True))
    profile_s = np.array([r.profile_s for r in data.rows])
    sfx = "" if part == "train" else f"_{part}"
    graph_s = np.array([float(r.raw.get(f"graph{sfx}_s", 0.0)) for r in data.rows])
    approaches: dict[str, dict[str, Any]] = {}
    predicted: dict[str, dict[StageKey, float]] = {}
    for name, pred in (family_predictors or {}).items():
        if pred.part != part:
            raise ConfigError(f"predictor {name} reads {pred.part} graphs, the search uses {part}")
        t0 = time.perf_counter()
        p = pred.predict(data.graphs)
        infer = time.perf_counter() - t0
        predicted[f"family-{name}"] = dict(zip(keys, p.tolist(), strict=True))
        approaches[f"family-{name}"] = {"measured": 0, "mre_pct": mre_pct(p, data.latency_s),
                                        "cost_s": float(graph_s.sum()) + infer, "train_s": 0.0}  # fmt: skip
    rng = np.random.default_rng([seed, 11])
    perm = rng.permutation(len(keys))
    n_meas = max(3, round(sample_fraction * len(keys)))
    meas, rest = perm[:n_meas], perm[n_meas:]
    n_val = max(1, round(0.2 * n_meas))
    tr, va = meas[n_val:], meas[:n_val]
    cfg_train = train_config or TrainConfig()
    for kind in kinds:
        tensors = data.tensors(reach=kind == "dag_transformer")
        cfg = ModelConfig.for_kind(kind, tensors[0].x.shape[1])
        pred = train_predictor([tensors[i] for i in tr], data.latency_s[tr], [tensors[i] for i in va],
                               data.latency_s[va], model_config=cfg, op_vocab=data.vocab, config=cfg_train,
                               part=part, input_features=input_features, per_work=per_work)  # fmt: skip
        t0 = time.perf_counter()
        p = pred.predict_tensors([tensors[i] for i in rest])
        infer = time.perf_counter() - t0
        lat = dict(measured)  # measured candidates keep their measurement
        lat.update({keys[i]: float(v) for i, v in zip(rest, p, strict=True)})
        name = f"sampled{round(sample_fraction * 100)}-{kind}"
        predicted[name] = lat
        train_s = pred.history.train_s if pred.history else 0.0
        approaches[name] = {"measured": int(n_meas), "mre_pct": mre_pct(p, data.latency_s[rest]),
                            "cost_s": float(profile_s[meas].sum() + graph_s[rest].sum()) + train_s + infer,
                            "train_s": train_s}  # fmt: skip
    cases = search_experiment(
        model, measured, predicted, microbatches=microbatches, devices=devices
    )
    full_s = float(profile_s.sum())
    for name, a in approaches.items():
        regrets = [c["approaches"][name]["regret_pct"] for c in cases]
        a |= {"saved_pct": 100.0 * (1.0 - a["cost_s"] / full_s), "mean_regret_pct": float(np.mean(regrets)),
              "max_regret_pct": float(np.max(regrets)),
              "same_plan": sum(c["approaches"][name]["same_plan"] for c in cases)}  # fmt: skip
    return {"family": family, "model": asdict(model), "candidates": len(keys),
            "full_profiling_s": full_s, "approaches": approaches, "cases": cases}  # fmt: skip


__all__ = [
    "MODEL_FLAGS",
    "SEARCH_MODELS",
    "MeasuredStages",
    "PipelineModel",
    "PipelinePlan",
    "PredictedStages",
    "StageLatencyProvider",
    "best_pipeline",
    "candidate_id",
    "is_default",
    "model_tag",
    "parse_stage",
    "pipeline_time_s",
    "run_search_integration",
    "search_candidates",
    "search_experiment",
    "search_model",
    "search_pipeline",
]
