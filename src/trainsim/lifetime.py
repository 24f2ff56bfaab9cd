"""Child processes that end with the process that started them.

A parent that is killed (SIGKILL, the OOM killer) runs no ``finally``. Children of the
forkserver rather than of it (capture and shard ranks, the search's screening workers) would go
on measuring or screening on the cores a rerun uses; Linux's parent-death signal does not reach
them, since the forkserver, not the parent, forked them.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path


def exit_with_parent(pid: int, cleanup: Path | None = None, *, period_s: float = 1.0, status: int = 1) -> None:
    """In a child: a daemon thread polls for process ``pid``; once it is gone (or its pid is
    another user's), the child removes ``cleanup`` (the run's scratch folder, which the dead
    parent would have removed), if given, and exits at once with ``status``."""

    def watch() -> None:
        while True:
            try:
                os.kill(pid, 0)
            except (ProcessLookupError, PermissionError):  # gone (or its pid reused by another user)
                if cleanup is not None:
                    shutil.rmtree(cleanup, ignore_errors=True)
                os._exit(status)
            time.sleep(period_s)

    threading.Thread(target=watch, name="trainsim-parent-watch", daemon=True).start()


__all__ = ["exit_with_parent"]
