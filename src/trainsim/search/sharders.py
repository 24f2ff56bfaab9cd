"""Embedding-table sharders for DLRM (000 Table III) and their ranking by predicted step time.

Each sharder maps every table to a rank: ``shard(tables, world, *, seed=0, device=None, ...)
-> list[int]`` (rank per table, in table order). ``tables`` is a sequence of
:class:`~trainsim.builders.dlrm.TableSpec` or a whole :class:`~trainsim.builders.dlrm.DLRMSpec`.

=====================  ===========================================================
naive                  index: table ``i`` on rank ``i % world``
random                 index: a uniformly random rank per table (``seed``)
size_greedy            greedy, cost E (rows)
lookup_greedy          greedy, cost L·D
norm_lookup_greedy     greedy, cost L/E
size_lookup_greedy     greedy, cost L·D·log10(E) (000's default sharder, §IV-B1)
predicted_greedy       greedy, cost = our kernel models' predicted fwd+bwd lookup seconds
                       (:func:`trainsim.builders.dlrm.table_costs`; needs ``device`` and the
                       batch: a DLRMSpec, or ``batch=``)
=====================  ===========================================================

Greedy = longest-processing-time list scheduling: tables by decreasing cost (ties: table
order), each onto the rank with the least summed cost so far (ties: the lowest rank) among the
ranks it fits on. ``capacity_bytes`` caps the table bytes (E·D·element size) per rank; an
index sharder that breaks it, or a table that fits on no rank, raises
:class:`~trainsim.errors.ConfigError`.

:func:`select_sharder` (000 §V-A) runs every sharder and predicts each step with the simulator.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainsim.builders.dlrm import (
    Coster,
    DLRMSpec,
    KernelModels,
    TableSpec,
    build_dlrm_workload,
    check_world,
    provenance_summary,
    sim_options,
    table_costs,
)
from trainsim.errors import ConfigError
from trainsim.hardware import DeviceSpec, SystemSpec

Tables = Sequence[TableSpec] | DLRMSpec
Sharder = Callable[..., list[int]]


def _tables(tables: Tables) -> tuple[TableSpec, ...]:
    return tables.tables if isinstance(tables, DLRMSpec) else tuple(tables)


def _check(tables: Sequence[TableSpec], world: int) -> None:
    if not isinstance(world, int) or world < 1:
        raise ConfigError(f"world must be a positive integer, got {world!r}")
    if not tables:
        raise ConfigError("no tables to shard")


def _table_bytes(tables: Tables, dtype: str | None) -> list[int]:
    dt = dtype or (tables.dtype if isinstance(tables, DLRMSpec) else "fp32")
    return [t.nbytes(dt) for t in _tables(tables)]


def _check_capacity(tables: Tables, ranks: list[int], world: int, *, capacity_bytes: float | None,
                    dtype: str | None, sharder: str) -> list[int]:  # fmt: skip
    if capacity_bytes is None:
        return ranks
    used = [0] * world
    for b, r in zip(_table_bytes(tables, dtype), ranks, strict=True):
        used[r] += b
    worst = max(range(world), key=lambda r: used[r])
    if used[worst] > capacity_bytes:
        held, cap = _gbs(used[worst], capacity_bytes)  # as many digits as "over" needs to read true
        names = [t.name for t, r in zip(_tables(tables), ranks, strict=True) if r == worst]
        raise ConfigError(f"{sharder}: rank {worst} would hold {held} GB of tables ({_names(names)}), "
                          f"over the {cap} GB cap")  # fmt: skip
    return ranks


def _names(names: Sequence[str], most: int = 3) -> str:
    """A few table names, quoted; the rest counted."""
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _no_room(name: str, table: str, need: float, used: Sequence[float], cap: float) -> str:
    """Why greedy could place a table nowhere: too big alone, or every rank too full already."""
    need_s, cap_s = _gbs(need, cap)
    head = f"{name}: table {table} ({need_s} GB) fits on no rank under the {cap_s} GB cap"
    if need > cap:
        return f"{head}: it alone is over the cap"
    # greedy order is why: the tables placed first left no rank with room for this one
    need_s, free_s = _gbs(need, cap - min(used))
    held = _gbs(*used) if len(used) <= 4 else [_gbs(min(used))[0]]
    if len(used) == 1:
        others = f"rank 0 holds {held[0]} GB of other tables"
    elif len(used) <= 4:
        others = f"ranks hold {', '.join(held[:-1])} and {held[-1]} GB of other tables"
    else:
        others = f"the emptiest of {len(used)} ranks holds {held[0]} GB of other tables"
    return f"{head}: no rank has {need_s} GB free (most free: {free_s} GB; {others})"


def greedy(costs: Sequence[float], world: int, *, sizes: Sequence[float] | None = None,
           capacity_bytes: float | None = None, name: str = "greedy",
           names: Sequence[str] | None = None) -> list[int]:  # fmt: skip
    """Largest cost first onto the least-loaded rank with room (see the module docstring).
    ``names``: the tables' names, for the error when one fits nowhere (default ``#index``)."""
    load = [0.0] * world
    used = [0.0] * world
    out = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        need = sizes[i] if sizes is not None else 0.0
        room = [
            r for r in range(world) if capacity_bytes is None or used[r] + need <= capacity_bytes
        ]
        if not room:
            table = repr(names[i]) if names is not None else f"#{i}"
            raise ConfigError(_no_room(name, table, need, used, capacity_bytes or 0.0))
        r = min(room, key=lambda r: (load[r], r))
        out[i] = r
        load[r] += costs[i]
        used[r] += need
    return out


