"""Pipeline schedules: the order in which each stage runs its forward and backward passes.

* ``1f1b`` — PipeDream-flush as Megatron runs it (Narayanan et al. 2021 §2.2.1): stage ``s`` of
  ``p`` runs ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one
  backward, then drains the remaining backwards.
* ``interleaved`` — Megatron's interleaved 1F1B (ibid. §2.2.2): ``v`` model chunks per stage;
  virtual micro-batch ``k`` is micro-batch ``(k // (p v)) p + k mod p`` of chunk
  ``(k // p) mod v`` (backwards visit the chunks in reverse); warm-up
  ``min((p - s - 1) · 2 + (v - 1) p, m v)``.
* ``gpipe`` — all forwards, then all backwards (Huang et al. 2019).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np

from trainsim.errors import ConfigError


class Action(NamedTuple):  # a tuple: deep pipelines make tens of thousands
    kind: Literal["F", "B"]
    mb: int
    chunk: int = 0


def _one_f_one_b(p: int, m: int, s: int) -> list[Action]:
    warm = min(p - s - 1, m)
    out = [Action("F", i) for i in range(warm)]
    for i in range(m - warm):
        out += [Action("F", warm + i), Action("B", i)]
    out += [Action("B", i) for i in range(m - warm, m)]
    return out


def _interleaved(p: int, m: int, v: int, s: int) -> list[Action]:
    total = m * v

    def fwd(k: int) -> Action:
        return Action("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def bwd(k: int) -> Action:
        return Action("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    warm = min((p - s - 1) * 2 + (v - 1) * p, total)
    out = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        out += [fwd(warm + k), bwd(k)]
    out += [bwd(k) for k in range(total - warm, total)]
    return out


def _check(name: str, p: int, m: int) -> None:
    if name not in ("1f1b", "gpipe", "interleaved"):
        raise ConfigError(f"unknown pipeline schedule {name!r}; known: 1f1b, interleaved, gpipe")
    if name == "interleaved" and m % p:
        raise ConfigError(f"interleaved schedule needs micro-batches ({m}) divisible by pp ({p})")


def schedule(name: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Per stage, its actions in issue order."""
    _check(name, p, m)
    if name == "1f1b":
        return [_one_f_one_b(p, m, s) for s in range(p)]
    if name == "gpipe":
        return [
            [Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]
            for _ in range(p)
        ]
    return [_interleaved(p, m, v, s) for s in range(p)]


class ScheduleArrays(NamedTuple):
    """:func:`schedule` as arrays: every stage's actions in issue order, stage after stage
    (each stage has ``m · v`` forwards and as many backwards, ``v`` model chunks interleaved,
    else 1)."""

    stage: np.ndarray
    forward: np.ndarray  # bool
    mb: np.ndarray
    chunk: np.ndarray


def schedule_arrays(name: str, p: int, m: int, v: int = 1) -> ScheduleArrays:
    """:func:`schedule`'s actions without a tuple each (deep pipelines make tens of
    thousands). All three schedules are warm-up forwards, then forward-backward pairs, then
    the remaining backwards, with a stage's warm-up ``w`` (GPipe: all of them); action ``j``
    of ``2 t`` (``t`` passes each way) is forward ``j`` before ``w``, then forward ``w + i`` or
    backward ``i`` of pair ``i``, then backward ``j - t``. Pass ``k`` is micro-batch ``k``
    (1F1B, GPipe); interleaved, it is :func:`_interleaved`'s virtual micro-batch ``k``:
    micro-batch ``(k // (p v)) p + k mod p`` of chunk ``(k // p) mod v`` forward,
    ``v - 1 - (k // p) mod v`` backward. Equality with :func:`schedule` is a test."""
    _check(name, p, m)
    v = v if name == "interleaved" else 1
    total = m * v
    stage = np.repeat(np.arange(p), 2 * total)
    j = np.tile(np.arange(2 * total), p)
    if name == "gpipe":
        warm = np.full(p, total)
    elif name == "1f1b":
        warm = np.minimum(p - np.arange(p) - 1, total)
    else:
        warm = np.minimum((p - np.arange(p) - 1) * 2 + (v - 1) * p, total)
    w = warm[stage]
    pair = (j >= w) & (j < 2 * total - w)
    forward = np.where(pair, (j - w) % 2 == 0, j < w)
    k = np.where(pair, np.where(forward, w + (j - w) // 2, (j - w) // 2), np.where(forward, j, j - total))
    if name == "interleaved":
        mb = (k // (p * v)) * p + k % p
        chunk = np.where(forward, (k // p) % v, v - 1 - (k // p) % v)
    else:
        mb, chunk = k, np.zeros_like(k)
    return ScheduleArrays(stage, forward, mb, chunk)
