"""Range checks for numbers a user passes (flags, API arguments): one line naming the flag, the value and the range.

Resource limits live here too, so a request for 100000 threads is refused up front with the number asked for.
"""

from __future__ import annotations

import math

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
