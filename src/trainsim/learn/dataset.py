"""Stage-latency datasets: sampling stages, resumable measurement, provenance, loading.

A dataset is a folder::

    provenance.json         host fingerprint, versions, XLA flags, core, seeds, sampler, timing settings
    stages.jsonl            one row per measured stage (schema ``trainsim.predtop-stage/1``)
    graphs/<sha16>.json.gz  the stage's full (unpruned) graphs, content-addressed

Each stage has two graphs (:data:`trainsim.learn.stages.PARTS`): the jaxpr of its training step
(``graph``: forward and backward, what is timed) and of its forward computation alone
(``graph_forward``: the same operators' shapes, a third of the nodes). ``wall_s`` (graphs,
compilation, warm-up and timed repeats) minus ``graph_s`` and ``graph_forward_s`` is the
stage's measurement cost.

A row::

    {"schema": "trainsim.predtop-stage/1", "id": "gpt-s0-0007", "family": "gpt",
     "spec": {...StageSpec...}, "latency_s": 0.0421, "samples_s": [...], "repeats": 24,
     "rel_iqr": 0.006, "rel_range": 0.03, "warmup": 2, "compile_s": 1.1, "graph_s": 0.2, "wall_s": 3.4,
     "flops": 2.9e9, "graph": "3f2a...", "nodes_full": 612, "nodes": 402, "graph_forward": "9c1e...",
     "graph_forward_s": 0.05, "nodes_full_forward": 230, "nodes_forward": 150,
     "host": "f97e94a9cbddf655", "timestamp": "2026-11-21T21:00:00+00:00"}

Rows are appended with one ``write`` on an ``O_APPEND`` descriptor and ``fsync``
(:func:`trainsim.bench.dataset.append_row`); the graph file is written first, atomically
(temporary file + ``os.replace``). An interrupted collection leaves at most a torn last line,
which :func:`read_rows` skips and :func:`collect` cuts off before it resumes; stages whose id is
already in the file are skipped, so a resumed collection never measures a stage twice.

**Sampling** (:func:`sample_stages`): the ``i``-th stage of ``(family, seed)`` is the same in
every run: a fixed pool of random configurations (hidden size, heads, sequence, micro-batch,
depth, position in the model, shard factor; MoE: experts, group size, capacity factor) is
drawn from ``seed``, configurations whose estimated latency (FLOPs / 70 GFLOP/s) lies outside
[``min_est_s``, ``max_est_s``] are dropped, the rest are binned by (depth, log estimated
latency) and taken round-robin over the bins, so that depths are balanced, latencies spread
over the logarithmic range (ms to ~1 s), and any prefix of the sequence is itself spread.

Collect with (sets single-threaded XLA and pins one core before importing jax)::

    python -m trainsim.learn.dataset DIR --family gpt --count 300 --seed 0
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import math
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.bench.dataset import append_row, complete_lines, repair_tail
from trainsim.errors import ConfigError, GraphError, TraceFormatError, TrainsimError
from trainsim.learn.graphs import StageGraph
from trainsim.learn.stages import (
    MALLOC_ENV,
    PARTS,
    XLA_SINGLE_THREAD,
    StageSpec,
    single_thread_env,
)

STAGE_SCHEMA = "trainsim.predtop-stage/1"
PROVENANCE_SCHEMA = "trainsim.predtop-provenance/1"
RATE_FLOPS = 70e9  # single-core XLA CPU fp32 rate used only to spread the sampled latencies
_POOL = 12000
_BINS = 8


# --- sampling -----------------------------------------------------------------------------------


def _gpt_candidate(rng: np.random.Generator) -> StageSpec:
    hidden = int(rng.choice([256, 384, 512, 768, 1024]))
    layers = int(rng.integers(1, 5))
    return StageSpec(
        family="gpt", hidden=hidden, heads=hidden // 64, seq=int(rng.choice([128, 256, 512, 1024])),
        micro_batch=int(rng.choice([1, 2, 4, 8])), layers=layers,
        first_layer=int(rng.integers(0, 24 - layers + 1)), shard=int(rng.choice([1, 2, 4])),
        embed=bool(rng.random() < 0.25), head=bool(rng.random() < 0.25), vocab=16384,
    )  # fmt: skip


def _moe_candidate(rng: np.random.Generator) -> StageSpec:
    hidden = int(rng.choice([256, 384, 512, 768]))
    layers = int(rng.integers(1, 5))
    seq = int(rng.choice([128, 256, 512]))
    mb = int(rng.choice([1, 2, 4, 8]))
    group = int(rng.choice([g for g in (128, 256, 512) if (mb * seq) % g == 0]))
    return StageSpec(
        family="moe", hidden=hidden, heads=hidden // 64, seq=seq, micro_batch=mb, layers=layers,
        first_layer=int(rng.integers(0, 32 - layers + 1)), shard=int(rng.choice([1, 2, 4])),
        embed=bool(rng.random() < 0.25), head=bool(rng.random() < 0.25), vocab=8192,
        experts=int(rng.choice([8, 16, 32])), group_size=group,
        capacity_factor=float(rng.choice([1.0, 1.25, 2.0])),
    )  # fmt: skip


_CANDIDATES: dict[str, Callable[[np.random.Generator], StageSpec]] = {
    "gpt": _gpt_candidate,
    "moe": _moe_candidate,
}


def estimated_latency_s(spec: StageSpec) -> float:
    """A rough latency (FLOPs at :data:`RATE_FLOPS` plus 1 ms) used only to spread samples."""
    return spec.flops() / RATE_FLOPS + 1e-3


def sample_stages(family: str, count: int, *, seed: int = 0, min_est_s: float = 3e-3,
                  max_est_s: float = 1.0) -> list[tuple[str, StageSpec]]:  # fmt: skip
    """The first ``count`` stages of ``(family, seed)`` as ``(id, spec)`` (module docstring)."""
    if family not in _CANDIDATES:
        raise ConfigError(f"family must be one of {', '.join(sorted(_CANDIDATES))}, got {family!r}")
    bins = _strata(family, seed, min_est_s, max_est_s)
    out: list[tuple[str, StageSpec]] = []
    k = 0
    while len(out) < count:
        if not any(len(b) > k for b in bins):
            raise ConfigError(f"only {len(out)} distinct {family} stages in the sampling pool")
        for b in bins:
            if len(b) > k and len(out) < count:
                out.append((f"{family}-s{seed}-{len(out):04d}", b[k]))
        k += 1
    return out


@functools.lru_cache(maxsize=8)
def _strata(
    family: str, seed: int, min_est_s: float, max_est_s: float
) -> tuple[tuple[StageSpec, ...], ...]:
    rng = np.random.default_rng([seed, 3])
    seen: set[str] = set()
    strata: dict[tuple[int, int], list[StageSpec]] = {}
    lo, hi = math.log(min_est_s), math.log(max_est_s)
    for _ in range(_POOL):
        try:
            spec = _CANDIDATES[family](rng)
        except ConfigError:  # e.g. a shard factor that does not divide the heads
            continue
        est = estimated_latency_s(spec)
        if not min_est_s <= est <= max_est_s or spec.key() in seen:
            continue
        seen.add(spec.key())
        b = min(_BINS - 1, int((math.log(est) - lo) / (hi - lo) * _BINS))
        strata.setdefault((spec.layers, b), []).append(spec)
    return tuple(tuple(strata[k]) for k in sorted(strata))


# --- provenance ---------------------------------------------------------------------------------


def _cpu_model() -> str:
    from trainsim.bench.comm import _cpu_model as cpu

    return cpu()


def host_fingerprint() -> dict[str, Any]:
    """What the latencies depend on: host, CPU model, software versions."""
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("jax", "jaxlib", "numpy", "trainsim"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    info: dict[str, Any] = {"host": platform.node(), "machine": platform.machine(), "cpu": _cpu_model(),
                            "cpus": os.cpu_count(), "versions": versions}  # fmt: skip
    info["id"] = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16]
    return info


def _write_json_atomic(path: Path, doc: Any, *, compress: bool = False) -> None:
    data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    if compress:
        data = gzip.compress(data, mtime=0)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# --- the folder ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StageRow:
    id: str
    family: str
    spec: StageSpec
    latency_s: float
    rel_iqr: float
    graph: str
    raw: dict[str, Any]
    source: str = field(default="", compare=False, repr=False)  # the stages.jsonl it was read from

    def graph_of(self, part: str = "train") -> str:
        """The digest of this stage's ``part`` graph (:data:`~trainsim.learn.stages.PARTS`):
        ``graph`` for the training step, ``graph_<part>`` for the others."""
        if part == "train":
            return self.graph
        if part not in PARTS:
            raise ConfigError(f"part must be one of {', '.join(PARTS)}, got {part!r}")
        digest = self.raw.get(f"graph_{part}")
        if digest is None:  # a row written by hand or by another tool may hold the training graph only
            raise TraceFormatError(
                self.source or "stages.jsonl", f"stage {self.id}: no graph_{part} (the digest of its {part} graph), "
                f"which a {part} predictor reads; add it to every row with "
                "trainsim.learn.dataset.rebuild_graphs(folder) (measurements are kept)",
            )
        return str(digest)

    @property
    def profile_s(self) -> float:
        """Measurement cost: compilation, warm-up and timed repeats (graph building excluded)."""
        return float(self.raw["wall_s"]) - sum(
            float(self.raw.get(f"graph{s}_s", 0.0)) for s in ("", "_forward")
        )


def _dataset_folder(folder: Path | str) -> Path:
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder}: is a file; a stage dataset is a folder (stages.jsonl, graphs/)")
    return folder


def _stages_file(folder: Path | str) -> Path:
    """``folder/stages.jsonl`` (``folder`` checked): a one-line error where it is a folder."""
    path = _dataset_folder(folder) / "stages.jsonl"
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; a stage dataset's stages.jsonl is a file of rows (JSON lines)")
    return path


_TORN_SAID: set[str] = set()  # files whose torn last line was warned of (once per process)


def read_rows(folder: Path | str) -> list[StageRow]:
    """Every complete row of ``folder/stages.jsonl`` (a torn last line is skipped).

    A stage id appears once (a resumed collection skips the ids it holds): a file with an id
    twice (e.g. two folders merged by hand) is refused, since which measurement is the stage's
    (and which split a predictor put it in) would be a guess."""
    path = _stages_file(folder)
    if not path.exists():
        return []
    out = []
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceFormatError(path, f"unreadable ({e.strerror or e})") from None
    if raw[raw.rfind(b"\n") + 1 :].strip() and str(path) not in _TORN_SAID:  # a count one short is a mystery
        _TORN_SAID.add(str(path))
        print(f"warning: {path}: its last line is incomplete (an interrupted collection) and is skipped; "
              "`trainsim stages collect` on the folder cuts it and resumes", file=sys.stderr)  # fmt: skip
    line_of: dict[str, int] = {}
    for lineno, d in complete_lines(path, raw):
        if not isinstance(d, dict) or d.get("schema") != STAGE_SCHEMA:
            raise TraceFormatError(path, f"line {lineno}: not a {STAGE_SCHEMA} row")
        sid, latency = d.get("id"), d.get("latency_s")
        if not isinstance(sid, str) or not sid:
            raise TraceFormatError(path, f"line {lineno}: id must be a stage id (text), got {sid!r}")
        if sid in line_of:
            raise TraceFormatError(path, f"line {lineno}: stage {sid} is on line {line_of[sid]} already; "
                                   "a stage appears once (two folders merged?): keep one of the two rows")  # fmt: skip
        line_of[sid] = lineno
        if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not 0 < latency < math.inf:
            raise TraceFormatError(path, f"line {lineno}: latency_s must be a positive number, got {latency!r}")
        try:
            spec = StageSpec.from_dict(d.get("spec"))
        except ConfigError as e:
            raise TraceFormatError(path, f"line {lineno}: spec: {e}") from None
        try:
            out.append(StageRow(sid, d["family"], spec, float(latency), float(d.get("rel_iqr", 0.0)), d["graph"], d,
                                str(path)))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise TraceFormatError(path, f"line {lineno}: malformed row ({type(e).__name__}: {e})") from None
    return out


_DIGEST = re.compile(r"[0-9a-f]{16}")  # a graph file's name: the first 16 hex digits of its sha256


def load_graph(folder: Path | str, digest: str) -> StageGraph:
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):  # a row names it: never a path
        raise TraceFormatError(Path(folder) / "stages.jsonl", f"graph {digest!r} is not a graph digest "
                               "(16 hex digits); the row was edited or damaged")  # fmt: skip
    path = Path(folder) / "graphs" / f"{digest}.json.gz"
    try:
        return StageGraph.from_json(json.loads(gzip.decompress(path.read_bytes())))
    except FileNotFoundError:
        raise TraceFormatError(
            path, "graph file missing; run `trainsim stages collect` on the folder again (same options) to rebuild it"
        ) from None
    except GraphError as e:  # read, but not a stage graph (another schema, a cycle, a dangling edge)
        raise TraceFormatError(
            path, f"{e}; run `trainsim stages collect` on the folder again (same options) to rebuild it"
        ) from None
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise TraceFormatError(
            path, f"unreadable stage graph ({type(e).__name__}); run `trainsim stages collect` on the folder "
            "again (same options) to rebuild it"
        ) from None


def _graph_readable(folder: Path, digest: str) -> bool:
    try:
        load_graph(folder, digest)
    except TraceFormatError:
        return False
    return True


def _restore_graphs(folder: Path, row: StageRow) -> list[str]:
    """Rebuild the graph files of an already measured ``row`` that are missing or unreadable.

    The graphs are a function of the stage's spec (no timing), so a resumed collection writes
    them again; a rebuilt graph whose digest differs from the row's means the graph builder
    changed since the row was measured (:func:`rebuild_graphs` is the way then).
    Returns the parts rebuilt.
    """
    rebuilt = []
    for part in PARTS:
        if part != "train" and row.raw.get(f"graph_{part}") is None:
            continue  # a graph the row never recorded is not restored (rebuild_graphs adds it)
        digest = row.graph_of(part)
        if _graph_readable(folder, digest):
            continue
        _, now = _store_graph(folder, row.spec, part, overwrite=True)
        if now != digest:
            raise ConfigError(
                f"{folder / 'stages.jsonl'}: row {row.id}: its {part} graph {digest} is missing or unreadable and the stage "
                f"now builds graph {now}: the graph builder changed since it was measured; rebuild every row's "
                "graphs with trainsim.learn.dataset.rebuild_graphs (measurements are kept)"
            )
        rebuilt.append(part)
    return rebuilt


def iter_graphs(
    folder: Path | str, rows: Sequence[StageRow], part: str = "train"
) -> Iterator[StageGraph]:
    cache: dict[str, StageGraph] = {}
    for r in rows:
        digest = r.graph_of(part)
        if digest not in cache:
            cache[digest] = load_graph(folder, digest)
        yield cache[digest]


def _sampler_words(kind: Any, family: Any, seed: Any, model_tag: Any = None) -> str:
    """A folder's stage set as the ``stages collect`` flags that make it."""
    if kind == "search-candidates":
        if model_tag:
            return (f"the candidate stages of another {family} search model (model {model_tag}: --search-set "
                    "with --layers/--hidden/... options)")  # fmt: skip
        return f"the {family} search model's candidate stages (--search-set)"
    if kind == "003-protocol":
        return f"003's {family} protocol stages (--protocol)"
    return f"random {family} stages of sampler seed {seed} (--seed {seed})"


