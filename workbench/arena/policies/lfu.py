from collections import OrderedDict

from .base import Policy, _token_ends, register
from .kernels import lfu_replay


@register
class LFU(Policy):
    """Least frequently used (in-cache counts, reset on eviction); ties evict the least recently used."""

    name = "lfu"
    replay_cost = 1.7

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
        """Fast demand-only replay (same result as ``Policy.replay``; ``kernels.lfu_replay``); ticks are no-ops."""
        _token_ends(token_end, len(keys))
        start = list(self.order())
        hits, order, freqs = lfu_replay(keys, start, [self._freq[k] for k in start], self.capacity)
        self._freq, self._buckets = {}, {}
        for k, f in zip(order.tolist(), freqs.tolist()):
            self._put(k, f)
        return hits
