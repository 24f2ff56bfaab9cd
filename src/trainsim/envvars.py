"""Environment variables set for the length of a block and restored after it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

# the variables naming a user's artifacts (envvars.joined_paths), here so that a command that only
# clears them need not import the registries that read them (~0.24 s of imports)
KERNEL_MODELS_ENV = "TRAINSIM_KERNEL_MODELS"  # `trainsim fit` artifacts: trainsim.kernels.registry
COMM_MODELS_ENV = "TRAINSIM_COMM_MODELS"  # `trainsim fit-comm` artifacts: trainsim.comm.registry


@contextmanager
def restored_environ(names: Iterable[str]) -> Iterator[None]:
    """Inside the block, ``names`` may be set or removed freely; after it (also on an error)
    each is back to its value before, or absent again."""
    saved = {n: os.environ.get(n) for n in names}
    try:
        yield
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


def joined_paths(paths: Iterable[str]) -> str:
    """Paths as one variable's value: ``os.pathsep``-separated, or a JSON list when a path
    holds ``os.pathsep`` or starts with ``[`` (a ':' in a file name); :func:`split_paths` reads
    both back."""
    items = [str(p) for p in paths]
    if any(os.pathsep in p or p.startswith("[") for p in items):
        return json.dumps(items)
    return os.pathsep.join(items)


def split_paths(value: str) -> list[str]:
    """The paths in a variable written by :func:`joined_paths` (or by hand, ``os.pathsep``-separated)."""
    if value.startswith("["):
        try:
            doc = json.loads(value)
        except json.JSONDecodeError:
            doc = None
        if isinstance(doc, list) and all(isinstance(p, str) for p in doc):
            return [p for p in doc if p]
    return [p for p in value.split(os.pathsep) if p]
