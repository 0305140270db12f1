"""Admission gates for speculative reads: decide which ahead() candidates are worth reading.

Every gate has the same small interface (engine and simulator share it):

  admit(layer, expert, **ctx) -> bool    read this candidate now?
  update(layer, candidates, selected)    after the real router ran for ``layer``:
                                         ``candidates`` are ALL eligible candidates that
                                         were ranked for it (admitted or not), ``selected``
                                         the experts the router chose.

Gates:

* ``none``: admit everything.
* ``confidence``: a 2-bit saturating counter per (layer, expert), 0..3, starting at
  ``init`` (default 2); admit at >= ``threshold`` (2). ``update`` adds +1 to every eligible
  candidate the router confirmed and -1 to every one it rejected.
* ``cost``: admit when ``q * stall_saved > price * bytes + victim_loss``: q is the
  probability the candidate is claimed (``ctx['q']``, e.g. from a calibration table, else
  ``q_default``), ``stall_saved`` the seconds a useful read saves, ``price`` seconds (or any
  cost unit) per byte read, ``bytes`` the expert's size (``ctx['bytes']`` or the gate's
  ``bytes``), ``victim_loss`` the expected cost of evicting the victim (``ctx``, default 0).
"""

from __future__ import annotations

import numpy as np

__all__ = ["Gate", "NoGate", "ConfidenceGate", "CostGate", "GATES", "make_gate"]


class Gate:
    """Base gate: admits everything, learns nothing."""

    name = "base"
    learns = False  # whether ``update`` changes anything (callers skip building its arguments)

    def admit(self, layer: int, expert: int, **ctx) -> bool:
        return True

    def filter(self, layer: int, candidates, **ctx) -> list[int]:
        """The admitted subset of ``candidates``, order kept."""
        return [int(e) for e in candidates if self.admit(layer, int(e), **ctx)]

    def update(self, layer: int, candidates, selected) -> None:
        pass


class NoGate(Gate):
    """No gate: every candidate is read."""

    name = "none"


class ConfidenceGate(Gate):
    """2-bit saturating confidence counters per (layer, expert); admit at >= 2."""

    name = "confidence"
    learns = True

    def __init__(self, init: int = 2, threshold: int = 2):
        if not 0 <= int(init) <= 3 or not 0 <= int(threshold) <= 3:
            raise ValueError(f"confidence gate init and threshold must be in 0..3 (2-bit counters), got {init}, {threshold}")
        self.init = int(init)
        self.threshold = int(threshold)
        self.counters: dict[tuple[int, int], int] = {}

    def counter(self, layer: int, expert: int) -> int:
        return self.counters.get((int(layer), int(expert)), self.init)

    def admit(self, layer, expert, **ctx):
        return self.counter(layer, expert) >= self.threshold

    def update(self, layer, candidates, selected):
        sel = {int(e) for e in np.asarray(selected).ravel()}
        for e in np.asarray(candidates).ravel():
            key = (int(layer), int(e))
            c = self.counters.get(key, self.init)
            self.counters[key] = min(3, c + 1) if int(e) in sel else max(0, c - 1)


class CostGate(Gate):
    """Cost test: admit when q * stall_saved > price * bytes + victim_loss.

    ``q_table`` ({layer: [q of rank 1, rank 2, ...]}, from a fitted claim model:
    ``analysis.calibration.ClaimModel.gate_table``) gives each candidate the q of its rank among
    all experts (``ranks=`` to ``filter``; the planner passes them); without it q is ``q_default``."""

    name = "cost"

    def __init__(self, stall_saved: float = 1e-3, price: float = 2.5e-10, bytes: int | None = None, q_default: float = 0.5,
                 q_table: dict | None = None):
        if stall_saved < 0 or price < 0:
            raise ValueError(f"cost gate stall_saved and price must be >= 0, got {stall_saved}, {price}")
        if not 0.0 <= q_default <= 1.0:
            raise ValueError(f"cost gate q_default is a probability in [0, 1], got {q_default}")
        self.stall_saved = float(stall_saved)
        self.price = float(price)
        self.bytes = bytes
        self.q_default = float(q_default)
        self.q_table = None
        if q_table is not None:
            self.q_table = {int(l): [float(q) for q in qs] for l, qs in q_table.items()}
            bad = [q for qs in self.q_table.values() for q in qs if not 0.0 <= q <= 1.0]
            if bad or not all(self.q_table.values()):
                raise ValueError("cost gate q_table holds, per layer, a non-empty list of probabilities in [0, 1]")

    def q_of(self, layer: int, rank: int) -> float | None:
        """The fitted q of the candidate of ``rank`` (1 = best) for ``layer``; ranks past the table take its last."""
        qs = None if self.q_table is None else self.q_table.get(int(layer))
        return None if qs is None else qs[min(int(rank), len(qs)) - 1]

    def filter(self, layer: int, candidates, ranks=None, **ctx) -> list[int]:
        if self.q_table is None:
            return super().filter(layer, candidates, **ctx)
        ranks = range(1, len(candidates) + 1) if ranks is None else ranks
        return [int(e) for e, r in zip(candidates, ranks) if self.admit(layer, int(e), q=self.q_of(layer, r), **ctx)]

    def admit(self, layer, expert, q=None, bytes=None, victim_loss=0.0, **ctx):
        q = self.q_default if q is None else float(q)
        nbytes = bytes if bytes is not None else self.bytes
        if nbytes is None:
            raise ValueError("cost gate needs the expert size: pass bytes= to make_gate('cost', bytes=...) or to admit()")
        return q * self.stall_saved > self.price * float(nbytes) + float(victim_loss)


GATES = {g.name: g for g in (NoGate, ConfidenceGate, CostGate)}


def make_gate(name: str = "none", **options) -> Gate:
    """Build a gate by name; unknown names raise a ValueError listing the valid ones."""
    try:
        cls = GATES[name]
    except KeyError:
        raise ValueError(f"unknown gate {name!r}; valid gates: {', '.join(sorted(GATES))}") from None
    try:
        return cls(**options)
    except TypeError as e:
        raise ValueError(f"gate {name!r}: bad options {sorted(options)} ({e})") from None
