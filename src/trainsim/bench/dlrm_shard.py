"""Real step times of a table-wise sharded DLRM on N gloo ranks of this host (CPU).

:func:`measure_assignments` starts ``world`` ranks once (``forkserver`` with torch preloaded,
as :mod:`trainsim.capture.distributed` does), and in them times one training step of the DLRM
described by a spec for each of several table → rank assignments. One step, on every rank:

1. embedding forward: one batched lookup (fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen``,
   ``EmbeddingLocation.HOST`` / ``ComputeDevice.CPU``; sum pooling) of the rank's own tables
   for the *global* batch (table-wise model parallelism; the index input distribution is
   not modelled: each rank draws the global batch's indices of its tables itself);
2. ``all_to_all_single`` of the pooled embeddings: rank ``r`` receives the rows of its batch
   slice from every table;
3. dense part, data parallel on the local batch (global / world): bottom MLP on the dense
   features, interaction (DLRM's pairwise dots when every table has the bottom MLP's output
   width and the spec's interaction is ``"dot"`` or ``"auto"``, else concatenation), top MLP,
   BCE loss, backward;
4. the reverse ``all_to_all_single`` of the pooled embeddings' gradients, then the embedding
   backward with its fused optimizer (exact SGD by default, as
   :mod:`trainsim.builders.dlrm` models the update; or exact row-wise Adagrad, TorchRec's usual);
5. one ``all_reduce`` of the flattened dense gradients (a single DDP bucket), averaged, and an
   SGD step of the MLPs.

Timing: a barrier before each step; a step's time is the slowest rank's (``max`` over ranks of
``perf_counter`` around the step). Each rank also times its phases (embedding forward and
backward, the two all-to-alls, dense, all-reduce, optimizer). Each assignment is measured in
*blocks* of ``warmup`` untimed steps then timed steps until ``steps`` of them are clean (or
``max_steps`` were timed); with ``repeats`` > 1 the blocks of all assignments are interleaved
(repeat ``k`` runs every assignment once, in a random order seeded by the spec) so that slow
drifts of a shared machine do not favour one assignment. The model (tables allocated afresh,
zero-initialised; MLPs from the same seed on every rank) is rebuilt for each block, so no block
inherits another's warm caches beyond what the machine keeps. Before the first block, one
untimed block of the first assignment warms the processes up: without it the first measured
block ran 10–40 % slow (clean steps all the same), a bias against whichever assignment came
first.

Contention: on a small machine shared with other jobs, a rank that loses its core for part of
a step runs up to twice as long (measured here: 200 ms clean steps became 300–600 ms while
other processes ran). Each rank compares its thread's CPU time with the wall time of the
step's compute phases (no collective inside); a step is *clean* when every rank's ratio is at
least ``clean_ratio`` (0.9; clean steps measure 0.95–1.0, shared ones 0.4–0.8). The step time
reported (``median_s``, ``repeat_medians_s``) is the median of the clean steps; every step is
kept with its ratio and flag (``samples_s``, ``cpu_ratios``, ``clean``; ``all_median_s``).

Index batches: per table, ``round(batch × pooling)`` lookups spread evenly over the ``batch``
bags (bag sizes differ by at most one), the rows following the table's reuse-factor histogram
(:func:`trainsim.bench.reuse.reuse_indices`), or uniform with reuse ``None``. A table with
fewer rows than the histogram's unique rows for that many lookups gets the histogram's batch
drawn on a virtual table of just enough rows, folded onto its rows (``index mod rows``): its
reuse is higher than the histogram's, as it must be. ``index_batches`` distinct batches per
table are cycled through.

Everything runs in fp32 with ``threads`` intra-op threads per rank (default: the usable cores
shared evenly). Without fbgemm-gpu (``pip install fbgemm-gpu-cpu``), ``torch.nn.EmbeddingBag``
(one per table, sparse gradients, SGD) stands in, reported as ``backend: "torch"``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from trainsim.capture.distributed import start_forkserver_deaf_to_ctrl_c, stop_processes
from trainsim.errors import CaptureError, ConfigError
from trainsim.lifetime import exit_with_parent, main_module_hidden

_TAIL_CHARS = 2000
_PRELOAD = ("torch", "torch.distributed", "numpy", "trainsim.bench.reuse")
PROTOCOL = 2  # bump when the measurement changes meaning: results files key rows by it
PHASES = ("emb_fwd", "a2a_fwd", "dense", "a2a_bwd", "emb_bwd", "allreduce", "optim")


@dataclass(frozen=True, slots=True)
class ShardRun:
    """How the measurement is taken (see the module docstring)."""

    steps: int = 8  # clean timed steps wanted per block ...
    max_steps: int | None = None  # ... timing at most this many (None: 3 x steps)
    clean_ratio: float = 0.9  # a step is clean when every rank's CPU/wall ratio is >= this
    warmup: int = 2  # untimed steps per block, after the (untimed) model build
    repeats: int = 1  # blocks per assignment, interleaved across assignments
    threads: int | None = None  # intra-op threads per rank; None: usable cores / world
    index_batches: int = 2  # distinct index batches per table, cycled
    optimizer: str = "sgd"  # embedding optimizer: sgd or rowwise_adagrad
    backend: str = "auto"  # fbgemm, torch, or auto (fbgemm when importable)
    seed: int = 0
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 0 or self.repeats < 1 or self.index_batches < 1:
            raise ConfigError(f"bad measurement schedule {self}")
        if self.max_steps is not None and self.max_steps < self.steps:
            raise ConfigError(f"max_steps {self.max_steps} < steps {self.steps}")
        if self.optimizer not in ("rowwise_adagrad", "sgd"):
            raise ConfigError(f"optimizer must be rowwise_adagrad or sgd, got {self.optimizer!r}")
        if self.backend not in ("auto", "fbgemm", "torch"):
            raise ConfigError(f"backend must be auto, fbgemm or torch, got {self.backend!r}")


@dataclass(slots=True)
class ShardMeasurement:
    """One assignment's measured step: every timed step (max over ranks), per repeat."""

    name: str
    assignment: list[int]
    median_s: float  # over the clean steps (all steps if none was clean)
    samples_s: list[float]  # every timed step of every repeat, in order
    repeat_medians_s: list[float]  # per repeat, over its clean steps (all if none was clean)
    clean: list[bool] = field(default_factory=list)  # per sample: no rank was preempted
    cpu_ratios: list[float] = field(default_factory=list)  # per sample: min over ranks
    all_median_s: float = 0.0  # over every timed step, clean or not
    per_rank: list[dict[str, float]] = field(default_factory=list)  # median seconds per phase
    build_s: float = 0.0  # model construction, median over repeats (not part of the step)
    load_1m: list[float] = field(default_factory=list)  # rank 0's load average at each repeat
    backend: str = ""  # fbgemm or torch
    folded_tables: list[str] = field(default_factory=list)  # too small for their reuse histogram
    repeat_steps: list[int] = field(default_factory=list)  # timed steps per repeat

    def clean_fraction(self) -> float:
        return sum(self.clean) / len(self.clean) if self.clean else 1.0

    def contended_repeats(self) -> int:
        """Repeats without a single clean step (their median is of contended steps)."""
        out, k = 0, 0
        for n in self.repeat_steps:
            out += not any(self.clean[k : k + n])
            k += n
        return out

    def spread_pct(self) -> float | None:
        """Repeat-to-repeat spread, (max − min) / median of the repeat medians, in %, over the
        repeats with clean steps; None with fewer than 2 of them (see :func:`repeat_spread_pct`)."""
        return repeat_spread_pct(self.repeat_medians_s, self.repeat_steps, self.clean)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {**d, "spread_pct": self.spread_pct(), "clean_fraction": self.clean_fraction(),
                "contended_repeats": self.contended_repeats()}  # fmt: skip