def naive(tables: Tables, world: int, *, seed: int = 0, device: Any = None,
          capacity_bytes: float | None = None, dtype: str | None = None, **_: Any) -> list[int]:  # fmt: skip
    """Table ``i`` on rank ``i % world``."""
    ts = _tables(tables)
    _check(ts, world)
    return _check_capacity(
        tables,
        [i % world for i in range(len(ts))],
        world,
        capacity_bytes=capacity_bytes,
        dtype=dtype,
        sharder="naive",
    )


def random_sharder(tables: Tables, world: int, *, seed: int = 0, device: Any = None,
                   capacity_bytes: float | None = None, dtype: str | None = None, **_: Any) -> list[int]:  # fmt: skip
    """A uniformly random rank per table, reproducible by ``seed``."""
    ts = _tables(tables)
    _check(ts, world)
    rng = random.Random(seed)
    return _check_capacity(
        tables,
        [rng.randrange(world) for _ in ts],
        world,
        capacity_bytes=capacity_bytes,
        dtype=dtype,
        sharder="random",
    )


def _cost_sharder(name: str, cost: Callable[[TableSpec], float]) -> Sharder:
    def shard(tables: Tables, world: int, *, seed: int = 0, device: Any = None,
              capacity_bytes: float | None = None, dtype: str | None = None, **_: Any) -> list[int]:  # fmt: skip
        ts = _tables(tables)
        _check(ts, world)
        return greedy([cost(t) for t in ts], world, sizes=_table_bytes(tables, dtype),
                      capacity_bytes=capacity_bytes, name=name, names=[t.name for t in ts])  # fmt: skip

    shard.__name__ = name
    shard.__doc__ = f"Greedy on 000 Table III's {name.replace('_', ' ')} cost."
    return shard


def predicted_greedy(tables: Tables, world: int, *, seed: int = 0, device: str | Path | DeviceSpec | None = None,
                     capacity_bytes: float | None = None, dtype: str | None = None, batch: int | None = None,
                     kernel_models: KernelModels = None, coster: Coster | None = None, tbe: bool | None = None,
                     **_: Any) -> list[int]:  # fmt: skip
    """Greedy on each table's predicted lookup seconds (our kernel models on ``device``)."""
    ts = _tables(tables)
    _check(ts, world)
    if device is None and coster is None:
        raise ConfigError("predicted_greedy needs a device (its kernel models cost the tables)")
    if isinstance(tables, DLRMSpec):
        spec = tables
    elif batch is None:
        raise ConfigError("predicted_greedy needs the batch: give a DLRMSpec or batch=")
    else:
        spec = DLRMSpec(ts, batch=batch, dtype=dtype or "fp32")
    dev = device if device is not None else coster.device  # type: ignore[union-attr]
    costs = table_costs(spec, device=dev, kernel_models=kernel_models, coster=coster, tbe=tbe)
    return greedy(costs, world, sizes=_table_bytes(spec, dtype), capacity_bytes=capacity_bytes,
                  name="predicted_greedy", names=[t.name for t in ts])  # fmt: skip


SHARDERS: dict[str, Sharder] = {
    "naive": naive,
    "random": random_sharder,
    "size_greedy": _cost_sharder("size_greedy", lambda t: float(t.rows)),
    "lookup_greedy": _cost_sharder("lookup_greedy", lambda t: t.pooling * t.dim),
    "norm_lookup_greedy": _cost_sharder("norm_lookup_greedy", lambda t: t.pooling / t.rows),
    "size_lookup_greedy": _cost_sharder("size_lookup_greedy", lambda t: t.pooling * t.dim * math.log10(t.rows) if t.rows > 1 else 0.0),
    "predicted_greedy": predicted_greedy,
}  # fmt: skip


