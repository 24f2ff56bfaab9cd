"""The ``trainsim`` command: a thin layer over the Python API.

Contract (DESIGN.md "CLI contract"): every command takes ``--format table|json``; JSON goes to
stdout alone, logs and progress to stderr; exit 0 on success, 1 on a ``TrainsimError`` (one
line, no traceback unless ``--debug``), 2 on a usage error (typer's own checks, and a
``UsageError``: one line too, :mod:`trainsim.cli.usage`), 130 on a Ctrl-C, and 141 (128 +
SIGPIPE, nothing on stderr) when the reader of stdout or stderr closes it early
(``trainsim ... | head -1``).

Each command lives in its own module under ``trainsim.cli`` and registers itself on ``app``;
``COMMAND_MODULES`` is the one table of them.
"""

from __future__ import annotations

import _signal
import atexit
import contextlib
import errno
import importlib
import importlib.abc
import os
import select
import signal
import sys
import threading
import time
from typing import Any

import typer

from trainsim.errors import TrainsimError, UsageError

EXIT_USAGE = 2  # click's and typer's code for a usage error


class _BrokenPipe(Exception):
    """An EPIPE a command's write raised, carried past typer: its standalone mode ends every
    EPIPE with a silent exit 1, whether the reader of stdout left (``| head -1``) or a pipe the
    command writes to as a file did (a FIFO given to ``-o``), which is a real error."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _Group(typer.core.TyperGroup):
    def invoke(self, ctx: Any) -> Any:  # every command (and sub-command) runs in here
        try:
            return super().invoke(ctx)
        except OSError as e:
            if e.errno == errno.EPIPE:
                raise _BrokenPipe(e) from e
            raise
        except UsageError as e:  # here, not in app_entry: `app` run in-process exits 2 as well
            if _state["debug"]:
                import traceback

                traceback.print_exc()
            print(f"trainsim: error: {e}", file=sys.stderr)
            raise typer.Exit(EXIT_USAGE) from None


app = typer.Typer(
    cls=_Group,
    name="trainsim",
    help="Predict, explain and optimise the time of one ML training iteration.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = (
    "trainsim.cli.analyze_cmd",
    "trainsim.cli.capture_cmd",
    "trainsim.cli.replay_cmd",
    "trainsim.cli.validate_cmd",
    "trainsim.cli.comm_cmd",
    "trainsim.cli.bench_cmd",
    "trainsim.cli.fit_cmd",
    "trainsim.cli.predict_cmd",
    "trainsim.cli.shard_cmd",
    "trainsim.cli.search_cmd",
    "trainsim.cli.stages_cmd",
)

_state = {"debug": False, "interrupt_said": False, "exiting_interrupted": 0.0}  # interrupt_said: a command printed its own interrupt line


def _hide_flag_types() -> None:
    """Show on/off flags in ``--help`` without a value type.

    typer 0.29 prints every option's type, so ``--debug <bool>`` reads as if it took a value;
    a flag takes none. Older typer prints nothing for flags and has no such hook to wrap.
    """
    option = getattr(typer.core, "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if shown is None or getattr(shown, "_trainsim_flags_hidden", False):
        return

    def display_type_rich(self: object, ctx: object) -> object:
        if getattr(self, "is_flag", False) and not getattr(self, "count", False):
            return None
        return shown(self, ctx)

    display_type_rich._trainsim_flags_hidden = True  # type: ignore[attr-defined]
    option.display_type_rich = display_type_rich  # type: ignore[union-attr]


_hide_flag_types()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    _state["debug"] = debug


def _register() -> None:
    for name in COMMAND_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # a real missing dependency inside the module
                raise


_FORCE_AFTER_S = 2.0  # an interrupted exit's cleanup takes 0.1-0.2 s (a Dask client closed, a pool joined)


def _on_second_interrupt(_signum: int, _frame: object) -> None:
    """A Ctrl-C after the interrupt's line: within :data:`_FORCE_AFTER_S` of it (a double
    Ctrl-C), the cleanup already under way goes on; later (a cleanup that hangs) the process
    ends at once. Both exit 130. Ending at once as soon as it came left the multiprocessing
    resource tracker warning of "leaked semaphore objects" after the line."""
    if time.monotonic() - float(_state["exiting_interrupted"]) > _FORCE_AFTER_S:
        os._exit(130)


def _exiting_interrupted() -> None:
    """From an interrupt's line on, a second Ctrl-C no longer ends the process with SIGINT's
    status (-2): it had when it came during the exit's cleanup or in the interpreter's last
    steps, which give a Python handler's signal its default action back (a search on Dask
    spends ~0.2 s there). A Ctrl-C held down can land while the handler is being put in place:
    one that raises there is absorbed and the handler put in place again (it had escaped from
    ``signal.getsignal``'s enum lookup, a few hundred bytecodes of Python, as a traceback and
    -2 in 1 of 12 runs of tests/test_cli_interrupts.py's held-down case); the swap itself is
    ``_signal.signal``, one C call that hands back the old handler without that lookup."""
    if threading.current_thread() is not threading.main_thread():
        return
    for _ in range(1000):  # each pass is a few bytecodes once the handler is in place
        try:
            _state["exiting_interrupted"] = time.monotonic()  # before the handler, which reads it
            if _signal.signal(_signal.SIGINT, _on_second_interrupt) == _signal.SIG_IGN:
                _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # started ignoring it (a background job): kept
            return
        except KeyboardInterrupt:
            continue


@atexit.register  # registered at import, before any command's: it runs after theirs
def _ignore_late_interrupts() -> None:
    """After the last exit handler, an interrupted run ignores Ctrl-C: no Python handler runs
    in what is left of the exit, and the default action would end it with -2 instead of 130."""
    if _state.get("exiting_interrupted"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _debug_first(argv: list[str]) -> bool:
    """Whether ``--debug`` is given; given after the command (``trainsim predict X --debug``, as
    one adds it to a command that just failed) it moves before it, where the option lives (it
    was "No such option: --debug"); given twice (before and after the command) it is given once.
    Arguments after ``--`` are left alone. ``--debug`` where an option's value goes is taken as
    the flag (``--system --debug``: "Option '--system' requires an argument", as for a value
    forgotten; no option here takes "--debug" for a value)."""
    end = argv.index("--", 1) if "--" in argv[1:] else len(argv)
    if "--debug" not in argv[1:end]:
        return False
    argv[1:] = ["--debug", *(a for a in argv[1:end] if a != "--debug"), *argv[end:]]
    return True


class _NumpyBeforeTorch(importlib.abc.MetaPathFinder):
    """Imports numpy, in Python, as torch starts to import (whichever command imports it first).

    torch's C initialisation imports numpy itself and swallows what that import raises ("Failed
    to initialize NumPy"): a Ctrl-C that landed there was lost (the command ran on to exit 0) or
    left numpy half imported (a RecursionError later, exit 1). Imported here first, numpy's
    import raises the KeyboardInterrupt out of ``import torch`` like any other import's. A command
    that never imports torch does not import numpy for it. It finds nothing itself; it stays in
    ``sys.meta_path`` (leaving it while the import iterates over that list would skip a finder).
    """

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname == "torch" and "numpy" not in sys.modules:
            with contextlib.suppress(ImportError):  # no numpy: torch imports without it
                import numpy  # noqa: F401


def _import_numpy_before_torch() -> None:
    if not any(isinstance(f, _NumpyBeforeTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _NumpyBeforeTorch())


EXIT_PIPE_CLOSED = 128 + 13  # 128 + SIGPIPE: what a shell reports for `yes | head -1`
_WRITE_FAILED = {errno.ENOSPC, errno.EIO, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _closed_streams() -> list[int]:
    """stdout and stderr, of the two, whose reader has closed its end: a pipe or socket for
    which poll says POLLERR or POLLHUP (a file or a live terminal says neither)."""
    if not hasattr(select, "poll"):
        return [1]  # no poll (Windows): an EPIPE there is the reader of stdout leaving
    poller = select.poll()
    for fd in (1, 2):
        poller.register(fd, select.POLLOUT)
    return [fd for fd, ev in poller.poll(0) if ev & (select.POLLERR | select.POLLHUP) and not ev & select.POLLNVAL]


def _exit_pipe_closed(closed: list[int]) -> None:
    """Exit :data:`EXIT_PIPE_CLOSED` quietly: the closed streams point at the null device, so
    the interpreter's last flush of what is still buffered for them raises nothing ("Exception
    ignored ... BrokenPipeError")."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in closed:
        os.dup2(null, fd)
    os.close(null)
    sys.exit(EXIT_PIPE_CLOSED)


def _stdout_flushed() -> None:
    """Flush stdout before the exit, where a closed pipe is still heard (the interpreter's own
    flush at the end says "Exception ignored" and exits 120)."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        closed = _closed_streams()
        if closed:
            _exit_pipe_closed(closed)
        raise


def _console_broken_pipe(self: object) -> None:
    """rich's ``Console.on_broken_pipe`` for the command line: the EPIPE is raised on, to be
    told apart as :func:`app_entry` does for any other write. rich's own points stdout at the
    null device and exits 1 silently, whichever file the console wrote to."""
    self.quiet = True  # type: ignore[attr-defined]  # this console writes nothing more
    raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def _console_pipe_errors_raised() -> None:
    from rich.console import Console

    Console.on_broken_pipe = _console_broken_pipe  # type: ignore[method-assign]  # rich's documented hook


def app_entry() -> None:
    """Console-script entry point with the error contract (exit 1 + one line on TrainsimError)."""
    debug = _debug_first(sys.argv)
    if sys.stdout is None:  # started with stdout closed (`trainsim ... >&-`): every result goes there
        print("trainsim: error: stdout is closed; redirect it (> FILE, or > /dev/null to discard the result)",
              file=sys.stderr)  # fmt: skip
        sys.exit(1)
    _import_numpy_before_torch()
    _console_pipe_errors_raised()
    try:
        _register()  # imports every command module: a Ctrl-C in it is an interrupt like any other
        # standalone mode: click/typer print usage errors themselves and exit 2.
        app()
    except (_BrokenPipe, OSError) as e:
        error = e.error if isinstance(e, _BrokenPipe) else e  # an OSError: raised outside a command (typer's usage line)
        if error.errno == errno.EPIPE and (closed := _closed_streams()):
            _exit_pipe_closed(closed)  # the reader left (`| head -1`): done, quietly
        if debug or error.errno not in _WRITE_FAILED | {errno.EPIPE}:
            raise error from None
        # a full disk under `> out.json`, a pipe the command writes to as a file: real errors
        print(f"trainsim: error: {error}", file=sys.stderr)
        sys.exit(1)
    except TrainsimError as e:
        if debug:
            raise
        print(f"trainsim: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        _exiting_interrupted()
        print("trainsim: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit as e:
        # typer turns Ctrl-C into a silent exit 130 (its standalone mode), so the branch above
        # hears only of one outside a command; 130 comes from nothing else here
        if e.code == 130:
            _exiting_interrupted()
            if not _state.get("interrupt_said"):
                print("trainsim: interrupted", file=sys.stderr)
        elif e.code == 1 and type(sys.stdout).__name__ == "PacifyFlushWrapper":
            # typer's own EPIPE exit, for what it printed before a command ran (`--help`)
            closed = _closed_streams()
            if closed:
                _exit_pipe_closed(closed)
        else:
            _stdout_flushed()
        raise