def repeat_spread_pct(
    repeat_medians_s: Sequence[float], repeat_steps: Sequence[int], clean: Sequence[bool]
) -> float | None:
    """(max − min) / median of the medians of the repeats that have a clean step, in %.

    None when fewer than 2 repeats have one: a single repeat has no repeat-to-repeat spread to
    measure (reporting 0 % would claim a noiseless machine), and a repeat of contended steps
    only measures the contention. Without per-step flags (``clean`` empty, older rows) every
    repeat counts."""
    good, k = [], 0
    for med, n in zip(repeat_medians_s, repeat_steps or [0] * len(repeat_medians_s), strict=True):
        if not clean or any(clean[k : k + n]):
            good.append(med)
        k += n
    if len(good) < 2:
        return None
    return (max(good) - min(good)) / statistics.median(good) * 100


# ---------------------------------------------------------------------------------------------
# The spec, as plain data (a DLRMSpec or an equivalent mapping)


def _hist_payload(reuse: Any) -> Any:
    """A reuse description → ``None`` (uniform) or a histogram's ``[name, buckets]``.

    Accepted: ``None``/``"uniform"``; a :class:`~trainsim.bench.reuse.ReuseHistogram` or its
    name; ``(lo, hi, fraction)`` buckets; or, as :class:`trainsim.builders.dlrm.TableSpec`
    has it, fractions of the unique rows per reuse bin (0,1], (1,2], (2,4], … (renormalised).
    """
    from trainsim.bench.reuse import DLRM_2022, ReuseHistogram

    if reuse is None or reuse == "uniform":
        return None
    if isinstance(reuse, ReuseHistogram):
        return [reuse.name, [list(b) for b in reuse.buckets]]
    if isinstance(reuse, str):
        if reuse == DLRM_2022.name:
            return [DLRM_2022.name, [list(b) for b in DLRM_2022.buckets]]
        raise ConfigError(f"unknown reuse histogram {reuse!r} (known: dlrm2022, uniform)")
    if isinstance(reuse, Mapping) and "buckets" in reuse:
        return [str(reuse.get("name", "custom")), [list(b) for b in reuse["buckets"]]]
    if isinstance(reuse, Sequence) and reuse and isinstance(reuse[0], Sequence):
        return ["custom", [list(b) for b in reuse]]
    if isinstance(reuse, Sequence) and reuse and all(isinstance(x, int | float) for x in reuse):
        total = float(sum(reuse))
        if total <= 0 or any(x < 0 for x in reuse):
            raise ConfigError(f"reuse fractions must be non-negative, not all 0: {reuse!r}")
        bins = [
            [0 if i == 0 else 2 ** (i - 1), 2**i, float(x) / total] for i, x in enumerate(reuse)
        ]
        return ["bins", [b for b in bins if b[2] > 0]]
    raise ConfigError(
        f"table reuse {reuse!r}: give a ReuseHistogram, its name, buckets, bin fractions, or None"
    )


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def spec_payload(spec: Any) -> dict[str, Any]:
    """The plain-data form of a DLRM spec the ranks build from (also a stable key of it)."""
    tables = [
        {"name": str(_get(t, "name", f"t{i}")), "rows": int(_get(t, "rows")), "dim": int(_get(t, "dim")),
         "pooling": float(_get(t, "pooling")), "reuse": _hist_payload(_get(t, "reuse"))}
        for i, t in enumerate(_get(spec, "tables"))
    ]  # fmt: skip
    if not tables:
        raise ConfigError("a DLRM spec needs at least one table")
    for t in tables:
        if t["rows"] < 1 or t["dim"] < 1 or t["pooling"] < 0:
            raise ConfigError(f"bad table {t}")
    bottom = [int(x) for x in _get(spec, "bottom_mlp", (64,))]
    top = [int(x) for x in _get(spec, "top_mlp", (64, 1))]
    interaction = str(_get(spec, "interaction", "auto") or "auto")
    return {"tables": tables, "batch": int(_get(spec, "batch")),
            "dense_features": int(_get(spec, "dense_features", 13)),
            "bottom_mlp": bottom, "top_mlp": top, "interaction": interaction}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Parent side


