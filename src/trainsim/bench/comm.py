"""The collective micro-benchmark: time collectives over message sizes with torch.distributed.

``run_comm_bench`` starts ``world_size`` local processes (``torch.multiprocessing``: forked
with gloo on CPU, spawned with NCCL on GPUs) or, when started under ``torchrun`` (``RANK``/``WORLD_SIZE`` set), runs in
the current process as one rank of the job. For every (collective, size) it warms up, then
times ``iters`` iterations, each one started together (barrier) and taking the slowest rank's
time; the row keeps the median and every iteration.

The dataset is JSONL, one row per (collective, size) in the ``trainsim.comm-bench/1`` schema
that :func:`trainsim.comm.read_comm_dataset` reads. Rank 0 appends each row with one
``write`` on an ``O_APPEND`` descriptor followed by ``fsync``, so a crash loses at most the
row being written; a torn last line is cut off on resume. Rows already present for the same
device fingerprint, backend, world size, collective and size are skipped (``resume``).

Sizes follow :mod:`trainsim.comm.sizing`: all_gather rows count the gathered output,
reduce_scatter the input, all_to_allv the 000 §III-C size (max over ranks of max(sent,
received)), send/recv one message (pairs 0→1, 2→3, ... at once).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsim.bench.dataset import append_row, check_appendable, sweep_lock
from trainsim.comm.readers import BENCH_SCHEMA
from trainsim.comm.sizing import all_to_all_size_bytes
from trainsim.errors import CaptureError, ConfigError
from trainsim.ir.kinds import CollectiveKind as C

BENCH_KINDS: tuple[C, ...] = (
    C.ALL_REDUCE,
    C.ALL_GATHER,
    C.REDUCE_SCATTER,
    C.ALL_TO_ALL,
    C.ALL_TO_ALLV,
    C.BROADCAST,
    C.SEND,
)
QUICK_SIZES = tuple(2**p for p in range(10, 21, 5))  # 1 KiB, 32 KiB, 1 MiB
FULL_SIZES = tuple(2**p for p in range(10, 29))  # 1 KiB .. 256 MiB
_ELEM_BYTES = 4  # float32 buffers


@dataclass(frozen=True, slots=True)
class BenchResult:
    dataset: Path
    samples: int  # rows written by this run
    skipped: int  # rows already in the dataset (resume)
    unsupported: tuple[str, ...]  # collectives the backend refused
    device: str


def _versions() -> dict[str, str | None]:
    import torch

    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):
            nccl = None
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("trainsim")
    except PackageNotFoundError:
        ours = None
    return {"torch": torch.__version__, "python": platform.python_version(), "nccl": nccl,
            "cuda": torch.version.cuda, "trainsim": ours}  # fmt: skip


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_fingerprint(device: str) -> dict[str, Any]:
    """What the numbers depend on: host, CPU or GPU model, and software versions."""
    import torch

    gpu = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else None
    info: dict[str, Any] = {"host": socket.gethostname(), "machine": platform.machine(), "cpu": _cpu_model(),
                            "cpus": os.cpu_count(), "gpu": gpu, "gpu_count": torch.cuda.device_count() if gpu else 0,
                            "versions": _versions()}  # fmt: skip
    info["id"] = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16]
    return info


def _row_key(
    kind: str, nbytes: float, world: int, backend: str, fp: str
) -> tuple[str, int, int, str, str]:
    return (kind, int(nbytes), world, backend, fp)


def _load_done(path: Path) -> set[tuple[str, int, int, str, str]]:
    """Keys of rows already in the dataset; a torn last line (crash mid-write) is cut off."""
    if not path.exists():
        return set()
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        with path.open("r+b") as fh:
            fh.truncate(raw.rfind(b"\n") + 1)
        raw = raw[: raw.rfind(b"\n") + 1]
    done = set()
    for lineno, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            done.add(
                _row_key(
                    r["kind"],
                    r["nbytes"],
                    r["nodes"] * r["gpus_per_node"],
                    r["backend"],
                    r["fingerprint"],
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ConfigError(
                f"{path}:{lineno}: not a {BENCH_SCHEMA} row; move the file away or fix it"
            ) from None
    return done


# --- one rank ----------------------------------------------------------------------------------


def _alltoallv_splits(world: int, elems: int) -> list[list[int]]:
    """A fixed uneven exchange: rank i sends to j a share growing with (i + j) mod world."""
    out = []
    for i in range(world):
        w = [1 + (i + j) % world for j in range(world)]
        row = [elems * x // sum(w) for x in w]
        row[-1] += elems - sum(row)
        out.append(row)
    return out


def _make_op(kind: C, nbytes: int, rank: int, world: int, dev: Any) -> tuple[Any, float]:
    """A callable running one collective of ``nbytes`` (sizing convention) and its model size."""
    import torch
    import torch.distributed as dist

    elems = max(nbytes // _ELEM_BYTES, world)
    if kind is C.ALL_REDUCE:
        t = torch.ones(elems, device=dev)
        return (lambda: dist.all_reduce(t)), elems * _ELEM_BYTES
    if kind is C.BROADCAST:
        t = torch.ones(elems, device=dev)
        return (lambda: dist.broadcast(t, src=0)), elems * _ELEM_BYTES
    if kind is C.ALL_GATHER:
        per = max(elems // world, 1)
        inp, out = torch.ones(per, device=dev), torch.empty(per * world, device=dev)
        gather = (
            getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        )  # renamed in torch 2.13
        return (lambda: gather(out, inp)), per * world * _ELEM_BYTES
    if kind is C.REDUCE_SCATTER:
        per = max(elems // world, 1)
        inp, out = torch.ones(per * world, device=dev), torch.empty(per, device=dev)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return (lambda: scatter(out, inp)), per * world * _ELEM_BYTES
    if kind is C.ALL_TO_ALL:
        per = max(elems // world, 1)
        inp, out = torch.ones(per * world, device=dev), torch.empty(per * world, device=dev)
        return (lambda: dist.all_to_all_single(out, inp)), per * world * _ELEM_BYTES
    if kind is C.ALL_TO_ALLV:
        splits = _alltoallv_splits(world, elems)
        send = splits[rank]
        recv = [splits[j][rank] for j in range(world)]
        inp, out = torch.ones(sum(send), device=dev), torch.empty(sum(recv), device=dev)
        size = int(
            all_to_all_size_bytes([[x * _ELEM_BYTES for x in row] for row in splits])
        )  # whole bytes
        return (lambda: dist.all_to_all_single(out, inp, recv, send)), size
    if kind is C.SEND:
        t = torch.ones(elems, device=dev)
        peer = rank ^ 1
        if peer >= world:
            return (lambda: None), elems * _ELEM_BYTES
        return (
            (lambda: dist.send(t, peer)) if rank % 2 == 0 else (lambda: dist.recv(t, peer))
        ), elems * _ELEM_BYTES
    raise ConfigError(f"the comm benchmark does not run {kind}")


def _time_op(op: Any, *, warmup: int, iters: int, dev: Any) -> list[float]:
    """Per-iteration seconds of the slowest rank (every iteration starts after a barrier)."""
    import torch
    import torch.distributed as dist

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        op()
    sync()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        op()
        sync()
        times.append(time.perf_counter() - t0)
    worst = torch.tensor(times, dtype=torch.float64, device=dev)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return [float(x) for x in worst.cpu()]


def _bench_rank(rank: int, world: int, cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(
            cfg["backend"], init_method=cfg["init_method"], rank=rank, world_size=world
        )
    dev = (
        torch.device(
            "cuda", int(os.environ.get("LOCAL_RANK", rank)) % max(torch.cuda.device_count(), 1)
        )
        if cfg["device"] == "cuda"
        else torch.device("cpu")
    )
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    path = Path(cfg["dataset"])
    try:
        for kind_s, nbytes in cfg["todo"]:
            kind = C(kind_s)
            try:
                op, size = _make_op(kind, nbytes, rank, world, dev)
                times = _time_op(op, warmup=cfg["warmup"], iters=cfg["iters"], dev=dev)
            except (RuntimeError, NotImplementedError, ValueError) as e:
                if rank == 0:
                    print(
                        f"trainsim bench comm: {cfg['backend']} cannot run {kind_s}: {str(e).splitlines()[0]}",
                        flush=True,
                    )
                dist.barrier()
                continue
            if rank == 0:
                append_row(path, {
                    "schema": BENCH_SCHEMA, "kind": kind_s, "nbytes": size, "requested_bytes": nbytes,
                    "nodes": world // local, "gpus_per_node": local, "duration_s": statistics.median(times),
                    "times_s": times, "warmup": cfg["warmup"], "iters": cfg["iters"], "dtype": "float32",
                    "backend": cfg["backend"], "device": cfg["device_name"], "fingerprint": cfg["fingerprint"]["id"],
                    "host": cfg["fingerprint"], "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                })  # fmt: skip
    finally:
        dist.barrier()
        if cfg.get("owns_group", True):
            dist.destroy_process_group()


def _spawn_entry(rank: int, world: int, cfg: dict[str, Any]) -> None:
    _bench_rank(rank, world, cfg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_comm_bench(dataset: Path | str, *, kinds: Sequence[C | str] = BENCH_KINDS, sizes_bytes: Sequence[int] | None = None,
                   world_size: int = 2, backend: str | None = None, device: str = "cpu", warmup: int = 5, iters: int = 20,
                   quick: bool = False, resume: bool = True) -> BenchResult:  # fmt: skip
    """Benchmark collectives into ``dataset`` (JSONL, appended). See the module docstring."""
    import torch

    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible to torch")
    backend = backend or ("nccl" if device == "cuda" else "gloo")
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else world_size
    if world < 2:
        raise ConfigError(f"a collective benchmark needs at least 2 ranks, got {world}")
    if quick:
        warmup, iters = min(warmup, 2), min(iters, 5)
    sizes = tuple(sizes_bytes) if sizes_bytes else (QUICK_SIZES if quick else FULL_SIZES)
    from trainsim.ir.serialize import output_path

    path = output_path(dataset)  # not a folder, its folder creatable: one-line errors
    check_appendable(path, BENCH_SCHEMA, "a trainsim comm bench dataset")  # before its tail is cut
    # one sweep writes a dataset at a time (under torchrun only rank 0 writes, so it alone locks)
    lock = (
        sweep_lock(path)
        if not under_torchrun or os.environ["RANK"] == "0"
        else contextlib.nullcontext()
    )
    with lock:
        fp = device_fingerprint(device)
        dev_name = fp["gpu"] or fp["cpu"]
        done = _load_done(path) if resume else set()
        todo = [(C(k).value, int(s)) for k in kinds for s in sizes]
        pending = [
            (k, s)
            for k, s in todo
            if _row_key(k, _model_size(C(k), s, world), world, backend, fp["id"]) not in done
        ]
        before = _count_rows(path)
        if pending:
            cfg = {"backend": backend, "device": device, "device_name": dev_name, "dataset": str(path), "todo": pending,
                   "warmup": warmup, "iters": iters, "fingerprint": fp}  # fmt: skip
            if under_torchrun:
                cfg.update(init_method="env://", owns_group=not torch.distributed.is_initialized())
                _bench_rank(int(os.environ["RANK"]), world, cfg)
            else:
                cfg["init_method"] = f"tcp://127.0.0.1:{_free_port()}"
                _run_ranks(world, cfg, backend, device)
        written = _count_rows(path) - before
        refused = tuple(sorted({k for k, _ in pending} - _kinds_in(path, fp["id"], world, backend)))
    return BenchResult(path, written, len(todo) - len(pending), refused, dev_name)


def _run_ranks(world: int, cfg: dict[str, Any], backend: str, device: str) -> None:
    """The ranks as local processes. On Ctrl-C they are stopped, not left to finish the sweep:
    torch's children swallow the interrupt, a rank blocked in a collective whose peer left never
    returns, and multiprocessing's exit handler would wait for them (rows already written stay:
    each is one appended write)."""
    import torch

    # fork reuses this process's imported torch (seconds per rank saved); CUDA needs spawn.
    method = "fork" if device == "cpu" and hasattr(os, "fork") else "spawn"
    ctx = torch.multiprocessing.start_processes(
        _spawn_entry, args=(world, cfg), nprocs=world, join=False, start_method=method
    )
    try:
        while not ctx.join():
            pass
    except KeyboardInterrupt:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.terminate()
        for proc in ctx.processes:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        raise
    except Exception as e:  # torch raises ProcessRaisedException / ProcessExitedException
        raise CaptureError(
            f"comm benchmark with {world} {backend} ranks failed: {str(e).strip().splitlines()[-1]}"
        ) from e


def _model_size(kind: C, nbytes: int, world: int) -> float:
    """The size a row of this request will carry (to recognise it on resume)."""
    elems = max(nbytes // _ELEM_BYTES, world)
    if kind in (C.ALL_GATHER, C.REDUCE_SCATTER, C.ALL_TO_ALL):
        return max(elems // world, 1) * world * _ELEM_BYTES
    if kind is C.ALL_TO_ALLV:
        splits = _alltoallv_splits(world, elems)
        return int(all_to_all_size_bytes([[x * _ELEM_BYTES for x in row] for row in splits]))
    return elems * _ELEM_BYTES


def _count_rows(path: Path) -> int:
    return (
        sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        if path.exists()
        else 0
    )


def _kinds_in(path: Path, fp: str, world: int, backend: str) -> set[str]:
    return {k for k, _, w, b, f in _load_done(path) if f == fp and w == world and b == backend}
