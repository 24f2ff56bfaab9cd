"""Usage errors of the command line (DESIGN.md "CLI contract": exit 2).

A value of an option or argument outside that option's own domain — a choice not in its list,
a number out of its range, a malformed list or format, options that conflict or one that is
missing — is a usage error: one line naming the option, exit 2 (:class:`trainsim.errors.UsageError`,
printed by :mod:`trainsim.cli.main`). What depends on what an input holds (the model, the system,
a file: "tp 7 does not divide gpt3-175b's 96 heads", an unknown catalog name) stays a
``ConfigError``, exit 1. The library's checks are shared with YAML and CSV inputs, whose bad
fields stay exit-1 errors naming the file: the mapping happens here, at the option layer.

Plain integer bounds are typer's own (``min=1`` on the option); typer prints those itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from trainsim.errors import TrainsimError, UsageError


def one_of(value: object, choices: Iterable[object], flag: str) -> None:
    """Refuse ``value`` unless it is one of ``choices`` (listed in the message, in order)."""
    allowed = list(choices)
    if value not in allowed:
        raise UsageError(f"{flag} must be one of {', '.join(map(str, allowed))}, got {value!r}")


def positive(value: float | None, flag: str) -> None:
    """Refuse a number that is not finite and > 0 (NaN passes ``<= 0``; typer's ``min`` is inclusive)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(f"{flag} must be a positive number, got {value:g}")


def fraction(value: float | None, flag: str) -> None:
    """Refuse a number outside [0, 1) (a probability or share that cannot be the whole)."""
    if value is not None and not 0.0 <= value < 1.0:
        raise UsageError(f"{flag} must be in [0, 1), got {value:g}")


@contextmanager
def usage() -> Iterator[None]:
    """Run a library check of option values alone (no input read): the error it raises is a
    usage error, its message kept."""
    try:
        yield
    except UsageError:
        raise
    except TrainsimError as e:
        raise UsageError(str(e)) from e
