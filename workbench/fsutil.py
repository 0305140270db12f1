"""Files and folders the workbench creates: where its cache lives, the user's umask, atomic temp
names, atomic writes, and one-line hints when the disk is full or a place is read-only."""

from __future__ import annotations

import errno
import os
import tempfile
import threading
from pathlib import Path

_LOCK = threading.Lock()


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


def temp_file(prefix: str, parent) -> str:
    """``tempfile.mkstemp`` in ``parent`` (closed), with the mode ``open(..., "w")`` would give (not 0600)."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~umask())
    return tmp


def atomic_write(path, write) -> None:
    """Call ``write(tmp)`` on a temp file beside ``path``, then rename it into place: a reader sees the
    old file or the whole new one, never a part; a failed write leaves no temp file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_file(f".{path.name}.", path.parent)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
