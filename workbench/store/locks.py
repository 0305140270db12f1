"""Packers' locks, shared by ``pack`` and the store cache (both import it; it imports neither).

One process packs into a store directory at a time: it holds an ``flock`` on ``.NAME.lock``
beside it (``file_lock``). A packer's temp folder holds a locked ``.packing`` file
(``hold_packing_lock``); the lock goes with the process, so a folder whose lock is free belongs
to a dead packer (``is_stale``) and is removed (``clean_stale``). Folders without the marker are
never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
from pathlib import Path

PACKING = ".packing"  # inside a packer's temp folder, flock'ed while it runs


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


def hold_packing_lock(tmp: Path) -> int:
    """Mark ``tmp`` as a live packer's folder; the lock goes with the process (kill -9 included)."""
    fd = os.open(tmp / PACKING, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def is_stale(tmp: Path) -> bool:
    """True for a packer's temp folder whose packer is gone (its ``.packing`` lock is free)."""
    marker = tmp / PACKING
    if not marker.is_file():
        return False  # not a folder this module marked: never touched
    try:
        fd = os.open(marker, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def stale_temp_dirs(parent: Path, name: str | None = None) -> list[Path]:
    pattern = f".{name}.tmp-*" if name else ".*.tmp-*"
    return [p for p in sorted(Path(parent).glob(pattern)) if p.is_dir() and is_stale(p)]


def clean_stale(parent: Path, name: str | None = None) -> list[Path]:
    """Remove temp folders of dead packers in ``parent`` (of store ``name``, or all); returns them."""
    gone = []
    for p in stale_temp_dirs(parent, name):
        shutil.rmtree(p, ignore_errors=True)
        gone.append(p)
    return gone
