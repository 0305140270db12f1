"""The validation layer: numbers a user passes (flags, grid files, API arguments) and paths, each checked
before it is trusted, opened or allocated; one line naming the flag or file, the problem and the fix.

Resource limits live here too, so a request for 100000 threads is refused up front with the number asked for.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

MAX_IO_WORKERS = 256  # threads of one I/O scheduler


def is_whole(v) -> bool:
    """An int that is not a bool (JSON true/false parse as bool, a subclass of int)."""
    return isinstance(v, int) and not isinstance(v, bool)


def whole(flag: str, value, lo: int | None = None, hi: int | None = None, *, none_ok: bool = False):
    """``value`` as an int in [lo, hi]; ValueError naming ``flag`` otherwise."""
    if value is None and none_ok:
        return None
    if not is_whole(value):
        raise ValueError(f"{flag} must be a whole number, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"{flag} {value} is out of range: give {_range(lo, hi)}")
    return value


def real(flag: str, value, lo: float | None = None, hi: float | None = None, *, none_ok: bool = False,
         open_lo: bool = False):
    """``value`` as a finite float in [lo, hi] ((lo, hi] with ``open_lo``); ValueError naming ``flag`` otherwise."""
    if value is None and none_ok:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{flag} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{flag} must be a finite number, got {value!r}")
    if (lo is not None and (v < lo or (open_lo and v == lo))) or (hi is not None and v > hi):
        raise ValueError(f"{flag} {value} is out of range: give {_range(lo, hi, open_lo)}")
    return v


def io_workers(flag: str, workers, reserved=None, reserved_flag: str = "--io-reserved"):
    whole(flag, workers, 1, MAX_IO_WORKERS)
    if reserved is not None:
        whole(reserved_flag, reserved, 0, workers)
    return workers


def json_kind(v) -> str:
    """The JSON name of a parsed value's type, for messages (null, list, string, number, object)."""
    if v is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "list", dict: "object"}.get(
        type(v), type(v).__name__)


def _range(lo, hi, open_lo=False) -> str:
    if hi is None:
        return f"a value {'>' if open_lo else '>='} {lo}"
    if lo is None:
        return f"a value <= {hi}"
    return f"a value in {'(' if open_lo else '['}{lo}, {hi}]"


def parse_whole(flag: str, text, lo: int | None = None, hi: int | None = None) -> int:
    """``text`` (a flag's or a grid file's value) read as a whole number in [lo, hi]; ValueError naming ``flag``."""
    if not is_whole(text):
        try:
            text = int(str(text).strip())
        except ValueError:
            raise ValueError(f"{flag} must be a whole number, got {text!r}") from None
    return whole(flag, text, lo, hi)


def one_of(flag: str, value, options):
    """``value`` if it is one of ``options``; ValueError naming ``flag`` and listing them otherwise."""
    if value not in options:
        raise ValueError(f"{flag} {value!r} is not known; give one of {', '.join(map(str, options))}")
    return value


# --- paths: checked before they are opened (a FIFO blocks open(), /dev/zero never ends) ---

MAX_TEXT_BYTES = 256 * 2**20  # manifests, configs, tokenizers, hotlists, grids, params (metadata, never weights)


def _not_regular(st) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    for test, words in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket")):
        if test(st.st_mode):
            return words
    return None if stat.S_ISREG(st.st_mode) else "not a regular file"


