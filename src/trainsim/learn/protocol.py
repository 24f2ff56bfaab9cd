"""003's own evaluation protocol (§VII-A/B, Tables III–V): one model, one runtime configuration
per set, stages that differ in which and how many layers they hold.

003 profiles every stage of one benchmark model (GPT-3 1.3B, 24 layers; GShard MoE 2.6B) on
each (mesh, configuration) of its Table III — a mesh of 1, 2 or 4 GPUs split between data and
model (intra-operator) parallelism — and reports the MRE per column (Table V: a predictor per
(mesh, configuration), trained on 10–80 % of that column's stages). Our random stage sets
(``gpt/``, ``moe/``) vary hidden size, sequence, micro-batch and shard as well; this module builds
the narrower sets 003 evaluates on, so both can be reported.

On this machine's CPU a stage is timed as one device of its mesh sees it (what the random sets
do too): ``dp``-way data parallelism gives the device ``micro_batch / dp`` of the micro-batch,
``mp``-way model parallelism a ``1/mp`` shard of every layer (:class:`StageSpec.shard`).
Inter-device communication (the gradient all-reduce of data parallelism, the activations'
all-reduce of model parallelism) is not part of the timed work — there is one core.

The models are 003 Table IV's, narrowed so that a stage takes 10 ms – 1 s on one core: hidden
512, 8 heads, sequence 128, a micro-batch of 4 on the whole mesh (so 4-way data parallelism
leaves one sequence per device). GPT: 12 layers, stages of 1–5 consecutive layers (50 per
configuration, 300 in all). MoE: 10 layers (GShard: every other layer's FFN is a top-2 mixture
of 16 experts, groups of 128 tokens, capacity factor 1.25), stages of 1–3 layers (27 per
configuration, 162 in all). The first stage holds the embedding and the last the LM head and
loss, as in every pipeline.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.errors import ConfigError
from trainsim.learn.dataset import StageRow
from trainsim.learn.provider import PipelineModel
from trainsim.learn.stages import StageSpec

# 003 §IV-B6–8: 500 epochs, batches of 32, Adam from 1e-3 with cosine decay to 0, early stopping
# after 200 epochs without improvement. Our random sets train with a cut schedule (250/80) to fit
# the 15-minute budget; the protocol's columns are small enough for 003's own.
PROTOCOL_EPOCHS = 500
PROTOCOL_PATIENCE = 200
PROTOCOL_FRACTIONS = (0.1, 0.3, 0.8)
PROTOCOL_CASE_SCHEMA = "trainsim.predtop-protocol-case/1"
DEFAULT_READOUT = "logsumexp"


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """One column of 003 Table III: a mesh of ``dp * mp`` devices."""

    mesh: int
    conf: int
    dp: int
    mp: int

    @property
    def label(self) -> str:
        return f"m{self.mesh}c{self.conf}"

    def describe(self) -> str:
        if self.dp == self.mp == 1:
            return "1 device"
        parts = [f"{self.dp}-way data" if self.dp > 1 else "", f"{self.mp}-way model" if self.mp > 1 else ""]
        return " × ".join(p for p in parts if p) + " parallel"


# 003 Table III: mesh 1 = 1 GPU; mesh 2 = 2 GPUs (2-way DP, 2-way MP); mesh 3 = 4 GPUs (4-way DP,
# 2 DP × 2 MP, 4-way MP).
RUNTIME_CONFIGS: tuple[RuntimeConfig, ...] = (
    RuntimeConfig(1, 1, 1, 1),
    RuntimeConfig(2, 1, 2, 1),
    RuntimeConfig(2, 2, 1, 2),
    RuntimeConfig(3, 1, 4, 1),
    RuntimeConfig(3, 2, 2, 2),
    RuntimeConfig(3, 3, 1, 4),
)

# 003 Table IV's benchmarks, narrowed for one CPU core (module docstring). micro_batch is the
# whole mesh's; a configuration's device runs micro_batch / dp of it.
PROTOCOL_MODELS = {
    "gpt": PipelineModel("gpt", layers=12, hidden=512, heads=8, seq=128, micro_batch=4, vocab=16384,
                         max_stage_layers=5),
    "moe": PipelineModel("moe", layers=10, hidden=512, heads=8, seq=128, micro_batch=4, vocab=8192,
                         experts=16, group_size=128, capacity_factor=1.25, max_stage_layers=3),
}  # fmt: skip


def config_of(spec: StageSpec, family: str) -> RuntimeConfig:
    """The Table III configuration a protocol stage was measured under."""
    model = PROTOCOL_MODELS[family]
    for c in RUNTIME_CONFIGS:
        if spec.shard == c.mp and spec.micro_batch * c.dp == model.micro_batch:
            return c
    raise ConfigError(f"stage {spec.key()} is not one of the {family} protocol's configurations")


def protocol_stages(family: str) -> list[tuple[str, StageSpec]]:
    """Every stage of ``family``'s protocol model under every configuration, as ``(id, spec)``.

    Ordered configuration by configuration, so an interrupted collection leaves whole columns.
    """
    if family not in PROTOCOL_MODELS:
        raise ConfigError(f"no protocol model for family {family!r}; known: {sorted(PROTOCOL_MODELS)}")
    m = PROTOCOL_MODELS[family]
    out = []
    for c in RUNTIME_CONFIGS:
        if m.micro_batch % c.dp:
            raise ConfigError(f"{family}: micro-batch {m.micro_batch} does not split {c.dp} ways")
        mc = replace(m, micro_batch=m.micro_batch // c.dp, shards=(c.mp,))
        for start, end, _ in mc.candidates():
            out.append((f"{family}003-{c.label}-{start}-{end}", mc.stage(start, end, c.mp)))
    return out


def target_of(readout: str) -> str:
    """The target a readout trains on: ``sum`` adds seconds (log), the others predict per FLOP.

    An unknown readout is a one-line error naming the option (one check for every caller)."""
    from trainsim.learn.models import READOUTS

    if readout not in READOUTS:
        raise ConfigError(f"--readout must be one of {', '.join(READOUTS)}, got {readout!r}")
    return "log" if readout == "sum" else "log-per-flop"


PER = ("config", "mesh")


def _in_configs(row: StageRow, *, family: str, configs: tuple[RuntimeConfig, ...]) -> bool:
    return config_of(row.spec, family) in configs


def mesh_configs(mesh: int) -> tuple[RuntimeConfig, ...]:
    """The Table III configurations of ``mesh``."""
    return tuple(c for c in RUNTIME_CONFIGS if c.mesh == mesh)


def _check_per(per: str) -> None:
    if per not in PER:
        raise ConfigError(f"--per must be one of {', '.join(PER)}, got {per!r}")


def row_per(config: str, per: str) -> str:
    """The ``per`` a case row of ``config`` carries: a mesh of one configuration (mesh 1) trains the
    same predictor either way, so its rows are the per-configuration ones."""
    _check_per(per)
    rc = next((c for c in RUNTIME_CONFIGS if c.label == config), None)
    return "config" if rc is not None and len(mesh_configs(rc.mesh)) == 1 else per


def _key(c: Mapping[str, Any]) -> tuple[str, str, float, str, int, str, int, str, str]:
    from trainsim.learn.evaluate import row_stop

    # rows written before the readout, the bag, per-mesh predictors and the bag's stop were
    # choices are the defaults' (one model, a predictor per configuration, each member's own stop)
    return (c["family"], c["config"], round(float(c["fraction"]), 3), c["model"], int(c["seed"]),
            c.get("readout", DEFAULT_READOUT), int(c.get("members", 1)), c.get("per", "config"), row_stop(c))  # fmt: skip


def evaluate_protocol(folders: Mapping[str, Path | str], results: Path | str, *,
                      fractions: Sequence[float] = PROTOCOL_FRACTIONS, kinds: Sequence[str] | None = None,
                      seed: int = 0, train_config: Any = None, readout: str = DEFAULT_READOUT,
                      configs: Sequence[str] | None = None, per: str = "config",
                      log: Callable[[str], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """003 Table V on the protocol sets: a predictor per (family, configuration, fraction, model),
    or with ``per="mesh"`` per (family, mesh, fraction, model).

    ``folders`` maps a family to its protocol dataset (``gpt-003/``, ``moe-003/``). Each finished
    case is appended to ``results/protocol_cases.jsonl`` (resumable, like :func:`evaluate`).
    ``readout`` is the models' pooling (:mod:`trainsim.learn.models`; its target: :func:`target_of`).
    ``configs`` limits the run to those configurations (labels such as ``m3c1``; default all).

    ``per="mesh"`` is 003 §VI's workflow as written: "train a DAG Transformer model for each
    mesh", then predict "all the stages on the corresponding mesh". A mesh's predictor trains on
    the union of its configurations' training stages, each configuration split exactly as for its
    own predictor (same validation, training and test stages), and every configuration's row
    reports the MRE on its own test stages — so the two settings are compared on the same tests.
    A mesh of one configuration (mesh 1) is the same predictor either way and keeps its rows.
    Returns :func:`summarize_protocol` of every case there with that readout, bag size and ``per``.
    """
    from trainsim.bench.dataset import append_row, repair_tail
    from trainsim.learn.evaluate import (
        FamilyData,
        check_kinds,
        heldout_errors,
        results_folder,
        split,
        stop_of,
        train_case,
    )
    from trainsim.learn.models import MODEL_KINDS
    from trainsim.learn.train import TrainConfig

    kinds = tuple(dict.fromkeys(kinds or MODEL_KINDS))  # each case once
    fractions = tuple(dict.fromkeys(fractions))
    check_kinds(kinds)
    tc = train_config or TrainConfig(epochs=PROTOCOL_EPOCHS, patience=PROTOCOL_PATIENCE)
    results = results_folder(results)
    path = results / "protocol_cases.jsonl"
    repair_tail(path)
    done = {_key(c) for c in read_protocol_cases(results)}
    labels = [c.label for c in RUNTIME_CONFIGS]
    if configs is not None and set(configs) - set(labels):
        raise ConfigError(f"unknown configuration(s) {sorted(set(configs) - set(labels))}; known: {', '.join(labels)}")
    _check_per(per)
    meshes = sorted({c.mesh for c in RUNTIME_CONFIGS})
    groups = [(rc,) for rc in RUNTIME_CONFIGS] if per == "config" else [mesh_configs(m) for m in meshes]
    for family, folder in folders.items():
        for group in groups:
            cols = [rc for rc in group if configs is None or rc.label in configs]
            todo = [(f, k) for f in fractions for k in kinds
                    if any((family, rc.label, round(float(f), 3), k, seed, readout, tc.members,
                            row_per(rc.label, per), stop_of(tc)) not in done for rc in cols)]  # fmt: skip
            if not todo:
                continue
            # a mesh's predictor trains on all its configurations, even where only some are asked for
            data = FamilyData(folder, input_features=True, what=f"under {' / '.join(rc.label for rc in group)}",
                              select=functools.partial(_in_configs, family=family, configs=group))  # fmt: skip
            at = {rc: np.array([i for i, r in enumerate(data.rows) if config_of(r.spec, family) == rc]) for rc in group}
            missing = [rc.label for rc in group if not len(at[rc])]
            if missing:
                raise ConfigError(f"{folder}: no measured stages under configuration(s) {', '.join(missing)}")
            for fraction, kind in todo:
                # each configuration's own split (split() of its rows in dataset order), mapped to `data`
                own = {rc: split(len(at[rc]), fraction, seed=seed) for rc in group}
                tr, va, te = (np.concatenate([at[rc][own[rc][j]] for rc in group]) for j in range(3))
                if log:
                    log(f"{family} {'+'.join(rc.label for rc in group)} {fraction:.0%} {kind}: training "
                        f"({len(tr)} train stages, at most {tc.epochs} epochs)…")  # fmt: skip
                pred, case = train_case(data, kind=kind, fraction=fraction, seed=seed, train_config=tc,
                                        readout=readout, per_work=target_of(readout) == "log-per-flop",
                                        parts=(tr, va, te))  # fmt: skip
                tensors = data.tensors(reach=kind == "dag_transformer")
                for rc in group:
                    mine = at[rc][own[rc][2]]
                    row = dict(case)
                    if len(group) > 1:
                        row |= heldout_errors(pred.predict_tensors([tensors[i] for i in mine]), data.latency_s[mine])
                        row |= {"train": len(own[rc][0]), "val": len(own[rc][1]), "test": len(mine),
                                "mesh_train": len(tr), "mesh_val": len(va)}  # fmt: skip
                    row |= {"schema": PROTOCOL_CASE_SCHEMA, "family": family, "config": rc.label,
                            "config_desc": rc.describe(), "stages": len(at[rc]), "per": row_per(rc.label, per),
                            "train_config": asdict(replace(tc, seed=seed))}  # fmt: skip
                    append_row(path, row)
                    if log:
                        log(f"{family} {rc.label} {fraction:.0%} {kind}: MRE {row['mre_pct']:.2f} % "
                            f"({len(tr)} train, {row['train_s']:.0f} s, best epoch {row['best_epoch'] + 1})")  # fmt: skip
    return summarize_protocol(read_protocol_cases(results), seed=seed, readout=readout, members=tc.members, per=per,
                              stop=stop_of(tc))  # fmt: skip


def read_protocol_cases(results: Path | str) -> list[dict[str, Any]]:
    from trainsim.bench.dataset import complete_lines

    path = Path(results) / "protocol_cases.jsonl"
    if not path.exists():
        return []
    return [d for _, d in complete_lines(path) if isinstance(d, dict) and d.get("schema") == PROTOCOL_CASE_SCHEMA]


def summarize_protocol(cases: Sequence[Mapping[str, Any]], *, seed: int = 0,
                       readout: str = DEFAULT_READOUT, members: int = 1, per: str = "config",
                       expected_rows: int | None = None, stop: str = "each") -> dict[str, Any]:  # fmt: skip
    """Per (family, fraction): each model's MRE per configuration and their mean (003 Fig. 8),
    over the cases of one seed, readout, bag size, ``per`` and bag stop (for the last row of a case).

    The wins count every (family, fraction) row where all three models share a column; the
    acceptance figures read only complete rows (every configuration, all three models), and with
    ``expected_rows`` (the families × fractions asked for) hold only when all of those are complete.
    """
    from trainsim.learn.evaluate import row_stop

    by: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for c in cases:
        if (int(c["seed"]), c.get("readout", DEFAULT_READOUT), int(c.get("members", 1)), c.get("per", "config"),
                row_stop(c)) != (seed, readout, members, row_per(c["config"], per), stop if members > 1 else "each"):  # fmt: skip
            continue
        cell = by.setdefault(c["family"], {}).setdefault(f"{float(c['fraction']):.1f}", {})
        cell.setdefault(c["model"], {})[c["config"]] = float(c["mre_pct"])
    mean = {f: {fr: {m: statistics.fmean(v.values()) for m, v in cell.items()} for fr, cell in rows.items()}
            for f, rows in by.items()}  # fmt: skip
    all_cols = {c.label for c in RUNTIME_CONFIGS}
    wins = total = col_wins = col_total = full_wins = full = 0
    for rows in by.values():
        for cell in rows.values():
            if not {"dag_transformer", "gcn", "gat"} <= set(cell):
                continue
            common = set(cell["dag_transformer"]) & set(cell["gcn"]) & set(cell["gat"])
            if not common:
                continue
            total += 1  # the models' means over the columns all three have
            m = {k: statistics.fmean(cell[k][c] for c in common) for k in ("dag_transformer", "gcn", "gat")}
            won = m["dag_transformer"] < min(m["gcn"], m["gat"])
            wins += won
            if common >= all_cols:
                full, full_wins = full + 1, full_wins + won
            col_total += len(common)
            col_wins += sum(cell["dag_transformer"][c] < min(cell["gcn"][c], cell["gat"][c]) for c in common)
    at30 = {f: rows.get("0.3", {}).get("dag_transformer") for f, rows in mean.items()}
    at30_full = all(set(rows.get("0.3", {}).get("dag_transformer", {})) >= all_cols for rows in by.values())
    return {
        "mre_pct": by, "mean_mre_pct": mean, "dag_transformer_mre_at_30pct": at30,
        "dag_transformer_wins": wins, "cases_compared": total, "complete_rows": full, "complete_row_wins": full_wins,
        "column_wins": col_wins, "columns_compared": col_total,
        "acceptance": {
            "mre_at_30pct_le_4": bool(at30) and at30_full and all(v is not None and v <= 4.0 for v in at30.values()),
            "wins_ge_75pct": bool(full) and full_wins / full >= 0.75 and (expected_rows is None or full >= expected_rows),
        },
    }  # fmt: skip


__all__ = ["DEFAULT_READOUT", "PER", "PROTOCOL_MODELS", "RUNTIME_CONFIGS", "RuntimeConfig", "config_of", "evaluate_protocol", "mesh_configs",
           "protocol_stages", "read_protocol_cases", "row_per", "summarize_protocol", "target_of"]
