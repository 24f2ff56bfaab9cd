"""Output helpers shared by commands: JSON to stdout alone, tables via rich, logs to stderr."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any

from rich.console import Console

stderr = Console(stderr=True, soft_wrap=True)  # a log line stays one line (a file, a pipe, a CI log: no 80-column breaks)


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"


def _clean(o: Any, *, count: bool = False) -> Any:
    """JSON-safe values: non-finite floats as null, and counts as integers — a value under a key
    that ends in ``_bytes`` or is ``params`` (memory and parameter formulas compute them as
    floats: 84810924032.0 beside an int of the same kind read as two types)."""
    if isinstance(o, float):
        if not math.isfinite(o):
            return None
        return round(o) if count else o
    if isinstance(o, dict):
        return {str(k): _clean(v, count=str(k).endswith("_bytes") or k == "params") for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_clean(v, count=count) for v in o]
    return o


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(_clean(doc), indent=2))
    sys.stdout.write("\n")
    sys.stdout.flush()


def not_an_input(output: Path | None, inputs: Iterable[Path | str], flag: str, *, new_inside: bool = True) -> None:
    """Refuse an output path that would overwrite what the command reads: one of its input
    files, or a file already inside an input folder (folders are searched for their inputs).
    A new file inside an input folder is allowed unless ``new_inside`` is false (an output the
    next read of that folder would take for an input, e.g. a Chrome-trace timeline)."""
    from trainsim.errors import ConfigError

    if output is None:
        return
    searchable_output(output, flag)
    out = Path(output).expanduser().resolve()
    for given in inputs:
        p = Path(given).expanduser().resolve()
        if out == p or (p.is_dir() and out.exists() and p in out.parents):
            raise ConfigError(f"{flag} {output}: would overwrite the input {given}; write it elsewhere")
        if not new_inside and p.is_dir() and p in out.parents:
            raise ConfigError(f"{flag} {output}: inside the input folder {given}, where the next read would "
                              "take it for a trace; write it elsewhere")  # fmt: skip


def distinct_outputs(outputs: Iterable[tuple[Path | None, str]]) -> None:
    """Refuse two outputs of one command at the same path: the later would replace the earlier
    while both are reported written."""
    from trainsim.errors import ConfigError

    seen: dict[Path, str] = {}
    for output, flag in outputs:
        if output is None:
            continue
        r = Path(output).expanduser().resolve()
        if r in seen:
            raise ConfigError(f"{flag} {output}: the same file as {seen[r]}; give each output its own path")
        seen[r] = flag


# the top-level key that tells each replaceable trainsim JSON artifact from the others
_ARTIFACT_KEYS = {"workload": b'"process_groups"', "overhead database": b'"per_op"'}
# artifacts that name their own schema (no schema_version): the mark alone tells them
_SCHEMA_MARKS = {"comm model": b'"trainsim.comm-model/'}  # `fit-comm -o`


def json_target(output: Path | None, flag: str, kind: str) -> None:
    """Refuse to replace an existing file unless it is empty or the trainsim artifact ``kind``
    (a key of :data:`_ARTIFACT_KEYS`) an earlier run wrote: ``schema_version`` and the kind's
    own key near its start (a profiler trace's key is ``schemaVersion``), so a saved workload
    never replaces an overhead database or a device file, nor the reverse. A kind of
    :data:`_SCHEMA_MARKS` (a comm model) is told by its schema mark instead."""
    from trainsim.errors import ConfigError

    if output is None:
        return
    not_stdout(output, flag)
    writable_path(output, flag)
    head = _existing_head(output, flag, 65536, "")
    if head is None or not head.strip():
        return  # an empty file (mktemp's)
    from trainsim.ir.serialize import is_trainsim_json

    if kind in _SCHEMA_MARKS:
        mine = head.lstrip().startswith(b"{") and _SCHEMA_MARKS[kind] in head
    else:
        mine = is_trainsim_json(head) and _ARTIFACT_KEYS[kind] in head
    if not mine:
        an = "an" if kind[0] in "aeiou" else "a"
        raise ConfigError(f"{flag} {output}: exists and is not {an} {kind} trainsim wrote; remove it or write elsewhere")


def writable_path(output: Path | None, flag: str) -> None:
    """Refuse, before the work, an output file that could not be written after it (a file where
    one of its folders should be, a folder that takes no file); creates nothing."""
    from trainsim.ir.serialize import writable_path as check

    if output is not None:
        not_stdout(output, flag)
        check(output, flag)


def not_stdout(output: Path | str, flag: str) -> None:
    """Refuse an output that is this command's own stdout (``/dev/stdout``, ``/proc/self/fd/1``,
    or the file stdout is redirected to): the table or JSON the command prints goes there too,
    so the two would interleave (``--timeline /dev/stdout --format json`` printed two JSON
    documents one after the other; under ``> t.json`` the timeline was refused as 'not a
    timeline trainsim wrote'). A character device that is not a terminal (``/dev/null`` under
    ``> /dev/null``) mixes nothing and passes."""
    import os
    import stat

    from trainsim.errors import ConfigError

    try:
        fd = sys.stdout.fileno()
        mine, out = os.fstat(fd), Path(output).expanduser().stat()
    except (OSError, ValueError, AttributeError):
        return  # no real stdout (captured), or no such path yet: nothing it could be
    if not os.path.samestat(mine, out) or (stat.S_ISCHR(out.st_mode) and not os.isatty(fd)):
        return
    raise ConfigError(f"{flag} {output}: is this command's stdout, where its table or JSON goes too (the two would "
                      "interleave); write it to a file or a stream of its own (a FIFO, >(gzip > out.gz))")


def timeline_target(output: Path | None, inputs: Iterable[Path | str], flag: str = "--timeline") -> None:
    """Refuse a timeline path that would overwrite an input (:func:`not_an_input`) or any
    existing file but a timeline trainsim wrote (its producer mark opens the file): a measured
    profiler trace is Chrome-trace JSON too."""
    from trainsim.errors import ConfigError
    from trainsim.ir.serialize import is_trainsim_timeline

    if output is None:
        return
    not_stdout(output, flag)
    not_an_input(output, inputs, flag, new_inside=False)
    head = _existing_head(output, flag, 4096, f" (e.g. {Path(output).expanduser() / 'timeline.json'})")
    if head is not None and not is_trainsim_timeline(head):
        raise ConfigError(f"{flag} {output}: exists and is not a timeline trainsim wrote; "
                          "remove it or write the timeline elsewhere")  # fmt: skip
    writable_path(output, flag)  # a folder that takes no file: refused before the simulation


def _existing_head(output: Path, flag: str, size: int, example: str) -> bytes | None:
    """The first ``size`` bytes of the file an output would replace (None: no file there);
    one-line errors for a folder (``example``: a file path to suggest) or an unreadable file."""
    from trainsim.errors import ConfigError

    out = Path(output).expanduser()
    searchable_output(output, flag)
    if out.is_dir():
        raise ConfigError(f"{flag} {output}: is a folder; give a file path{example}")
    from trainsim.ir.serialize import is_stream

    if not out.exists() or is_stream(out):  # a FIFO or device holds no file to protect (reading one blocks)
        return None
    try:
        with out.open("rb") as f:
            return f.read(size)
    except OSError as e:
        raise ConfigError(f"{flag} {output}: cannot read the existing file ({e.strerror})") from None


def searchable_output(output: Path, flag: str) -> None:
    """A one-line error for an output under a folder this user cannot search (``stat`` of the
    path: Permission denied), which pathlib's exists()/is_dir() raise as a traceback."""
    from trainsim.errors import ConfigError

    try:
        Path(output).expanduser().stat()
    except PermissionError as e:
        raise ConfigError(f"{flag} {output}: cannot write there ({e.strerror})") from None
    except (OSError, ValueError):
        pass  # not there (yet), a dangling link, ...: the checks after this one say what they find


def log(msg: str) -> None:
    stderr.print(msg, highlight=False)
