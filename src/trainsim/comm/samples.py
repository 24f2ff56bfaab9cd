"""Collective measurements as one columnar table, whatever file format they came from.

Every row is one timed collective: which collective, how many bytes (in the nccl-tests
convention of :mod:`trainsim.comm.sizing`), on how many nodes and GPUs per node, how long it
took (seconds), and where the row came from (``file:line``) so errors and outliers can be
traced back. ``series`` keeps apart sweeps that a benchmark wrote separately (paper 001's
``allreduce`` and ``allreduce_large`` files cover different size ranges of one collective).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from trainsim.errors import ModelError
from trainsim.ir.kinds import CollectiveKind


@dataclass(frozen=True, slots=True)
class CaseKey:
    """One fitted curve: a collective on ``nodes`` x ``gpus_per_node`` ranks."""

    kind: CollectiveKind
    nodes: int
    gpus_per_node: int

    @property
    def group_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def label(self) -> str:
        return f"{self.kind.value} {self.nodes}x{self.gpus_per_node}"


@dataclass(frozen=True, slots=True)
class CommSample:
    kind: CollectiveKind
    nbytes: float
    nodes: int
    gpus_per_node: int
    duration_s: float
    origin: str  # "file:line"
    series: str = ""


@dataclass(slots=True)
class CommDataset:
    """Rows of collective timings plus what is known about where they were measured."""

    name: str
    samples: list[CommSample] = field(default_factory=list)
    device: str | None = None  # device name as the data states it
    system_hint: str | None = None  # text that may name a catalog system (folder names)
    formats: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)  # odd but usable input the readers met

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[CommSample]:
        return iter(self.samples)

    def extend(self, rows: Iterable[CommSample]) -> None:
        self.samples.extend(rows)

    def cases(self) -> list[CaseKey]:
        seen = {CaseKey(s.kind, s.nodes, s.gpus_per_node) for s in self.samples}
        return sorted(seen, key=lambda k: (k.kind.value, k.group_size, k.nodes))

    def series_of(self, key: CaseKey) -> list[str]:
        return sorted(
            {s.series for s in self.samples if CaseKey(s.kind, s.nodes, s.gpus_per_node) == key}
        )

    def arrays(self, key: CaseKey, series: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(bytes, seconds) of one case (optionally one series), sorted by size."""
        rows = [
            (s.nbytes, s.duration_s)
            for s in self.samples
            if s.kind is key.kind and s.nodes == key.nodes and s.gpus_per_node == key.gpus_per_node
            and (series is None or s.series == series)
        ]  # fmt: skip
        if not rows:
            raise ModelError(f"dataset {self.name} has no rows for {key.label}")
        a = np.array(sorted(rows), dtype=float)
        return a[:, 0], a[:, 1]


def heldout_split(
    nbytes: np.ndarray, *, fraction: float, seed: int, keep_ends: bool = True
) -> np.ndarray:
    """Boolean mask of held-out rows: ``fraction`` of the distinct sizes, drawn with ``seed``.

    Whole sizes are held out (every repeat of a size goes to the same side). With
    ``keep_ends`` the smallest and largest sizes always train: held-out sizes are then
    interpolation, not extrapolation in size.
    """
    sizes = np.unique(nbytes)
    pool = sizes[1:-1] if keep_ends and sizes.size > 2 else sizes
    n_out = round(fraction * sizes.size)
    if n_out == 0 or pool.size == 0:
        return np.zeros(nbytes.shape, dtype=bool)
    rng = np.random.default_rng(seed)
    out = rng.choice(pool, size=min(n_out, pool.size), replace=False)
    return np.isin(nbytes, out)