def measure_step(
    spec: Any, assignment: Sequence[int], *, world: int = 2, run: ShardRun | None = None
) -> ShardMeasurement:
    """Measure one assignment (table ``i`` on rank ``assignment[i]``)."""
    return measure_assignments(spec, {"assignment": assignment}, world=world, run=run)["assignment"]


def measure_assignments(
    spec: Any,
    assignments: Mapping[str, Sequence[int]],
    *,
    world: int = 2,
    run: ShardRun | None = None,
) -> dict[str, ShardMeasurement]:
    """Measure every named assignment of ``spec``'s tables on ``world`` gloo ranks.

    Returns, per name, the step time (median over all timed steps of all repeats, a step's
    time being its slowest rank's) with every sample. Raises :class:`CaptureError` if a rank
    fails or the run exceeds ``run.timeout_s``.
    """
    run = run or ShardRun()
    payload = spec_payload(spec)
    n = len(payload["tables"])
    if world < 2:
        raise ConfigError(f"sharding needs at least 2 ranks, got world={world}")
    if payload["batch"] % world:
        raise ConfigError(f"batch {payload['batch']} is not divisible by world {world}")
    if not assignments:
        raise ConfigError("no assignment to measure")
    plain: dict[str, list[int]] = {}
    for name, given in assignments.items():
        a = [int(r) for r in given]
        if len(a) != n or any(not 0 <= r < world for r in a):
            raise ConfigError(
                f"assignment {name!r} must give each of {n} tables a rank < {world}: {a}"
            )
        plain[name] = a
    threads = run.threads or max(1, _usable_cores() // world)
    job = {"spec": payload, "assignments": plain, "world": world,
           "run": {**asdict(run), "threads": threads, "max_steps": run.max_steps or 3 * run.steps}}  # fmt: skip
    results = _spawn(job, world, run.timeout_s)
    return _combine(results, plain)


def _usable_cores() -> int:
    from trainsim.capture.distributed import usable_cores

    return usable_cores()


def _combine(
    results: list[dict[str, Any]], plain: Mapping[str, list[int]]
) -> dict[str, ShardMeasurement]:
    out: dict[str, ShardMeasurement] = {}
    for name, a in plain.items():
        samples: list[float] = []
        clean: list[bool] = []
        ratios: list[float] = []
        sizes: list[int] = []
        rep_medians: list[float] = []
        builds: list[float] = []
        loads: list[float] = []
        per_rank: list[dict[str, float]] = []
        blocks = [[b for b in r["blocks"] if b["name"] == name] for r in results]
        for k in range(len(blocks[0])):
            steps = list(zip(*(rb[k]["total"] for rb in blocks), strict=True))
            worst = [max(s) for s in steps]
            ok = [bool(c) for c in blocks[0][k]["clean"]]  # agreed by all ranks
            samples.extend(worst)
            clean.extend(ok)
            ratios.extend(blocks[0][k]["cpu_ratio_min"])
            sizes.append(len(worst))
            good = [w for w, c in zip(worst, ok, strict=True) if c]
            rep_medians.append(statistics.median(good or worst))
            builds.append(max(rb[k]["build_s"] for rb in blocks))
            loads.append(blocks[0][k]["load_1m"])
        any_clean = any(clean)
        for rank, rb in enumerate(blocks):
            row: dict[str, float] = {"rank": rank, "tables": sum(1 for r in a if r == rank)}
            for ph in ("total", *PHASES):  # over the clean steps
                row[ph] = statistics.median(x for b in rb for x, c in zip(b[ph], b["clean"], strict=True)
                                            if c or not any_clean)  # fmt: skip
            per_rank.append(row)
        folded = sorted({n for r in results for n in r["folded_tables"]})
        good = [w for w, c in zip(samples, clean, strict=True) if c]
        out[name] = ShardMeasurement(name=name, assignment=list(a), median_s=statistics.median(good or samples),
                                     samples_s=samples, repeat_medians_s=rep_medians, clean=clean,
                                     cpu_ratios=ratios, all_median_s=statistics.median(samples),
                                     per_rank=per_rank, build_s=statistics.median(builds), load_1m=loads,
                                     backend=results[0]["backend"], folded_tables=folded,
                                     repeat_steps=sizes)  # fmt: skip
    return out


def _context() -> Any:
    import torch.multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(_PRELOAD))  # takes effect only when the server starts
    start_forkserver_deaf_to_ctrl_c()
    return ctx


