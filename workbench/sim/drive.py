"""What the two arena simulators (``sim.vtime``, ``sim.ioreplay``) share with the engine: a trace's
routing decisions in the order the engine made them, the engine's preload, and its residency hash.

A routing decision is one ``experts.selected`` event: the trace rows of one (step, layer), in trace
order. Prefill is one decision per layer (step 0, a row per prompt token but the last); a decode
token is one decision per layer (one row). Each decision goes through ``arena.claims.Claims``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..arena.claims import preload as _preload
from ..trace.schema import TraceError

PHASES = ("all", "decode")  # all: prefill then decode, as the engine ran them; decode: decode rows only


@dataclass
class Decision:
    step: int
    phase: str
    layer: int
    ids: np.ndarray  # [tokens, k] host ids, one row per token
    row: int  # its first row's position among the rows it was grouped from


def check_phase(phase) -> str:
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; valid: all (prefill, then decode: as the engine ran them), "
                         "decode (decode rows only)")
    return phase


def decisions(rows: pd.DataFrame) -> list[Decision]:
    """``rows`` (a trace's routing rows) grouped by (step, layer), groups in the order they first
    appear, rows in trace order within each."""
    steps = rows["step"].to_numpy(dtype=np.int64)
    layers = rows["layer"].to_numpy(dtype=np.int64)
    codes, _ = pd.factorize(pd.MultiIndex.from_arrays([steps, layers]), sort=False)
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    selected, phases = rows["selected"].tolist(), rows["phase"].tolist()
    out = []
    for group in np.split(order, bounds) if len(order) else []:
        first = int(group[0])
        try:
            ids = np.array([selected[i] for i in group], dtype=np.int64)
        except ValueError:
            raise TraceError(f"trace rows of step {steps[first]} layer {layers[first]} route different numbers of "
                             "experts; re-record the trace") from None
        if len(group) == 1:
            ids = np.unique(ids)[None]  # a token's ids are distinct (a hand-made trace may repeat one)
        out.append(Decision(int(steps[first]), phases[first], int(layers[first]), ids, first))
    return out


def preload(arena, counters, how) -> None:
    """The engine's preload (``arena.claims.preload``), counted apart (step -1, phase "preload")."""
    arena.step = -1
    counters.phase[-1] = "preload"
    _preload(arena, how)


class ResidencyHash:
    """The engine's ``stats["residency_hash"]``: sha256 over the arena's residency signature after
    every decode token, its first 16 hex digits."""

    def __init__(self):
        self._h = hashlib.sha256()

    def update(self, arena) -> str:
        """Add the arena's residency now (a token ended); the hash so far."""
        self._h.update(arena.map.signature())
        return self.hexdigest()

    def hexdigest(self) -> str:
        return self._h.hexdigest()[:16]
