"""Parse ``--arena``: a fraction of all routed experts (``0.25``, ``25%``), a slot count (``64``) or bytes (``2GB``)."""

from __future__ import annotations

import re

_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def arena_slots(spec, n_routed: int, expert_bytes: int, top_k: int) -> int:
    """Number of slots for ``spec``; raises ValueError when it cannot hold one layer's top-k."""
    text = str(spec).strip().lower()
    if isinstance(spec, float) or ("." in text and re.fullmatch(r"[0-9]*\.[0-9]+", text)):
        frac = float(text)
        if not 0 < frac <= 1:
            raise ValueError(f"arena fraction must be in (0, 1], got {spec}")
        slots = max(1, round(frac * n_routed))
    elif text.endswith("%"):
        return arena_slots(float(text[:-1]) / 100, n_routed, expert_bytes, top_k)
    elif re.fullmatch(r"[0-9]+", text):
        slots = int(text)
    elif m := re.fullmatch(r"([0-9.]+)\s*([kmgt]i?b|b)", text):
        slots = int(float(m.group(1)) * _UNITS[m.group(2)] // expert_bytes)
    else:
        raise ValueError(f"cannot read arena size {spec!r}; use a fraction (0.25), a slot count (64) or a size (2GB)")
    if slots < top_k:
        raise ValueError(
            f"arena of {slots} slots cannot hold one layer's {top_k} routed experts; "
            f"use --arena {top_k} or more (each slot is {expert_bytes} bytes)"
        )
    return min(slots, n_routed)
