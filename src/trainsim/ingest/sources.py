"""Open trace inputs as published: ``.json``, ``.json.gz``, ``.tar.gz``/``.tgz``/``.tar`` archives,
folders.

Everything becomes a list of :class:`TraceBlob` (a display name plus the uncompressed bytes),
classified by content (Kineto vs execution trace), never by file name alone. A path the user
names is read whatever its suffix; inside folders and archives only ``.json``/``.json.gz`` files
are traces (``.tar.gz`` archives too, in folders). Every failure is a ``TraceFormatError`` that
names the file (``archive.tar.gz:member`` for archive members) and says what was expected.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from trainsim.errors import TraceFormatError


class BlobKind(StrEnum):
    KINETO = "kineto"
    EXECUTION_TRACE = "execution_trace"
    CHAKRA = "chakra"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class TraceBlob:
    name: str  # path, or "archive.tar.gz:member" for archive members
    data: bytes

    @property
    def kind(self) -> BlobKind:
        return sniff_kind(self.data)


_GZIP_MAGIC = b"\x1f\x8b"
_UTF8_BOM = b"\xef\xbb\xbf"
_JSON_SUFFIXES = (".json", ".json.gz")
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
_NOT_A_TRACE_NAME = "not a trace file name (.json, .json.gz, .tar.gz)"
_EXPECTED = "expected a Kineto or execution trace (.json, .json.gz, or a .tar.gz of them)"


def sniff_kind(data: bytes) -> BlobKind:
    """Classify a JSON document by its leading keys (cheap: looks at the first 64 KiB)."""
    head = data[:65536]
    if b'"traceEvents"' in head or b'"schemaVersion"' in head:
        return BlobKind.KINETO
    if b'"nodes"' in head and b'"schema"' in head:
        return BlobKind.EXECUTION_TRACE
    if b'"workload_graph"' in head or b'"chakra' in head.lower():
        return BlobKind.CHAKRA
    if b'"traceEvents"' in data:  # Kineto files may start with a large header (deviceProperties)
        return BlobKind.KINETO
    return BlobKind.UNKNOWN


def _gunzip(label: str, raw: bytes) -> bytes:
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; CRC errors too
        raise TraceFormatError(label, f"corrupt or truncated gzip data ({e})") from e
    except MemoryError:
        raise too_large(label, _gzip_size(raw)) from None


def too_large(label: object, size: str = "") -> TraceFormatError:
    """The error for a file whose contents do not fit in this machine's memory; ``size`` says
    how large they are, where known."""
    return TraceFormatError(label, f"too large to load in this memory{f' ({size})' if size else ''}; load it on "
                                   "a machine with more memory, or profile fewer steps")  # fmt: skip


def _gzip_size(raw: bytes) -> str:
    """The uncompressed size the gzip trailer records (its last member's, modulo 4 GiB: left
    out where it cannot be the size, less than the compressed data)."""
    size = int.from_bytes(raw[-4:], "little") if len(raw) >= 18 else 0
    return f"its gzip trailer records {size / 1e9:.2f} GB uncompressed" if size >= len(raw) else ""


def _as_json(label: str, data: bytes) -> bytes:
    """Uncompress if gzip, then check the bytes can be a JSON document (object or array)."""
    gzipped = data[:2] == _GZIP_MAGIC
    if gzipped:
        data = _gunzip(label, data)
    if data.startswith(_UTF8_BOM):
        data = data[len(_UTF8_BOM) :]
    first = data[:4096].lstrip()[:1]
    if not first:
        raise TraceFormatError(label, f"file is empty; {_EXPECTED}")
    if first not in (b"{", b"["):
        what = "gzip data that is not JSON" if gzipped else "not JSON, gzip or tar"
        raise TraceFormatError(label, f"{what} (starts with {data[:8]!r}); {_EXPECTED}")
    return data


def _read_archive(path: Path, raw: bytes, skipped: list[str] | None = None) -> list[TraceBlob]:
    if raw[:2] == _GZIP_MAGIC:
        # Through a gzip stream, tarfile reads every header first and then seeks back to each
        # member: a backward seek decompresses the stream again from its start (8 ranks of DLRM:
        # 5 passes over the archive). Decompressed at once, the tar is read from memory. Any
        # failure (corrupt data, memory) takes the streaming path, whose errors are the ones said.
        try:
            tar_bytes = gzip.decompress(raw)
            kept_skipped = list(skipped) if skipped is not None else None
            blobs = _read_tar(path, tar_bytes, kept_skipped, "r:")
        except (MemoryError, TraceFormatError, tarfile.TarError, EOFError, OSError, zlib.error):
            pass
        else:
            if skipped is not None and kept_skipped is not None:
                skipped[:] = kept_skipped
            return blobs
    return _read_tar(path, raw, skipped, "r:*")


def _read_tar(path: Path, raw: bytes, skipped: list[str] | None, mode: str) -> list[TraceBlob]:
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode=mode) as tar:  # type: ignore[call-overload]
            members = [m for m in tar.getmembers() if m.isfile()]
            kept = [m for m in members if _is_trace_name(Path(m.name).name, _JSON_SUFFIXES)]
            if not kept:
                names = ", ".join(sorted(m.name for m in members)[:5]) or "nothing"
                raise TraceFormatError(
                    path, f"archive holds no .json or .json.gz trace files (it holds: {names})"
                )
            if skipped is not None:
                read = {m.name for m in kept}
                skipped += [f"{path}:{m.name}: {_NOT_A_TRACE_NAME}" for m in sorted(members, key=lambda m: m.name)
                            if m.name not in read and not Path(m.name).name.startswith(".")]  # fmt: skip
            blobs = []
            for m in sorted(kept, key=lambda m: m.name):
                f = tar.extractfile(m)
                label = f"{path}:{m.name}"
                if f is None:
                    raise TraceFormatError(label, "archive member cannot be read")
                blobs.append(TraceBlob(label, _as_json(label, f.read())))
            # tarfile stops reading at the end-of-archive marker, before the gzip trailer: read
            # on to it, so that the CRC check also covers the members we extracted.
            while tar.fileobj is not None and tar.fileobj.read(1 << 20):
                pass
            return blobs
    except MemoryError:
        raise too_large(path) from None
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        body = _head(raw)
        if body is not None and body[257:262] != b"ustar" and not _looks_like_old_tar(body):
            # named like an archive, but it is not one: say what it is
            inner = "gzip data that is not a tar archive" if raw[:2] == _GZIP_MAGIC else "not a tar archive"
            raise TraceFormatError(path, f"{inner} (starts with {body[:8]!r}); {_EXPECTED}") from e
        first = (str(e).splitlines() or [type(e).__name__])[0].rstrip(":")
        raise TraceFormatError(path, f"corrupt or truncated tar archive ({first})") from e


def _looks_like_old_tar(block: bytes) -> bool:
    """A pre-POSIX tar header: its checksum field (octal digits) at 148-155."""
    field = block[148:156].strip(b" \0")
    return len(block) >= 512 and bool(field) and all(48 <= c <= 55 for c in field)


def _is_trace_name(base: str, suffixes: tuple[str, ...]) -> bool:
    # "._x.json" are macOS resource forks; other dot-files are editor/OS litter.
    return not base.startswith(".") and base.lower().endswith(suffixes)


def read_path(path: str | Path, skipped: list[str] | None = None) -> list[TraceBlob]:
    """Read one file (json, gz, tar.gz) or every trace file in a folder (recursively).

    Files of a folder, and members of an archive, whose names are not trace names are left out;
    with ``skipped`` given, each is appended to it as ``"<name>: <why>"`` (dot-files, editor and
    OS litter, are left out unsaid)."""
    p = Path(path)
    if p.is_dir():
        every = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
        files = [f for f in every if _is_trace_name(f.name, _JSON_SUFFIXES + _ARCHIVE_SUFFIXES)]
        if not files:
            raise TraceFormatError(p, "folder holds no .json, .json.gz or .tar.gz trace files")
        if skipped is not None:
            read = set(files)
            skipped += [f"{f}: {_NOT_A_TRACE_NAME}" for f in every if f not in read]
        out: list[TraceBlob] = []
        for f in files:
            out.extend(read_path(f, skipped))
        return out
    try:
        raw = p.read_bytes()
    except FileNotFoundError as e:
        raise TraceFormatError(p, "no such file or folder") from e
    except OSError as e:
        raise TraceFormatError(p, f"cannot read: {e.strerror or e}") from e
    if not raw:
        raise TraceFormatError(p, f"file is empty; {_EXPECTED}")
    if p.name.lower().endswith(_ARCHIVE_SUFFIXES) or _is_tar(raw):
        return _read_archive(p, raw, skipped)
    return [TraceBlob(str(p), _as_json(str(p), raw))]


def _head(raw: bytes) -> bytes | None:
    """The first bytes of ``raw`` (up to 1 KiB, a tar header's worth), gunzipped if gzip; None
    for gzip data that does not decompress."""
    if raw[:2] != _GZIP_MAGIC:
        return raw[:1024]
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw[:4096], 1024)
    except zlib.error:
        return None


def _is_tar(raw: bytes) -> bool:
    head = _head(raw)
    return head is not None and len(head) >= 262 and head[257:262] == b"ustar"


def read_paths(paths: Iterable[str | Path], skipped: list[str] | None = None) -> list[TraceBlob]:
    """:func:`read_path` of each path (each at most once); ``skipped`` as there."""
    out: list[TraceBlob] = []
    seen: dict[Path, str] = {}
    for p in paths:
        key = Path(p).expanduser().resolve()
        if key in seen:  # one rank twice would read as two ranks that cannot be told apart
            raise TraceFormatError(p, f"given twice (also as {seen[key]})")
        seen[key] = str(p)
        out.extend(read_path(p, skipped))
    return out
