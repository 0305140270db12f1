"""The eviction-policy interface shared by the live arena and the replay simulator.

A policy orders the keys resident in a fixed-capacity cache. Keys are ints
(``layer * n_experts + expert``). The cache (engine arena or simulator) owns
residency; the policy only keeps recency/frequency state and yields victims.

Call protocol (the cache calls, in this order of events):
  admit(key, speculative)   key was just placed in a slot (demand miss or prefetch)
  access(key, speculative)  a demand claim of a resident key (a hit); speculative=True
                            when this is the first demand claim of a prefetched key
  remove(key)               key left the cache (evicted or invalidated)
  order()                   iterator over resident keys, coldest first; the cache
                            scans it and skips keys it may not evict (pinned, in flight)
  tick()                    end of one decode token (for decaying policies)

Speculation rule shared by every policy: a speculative ``admit`` followed later by
the first demand claim ``access(key, speculative=True)`` leaves the policy as a
demand ``admit(key)`` at claim time would have; the prefetch itself never counts
as a use (two-hit reuse, ds4 hotness, LFU frequency, SLRU promotion).

Optional extensions (added compatibly; the base class gives working defaults):
  replay(keys, token_end=None) -> bool array of hits, driving this policy with a
                            demand-only cache of ``capacity`` slots (see ``replay``);
                            policies may override it with a fast loop that the
                            conformance suite checks against step-by-step driving
  warm_keys()               keys the policy wants loaded before the run (hotlists)
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np


class Policy:
    """Base class: every eviction policy implements these five methods."""

    name = "base"
    replay_cost = 1.0  # a replay cell's time against an LRU cell's on the same trace (measured on 2048- and 256-token
    # cells, bench/RESULTS.md bench_sweep): sweeps start the costliest cells first

    def __init__(self, capacity: int, **options):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
            raise ValueError(f"policy capacity must be a whole number of slots, got {capacity!r}")
        if capacity < 1:
            raise ValueError(f"policy capacity must be >= 1, got {capacity}")
        unknown = sorted(set(options) - COMMON_OPTIONS)
        if unknown:
            raise ValueError(
                f"policy {self.name!r} does not take option(s) {unknown}; "
                f"options every policy accepts: {sorted(COMMON_OPTIONS)} (see the policy's docstring for its own)"
            )
        self.capacity = int(capacity)

    def admit(self, key: int, speculative: bool = False) -> None:
        raise NotImplementedError

    def access(self, key: int, speculative: bool = False) -> None:
        raise NotImplementedError

    def access_many(self, keys) -> None:
        """Demand hits on ``keys``, in order (one call per layer on the engine's hot path)."""
        for key in keys:
            self.access(key)

    def remove(self, key: int) -> None:
        raise NotImplementedError

    def order(self) -> Iterator[int]:
        raise NotImplementedError

    def tick(self) -> None:
        pass

    def warm_keys(self) -> list[int]:
        """Keys to load before the first request (a hotlist); none by default."""
        return []

    def replay(self, keys: Iterable[int], token_end=None) -> np.ndarray:
        """Drive this policy with a demand-only cache of ``capacity`` slots.

        The driving protocol (the same one ``workbench.sim.cache.SimCache`` uses):
        for each key, a resident key is a hit and gets ``access(key)``; a missing key
        first evicts ``next(iter(order()))`` when the cache is full (``remove``),
        then gets ``admit(key)``. The cache starts with the keys the policy already
        orders (so a fresh policy starts empty). ``token_end`` (bool array, same
        length) calls ``tick()`` after each marked request. Returns a bool array,
        True where the request hit.
        """
        keys = np.asarray(keys, dtype=np.int64)
        ends = _token_ends(token_end, len(keys))
        resident = set(self.order())
        cap = self.capacity
        out = bytearray(len(keys))
        for i, k in enumerate(keys.tolist()):
            if k in resident:
                self.access(k)
                out[i] = 1
            else:
                if len(resident) >= cap:
                    victim = next(iter(self.order()))
                    self.remove(victim)
                    resident.discard(victim)
                self.admit(k)
                resident.add(k)
            if ends is not None and ends[i]:
                self.tick()
        return np.frombuffer(bytes(out), dtype=np.bool_).copy()


def _token_ends(token_end, n):
    """Validate a ``token_end`` argument: None or a bool sequence of length ``n``."""
    if token_end is None:
        return None
    ends = np.asarray(token_end, dtype=bool)
    if ends.shape != (n,):
        raise ValueError(f"token_end must be a bool array of length {n} (one flag per request), got shape {ends.shape}")
    return ends.tolist()


POLICIES: dict[str, type[Policy]] = {}
# Options any policy accepts (and may ignore), so callers can pass them uniformly.
COMMON_OPTIONS = frozenset({"n_keys", "n_experts"})
POLICY_MODULES = ("lru", "slru", "twohit", "ds4", "static", "s3fifo", "lfu", "fifo")


def register(cls: type[Policy]) -> type[Policy]:
    POLICIES[cls.name] = cls
    return cls


def load_all():
    """Import every policy module so each registers itself in ``POLICIES``."""
    import importlib

    for mod in POLICY_MODULES:
        importlib.import_module(f"{__package__}.{mod}")


def make_policy(name: str, capacity: int, **options) -> Policy:
    """Build a policy by name; unknown names raise a ValueError listing the valid ones."""
    load_all()  # registers every policy module

    try:
        cls = POLICIES[name]
    except KeyError:
        valid = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown policy {name!r}; valid policies: {valid}") from None
    return cls(capacity, **options)