def input_file(what: str, path, max_bytes: int | None = None, fix: str | None = None) -> Path:
    """``path`` as an existing, readable regular file (a symlink to one is fine) of at most ``max_bytes``;
    ValueError naming ``what`` (a flag or the file's role), the problem and the fix (``fix`` replaces the
    generic one) otherwise. Never opens it."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ValueError(f"{what} {path} does not exist; {fix or 'give an existing file'}") from None
    except OSError as e:
        raise ValueError(f"{what} {path} cannot be read ({e.strerror}); {fix or 'give a readable file'}") from None
    bad = _not_regular(st)
    if bad:
        raise ValueError(f"{what} {path} is {bad}, not a regular file; {fix or 'give a regular file'}")
    if max_bytes is not None and st.st_size > max_bytes:
        raise ValueError(f"{what} {path} is {st.st_size} bytes, more than the {max_bytes} a file of its kind may be; "
                         f"{fix or 'give the right file'}")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{what} {path} is not readable (permission denied); {fix or 'fix its permissions (chmod u+r)'}")
    return path


def read_bytes(what: str, path, max_bytes: int = MAX_TEXT_BYTES, fix: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (``input_file``'s checks, made on the opened
    file too, so a file swapped for a FIFO in between cannot block nor a device run forever)."""
    input_file(what, path, max_bytes, fix)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ValueError(f"{what} {path} cannot be opened ({e.strerror}); {fix or 'give a readable file'}") from None
    with os.fdopen(fd, "rb") as f:
        bad = _not_regular(os.fstat(fd))
        if bad:
            raise ValueError(f"{what} {path} is {bad}, not a regular file; {fix or 'give a regular file'}")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{what} {path} is larger than the {max_bytes} bytes a file of its kind may be; "
                         f"{fix or 'give the right file'}")
    return data


def read_text(what: str, path, max_bytes: int = MAX_TEXT_BYTES, fix: str | None = None) -> str:
    """``read_bytes`` decoded as UTF-8; ValueError naming ``what`` when it is not text."""
    data = read_bytes(what, path, max_bytes, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte {e.start}); {fix or 'give a text file'}") from None


def read_json(what: str, path, fix: str, max_bytes: int = MAX_TEXT_BYTES):
    """``read_text`` parsed as JSON; ValueError naming ``what``, the file and ``fix`` when it is not JSON."""
    import json

    text = read_text(what, path, max_bytes, fix)
    try:
        return json.loads(text)
    except ValueError as e:
        raise ValueError(f"{what} {path} is corrupt: it is not valid JSON ({e}); {fix}") from None


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _writable_folder(what: str, path: Path, folder: Path, fix: str) -> None:
    """``folder`` (``path`` itself, or the existing folder that will hold it) is a writable directory."""
    if not folder.is_dir():
        at = "" if folder == path else f": {folder}"
        raise ValueError(f"{what} {path}{at} is a file, not a folder; {fix}")
    if not os.access(folder, os.W_OK | os.X_OK):
        at = "" if folder == path else f": folder {folder}"
        raise ValueError(f"{what} {path}{at} is not writable; {fix}")


def _writable_place(what: str, path: Path, fix: str) -> None:
    """The folder that will hold ``path`` (its nearest existing ancestor) is a writable directory."""
    _writable_folder(what, path, _nearest_existing(path.parent if str(path.parent) else Path(".")), fix)


def output_file(what: str, path, fix: str | None = None) -> Path:
    """``path`` as a place a file can be written (atomically, by rename): missing or a regular file, in a
    writable folder (created if missing); ValueError naming ``what`` (``fix`` replaces the generic fix)
    otherwise. Creates nothing."""
    path = Path(path)
    fix = fix or "give a file path in a writable folder"
    if path.exists() or path.is_symlink():
        try:
            bad = _not_regular(os.stat(path))
        except OSError as e:
            raise ValueError(f"{what} {path} cannot be used ({e.strerror}); {fix}") from None
        if bad:
            raise ValueError(f"{what} {path} is {bad}; {fix}")
    _writable_place(what, path, fix)
    return path


def output_dir(what: str, path, fix: str | None = None) -> Path:
    """``path`` as a folder that can be written: missing (its nearest existing ancestor a writable folder)
    or a writable directory; ValueError naming ``what`` otherwise. Creates nothing."""
    path = Path(path)
    fix = fix or "give a folder path that can be written"
    if path.exists():
        _writable_folder(what, path, path, fix)
    else:
        _writable_place(what, path, fix)
    return path