def _spawn(job: dict[str, Any], world: int, timeout_s: float) -> list[dict[str, Any]]:
    from trainsim.capture.distributed import free_port

    ctx = _context()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="trainsim-dlrm-shard-") as tmp:
        work = Path(tmp)
        (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
        port = free_port()
        procs = [ctx.Process(target=_worker, args=(rank, world, port, tmp, env), kwargs={"parent": os.getpid()},
                             name=f"trainsim-shard-rank{rank}") for rank in range(world)]  # fmt: skip
        try:
            with main_module_hidden():  # the ranks need nothing from a library user's script
                for p in procs:
                    p.start()
            _wait_all(procs, work, timeout_s)
        finally:
            stop_processes(procs)
        out = []
        for rank in range(world):
            path = work / f"rank{rank}.json"
            try:
                out.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError) as e:
                raise CaptureError(
                    f"DLRM shard rank {rank} left no result ({e}); log:\n{_log_tail(work, rank)}"
                ) from e
        return out


def _wait_all(procs: list[Any], work: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    running = {p.sentinel: rank for rank, p in enumerate(procs)}
    while running:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CaptureError(
                f"DLRM shard measurement timed out after {timeout_s:.0f} s; rank 0 log:\n"
                f"{_log_tail(work, 0)}"
            )
        for sentinel in wait(list(running), timeout=left):
            rank = running.pop(sentinel)
            procs[rank].join()
            if procs[rank].exitcode != 0:
                raise CaptureError(
                    f"DLRM shard rank {rank} failed (exit code {procs[rank].exitcode}); its log "
                    f"ends with:\n{_log_tail(work, rank)}"
                )


def _log_tail(work: Path, rank: int) -> str:
    try:
        text = (work / f"rank{rank}.log").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return text[-_TAIL_CHARS:].strip() or "(empty log)"


# ---------------------------------------------------------------------------------------------
# Rank side


def _worker(rank: int, world: int, port: int, work_dir: str, env: dict[str, str], *, parent: int) -> None:
    """Entry point of one rank (forked by the forkserver or spawned); it ends with process
    ``parent`` (:func:`~trainsim.lifetime.exit_with_parent`)."""
    work = Path(work_dir)
    exit_with_parent(parent, work)
    try:
        fd = os.open(work / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except FileNotFoundError:  # the run was given up (Ctrl-C) before the forkserver forked this rank
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))  # fmt: skip
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    job = json.loads((work / "job.json").read_text(encoding="utf-8"))

    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(job["run"]["threads"]))
    dist.init_process_group(backend="gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=float(job["run"]["timeout_s"])))  # fmt: skip
    try:
        result = _rank_main(job, rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    tmp = work / f"rank{rank}.json.tmp"
    tmp.write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp, work / f"rank{rank}.json")


def _pick_backend(asked: str) -> str:
    if asked == "torch":
        return "torch"
    import warnings

    try:
        with warnings.catch_warnings():  # fbgemm-gpu-cpu warns about its GPU-only (SSD) ops
            warnings.simplefilter("ignore")
            import fbgemm_gpu  # noqa: F401
            from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: F401
                SplitTableBatchedEmbeddingBagsCodegen,
            )
    except Exception:  # ImportError, or an op library that fails to load against this torch
        if asked == "fbgemm":
            raise
        return "torch"
    return "fbgemm"


