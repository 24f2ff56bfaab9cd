"""Findings of the session-32 walkthroughs, each pinned by the check that would have caught it."""

from __future__ import annotations

import subprocess
import sys


def _cli(*args: str) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, timeout=300,
                       check=False)  # fmt: skip
    return p.returncode, p.stdout + p.stderr


def test_flags_show_no_value_type_in_help() -> None:
    """typer 0.29 printed ``--debug <bool>``, as if the flag took a value; value options keep
    their type."""
    rc, out = _cli("--help")
    assert rc == 0
    assert "--debug" in out and "<bool>" not in out
    rc, out = _cli("predict", "--help")
    assert rc == 0
    assert "<bool>" not in out and "<int" in out
