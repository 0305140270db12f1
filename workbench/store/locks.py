"""Packers' locks, shared by ``pack`` and the store cache (both import it; it imports neither).

One process packs into a store directory at a time: it holds an ``flock`` on ``.NAME.lock``
beside it (``file_lock``). A packer's temp folder is marked as every writer's is
(``fsutil.marked_temp_dir``); a dead packer's is removed by ``fsutil.clean_stale``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from pathlib import Path


@contextlib.contextmanager
def file_lock(path: Path, waiting: str | None = None):
    """Hold an exclusive ``flock`` on ``path`` (created if missing); say ``waiting`` if it must wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting:
                print(waiting, file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)