def _index_batches(
    spec: dict[str, Any], tables: Sequence[int], count: int, seed: int
) -> tuple[dict[int, list[tuple[Any, Any]]], list[str]]:
    """Per table: ``count`` (indices, offsets) int64 tensor pairs for the global batch."""
    import numpy as np
    import torch

    from trainsim.bench.reuse import ReuseHistogram, reuse_indices, unique_rows

    b = spec["batch"]
    out: dict[int, list[tuple[Any, Any]]] = {}
    folded: list[str] = []
    for t in tables:
        tab = spec["tables"][t]
        n = max(1, round(b * tab["pooling"]))
        offsets = torch.from_numpy((np.arange(b + 1, dtype=np.int64) * n) // b)
        hist, rows = None, tab["rows"]
        if tab["reuse"] is not None:
            name, buckets = tab["reuse"]
            hist = ReuseHistogram(
                name, tuple((int(lo), int(hi), float(f)) for lo, hi, f in buckets)
            )
            if unique_rows(n, hist) > rows:
                folded.append(tab["name"])
        batches = []
        for k in range(count):
            s = seed * 1_000_003 + t * 101 + k
            if hist is None:
                idx = np.random.default_rng(s).integers(0, rows, n)
            else:
                idx = reuse_indices(n, max(rows, unique_rows(n, hist)), hist, seed=s) % rows
            batches.append((torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64)), offsets))
        out[t] = batches
    return out, folded


