"""Arena sizes and byte sizes: the one parser every command, simulator and notebook uses.

``--arena`` is a fraction of all routed experts (``0.25``, ``25%``; ``1.0`` is all of them), a
slot count (``64``) or a size. Sizes are bytes with a unit, case-insensitive, an optional space
between: decimal ``B KB MB GB TB`` (powers of 1000) or binary ``KiB MiB GiB TiB`` (powers of
1024). ``2GB`` is 2 000 000 000 bytes, ``2GiB`` 2 147 483 648.
"""

from __future__ import annotations

import math
import re

UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"([0-9]*\.?[0-9]+)\s*([a-z]+)")
FORMS = "a fraction in (0, 1] (0.25), a percentage (25%), a slot count (64) or a size (2GB = 2e9 bytes, 2GiB = 2^31)"


def _is_size(text: str) -> bool:
    m = _SIZE.fullmatch(text)
    return bool(m) and m.group(2) in UNITS


def parse_bytes(spec) -> int:
    """Bytes of ``2GB`` / ``1.5 GiB`` / ``4096`` (a bare whole number is bytes); ValueError otherwise."""
    text = str(spec).strip().lower()
    if re.fullmatch(r"[0-9]+", text):
        return int(text)
    m = _SIZE.fullmatch(text)
    if m is None or m.group(2) not in UNITS:
        raise ValueError(f"cannot read size {spec!r}; use a number with a unit: B, KB, MB, GB, TB (powers of 1000) "
                         "or KiB, MiB, GiB, TiB (powers of 1024), e.g. 2GB or 512MiB")
    value = float(m.group(1)) * UNITS[m.group(2)]
    if not math.isfinite(value) or value > 2**62:
        raise ValueError(f"size {spec!r} is too large")
    return int(value)


def arena_slots(spec, n_routed: int, expert_bytes: int | None = None, top_k: int = 1) -> int:
    """Slots for ``spec`` (at most ``n_routed``); ValueError when it is unreadable or cannot hold
    one layer's ``top_k`` experts. A size needs ``expert_bytes``."""
    if isinstance(spec, bool):
        raise ValueError(f"cannot read arena size {spec!r}; use {FORMS}")
    text = str(spec).strip().lower()
    if isinstance(spec, float) or re.fullmatch(r"[0-9]*\.[0-9]+", text):
        frac = float(text)
        if not 0 < frac <= 1:
            raise ValueError(f"arena fraction must be in (0, 1], got {spec}; or use {FORMS}")
        slots = max(1, round(frac * n_routed))
    elif text.endswith("%") and re.fullmatch(r"[0-9]*\.?[0-9]+", text[:-1].strip()):
        pct = float(text[:-1])
        if not 0 < pct <= 100:
            raise ValueError(f"arena percentage must be in (0, 100], got {spec}; or use {FORMS}")
        slots = max(1, round(pct / 100 * n_routed))
    elif re.fullmatch(r"[0-9]+", text):
        slots = int(text)
    elif _is_size(text):
        if not expert_bytes:
            raise ValueError(f"arena {spec!r} is a size, but the expert size is unknown here; "
                             "give a fraction (0.25) or a slot count (64)")
        slots = parse_bytes(text) // expert_bytes
    else:
        raise ValueError(f"cannot read arena size {spec!r}; use {FORMS}")
    if slots < max(1, top_k):
        each = f" (each slot is {expert_bytes} bytes)" if expert_bytes else ""
        raise ValueError(
            f"arena of {slots} slots cannot hold one layer's {top_k} routed experts; "
            f"use --arena {max(1, top_k)} or more{each}; the arena takes {FORMS}"
        )
    return min(slots, n_routed)


def check_arena(spec) -> None:
    """Refuse an arena ``spec`` that cannot be read, before the model is known (``arena_slots``
    then counts its slots against the model)."""
    text = str(spec).strip().lower()
    if isinstance(spec, str) and _is_size(text):
        parse_bytes(text)
    else:
        arena_slots(spec, 2**62)
