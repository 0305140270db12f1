"""SimCache: a uniform-size cache of N slots that drives an engine policy step by step.

It follows the arena's call protocol (``workbench.arena.policies.base``) and is the
reference the conformance suite checks every policy's fast ``replay`` against:

* ``lookup(key)``: a demand lookup. Resident: a hit, ``access(key, speculative=<first
  claim of a prefetch>)``. Missing: evict ``first of order()`` that is not pinned when full
  (``remove``), then ``admit(key)``.
* ``prefetch(key)``: a speculative admit into a free slot or over an evictable victim;
  never over a pinned, unclaimed speculative or ``protect``-ed key.
* ``preload(keys)``: warm keys are admitted speculatively (not a use) and published, so
  their first lookup is an ordinary hit.
"""

from __future__ import annotations

from ..arena.policies.base import Policy


class NoVictimError(ValueError):
    """Every resident slot is pinned or otherwise not evictable."""


class SimCache:
    """Resident set + pins + unclaimed speculation over a policy of the same capacity."""

    def __init__(self, policy: Policy, capacity: int | None = None):
        self.policy = policy
        self.capacity = int(capacity if capacity is not None else policy.capacity)
        self.resident: set[int] = set(policy.order())
        self.unclaimed: set[int] = set()
        self.pinned: set[int] = set()
        self.hits = 0
        self.misses = 0

    def __contains__(self, key):
        return key in self.resident

    def __len__(self):
        return len(self.resident)

    def victim(self, skip=()) -> int | None:
        """The coldest key the policy offers that is not pinned, unclaimed or in ``skip``."""
        for k in self.policy.order():
            if k not in self.pinned and k not in self.unclaimed and k not in skip:
                return k
        return None

    def _evict(self, key):
        self.policy.remove(key)
        self.resident.discard(key)
        self.unclaimed.discard(key)

    def lookup(self, key: int) -> bool:
        key = int(key)
        if key in self.resident:
            spec = key in self.unclaimed
            self.unclaimed.discard(key)
            self.policy.access(key, speculative=spec)
            self.hits += 1
            return True
        if len(self.resident) >= self.capacity:
            v = self.victim()
            if v is None:
                raise NoVictimError(
                    f"no evictable slot for key {key}: all {self.capacity} slots are pinned or hold unclaimed "
                    f"prefetches; unpin or use a larger cache"
                )
            self._evict(v)
        self.policy.admit(key, speculative=False)
        self.resident.add(key)
        self.misses += 1
        return False

    def prefetch(self, key: int, protect=()) -> bool:
        """Admit ``key`` speculatively; False when resident already or no victim is allowed."""
        key = int(key)
        if key in self.resident:
            return False
        if len(self.resident) >= self.capacity:
            v = self.victim(skip=protect)
            if v is None:
                return False
            self._evict(v)
        self.policy.admit(key, speculative=True)
        self.resident.add(key)
        self.unclaimed.add(key)
        return True

    def remove(self, key: int) -> None:
        if key in self.resident:
            self._evict(int(key))

    def preload(self, keys) -> int:
        """Admit up to the free capacity of ``keys`` as published residents; returns how many."""
        n = 0
        for k in keys:
            if len(self.resident) >= self.capacity:
                break
            k = int(k)
            if k in self.resident:
                continue
            self.policy.admit(k, speculative=True)
            self.resident.add(k)
            n += 1
        return n

    def pin(self, keys) -> None:
        self.pinned.update(int(k) for k in keys)

    def unpin(self, keys=None) -> None:
        if keys is None:
            self.pinned.clear()
        else:
            self.pinned.difference_update(int(k) for k in keys)

    def tick(self) -> None:
        self.policy.tick()
