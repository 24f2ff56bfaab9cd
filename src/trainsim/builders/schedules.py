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


def schedule(name: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Per stage, its actions in issue order."""
    if name == "1f1b":
        return [_one_f_one_b(p, m, s) for s in range(p)]
    if name == "gpipe":
        return [
            [Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]
            for _ in range(p)
        ]
    if name == "interleaved":
        if m % p:
            raise ConfigError(
                f"interleaved schedule needs micro-batches ({m}) divisible by pp ({p})"
            )
        return [_interleaved(p, m, v, s) for s in range(p)]
    raise ConfigError(f"unknown pipeline schedule {name!r}; known: 1f1b, interleaved, gpipe")
