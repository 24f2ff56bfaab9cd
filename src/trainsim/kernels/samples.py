"""Kernel measurements as one table, whatever file they came from, and how it is split.

Every row is one timed operator (or kernel): its family, the operator it belongs to (an entry
of :data:`trainsim.kernels.features.OPS`), the phase that was timed, the dtype, the operator's
inputs, and the duration in seconds (the statistic of ``repeats`` timings named by
``statistic``), with ``origin`` = ``file:line`` so outliers can be traced back.

One model *entry* is fitted per :class:`EntryKey` (operator, phase, dtype).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from trainsim.errors import ModelError
from trainsim.ir.kinds import KernelFamily
from trainsim.kernels.features import Phase, canonical_dtype, op_spec


@dataclass(frozen=True, slots=True, order=True)
class EntryKey:
    """What one fitted model answers: one operator, one phase, one dtype."""

    op: str
    phase: Phase
    dtype: str

    @property
    def label(self) -> str:
        return f"{self.op}/{self.phase.value}/{self.dtype}"

    @classmethod
    def parse(cls, label: str) -> EntryKey:
        try:
            op, phase, dtype = label.split("/")
            return cls(op, Phase(phase), canonical_dtype(dtype))
        except ValueError:
            raise ModelError(f"bad entry label {label!r} (expected op/phase/dtype)") from None


@dataclass(frozen=True, slots=True)
class KernelSample:
    family: KernelFamily
    key: EntryKey
    features: dict[str, float]
    duration_s: float
    origin: str  # "file:line"
    repeats: int = 1
    statistic: str = "mean"  # what duration_s is over the repeats: mean, median, min
    spread: float | None = None  # (p75 − p25) / median of the repeats, when the row keeps them


@dataclass(slots=True)
class KernelDataset:
    """Rows of kernel timings plus what is known about the device they were measured on."""

    name: str
    samples: list[KernelSample] = field(default_factory=list)
    device: str | None = None  # the device name as the data states it
    fingerprint: str | None = None
    formats: set[str] = field(default_factory=set)
    # (fingerprint, threads) of the bench rows: more than one, and repeats of a shape measured
    # on another machine or thread count are averaged together
    setups: set[tuple[str, int | None]] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[KernelSample]:
        return iter(self.samples)

    def extend(self, rows: Iterable[KernelSample]) -> None:
        self.samples.extend(rows)

    def entry_keys(self) -> list[EntryKey]:
        return sorted({s.key for s in self.samples})

    def families(self) -> set[KernelFamily]:
        return {s.family for s in self.samples}

    def select(self, key: EntryKey) -> list[KernelSample]:
        return [s for s in self.samples if s.key == key]

    def arrays(self, key: EntryKey) -> tuple[dict[str, np.ndarray], np.ndarray, list[str]]:
        """(inputs of the op as arrays, seconds, origins) of one entry, in file order."""
        rows = self.select(key)
        if not rows:
            raise ModelError(f"dataset {self.name} has no rows for {key.label}")
        spec = op_spec(key.op)
        names = [n for n in spec.inputs if any(n in r.features for r in rows)]
        missing = [n for n in spec.required if n not in names]
        if missing:
            raise ModelError(f"dataset {self.name}, {key.label}: no column for input(s) {missing}")
        x = {n: np.array([r.features.get(n, np.nan) for r in rows], dtype=float) for n in names}
        for n, v in x.items():
            if np.isnan(v).any():
                bad = rows[int(np.argmax(np.isnan(v)))].origin
                raise ModelError(f"{bad}: {key.label} row has no value for input {n!r}")
        return x, np.array([r.duration_s for r in rows], dtype=float), [r.origin for r in rows]

    def spreads(self, key: EntryKey) -> np.ndarray:
        """Each row's repeat spread (:attr:`KernelSample.spread`; NaN where unknown), in file order."""
        return np.array([np.nan if r.spread is None else r.spread for r in self.select(key)])

    def without_spread_above(self, limit: float) -> tuple[KernelDataset, int]:
        """(the rows whose repeat spread is at most ``limit`` or unknown, how many were dropped).

        A uniform screen on the measurement alone, applied before any split: a row whose
        repeats disagree by more than ``limit`` (a preempted case on a shared machine) says
        little about the kernel, whatever a model would make of it."""
        keep = [s for s in self.samples if s.spread is None or s.spread <= limit]
        out = KernelDataset(self.name, keep, self.device, self.fingerprint, set(self.formats))
        return out, len(self.samples) - len(keep)


def heldout_rows(n: int, *, fraction: float, seed: int, label: str = "") -> np.ndarray:
    """Boolean mask of held-out rows: ``round(fraction * n)`` rows drawn without replacement.

    The permutation is seeded by ``seed`` and the entry's label (CRC-32), so every entry gets
    its own draw, the same on every machine and run, whatever else the dataset holds."""
    if not 0 <= fraction < 1:
        raise ModelError(f"held-out fraction must be in [0, 1), got {fraction}")
    rng = np.random.default_rng([seed, zlib.crc32(label.encode())])
    out = np.zeros(n, dtype=bool)
    out[rng.permutation(n)[: round(fraction * n)]] = True
    return out


def kfold_ids(n: int, *, folds: int, seed: int) -> np.ndarray:
    """A fold number per row (0..folds-1), balanced, seeded."""
    rng = np.random.default_rng([seed, 7919])
    ids = np.arange(n) % folds
    rng.shuffle(ids)
    return ids
