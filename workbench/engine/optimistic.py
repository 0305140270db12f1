"""Verified optimistic decode: a whole token with no host sync per MoE layer.

Each MoE layer maps its expert ids to slots through a device table (``Arena.lut``) in which
every expert that is not published points at the placeholder slot, and records its ids. One
sync at the end of the token brings every layer's ids to the host, which checks them against
the table it uploaded. Layers before the first miss were computed on exact inputs with exact
weights: they are settled (claims, counters, policy touches, hooks, trace rows) in layer order,
exactly as per-layer decode would. At the first missed layer L the engine claims L's experts
(reading the misses), reads the perturbed pass's predictions for the later layers (the
*successors*, speculative, waited for), rolls the KV caches of layers >= L back one position and
recomputes from L's saved input. The output is exact by construction.

``Controller`` picks per token between this and per-layer decode from the recent miss pattern,
with a fixed cost model (never from timings, so residency never depends on timing).
"""

from __future__ import annotations

import numpy as np


class Controller:
    """Per-token choice of decode mode.

    Cost in units of one layer's compute: per-layer decode pays a host sync per MoE layer
    (``sync`` layers each), or with the handshake's hit-through (``through``) one per layer that
    missed plus one (the token's end, as an optimistic token's); an optimistic token pays one sync and,
    per recompute, a sync plus on average half the layers again. ``recomputes`` is a moving
    average of recomputes per token (observed in optimistic mode; in per-layer mode, the number of
    layers that missed, an upper bound). Per-layer mode probes optimistic decode every ``probe``
    tokens; a probe that cost more than per-layer decode doubles that interval (up to
    ``max_probe``), one that paid resets it.
    """

    def __init__(self, mode="auto", n_layers=1, sync=1.0, probe=16, decay=0.75, expect_misses=False, max_probe=256,
                 through=False):
        if mode not in ("auto", "optimistic", "layer"):
            raise ValueError(f"unknown decode mode {mode!r}; valid: auto, optimistic, layer")
        self.mode, self.n, self.sync, self.probe, self.decay = mode, n_layers, sync, probe, decay
        self.through = through
        self.recomputes = float(n_layers) if expect_misses else 0.0  # a partial arena starts per-layer
        self.interval, self.max_probe = probe, max_probe
        self.probed = False  # whether the last True from ``optimistic`` was a probe
        self._since_probe = 0

    def _cost(self, recomputes) -> float:
        return self.n + self.sync + recomputes * (self.sync + self.n / 2)

    def _layer_cost(self) -> float:
        if self.through:
            return self.n + self.sync * (1 + self.recomputes)
        return self.n * (1 + self.sync)

    def optimistic(self) -> bool:
        self.probed = False
        if self.mode != "auto":
            return self.mode == "optimistic"
        if self._cost(self.recomputes) <= self._layer_cost():
            return True
        self._since_probe += 1
        if self._since_probe >= self.interval:
            self._since_probe, self.probed = 0, True
            return True
        return False

    def observe(self, recomputes: int, probe: bool = False) -> None:
        if probe:
            lost = self._cost(recomputes) > self._layer_cost()
            self.interval = min(2 * self.interval, self.max_probe) if lost else self.probe
        self.recomputes = self.decay * self.recomputes + (1 - self.decay) * recomputes


def first_miss(lut: np.ndarray, table: np.ndarray, placeholder: int, layers, ids: np.ndarray):
    """Index (into ``layers``) of the first layer whose ids were not all published, in the slots
    of ``table`` (the pass's own copy of ``lut``), or None."""
    if len(layers) == 0:
        return None
    rows = np.asarray(layers, dtype=np.int64)[:, None]
    now = lut[rows, ids]
    missed = ((now == placeholder) | (now != table[rows, ids])).any(axis=1)
    hit = np.flatnonzero(missed)
    return int(hit[0]) if hit.size else None


def can_rewind(cache) -> bool:
    return all(c.is_trimmable() for c in cache)


class Rewind:
    """Roll the KV caches back one position for a recompute from decoder layer ``start``.

    Every cache is trimmed while the recompute's graph is built, so model-level code that reads
    ``cache[0]`` (masks, positions) sees the offsets it saw the first time; the skipped layers'
    cursors are put back afterwards (their entries for this token are exact and kept)."""

    def __init__(self, cache, start):
        self.cache, self.start = cache, start

    def __enter__(self):
        self.cursors = [_cursor(c) for c in self.cache[: self.start]]
        for c in self.cache:
            c.trim(1)
        return self

    def __exit__(self, *exc):
        for c, cur in zip(self.cache, self.cursors):
            _set_cursor(c, cur)


def _cursor(c):
    return {k: getattr(c, k) for k in ("offset", "_idx") if hasattr(c, k)}


def _set_cursor(c, cur):
    for k, v in cur.items():
        setattr(c, k, v)
