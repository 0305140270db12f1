"""Files and folders the workbench creates: where its cache lives, the user's umask, atomic temp
names, atomic writes, and one-line hints when the disk is full or a place is read-only.

Every temp file or folder a writer makes beside its target is named ``.NAME.tmp-XXXXXXXX`` and
marked while the writer runs: a temp file by an ``flock`` on itself, a temp folder by a locked
``.packing`` file inside it. The lock goes with the process (kill -9 included), so a temp whose
lock is free belongs to a dead writer (``is_stale``) and the next writer of NAME removes it
(``clean_stale``). Files and folders without the name and the free lock are never touched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

_LOCK = threading.Lock()
TEMP_MARK = ".packing"  # inside a writer's temp folder, flock'ed while it runs
_TEMP = re.compile(r"\.(.+)\.tmp-[A-Za-z0-9_]{8}")  # mkstemp/mkdtemp add 8 characters


def cache_dir() -> Path:
    """Where the workbench keeps stores and built models (``WORKBENCH_CACHE``)."""
    return Path(os.environ.get("WORKBENCH_CACHE", Path.home() / ".cache" / "workbench"))


def umask() -> int:
    with _LOCK:  # os.umask only sets; read it by setting it back
        old = os.umask(0o022)
        os.umask(old)
    return old


def temp_dir(prefix: str, parent) -> Path:
    """``tempfile.mkdtemp`` in ``parent``, but with the mode a plain ``mkdir`` would get (not 0700),
    so a finished store or report renamed into place is readable by whoever the umask allows."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o777 & ~umask())
    return path


def hold_lock(path) -> int:
    """An fd holding an exclusive ``flock`` on ``path`` (created if missing); it goes with the process."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _lock_is_free(path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def is_stale(tmp: Path) -> bool:
    """True for a temp folder or file of a dead writer (named ``.NAME.tmp-*``, its lock free)."""
    tmp = Path(tmp)
    if tmp.is_symlink() or not _TEMP.fullmatch(tmp.name):
        return False
    if tmp.is_dir():
        marker = tmp / TEMP_MARK
        return marker.is_file() and _lock_is_free(marker)  # a folder without the marker is never touched
    return tmp.is_file() and _lock_is_free(tmp)


def stale_temps(parent, name: str | None = None) -> list[Path]:
    """Dead writers' temp folders and files in ``parent`` (of target ``name``, or of any)."""
    pattern = f".{_glob_escape(name)}.tmp-*" if name else ".*.tmp-*"
    return [p for p in sorted(Path(parent).glob(pattern)) if is_stale(p)]


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?[])", r"[\1]", name)


def clean_stale(parent, name: str | None = None) -> list[Path]:
    """Remove dead writers' temps in ``parent`` (of ``name``, or all); returns them."""
    gone = []
    for p in stale_temps(parent, name):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
        gone.append(p)
    return gone


@contextlib.contextmanager
def marked_temp_dir(target):
    """A temp folder ``.NAME.tmp-*`` beside ``target``, marked while the block runs, for the block
    to fill and rename onto ``target`` (after ``unmark``); a dead writer's folders of NAME are
    removed first, and this one is removed if the block raises."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(target.parent, target.name)
    tmp = temp_dir(f".{target.name}.tmp-", target.parent)
    fd = None
    try:
        fd = hold_lock(tmp / TEMP_MARK)
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if fd is not None:
            os.close(fd)


def unmark(tmp: Path) -> None:
    """Drop a finished temp folder's marker, right before it is renamed into place."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(tmp) / TEMP_MARK)


def atomic_write(path, write) -> None:
    """Call ``write(tmp)`` on a temp file beside ``path`` (locked while it runs), then rename it into
    place: a reader sees the old file or the whole new one, never a part; a failed write leaves no
    temp file behind, and a killed writer's is removed by the next write of ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(path.parent, path.name)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.chmod(tmp, 0o666 & ~umask())  # the mode open(..., "w") would give, not 0600
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)


def os_error_hint(e: OSError) -> str:
    """One line for a failed file operation: what, where, and the fix (disk full, read-only, denied)."""
    where = e.filename or "?"
    base = f"{e.strerror or e} ({where})"
    cache = f"WORKBENCH_CACHE (now {cache_dir()})"
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return (f"{base}: the disk is full (or a file size limit was hit); free space there, or point {cache} "
                "or the output path at a disk with room")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"{base}: cannot write there; choose a writable output path, or set {cache} to a writable folder"
    return base if e.filename else str(e)
