from collections import OrderedDict

import numpy as np

from .base import Policy, _token_ends, register


@register
class LFU(Policy):
    """Least frequently used (in-cache counts, reset on eviction); ties evict the least recently used."""

    name = "lfu"

    # A demand admit starts at frequency 1 and each demand hit adds 1 (libCacheSim's LFU).
    # A speculative admit starts at 0 and its first claim sets 1, so unused prefetches go first.

    def __init__(self, capacity, **options):
        super().__init__(capacity, **options)
        self._freq: dict[int, int] = {}
        self._buckets: dict[int, OrderedDict] = {}

    def _put(self, key, f):
        self._freq[key] = f
        b = self._buckets.get(f)
        if b is None:
            b = self._buckets[f] = OrderedDict()
        b[key] = None

    def _take(self, key):
        f = self._freq.pop(key)
        b = self._buckets[f]
        del b[key]
        if not b:
            del self._buckets[f]
        return f

    def admit(self, key, speculative=False):
        if key in self._freq:
            self._take(key)
        self._put(key, 0 if speculative else 1)

    def access(self, key, speculative=False):
        f = self._take(key)
        self._put(key, f + 1)

    def remove(self, key):
        if key in self._freq:
            self._take(key)

    def order(self):
        for f in sorted(self._buckets):
            yield from list(self._buckets[f])

    def frequency(self, key) -> int:
        """Current in-cache frequency of a resident key."""
        return self._freq[key]

    def replay(self, keys, token_end=None):
        """Fast demand-only replay (same result as ``Policy.replay``)."""
        _token_ends(token_end, len(keys))
        freq, buckets, cap = self._freq, self._buckets, self.capacity
        minf = min(buckets) if buckets else 1
        out = bytearray(len(keys))
        i = 0
        for k in np.asarray(keys, dtype=np.int64).tolist():
            f = freq.get(k)
            if f is not None:
                b = buckets[f]
                del b[k]
                if not b:
                    del buckets[f]
                    if minf == f:
                        minf = f + 1
                f += 1
                freq[k] = f
                nb = buckets.get(f)
                if nb is None:
                    nb = buckets[f] = OrderedDict()
                nb[k] = None
                out[i] = 1
            else:
                if len(freq) >= cap:
                    if minf not in buckets:
                        minf = min(buckets)
                    b = buckets[minf]
                    victim, _ = b.popitem(last=False)
                    del freq[victim]
                    if not b:
                        del buckets[minf]
                freq[k] = 1
                nb = buckets.get(1)
                if nb is None:
                    nb = buckets[1] = OrderedDict()
                nb[k] = None
                if minf > 1:
                    minf = 1
            i += 1
        return np.frombuffer(bytes(out), dtype=np.bool_).copy()