def dataset_host(folder: Path | str) -> dict[str, Any] | None:
    """``{"id", "cpu"}`` of the host a dataset was measured on (its ``provenance.json``), or None."""
    try:
        host = json.loads((Path(folder) / "provenance.json").read_text(encoding="utf-8")).get("host") or {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    return {"id": host.get("id"), "cpu": host.get("cpu")} if host.get("id") else None


def _check_provenance(folder: Path, prov: dict[str, Any]) -> None:
    path = folder / "provenance.json"
    if not path.exists():
        _write_json_atomic(path, prov)
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: unreadable ({e}); it records where the folder was measured") from None
    if old.get("host", {}).get("id") != prov["host"]["id"]:
        was, now = old.get("host", {}), prov["host"]
        diff = [f"{k} {was.get(k)!r} -> {now.get(k)!r}" for k in ("host", "machine", "cpu", "cpus") if was.get(k) != now.get(k)]
        wv, nv = was.get("versions") or {}, now.get("versions") or {}
        diff += [f"{k} {wv.get(k)} -> {nv.get(k)}" for k in sorted(set(wv) | set(nv)) if wv.get(k) != nv.get(k)]
        raise ConfigError(
            f"{folder} was measured on host {was.get('id')} ({was.get('cpu')}), this is {now['id']} "
            f"({'; '.join(diff) or 'fingerprint differs'}): its stages would mix two setups' latencies; "
            "use another folder"
        )
    runs = old.setdefault("runs", [])
    # a folder keeps one sampler: the same kind, family and seed or search model (a count may grow)
    def sampler_id(run: dict[str, Any]) -> tuple[Any, ...]:
        s = run.get("sampler") or {}
        return s.get("kind"), s.get("family"), s.get("seed"), s.get("model_tag")

    new = sampler_id(prov["runs"][0])
    before = {sampler_id(r) for r in runs if r.get("sampler")}
    if before and new[0] is not None and new not in before:
        raise ConfigError(f"{folder} holds {_sampler_words(*sorted(before, key=str)[0])}; this run asks for "
                          f"{_sampler_words(*new)}: collect into another folder")  # fmt: skip
    runs.extend(prov["runs"])
    _write_json_atomic(path, old)


def _store_graph(
    folder: Path, spec: StageSpec, part: str, *, overwrite: bool = False
) -> tuple[StageGraph, str]:
    """Build ``spec``'s full ``part`` graph and write it content-addressed under ``folder/graphs``."""
    from trainsim.learn.stages import stage_graph

    full = stage_graph(spec, part=part)
    doc = full.to_json()
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
    gpath = folder / "graphs" / f"{digest}.json.gz"
    if overwrite or not gpath.exists():
        _write_json_atomic(gpath, doc, compress=True)
    return full, digest


# a stage whose repeats spread more than this (IQR / median) was measured under contention
NOISY_REL_IQR = 0.10
# a resumed folder's first stage, re-timed, is expected within this of its row, else a warning
# (another machine of the same fingerprint timed the shipped MoE stages 29-47 % faster)
RESUME_TOLERANCE = 0.20


def collect(folder: Path | str, items: Sequence[tuple[str, StageSpec]], *, warmup: int = 2,
            min_repeats: int = 5, max_repeats: int = 60, min_total_s: float = 1.0,
            target_spread: float = 0.02, max_total_s: float = 6.0,
            sampler: dict[str, Any] | None = None, log: Callable[[str], None] | None = None,
            stop_after: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Measure every ``(id, spec)`` not yet in ``folder``; resumable (module docstring).

    ``stop_after`` ends the run after that many new rows (tests use it to interrupt).
    Returns ``{"measured": n, "skipped": m, "total": rows in the folder}``.
    """
    from trainsim.ir.serialize import output_folder
    from trainsim.learn.graphs import prune
    from trainsim.learn.stages import measure_stage

    folder = _dataset_folder(folder)
    path = _stages_file(folder)
    output_folder(folder / "graphs")  # creatable, or a one-line error
    repair_tail(path)
    done = {r.id: r for r in read_rows(folder)}
    held, wanted = {r.family for r in done.values()}, {s.family for _, s in items}
    if held and not wanted <= held:
        raise ConfigError(f"{folder} holds {', '.join(sorted(held))} stages; collect "
                          f"{', '.join(sorted(wanted - held))} stages into another folder")  # fmt: skip
    host = host_fingerprint()
    settings = {"warmup": warmup, "min_repeats": min_repeats, "max_repeats": max_repeats,
                "min_total_s": min_total_s, "target_spread": target_spread, "max_total_s": max_total_s,
                "statistic": "median", "timer": "perf_counter"}  # fmt: skip
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    _check_provenance(folder, {
        "schema": PROVENANCE_SCHEMA, "host": host, "timing": settings,
        "runs": [{"started": datetime.now(UTC).isoformat(timespec="seconds"), "sampler": sampler or {},
                  "xla_flags": os.environ.get("XLA_FLAGS", ""), "cores": affinity,
                  "env": {k: os.environ.get(k) for k in (*MALLOC_ENV, "OMP_NUM_THREADS", "JAX_PLATFORMS")},
                  "single_thread": XLA_SINGLE_THREAD in os.environ.get("XLA_FLAGS", "")}],
    })  # fmt: skip
    for sid, spec in items:  # before anything is timed: a changed sampler is the error
        if sid in done and done[sid].spec != spec:
            raise ConfigError(f"{path}: row {sid} holds another stage than the sampler gives; "
                              "the sampler changed — collect into a new folder")  # fmt: skip
    todo = [sid for sid, _ in items if sid not in done]
    present = [r for sid, _ in items if (r := done.get(sid)) is not None]
    if present and todo:  # resuming: does this host time the folder's stages as its rows say?
        ref = min(present, key=lambda r: r.latency_s)  # the quickest to re-time
        again = measure_stage(ref.spec, warmup=warmup, min_repeats=min_repeats, max_repeats=max_repeats,
                              min_total_s=min_total_s, target_spread=target_spread, max_total_s=max_total_s)  # fmt: skip
        ratio = again.median_s / ref.latency_s
        line = (f"stage {ref.id} re-timed at {again.median_s * 1e3:.2f} ms, its row says {ref.latency_s * 1e3:.2f} ms "
                f"({100 * (ratio - 1):+.1f} %)")  # fmt: skip
        if abs(ratio - 1.0) > RESUME_TOLERANCE:  # a warning: a loaded host swings this much too
            print(f"warning: {folder}: {line}: another machine of the same fingerprint, or a loaded one; rows "
                  "measured now may not match the folder's (collect into another folder if the machine differs)",
                  file=sys.stderr)  # fmt: skip
        elif log:
            log(f"resume check: {line}")
    measured = skipped = restored = 0
    t_start = time.perf_counter()
    noisy: list[str] = []  # measured now with a spread above NOISY_REL_IQR
    for sid, spec in items:
        if sid in done:
            if done[sid].spec != spec:
                raise ConfigError(f"{path}: row {sid} holds another stage than the sampler gives; "
                                  "the sampler changed — collect into a new folder")  # fmt: skip
            parts = _restore_graphs(folder, done[sid])  # a deleted or damaged graph file comes back
            if parts:
                restored += 1
                if log:
                    log(f"{sid}: {' and '.join(parts)} graph rebuilt (missing or unreadable); its measurement is kept")
            skipped += 1
            continue
        t0 = time.perf_counter()
        graph_info: dict[str, Any] = {}
        for part in PARTS:
            t1 = time.perf_counter()
            full, digest = _store_graph(folder, spec, part)
            sfx = "" if part == "train" else f"_{part}"
            graph_info |= {f"graph{sfx}": digest, f"graph{sfx}_s": time.perf_counter() - t1,
                           f"nodes_full{sfx}": full.num_nodes, f"nodes{sfx}": prune(full).num_nodes}  # fmt: skip
        timing = measure_stage(spec, warmup=warmup, min_repeats=min_repeats,
                               max_repeats=max_repeats, min_total_s=min_total_s,
                               target_spread=target_spread, max_total_s=max_total_s)  # fmt: skip
        row = {
            "schema": STAGE_SCHEMA, "id": sid, "family": spec.family, "spec": spec.to_dict(),
            "latency_s": timing.median_s, "samples_s": list(timing.samples_s), "repeats": len(timing.samples_s),
            "rel_iqr": timing.rel_iqr, "rel_range": timing.rel_range, "warmup": timing.warmup,
            "compile_s": timing.compile_s, "wall_s": time.perf_counter() - t0, "flops": spec.flops(), **graph_info,
            "host": host["id"], "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        }  # fmt: skip
        append_row(path, row)
        measured += 1
        if timing.rel_iqr > NOISY_REL_IQR:
            noisy.append(sid)
        if log:
            left = (time.perf_counter() - t_start) / measured * (len(todo) - measured)  # the mean stage so far
            eta = f"{left:.0f} s" if left < 120 else f"{left / 60:.0f} min"
            log(f"[{measured}/{len(todo)}, ~{eta} left] "
                f"{sid} {spec.family} L={spec.layers} h={spec.hidden} b={spec.micro_batch} s={spec.seq} "
                f"t={spec.shard}: {timing.median_s * 1e3:.2f} ms ±{timing.rel_iqr * 100:.1f}% "
                f"({len(timing.samples_s)} reps, {row['wall_s']:.1f} s)"
                + (" — noisy: another process competed for the core?" if sid in noisy else ""))  # fmt: skip
        if stop_after is not None and measured >= stop_after:
            break
    return {"measured": measured, "skipped": skipped, "restored_graphs": restored, "total": len(read_rows(folder)),
            "noisy": noisy}  # fmt: skip


def rebuild_graphs(folder: Path | str, *, log: Callable[[str], None] | None = None) -> int:
    """Rebuild every row's graphs from its spec (when the graph format gains columns).

    Measurements are kept as they are; each row's graph digests (and node counts) are replaced
    and the graph files of the new digests written; ``stages.jsonl`` is rewritten atomically.
    A rebuilt graph must have the node count the row recorded (else the stage changed:
    :class:`ConfigError`). Returns the number of rows.
    """
    from trainsim.ir.serialize import write_text_atomic

    folder = Path(folder)
    path = _stages_file(folder)
    repair_tail(path)
    rows = read_rows(folder)
    lines = []
    for i, r in enumerate(rows):
        d = dict(r.raw)
        for part in PARTS:
            sfx = "" if part == "train" else f"_{part}"
            full, digest = _store_graph(folder, r.spec, part, overwrite=True)
            if f"nodes_full{sfx}" in d and d[f"nodes_full{sfx}"] != full.num_nodes:
                raise ConfigError(f"{path}: row {r.id}: rebuilt {part} graph has {full.num_nodes} nodes, "
                                  f"the row recorded {d[f'nodes_full{sfx}']}: the stage builder changed")  # fmt: skip
            d[f"graph{sfx}"] = digest
        lines.append(json.dumps(d, separators=(",", ":")))
        if log and (i + 1) % 50 == 0:
            log(f"{folder.name}: {i + 1}/{len(rows)} graphs rebuilt")
    write_text_atomic(path, "".join(x + "\n" for x in lines))
    keep = {d for r in read_rows(folder) for d in (r.graph, r.raw.get("graph_forward")) if d}
    for f in (folder / "graphs").glob("*.json.gz"):
        if f.name.removesuffix(".json.gz") not in keep:
            f.unlink()
    return len(rows)


def _pin_one_core() -> int | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[-1]
    os.sched_setaffinity(0, {core})
    return core


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainsim.learn.dataset DIR --family F --count N [--seed S] [--search | --protocol]``."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m trainsim.learn.dataset", description=__doc__.split("\n")[0]
    )
    ap.add_argument("folder", type=Path)
    ap.add_argument("--family", choices=sorted(_CANDIDATES), required=True)
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--search",
        action="store_true",
        help="measure every candidate stage of the search-integration model instead",
    )
    ap.add_argument(
        "--protocol",
        action="store_true",
        help="measure 003's protocol sets instead: every stage of one model under each Table III configuration",
    )
    from trainsim.learn.provider import MODEL_FLAGS

    for name in MODEL_FLAGS:  # --search: the search model's fields (default: SEARCH_MODELS[family])
        ap.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None,
                        type=str if name == "shards" else int)  # fmt: skip
    ap.add_argument("--min-total-s", type=float, default=1.0)
    ap.add_argument("--format", choices=("table", "json"), default="json")
    ap.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)  # `trainsim --debug stages collect`
    args = ap.parse_args(argv)
    # this runs as its own process (the collector restarts itself): it keeps the CLI contract itself
    try:
        return _collect_main(args, argv)
    except TrainsimError as e:  # one line, exit 1
        if args.debug:
            raise
        print(f"trainsim: error: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:  # the rows measured so far are on disk (each appended and fsynced)
        try:
            kept = f"{len(read_rows(args.folder))} stages in {args.folder} are kept"
        except TrainsimError:
            kept = f"the stages measured in {args.folder} are kept"
        print(f"trainsim: interrupted: {kept}; run the same command again to resume", file=sys.stderr, flush=True)
        if "jax" in sys.modules:
            # a stage's compile the interrupt cut short goes on in XLA's thread pool (it cannot be
            # cancelled) and dereferences the client that interpreter shutdown frees: the process
            # died of SIGSEGV after this line, 4 times in 4. Every row is on disk (appended and
            # fsynced), so there is nothing left to finalize: leave at once with the contract's 130.
            sys.stdout.flush()
            os._exit(130)
        return 130


def _collect_main(args: Any, argv: Sequence[str] | None) -> int:
    env = single_thread_env()
    if any(os.environ.get(k) != v for k, v in env.items()):
        # glibc reads MALLOC_* at process start and jax reads XLA_FLAGS at import: start afresh
        argv = list(sys.argv[1:] if argv is None else argv)
        os.execve(sys.executable, [sys.executable, "-m", "trainsim.learn.dataset", *argv], env)
    if "jax" in sys.modules:
        raise ConfigError("jax is already imported: run the collector as its own process")
    from trainsim.learn.provider import MODEL_FLAGS

    core = _pin_one_core()
    if args.search and args.protocol:
        raise ConfigError("--search and --protocol are two different stage sets: give one")
    given = [k for k in MODEL_FLAGS if getattr(args, k) is not None]
    if given and not args.search:
        raise ConfigError(f"--{given[0].replace('_', '-')} sets the search model: it goes with --search-set")
    if args.protocol:
        from trainsim.learn.protocol import PROTOCOL_MODELS, protocol_stages

        items = protocol_stages(args.family)
        m = PROTOCOL_MODELS[args.family]
        sampler = {"kind": "003-protocol", "family": args.family, "layers": m.layers,
                   "max_stage_layers": m.max_stage_layers, "hidden": m.hidden, "seq": m.seq,
                   "micro_batch": m.micro_batch}  # fmt: skip
    elif args.search:
        from trainsim.learn.provider import (
            is_default,
            model_tag,
            parse_shards,
            search_candidates,
            search_model,
        )

        fields = {k: getattr(args, k) for k in MODEL_FLAGS}
        if fields["shards"] is not None:
            fields["shards"] = parse_shards(fields["shards"])
        model = search_model(args.family, **fields)
        items = search_candidates(args.family, model)
        sampler = {"kind": "search-candidates", "family": args.family}
        if not is_default(model):  # its own model: a folder of its own (ids carry the tag)
            sampler |= {"model_tag": model_tag(model), "model": asdict(model)}
    else:
        items = sample_stages(args.family, args.count, seed=args.seed)
        sampler = {"kind": "stratified-log-latency", "family": args.family, "count": args.count,
                   "seed": args.seed, "rate_flops": RATE_FLOPS, "bins": _BINS, "pool": _POOL}  # fmt: skip
    sampler["core"] = core
    res = collect(args.folder, items, min_total_s=args.min_total_s, sampler=sampler,
                  log=lambda m: print(m, file=sys.stderr, flush=True))  # fmt: skip
    if args.format == "json":
        print(json.dumps(res))
    else:
        restored = f" ({res['restored_graphs']} with rebuilt graphs)" if res["restored_graphs"] else ""
        print(f"measured {res['measured']} stage(s), {res['skipped']} already there{restored}; "
              f"{res['total']} in {args.folder}")  # fmt: skip
    if res["noisy"]:  # kept (the median is robust), but said: a quiet machine measures them better
        print(f"warning: {len(res['noisy'])} of the {res['measured']} stages measured now spread more than "
              f"{NOISY_REL_IQR:.0%} (IQR / median; e.g. {res['noisy'][0]}): other processes competed for the core; "
              f"delete their rows from stages.jsonl and resume on a quieter machine to measure them again",
              file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "STAGE_SCHEMA",
    "StageRow",
    "collect",
    "estimated_latency_s",
    "host_fingerprint",
    "iter_graphs",
    "load_graph",
    "read_rows",
    "sample_stages",
]