class _RankModel:
    """One rank's share of the model for one assignment, and its training step."""

    def __init__(self, job: dict[str, Any], assignment: list[int], *, rank: int, world: int,
                 backend: str, batches: dict[int, list[tuple[Any, Any]]]) -> None:  # fmt: skip
        import torch
        from torch import nn

        spec, run = job["spec"], job["run"]
        self.rank, self.world = rank, world
        self.batch = spec["batch"]
        self.local = self.batch // world
        tabs = spec["tables"]
        self.mine = [t for t, r in enumerate(assignment) if r == rank]
        # tables in global order, grouped by owner: rank q's pooled block is [b, dims_q]
        self.dims_of = [sum(tabs[t]["dim"] for t, r in enumerate(assignment) if r == q)
                        for q in range(world)]  # fmt: skip
        self.owner_dims = [[tabs[t]["dim"] for t, r in enumerate(assignment) if r == q]
                           for q in range(world)]  # fmt: skip
        self.my_dim = self.dims_of[rank]
        self.backend = backend
        self.emb: Any = None
        self.emb_opt: Any = None
        if self.mine:
            if backend == "fbgemm":
                self.emb = self._tbe(tabs, run)
            else:
                self.emb = nn.ModuleList(
                    nn.EmbeddingBag(tabs[t]["rows"], tabs[t]["dim"], mode="sum", sparse=True)
                    for t in self.mine
                )
                for m in self.emb:
                    nn.init.zeros_(m.weight)
                self.emb_opt = torch.optim.SGD(self.emb.parameters(), lr=0.01)
        self.inputs = self._inputs(batches, run["index_batches"])
        # dense part: identical on every rank (same seed)
        torch.manual_seed(run["seed"])
        d_in = spec["dense_features"]
        layers: list[Any] = []
        for width in spec["bottom_mlp"]:
            layers += [nn.Linear(d_in, width), nn.ReLU()]
            d_in = width
        self.bottom = nn.Sequential(*layers)
        all_dims = [tabs[t]["dim"] for t in range(len(tabs))]
        self.dot = spec["interaction"] in ("dot", "auto") and all(d == d_in for d in all_dims)
        f = len(all_dims) + 1
        top_in = d_in + (f * (f - 1) // 2 if self.dot else sum(all_dims))
        widths = list(spec["top_mlp"])
        if not widths or widths[-1] != 1:
            widths.append(1)
        layers = []
        for i, width in enumerate(widths):
            layers.append(nn.Linear(top_in, width))
            if i < len(widths) - 1:
                layers.append(nn.ReLU())
            top_in = width
        self.top = nn.Sequential(*layers)
        self.dense_params = [*self.bottom.parameters(), *self.top.parameters()]
        self.opt = torch.optim.SGD(self.dense_params, lr=0.01)
        g = torch.Generator().manual_seed(run["seed"] + rank)
        self.x = torch.rand(self.local, spec["dense_features"], generator=g)
        self.y = torch.randint(0, 2, (self.local, 1), generator=g).float()
        self.step_no = 0

    def _tbe(self, tabs: list[dict[str, Any]], run: dict[str, Any]) -> Any:
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            EmbeddingLocation,
            OptimType,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        optim = (OptimType.EXACT_ROWWISE_ADAGRAD if run["optimizer"] == "rowwise_adagrad"
                 else OptimType.EXACT_SGD)  # fmt: skip
        specs = [(tabs[t]["rows"], tabs[t]["dim"], EmbeddingLocation.HOST, ComputeDevice.CPU)
                 for t in self.mine]  # fmt: skip
        return SplitTableBatchedEmbeddingBagsCodegen(
            specs, optimizer=optim, learning_rate=0.01, pooling_mode=PoolingMode.SUM
        )

    def _inputs(self, batches: dict[int, list[tuple[Any, Any]]], count: int) -> list[Any]:
        """Per index batch: the TBE's (indices, offsets) over the rank's tables, or per table."""
        import torch

        if not self.mine:
            return []
        out: list[Any] = []
        for k in range(count):
            pairs = [batches[t][k] for t in self.mine]
            if self.backend != "fbgemm":
                out.append(pairs)
                continue
            idx = torch.cat([p[0] for p in pairs])
            offs, base = [pairs[0][1][:1]], 0
            for p in pairs:
                offs.append(p[1][1:] + base)
                base += int(p[1][-1])
            out.append((idx, torch.cat(offs)))
        return out

    def step(self) -> dict[str, float]:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as nnf

        clock, cpu = time.perf_counter, time.thread_time
        t: dict[str, float] = {}
        b, w = self.local, self.world
        c0, t0 = cpu(), clock()
        # 1. embedding forward, global batch
        pooled: Any = None
        if self.mine:
            inp = self.inputs[self.step_no % len(self.inputs)]
            if self.backend == "fbgemm":
                pooled = self.emb(inp[0], inp[1])
            else:
                pooled = torch.cat(
                    [m(i, o[:-1]) for m, (i, o) in zip(self.emb, inp, strict=True)], dim=1
                )
        t1, c1 = clock(), cpu()
        # 2. all-to-all: my tables' rows of each rank's batch slice -> that rank
        send = pooled.detach().reshape(-1) if pooled is not None else torch.empty(0)
        recv = torch.empty(b * sum(self.dims_of))
        dist.all_to_all_single(recv, send, output_split_sizes=[b * d for d in self.dims_of],
                               input_split_sizes=[b * self.my_dim] * w)  # fmt: skip
        parts = [
            p.view(b, d)
            for p, d in zip(recv.split([b * d for d in self.dims_of]), self.dims_of, strict=True)
        ]
        emb = torch.cat(parts, dim=1).requires_grad_()
        c2, t2 = cpu(), clock()
        # 3. dense forward and backward, local batch
        x = self.bottom(self.x)
        if self.dot:
            feats = torch.cat([x.unsqueeze(1), emb.view(b, -1, x.shape[1])], dim=1)
            z = torch.bmm(feats, feats.transpose(1, 2))
            li, lj = torch.tril_indices(feats.shape[1], feats.shape[1], offset=-1)
            top_in = torch.cat([x, z[:, li, lj]], dim=1)
        else:
            top_in = torch.cat([x, emb], dim=1)
        loss = nnf.binary_cross_entropy_with_logits(self.top(top_in), self.y)
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        t3, c3 = clock(), cpu()
        # 4. reverse all-to-all of the pooled gradients, embedding backward + fused update
        grad = emb.grad
        assert grad is not None
        gsend = torch.cat([g.reshape(-1) for g in grad.split(self.dims_of, dim=1)])
        grecv = torch.empty(self.batch * self.my_dim)
        dist.all_to_all_single(grecv, gsend, output_split_sizes=[b * self.my_dim] * w,
                               input_split_sizes=[b * d for d in self.dims_of])  # fmt: skip
        c4, t4 = cpu(), clock()
        if pooled is not None:
            pooled.backward(grecv.view(self.batch, self.my_dim))
            if self.emb_opt is not None:
                self.emb_opt.step()
                self.emb_opt.zero_grad(set_to_none=True)
        t5, c5 = clock(), cpu()
        # 5. data-parallel gradient all-reduce (one bucket) and SGD
        flat = torch.cat([p.grad.reshape(-1) for p in self.dense_params])  # type: ignore[union-attr]
        dist.all_reduce(flat)
        flat /= w
        c6, t6 = cpu(), clock()
        off = 0
        for p in self.dense_params:
            n = p.numel()
            p.grad.copy_(flat[off : off + n].view_as(p))  # type: ignore[union-attr]
            off += n
        self.opt.step()
        t7, c7 = clock(), cpu()
        self.step_no += 1
        t.update(emb_fwd=t1 - t0, a2a_fwd=t2 - t1, dense=t3 - t2, a2a_bwd=t4 - t3, emb_bwd=t5 - t4,
                 allreduce=t6 - t5, optim=t7 - t6, total=t7 - t0)  # fmt: skip
        # this thread's CPU time over the wall time of the compute phases (no collective
        # inside): ~1 when the rank had its core, ~0.5 when another process shared it
        wall = (t1 - t0) + (t3 - t2) + (t5 - t4) + (t7 - t6)
        t["cpu_ratio"] = ((c1 - c0) + (c3 - c2) + (c5 - c4) + (c7 - c6)) / wall if wall > 0 else 1.0
        return t


def _rank_main(job: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    import random

    import torch
    import torch.distributed as dist

    run, spec = job["run"], job["spec"]
    backend = _pick_backend(run["backend"])
    names = list(job["assignments"])
    needed = sorted({t for a in job["assignments"].values() for t, r in enumerate(a) if r == rank})
    batches, folded = _index_batches(spec, needed, run["index_batches"], run["seed"])
    # the same orders on every rank; another order for another spec (no assignment always first)
    order_rng = random.Random(f"{run['seed']}:{spec_digest(spec)}")
    # process warm-up (allocator growth, first kernel calls, page faults): a block of the first
    # assignment, untimed, so that the first measured block pays none of it
    model = _RankModel(job, job["assignments"][names[0]], rank=rank, world=world,
                       backend=backend, batches=batches)  # fmt: skip
    for _ in range(run["warmup"] + run["steps"]):
        dist.barrier()
        model.step()
    del model
    blocks = []
    for rep in range(run["repeats"]):
        order = names[:] if rep == 0 and len(names) == 1 else order_rng.sample(names, len(names))
        for name in order:
            dist.barrier()
            t0 = time.perf_counter()
            model = _RankModel(job, job["assignments"][name], rank=rank, world=world,
                               backend=backend, batches=batches)  # fmt: skip
            build = time.perf_counter() - t0
            for _ in range(run["warmup"]):
                dist.barrier()
                model.step()
            rec: dict[str, Any] = {"name": name, "repeat": rep, "build_s": build,
                                   "load_1m": os.getloadavg()[0], "clean": [], "cpu_ratio_min": [],
                                   **{k: [] for k in ("total", "cpu_ratio", *PHASES)}}  # fmt: skip
            clean = 0
            while clean < run["steps"] and len(rec["total"]) < run["max_steps"]:
                dist.barrier()
                for k, v in model.step().items():
                    rec[k].append(v)
                # untimed: did any rank lose its core during the step? (all ranks agree)
                ratio = torch.tensor([rec["cpu_ratio"][-1]], dtype=torch.float64)
                dist.all_reduce(ratio, op=dist.ReduceOp.MIN)
                ok = float(ratio) >= run["clean_ratio"]
                rec["cpu_ratio_min"].append(float(ratio))
                rec["clean"].append(ok)
                clean += ok
            blocks.append(rec)
            del model
    return {"rank": rank, "backend": backend, "blocks": blocks, "folded_tables": folded}


def backend_available() -> str:
    """``"fbgemm"`` when fbgemm-gpu's CPU TBE imports here, else ``"torch"``."""
    return _pick_backend("auto")


def measurement_info(run: ShardRun, world: int) -> dict[str, Any]:
    """What the numbers depend on besides the spec (for result rows and resume keys)."""
    import platform

    import torch

    info: dict[str, Any] = {"protocol": PROTOCOL, "world": world, **asdict(run), "threads": run.threads or max(1, _usable_cores() // world),
                            "embedding_backend": backend_available(), "torch": torch.__version__,
                            "cpu": platform.processor() or platform.machine(), "cores": _usable_cores()}  # fmt: skip
    info.pop("timeout_s")
    if info["embedding_backend"] == "fbgemm":
        import fbgemm_gpu

        info["fbgemm_gpu"] = getattr(fbgemm_gpu, "__version__", "?")
    return info


def spec_digest(payload: Mapping[str, Any]) -> str:
    """A short stable digest of a spec payload (or any JSON-able mapping)."""
    import hashlib

    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = [
    "PHASES",
    "ShardMeasurement",
    "ShardRun",
    "backend_available",
    "measure_assignments",
    "measure_step",
    "measurement_info",
    "repeat_spread_pct",
    "spec_digest",
    "spec_payload",
]
