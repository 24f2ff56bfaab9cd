"""JSON I/O for the IR. ``workload_from_dict(workload_to_dict(w)) == w`` (tested).

Every dataclass is written as a plain object; enums as their values; tuples as lists. The
document carries ``schema_version`` so future readers can migrate old files.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

from trainsim.errors import ConfigError, GraphError
from trainsim.ir.graph import Collective, Kernel, Op, RankGraph, SyncPoint, TensorMeta, Workload
from trainsim.ir.kinds import CollectiveKind, KernelFamily, OpCategory, SyncKind

SCHEMA_VERSION = "1.0"


def _tensor(t: TensorMeta) -> dict[str, Any]:
    return {"shape": list(t.shape), "dtype": t.dtype, "tensor_id": t.tensor_id}


def _collective(c: Collective | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {
        "kind": c.kind.value, "group": c.group, "group_ranks": list(c.group_ranks),
        "bytes": c.bytes, "seq": c.seq, "dtype": c.dtype, "out_bytes": c.out_bytes,
        "peer_bytes": None if c.peer_bytes is None else list(c.peer_bytes), "peer": c.peer,
    }  # fmt: skip


def _kernel(k: Kernel) -> dict[str, Any]:
    return {
        "id": k.id, "name": k.name, "family": k.family.value, "stream": k.stream,
        "start_s": k.start_s, "duration_s": k.duration_s, "launch_start_s": k.launch_start_s,
        "launch_duration_s": k.launch_duration_s, "features": dict(k.features),
        "collective": _collective(k.collective), "predicted_s": k.predicted_s,
        "provenance": k.provenance,
    }  # fmt: skip


def _sync(s: SyncPoint) -> dict[str, Any]:
    return {
        "kind": s.kind.value, "start_s": s.start_s, "duration_s": s.duration_s,
        "stream": s.stream, "wait_on_stream": s.wait_on_stream, "wait_on_kernel": s.wait_on_kernel,
    }  # fmt: skip


def _op(o: Op) -> dict[str, Any]:
    return {
        "id": o.id, "name": o.name, "thread": o.thread, "category": o.category.value,
        "start_s": o.start_s, "duration_s": o.duration_s,
        "kernels": [_kernel(k) for k in o.kernels], "syncs": [_sync(s) for s in o.syncs],
        "inputs": [_tensor(t) for t in o.inputs], "outputs": [_tensor(t) for t in o.outputs],
        "deps": list(o.deps), "rf_id": o.rf_id, "et_id": o.et_id, "seq_nr": o.seq_nr, "moved_data": o.moved_data,
        "annotation": o.annotation, "predicted_s": o.predicted_s, "provenance": o.provenance,
    }  # fmt: skip


def workload_to_dict(w: Workload) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "process_groups": {k: list(v) for k, v in w.process_groups.items()},
        "metadata": dict(w.metadata),
        "ranks": [
            {
                "rank": r.rank, "streams": list(r.streams), "represents": r.represents,
                "device": r.device, "step_start_s": r.step_start_s, "step_end_s": r.step_end_s,
                "metadata": dict(r.metadata), "ops": [_op(o) for o in r.ops],
            }  # fmt: skip
            for r in w.ranks
        ],
    }


def _t_in(d: dict[str, Any]) -> TensorMeta:
    return TensorMeta(shape=tuple(d["shape"]), dtype=d["dtype"], tensor_id=d.get("tensor_id"))


def _c_in(d: dict[str, Any] | None) -> Collective | None:
    if d is None:
        return None
    pb = d.get("peer_bytes")
    return Collective(
        kind=CollectiveKind(d["kind"]), group=d["group"], group_ranks=tuple(d["group_ranks"]),
        bytes=d["bytes"], seq=d["seq"], dtype=d.get("dtype", ""), out_bytes=d.get("out_bytes"),
        peer_bytes=None if pb is None else tuple(pb), peer=d.get("peer"),
    )  # fmt: skip


def _time(d: dict[str, Any], key: str) -> float | None:
    """A saved time (seconds) or None; anything else is the error (a string would reach the
    simulator's arithmetic)."""
    v = d.get(key)
    if v is None or (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)):
        return v
    raise GraphError(f"{key} must be a number of seconds or null, got {v!r}")


def _k_in(d: dict[str, Any]) -> Kernel:
    return Kernel(
        id=d["id"], name=d["name"], family=KernelFamily(d["family"]), stream=d["stream"],
        start_s=_time(d, "start_s"), duration_s=_time(d, "duration_s"),
        launch_start_s=_time(d, "launch_start_s"), launch_duration_s=_time(d, "launch_duration_s"),
        features=dict(d.get("features", {})), collective=_c_in(d.get("collective")),
        predicted_s=d.get("predicted_s"), provenance=d.get("provenance", ""),
    )  # fmt: skip


