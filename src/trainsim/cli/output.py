"""Output helpers shared by commands: JSON to stdout alone, tables via rich, logs to stderr."""

from __future__ import annotations

import json
import math
import sys
from enum import StrEnum
from typing import Any

from rich.console import Console

stderr = Console(stderr=True)


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"


def _clean(o: Any) -> Any:
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_clean(v) for v in o]
    return o


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(_clean(doc), indent=2))
    sys.stdout.write("\n")
    sys.stdout.flush()


def log(msg: str) -> None:
    stderr.print(msg, highlight=False)
