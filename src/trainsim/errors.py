"""The one exception tree of trainsim.

::

    TrainsimError                  every error trainsim raises on purpose
    ├── ConfigError                bad user input: flags, YAML, catalog names
    │   └── UsageError             a command-line option outside its own domain (the CLI only)
    ├── TraceFormatError           a trace file that cannot be read as what it claims to be
    │   ├── UnsupportedSchemaError an execution-trace schema version we have no parser for
    │   └── TraceMismatchError     an ET/Kineto pair, or a set of rank traces, that do not belong together
    ├── GraphError                 an IR that violates its invariants (dangling ids, cycles)
    ├── ModelError                 a performance model cannot answer
    │   └── NotCalibratedError     no fitted model for this device/family
    ├── Infeasible                 a plan that cannot run (memory, divisibility): an expected outcome
    ├── CaptureError               recording a trace on this machine failed
    └── SimulationError            the simulator cannot make progress (deadlock, missing peer)

The CLI prints ``str(error)`` on one line and exits 1 for any ``TrainsimError``, 2 for a
``UsageError`` (DESIGN.md "CLI contract": a usage error).
Messages say what failed, which input (file, field, rank, op) and what to do.
"""

from __future__ import annotations


class TrainsimError(Exception):
    """Base class for every error trainsim raises on purpose."""


class ConfigError(TrainsimError):
    """Invalid user input (flags, YAML, catalog names)."""


class UsageError(ConfigError):
    """A command-line option's value outside that option's own domain: a choice not in its list,
    a number out of its range, a malformed list or format, options that conflict or one that is
    missing. Raised by the command layer only (:mod:`trainsim.cli.usage`), never for what an
    input holds: the same library check of a YAML or CSV field stays a ConfigError (exit 1)."""


def yaml_error(origin: object, e: Exception) -> ConfigError:
    """One line for a YAML parser error: the file, where the parser stopped and why."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return ConfigError(
        f"{origin}: not valid YAML{where} ({getattr(e, 'problem', None) or type(e).__name__})"
    )


class TraceFormatError(TrainsimError):
    """A trace file cannot be read as the format it claims to be."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class UnsupportedSchemaError(TraceFormatError):
    """An execution trace with a schema version no parser handles."""


class TraceMismatchError(TraceFormatError):
    """Traces that do not belong together (ET vs Kineto, or ranks of different jobs)."""


class GraphError(TrainsimError):
    """The workload IR violates one of its invariants."""


class ModelError(TrainsimError):
    """A performance model cannot produce a prediction."""


class NotCalibratedError(ModelError):
    """No fitted model exists for the requested device and kernel family."""


class Infeasible(TrainsimError):
    """A plan that cannot run; search counts these by reason."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


class CaptureError(TrainsimError):
    """Capturing traces on this machine failed."""


class SimulationError(TrainsimError):
    """The simulator cannot make progress (cycle, deadlock, missing collective member)."""


def read_utf8(path: object, what: str = "file") -> str:
    """The text of ``path`` (UTF-8, a BOM dropped) or a one-line ConfigError naming the file:
    missing, unreadable, or not UTF-8 (with the byte offset)."""
    from pathlib import Path

    p = Path(str(path))
    try:
        return p.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"{what} {p} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {p} is a folder; give a file") from None
    except OSError as e:
        raise ConfigError(f"{p}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start})") from None