def select_sharder(spec: DLRMSpec, world: int, *, device: str | Path | DeviceSpec,
                   system: str | Path | SystemSpec | None = None, capacity_bytes: float | None = None,
                   kernel_models: KernelModels = None, sharders: Sequence[str] | None = None, seed: int = 0,
                   capacity_source: str | None = None, **build_kw: Any) -> list[dict[str, Any]]:  # fmt: skip
    """Every sharder's assignment and simulated step time, fastest first (000 §V-A).

    Each entry: ``name``, ``predicted_step_s``, ``assignment``, ``embedding_load_s`` (each
    rank's predicted lookup seconds), ``imbalance`` (max / mean of it), ``provenance`` (kernel
    counts by source), ``comm``. A sharder that breaks ``capacity_bytes`` is listed last with
    those keys None and its ``error``; when none is feasible a one-line
    :class:`~trainsim.errors.ConfigError` names the largest table and the cap
    (``capacity_source``: where the cap came from, for that message). ``build_kw`` goes to
    :func:`~trainsim.builders.dlrm.build_dlrm_workload` (``overlap``, ``link_bandwidth_Bps``, ...).
    """
    from trainsim.sim import simulate

    if capacity_bytes is not None and not (
        isinstance(capacity_bytes, int | float)
        and math.isfinite(capacity_bytes)
        and capacity_bytes > 0
    ):
        raise ConfigError(f"capacity must be a positive number of bytes, got {capacity_bytes!r}")
    check_world(spec, world)
    names = list(sharders) if sharders is not None else list(SHARDERS)
    unknown = [n for n in names if n not in SHARDERS]
    if unknown:
        raise ConfigError(f"unknown sharder {unknown[0]!r}; known: {', '.join(SHARDERS)}")
    coster = Coster(device, kernel_models)
    tbe = build_kw.get("tbe")
    costs = table_costs(spec, device=coster.device, coster=coster, tbe=tbe)
    done, failed = [], []
    for name in names:
        try:
            a = SHARDERS[name](spec, world, seed=seed, device=coster.device, capacity_bytes=capacity_bytes,
                               coster=coster, tbe=tbe)  # fmt: skip
        except ConfigError as e:
            # the keys of a feasible entry (docs/sharding.md), null, so that JSON readers find them
            failed.append({"name": name, "predicted_step_s": None, "assignment": None, "embedding_load_s": None,
                           "imbalance": None, "provenance": None, "comm": None, "critical_path_s": None,
                           "error": str(e)})  # fmt: skip
            continue
        w = build_dlrm_workload(
            spec, a, world, device=coster.device, system=system, coster=coster, **build_kw
        )
        load = [0.0] * world
        for c, r in zip(costs, a, strict=True):
            load[r] += c
        mean = sum(load) / world
        res = simulate(w, sim_options(w))
        done.append({"name": name, "predicted_step_s": float(res.predicted_step_s),
                     "assignment": a, "embedding_load_s": load, "imbalance": max(load) / mean if mean else 1.0,
                     "provenance": provenance_summary(w), "comm": w.metadata["comm"],
                     # where the step's time goes along its critical path (kernel, host_gap, ...)
                     "critical_path_s": res.critical_path_by_kind()})  # fmt: skip
    if not done:
        raise ConfigError(
            _infeasible_message(
                spec, world, capacity_bytes, capacity_source, str(failed[0]["error"])
            )
        )
    done.sort(key=lambda d: d["predicted_step_s"])
    return done + failed


def _infeasible_message(spec: DLRMSpec, world: int, capacity_bytes: float | None, source: str | None,
                        first_error: str) -> str:  # fmt: skip
    if capacity_bytes is None:
        return f"no sharder is feasible: {first_error}"
    sizes = _table_bytes(spec, None)
    big = max(range(len(sizes)), key=lambda i: (sizes[i], -i))
    t = spec.tables[big]
    why = (
        "it alone does not fit"
        if sizes[big] > capacity_bytes
        else f"all {len(sizes)} tables ({_gb(sum(sizes))} GB) do not pack onto {world} ranks"
    )
    size, cap_gb = _gbs(sizes[big], capacity_bytes)
    cap = f"{cap_gb} GB per rank" + (f" ({source})" if source else "")
    return (f"no sharder is feasible: largest table {t.name!r} ({t.rows:,} rows x {t.dim} x {spec.dtype}) "
            f"is {size} GB against a cap of {cap}; {why}")  # fmt: skip


def _gb(nbytes: float) -> str:
    v = nbytes / 1e9
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _gbs(*nbytes: float) -> list[str]:
    """Byte counts in GB with the same number of decimals: 3 significant digits of the smallest,
    more while two different values would print the same (a 25.65 GB rank "over the 25.6 GB
    cap" reads false at 3 digits); trailing zeros dropped."""
    gbs = [b / 1e9 for b in nbytes]
    low = min((abs(v) for v in gbs if v), default=1.0)
    decimals = max(0, 2 - math.floor(math.log10(low)))
    while True:
        out = [f"{v:,.{decimals}f}" for v in gbs]
        pairs = ((i, j) for i in range(len(gbs)) for j in range(i) if gbs[i] != gbs[j])
        distinct = all(out[i] != out[j] for i, j in pairs)
        if distinct or decimals >= 9:  # 9 decimals of a GB: bytes
            break
        decimals += 1
    return [x.rstrip("0").rstrip(".") if "." in x else x for x in out]


__all__ = [
    "SHARDERS",
    "greedy",
    "naive",
    "predicted_greedy",
    "random_sharder",
    "select_sharder",
]