def _s_in(d: dict[str, Any]) -> SyncPoint:
    return SyncPoint(
        kind=SyncKind(d["kind"]), start_s=_time(d, "start_s"), duration_s=_time(d, "duration_s"),
        stream=d.get("stream"), wait_on_stream=d.get("wait_on_stream"),
        wait_on_kernel=d.get("wait_on_kernel"),
    )  # fmt: skip


def _o_in(d: dict[str, Any]) -> Op:
    return Op(
        id=d["id"], name=d["name"], thread=d["thread"], category=OpCategory(d["category"]),
        start_s=_time(d, "start_s"), duration_s=_time(d, "duration_s"),
        kernels=tuple(_k_in(k) for k in d.get("kernels", ())),
        syncs=tuple(_s_in(s) for s in d.get("syncs", ())),
        inputs=tuple(_t_in(t) for t in d.get("inputs", ())),
        outputs=tuple(_t_in(t) for t in d.get("outputs", ())),
        deps=tuple(d.get("deps", ())), rf_id=d.get("rf_id"), et_id=d.get("et_id"), seq_nr=d.get("seq_nr"),
        moved_data=bool(d.get("moved_data", False)),
        annotation=d.get("annotation", ""), predicted_s=d.get("predicted_s"),
        provenance=d.get("provenance", ""),
    )  # fmt: skip


