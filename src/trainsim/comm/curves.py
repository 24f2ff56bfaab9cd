"""Curve families fitted per (collective, nodes, GPUs per node): the one table of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike

from trainsim.comm.alphabeta import AlphaBetaCurve, fit_alphabeta
from trainsim.comm.monotone import MonotoneCurve, fit_monotone
from trainsim.comm.piecewise import PiecewiseCurve, fit_piecewise
from trainsim.errors import ModelError


class Curve(Protocol):
    def __call__(self, nbytes: ArrayLike) -> np.ndarray: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    fit: Callable[[ArrayLike, ArrayLike], Curve]
    load: Callable[[dict[str, Any]], Curve]


FAMILIES: dict[str, Family] = {}


def _register(f: Family) -> None:
    if f.name in FAMILIES:
        raise ModelError(f"curve family {f.name!r} is registered twice")
    FAMILIES[f.name] = f


_register(Family("piecewise", fit_piecewise, PiecewiseCurve.from_dict))
_register(Family("alpha-beta", fit_alphabeta, AlphaBetaCurve.from_dict))
_register(Family("monotone", fit_monotone, MonotoneCurve.from_dict))  # 001 §III-B's learned regressor


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ModelError(f"unknown curve family {name!r}; known: {', '.join(FAMILIES)}") from None
