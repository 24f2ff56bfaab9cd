"""The ``trainsim`` command: a thin layer over the Python API.

Contract (DESIGN.md "CLI contract"): every command takes ``--format table|json``; JSON goes to
stdout alone, logs and progress to stderr; exit 0 on success, 1 on a ``TrainsimError`` (one
line, no traceback unless ``--debug``), 2 on a usage error.

Each command lives in its own module under ``trainsim.cli`` and registers itself on ``app``;
``COMMAND_MODULES`` is the one table of them.
"""

from __future__ import annotations

import importlib
import sys

import typer

from trainsim.errors import TrainsimError

app = typer.Typer(
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

_state = {"debug": False, "interrupt_said": False}  # interrupt_said: a command printed its own interrupt line


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


def app_entry() -> None:
    """Console-script entry point with the error contract (exit 1 + one line on TrainsimError)."""
    debug = "--debug" in sys.argv
    try:
        _register()  # imports every command module: a Ctrl-C in it is an interrupt like any other
        # standalone mode: click/typer print usage errors themselves and exit 2.
        app()
    except TrainsimError as e:
        if debug:
            raise
        print(f"trainsim: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("trainsim: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit as e:
        # typer turns Ctrl-C into a silent exit 130 (its standalone mode), so the branch above
        # hears only of one outside a command; 130 comes from nothing else here
        if e.code == 130 and not _state.get("interrupt_said"):
            print("trainsim: interrupted", file=sys.stderr)
        raise