def workload_from_dict(doc: dict[str, Any]) -> Workload:
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise GraphError(f"workload schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
    where = "the workload"
    try:
        ranks = []
        for ri, r in enumerate(doc["ranks"]):
            where = f"rank {r.get('rank', ri) if isinstance(r, dict) else ri}"
            ops = []
            for oi, o in enumerate(r["ops"]):
                name = o.get("name") if isinstance(o, dict) else None
                where = f"rank {r.get('rank', ri)}, op {oi}" + (f" ({name})" if isinstance(name, str) else "")
                ops.append(_o_in(o))
            where = f"rank {r.get('rank', ri)}"
            ranks.append(RankGraph(
                rank=r["rank"], ops=tuple(ops),
                streams=tuple(r.get("streams", ())), represents=r.get("represents", 1),
                device=r.get("device", ""), step_start_s=_time(r, "step_start_s"),
                step_end_s=_time(r, "step_end_s"), metadata=dict(r.get("metadata", {})),
            ))  # fmt: skip
        if not ranks:
            raise GraphError("no ranks (a saved workload holds at least one)")
        where = "process_groups"
        groups = {k: tuple(v) for k, v in doc.get("process_groups", {}).items()}
    except KeyError as e:
        raise GraphError(f"malformed workload JSON: {where}: missing field {e}") from e
    except (TypeError, ValueError, GraphError) as e:
        raise GraphError(f"malformed workload JSON: {where}: {e}") from e
    return Workload(ranks=tuple(ranks), process_groups=groups, metadata=dict(doc.get("metadata", {})))


def save_workload(w: Workload, path: str | os.PathLike[str]) -> None:
    """Write atomically: a crash never leaves a half-written file."""
    write_json_atomic(Path(path), workload_to_dict(w))


def load_workload(path: str | os.PathLike[str]) -> Workload:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise GraphError(f"{p}: cannot read workload JSON: {e}") from e
    if not isinstance(doc, dict):
        raise GraphError(f"{p}: not a workload (a JSON object with schema_version and ranks)")
    try:
        return workload_from_dict(doc)
    except GraphError as e:
        raise GraphError(f"{p}: {e}") from e


# The mark a timeline trainsim writes opens its file with (sim/timeline.py): what tells it from a
# measured Chrome-trace JSON, both for replacing it (cli.output) and for refusing it as a trace.
TIMELINE_PRODUCER = "trainsim"
_TIMELINE_MARK = re.compile(rb'\s*\{\s*"otherData"\s*:\s*\{\s*"producer"\s*:\s*"' + TIMELINE_PRODUCER.encode() + rb'"')


def is_trainsim_timeline(head: bytes) -> bool:
    """Whether a file's first bytes (a UTF-8 BOM allowed) open a timeline trainsim wrote."""
    return _TIMELINE_MARK.match(head.removeprefix(b"\xef\xbb\xbf")) is not None


def is_trainsim_json(head: bytes) -> bool:
    """Whether a file's first bytes open a JSON artifact trainsim wrote (``schema_version`` at
    the top: a Kineto trace's key is ``schemaVersion``, an execution trace's ``schema``; a gzip
    file starts with its magic, not ``{``)."""
    return head.lstrip().startswith(b"{") and b'"schema_version"' in head and b'"traceEvents"' not in head


def write_json_atomic(path: Path, doc: Any, *, indent: int | None = None) -> None:
    write_text_atomic(path, json.dumps(doc, indent=indent))


def _file_on_the_way(folder: Path) -> Path | None:
    """The nearest existing ancestor of ``folder`` (itself included) when it is a file, not a
    folder: what makes ``mkdir`` fail with a bare "File exists"."""
    for q in (folder, *folder.parents):
        if q.exists():
            return None if q.is_dir() else q
    return None


def _make_folder(folder: Path, who: str, what: str) -> None:
    """``folder`` created with its parents; one-line errors naming a file in the way."""
    blocker = _file_on_the_way(folder)
    if blocker is not None:
        raise ConfigError(f"{who}: cannot create {what}: {blocker} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{who}: cannot create {what} ({e.strerror or e})") from None


def output_path(path: Path | str) -> Path:
    """``path`` checked as an output file: not a folder, its folder creatable (one-line errors)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p}: is a folder; give a file path to write")
    _make_folder(p.parent, str(p), "its folder")
    return p


def _probe(folder: Path, who: str) -> None:
    """Create and remove a scratch file in ``folder``: a one-line error where none can be made."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".trainsim-", suffix=".tmp")
    except OSError as e:
        raise ConfigError(f"{who}: cannot write there ({e.strerror or e})") from None
    try:
        os.close(fd)
    finally:  # an interrupt (Ctrl-C) or an error here leaves no scratch file behind
        Path(tmp).unlink(missing_ok=True)


def writable_path(path: Path | str, flag: str = "") -> None:
    """Check, before a command's work, that its output file ``path`` can be written after it,
    creating nothing: not a folder, no file where a folder of its path should be, and the
    nearest folder of its path that exists takes a file (a scratch file made and removed: a
    read-only folder, a pseudo file system or an exhausted quota fails now, not once a fit or
    simulation is done). ``flag``: the option to name. The path is the one the writers take,
    as given: a quoted ``~`` is no home folder to them (nor here), nor is ``-`` stdout."""
    p = Path(path)
    who = f"{flag} {path}" if flag else str(path)
    if is_stream(p):  # written straight into (write_bytes_atomic): no scratch file beside it
        if not os.access(p, os.W_OK):
            raise ConfigError(f"{who}: cannot write there (Permission denied)")
        return
    try:
        if p.is_dir():
            raise ConfigError(f"{who}: is a folder; give a file path to write")
        blocker = _file_on_the_way(p.parent)
        if blocker is not None:
            raise ConfigError(f"{who}: cannot create its folder: {blocker} is a file, not a folder")
        folder = next(q for q in (p.parent.absolute(), *p.parent.absolute().parents) if q.exists())
    except OSError as e:  # a folder of the path that cannot be searched (stat: Permission denied)
        raise ConfigError(f"{who}: cannot write there ({e.strerror or e})") from None
    _probe(folder, who)


def output_folder(path: Path | str, what: str = "") -> Path:
    """``path`` checked and created as an output folder (``what``: e.g. ``"--out "`` to name
    the option): not a file, creatable, writable (one-line errors)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what}{p}: is a file; give a folder")
    _make_folder(p, f"{what}{p}", "it")
    _probe(p, f"{what}{p}")  # a folder that takes no file fails now, not after the work meant for it
    return p


def remove_if_created_empty(path: Path | str, *, existed: bool) -> None:
    """Undo :func:`output_folder` for a run that failed or was interrupted: the folder goes when
    the run created it (``existed`` False beforehand) and left it empty."""
    p = Path(path)
    if not existed and p.is_dir() and not any(p.iterdir()):
        p.rmdir()


def is_stream(path: Path | str) -> bool:
    """Whether ``path`` is an existing FIFO, device or socket (``/dev/stdout``, ``/dev/null``, a
    named pipe): an output there is written straight into it. Replaced by a temporary file, it
    would have turned the node into a plain file (root may replace ``/dev/null``); read for a
    check beforehand, a FIFO blocks until someone writes to it."""
    try:
        mode = Path(path).expanduser().stat().st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """:func:`write_text_atomic` for bytes (a FIFO or device, :func:`is_stream`, is written
    straight into: it has no folder entry to replace)."""
    if is_stream(path):
        try:
            with Path(path).open("wb") as f:
                f.write(data)
        except OSError as e:
            raise ConfigError(f"{path}: cannot write ({e.strerror or e})") from None
        return
    path = output_path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise ConfigError(f"{path}: cannot write ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        Path(tmp).chmod(0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot write ({e.strerror or e})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same folder + os.replace: never a half-written file (UTF-8;
    the file gets the mode an ordinary ``open()`` would, where mkstemp makes 0600)."""
    write_bytes_atomic(path, text.encode("utf-8"))
