"""What a capture asks for (:class:`CaptureSpec`) and what it wrote (:class:`CaptureResult`),
plus the ``capture.json`` manifest beside the traces. No torch import here."""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "capture.json"
MANIFEST_VERSION = 1


def kineto_name(rank: int) -> str:
    return f"rank{rank}.kineto.json"


def et_name(rank: int) -> str:
    return f"rank{rank}.et.json"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class CaptureSpec:
    """One capture request; plain values so that it pickles into spawned worker processes."""

    model: str
    out_dir: str
    nproc: int = 1
    steps: int = 3
    warmup_steps: int = 2  # untraced steps before the traced ones (first steps are slow)
    batch_size: int | None = None  # None: the example's default
    seq_len: int | None = None  # None: the example's default (sequence models only)
    hidden: int | None = None  # None: the example's default (examples with a width to choose)
    heads: int | None = None  # None: the example's default attention heads (likewise)
    device: str = "cpu"
    threads_per_rank: int | None = None  # intra-op CPU threads per rank; None: cores // nproc
    seed: int = 0
    timeout_s: float = 600.0

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


@dataclass(frozen=True, slots=True)
class RankCapture:
    """One rank's files and timings. Step times come from the Kineto-only run."""

    rank: int
    kineto_file: str
    et_file: str
    step_times_s: tuple[float, ...]
    et_step_times_s: tuple[float, ...] = ()  # with the ET observer on: for the overhead only

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_times_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "kineto_file": self.kineto_file,
            "et_file": self.et_file,
            "median_step_s": self.median_step_s,
            "step_times_s": list(self.step_times_s),
            "et_step_times_s": list(self.et_step_times_s),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankCapture:
        return cls(
            rank=int(d["rank"]), kineto_file=str(d["kineto_file"]), et_file=str(d["et_file"]),
            step_times_s=tuple(float(x) for x in d["step_times_s"]),
            et_step_times_s=tuple(float(x) for x in d.get("et_step_times_s", ())),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class CaptureResult:
    spec: CaptureSpec
    ranks: tuple[RankCapture, ...]
    batch_size: int
    threads_per_rank: int
    summary: str
    seq_len: int | None = None  # tokens per sequence (sequence models; None: not one)
    hidden: int | None = None  # hidden size (examples with a width to choose; None: not one)
    heads: int | None = None  # their attention heads
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def trace_dir(self) -> Path:
        return Path(self.spec.out_dir)

    @property
    def measured_step_s(self) -> float:
        """Median step time across the traced steps, max over ranks (the slowest rank sets it)."""
        return max(r.median_step_s for r in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        s = self.spec
        return {
            "manifest_version": MANIFEST_VERSION,
            "trace_dir": str(self.trace_dir),
            "model": s.model,
            "summary": self.summary,
            "nproc": s.nproc,
            "steps": s.steps,
            "warmup_steps": s.warmup_steps,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "hidden": self.hidden,
            "heads": self.heads,
            "device": s.device,
            "threads_per_rank": self.threads_per_rank,
            "backend": s.backend if s.nproc > 1 else None,
            "versions": self.versions,
            "measured_step_s": self.measured_step_s,
            "ranks": [r.to_dict() for r in self.ranks],
        }


def write_manifest(result: CaptureResult) -> Path:
    path = result.trace_dir / MANIFEST_NAME
    write_atomic(path, json.dumps(result.to_dict(), indent=2) + "\n")
    return path
