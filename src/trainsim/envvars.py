"""Environment variables set for the length of a block and restored after it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


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
