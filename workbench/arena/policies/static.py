from collections import OrderedDict

import numpy as np

from .base import Policy, _token_ends, register
from .hotlist import load_hotlist


def require_hotlist(policy: str, options: dict, how: str = "keys= or hotlist=") -> None:
    """A run asking for static pinning must say what to pin (the class alone falls back to LRU)."""
    if policy == "static" and options.get("keys") is None and options.get("hotlist") is None:
        raise ValueError(f"--policy static pins the experts of a hotlist; give {how} (KEY or LAYER EXPERT per line)")


@register
class Static(Policy):
    """Static pinning: hotlist keys are never chosen while an unpinned key can go; the rest is LRU."""

    name = "static"

    # Options: keys (list of keys or (layer, expert) pairs) or hotlist (a file, see
    # hotlist.py), hottest first; top (keep only the first N); n_keys / n_experts validate
    # the hotlist against the model. The hotlist is the warm set. It must leave at least
    # one slot unpinned for streaming misses. order() yields unpinned keys LRU first, then
    # pinned keys coldest (last in the hotlist) first.

    def __init__(self, capacity, keys=None, hotlist=None, top=None, **options):
        super().__init__(capacity, **options)
        if keys is not None and hotlist is not None:
            raise ValueError("static policy: give either keys= or hotlist= (a file), not both")
        hl = load_hotlist(keys if keys is not None else hotlist, n_keys=options.get("n_keys"), n_experts=options.get("n_experts"))
        if hotlist is not None and not hl:
            raise ValueError(f"static policy: hotlist {hotlist} holds no keys; write KEY or LAYER EXPERT per line")
        if top is not None:
            hl = hl[: int(top)]
        if len(hl) >= self.capacity:
            raise ValueError(
                f"static pinning of {len(hl)} keys needs at least {len(hl) + 1} slots (one unpinned slot "
                f"for streaming misses), but capacity is {self.capacity}; pass top={self.capacity - 1} or a larger arena"
            )
        self.pinned = hl
        self._rank = {k: i for i, k in enumerate(hl)}
        self._lru = OrderedDict()  # unpinned resident keys
        self._pins: set[int] = set()  # pinned resident keys

    def admit(self, key, speculative=False):
        if key in self._rank:
            self._pins.add(key)
        else:
            self._lru[key] = None
            self._lru.move_to_end(key)

    def access(self, key, speculative=False):
        if key not in self._rank:
            self._lru.move_to_end(key)

    def remove(self, key):
        self._lru.pop(key, None)
        self._pins.discard(key)

    def order(self):
        yield from list(self._lru)
        yield from sorted(self._pins, key=self._rank.__getitem__, reverse=True)

    def warm_keys(self):
        return list(self.pinned)

    def replay(self, keys, token_end=None):
        """Fast demand-only replay (same result as ``Policy.replay``)."""
        _token_ends(token_end, len(keys))
        lru, pins, rank = self._lru, self._pins, self._rank
        cap = self.capacity
        out = bytearray(len(keys))
        i = 0
        for k in np.asarray(keys, dtype=np.int64).tolist():
            if k in pins:
                out[i] = 1
            elif k in lru:
                lru.move_to_end(k)
                out[i] = 1
            else:
                if len(lru) + len(pins) >= cap:
                    if lru:
                        lru.popitem(last=False)
                    else:
                        pins.discard(max(pins, key=rank.__getitem__))
                if k in rank:
                    pins.add(k)
                else:
                    lru[k] = None
            i += 1
        return np.frombuffer(bytes(out), dtype=np.bool_).copy()
