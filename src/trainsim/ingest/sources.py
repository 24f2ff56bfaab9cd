"""Open trace inputs as published: ``.json``, ``.json.gz``, ``.tar.gz``/``.tgz`` archives, folders.

Everything becomes a list of :class:`TraceBlob` (a display name plus the uncompressed bytes),
classified by content (Kineto vs execution trace), never by file name alone.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Iterable, Iterator
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
_TRACE_SUFFIXES = (".json", ".json.gz", ".tar.gz", ".tgz", ".tar", ".gz")


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


def _gunzip(path_label: str, raw: bytes) -> bytes:
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise TraceFormatError(path_label, f"corrupt or truncated gzip data ({e})") from e


def _read_archive(path: Path, raw: bytes) -> Iterator[TraceBlob]:
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            for m in sorted(members, key=lambda m: m.name):
                base = Path(m.name).name
                if base.startswith(("._", ".")) or not base.endswith(_TRACE_SUFFIXES):
                    continue  # macOS resource forks and non-trace files
                f = tar.extractfile(m)
                if f is None:
                    continue
                data = f.read()
                label = f"{path}:{m.name}"
                if data[:2] == _GZIP_MAGIC:
                    data = _gunzip(label, data)
                yield TraceBlob(label, data)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise TraceFormatError(path, f"corrupt or truncated tar archive ({e})") from e


def read_path(path: str | Path) -> list[TraceBlob]:
    """Read one file (json, gz, tar.gz) or every trace file in a folder (recursively)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(_TRACE_SUFFIXES))
        if not files:
            raise TraceFormatError(p, "folder holds no .json, .json.gz or .tar.gz trace files")
        out: list[TraceBlob] = []
        for f in files:
            out.extend(read_path(f))
        return out
    try:
        raw = p.read_bytes()
    except FileNotFoundError as e:
        raise TraceFormatError(p, "no such file or folder") from e
    except OSError as e:
        raise TraceFormatError(p, f"cannot read: {e.strerror}") from e
    if not raw:
        raise TraceFormatError(p, "file is empty (expected a JSON trace)")
    name = p.name
    if name.endswith((".tar.gz", ".tgz", ".tar")) or _is_tar(raw):
        blobs = list(_read_archive(p, raw))
        if not blobs:
            raise TraceFormatError(p, "archive holds no .json trace files")
        return blobs
    if raw[:2] == _GZIP_MAGIC:
        raw = _gunzip(str(p), raw)
    return [TraceBlob(str(p), raw)]


def _is_tar(raw: bytes) -> bool:
    if raw[:2] == _GZIP_MAGIC:
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw[:4096], 1024)
        except zlib.error:
            return False
        return len(head) >= 262 and head[257:262] == b"ustar"
    return len(raw) >= 262 and raw[257:262] == b"ustar"


def read_paths(paths: Iterable[str | Path]) -> list[TraceBlob]:
    out: list[TraceBlob] = []
    for p in paths:
        out.extend(read_path(p))
    return out
