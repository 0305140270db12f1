"""Hotlists: ordered lists of (layer, expert) keys, hottest first, for static and ds4 policies.

A hotlist is given as keys (ints, ``layer * n_experts + expert``), as ``(layer, expert)``
pairs, or as a file:

* text: one entry per line, ``KEY`` or ``LAYER EXPERT`` (also ``LAYER,EXPERT`` or
  ``LAYER:EXPERT``); ``#`` starts a comment; blank lines are skipped;
* JSON: a list of keys or of ``[layer, expert]`` pairs, or ``{"keys": [...]}``.

Pairs need ``n_experts`` to become keys. With ``n_keys`` (all routed experts of the model,
``n_layers * n_experts``) every key is checked to lie in the model; a hotlist naming an
expert the model lacks is a ValueError that names the entry.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

__all__ = ["load_hotlist", "save_hotlist"]

_SPLIT = re.compile(r"[\s,:]+")


def load_hotlist(source, n_keys: int | None = None, n_experts: int | None = None) -> list[int]:
    """Return the hotlist as a list of unique int keys, hottest first (first occurrence wins)."""
    if source is None:
        return []
    if isinstance(source, (str, os.PathLike)):
        entries, where = _read_file(Path(source))
    else:
        entries = list(source)
        where = ["entry %d" % i for i in range(len(entries))]
    keys: list[int] = []
    seen: set[int] = set()
    for entry, loc in zip(entries, where):
        key = _to_key(entry, n_experts, loc)
        if n_keys is not None and not 0 <= key < n_keys:
            raise ValueError(
                f"hotlist {loc}: key {key} is outside the model (valid keys 0..{n_keys - 1}, "
                f"key = layer * n_experts + expert); fix the hotlist or pass the right model shape"
            )
        if key not in seen:
            seen.add(key)
            keys.append(key)
    return keys


def save_hotlist(path, keys, n_experts: int | None = None) -> None:
    """Write ``keys`` (hottest first) as a text hotlist, ``LAYER EXPERT`` lines when ``n_experts`` is given."""
    from ...fsutil import atomic_write

    path = Path(path)
    lines = ["# workbench hotlist, hottest first"]
    for k in keys:
        k = int(k)
        lines.append(f"{k // n_experts} {k % n_experts}" if n_experts else str(k))
    atomic_write(path, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))


def _read_file(path: Path):
    if not path.exists():
        raise ValueError(f"hotlist file {path} does not exist; give a path to a text or JSON hotlist")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"hotlist file {path} is not text (UTF-8); write KEY or LAYER EXPERT per line") from None
    if path.suffix.lower() == ".json" or text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"hotlist file {path} is not valid JSON ({e}); write a list of keys or [layer, expert] pairs") from None
        if isinstance(data, dict):
            data = data.get("keys")
        if not isinstance(data, list):
            raise ValueError(f"hotlist file {path}: expected a JSON list of keys or {{\"keys\": [...]}}")
        return data, [f"{path} entry {i}" for i in range(len(data))]
    entries, where = [], []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = [p for p in _SPLIT.split(line) if p]
        try:
            vals = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"hotlist {path}:{n}: {line!r} is not 'KEY' or 'LAYER EXPERT' (whole numbers)") from None
        if len(vals) not in (1, 2):
            raise ValueError(f"hotlist {path}:{n}: {line!r} has {len(vals)} numbers; write 'KEY' or 'LAYER EXPERT'")
        entries.append(vals[0] if len(vals) == 1 else tuple(vals))
        where.append(f"{path}:{n}")
    return entries, where


def _to_key(entry, n_experts, loc) -> int:
    if isinstance(entry, (list, tuple)):
        if len(entry) != 2:
            raise ValueError(f"hotlist {loc}: {entry!r} is not a (layer, expert) pair")
        layer, expert = (int(x) for x in entry)
        if n_experts is None:
            raise ValueError(f"hotlist {loc}: (layer, expert) pairs need n_experts to form keys; pass n_experts=")
        if not 0 <= expert < n_experts or layer < 0:
            raise ValueError(
                f"hotlist {loc}: layer {layer} expert {expert} is not in the model "
                f"(experts 0..{n_experts - 1} per layer); fix the hotlist"
            )
        return layer * n_experts + expert
    try:
        key = int(entry)
    except (TypeError, ValueError):
        raise ValueError(f"hotlist {loc}: {entry!r} is not a key (a whole number)") from None
    if key < 0:
        raise ValueError(f"hotlist {loc}: key {key} is negative; keys are layer * n_experts + expert")
    return key
