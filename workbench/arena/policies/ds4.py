import heapq

import numpy as np

from .base import Policy, _token_ends, register
from .hotlist import load_hotlist


@register
class DS4(Policy):
    """ds4 hotness: +1 per routed selection, counters halved every 16 decode tokens; evict coldest, ties LRU."""

    name = "ds4"

    # Options: hotlist (keys, pairs or a file; see hotlist.py) seeds counters at ``seed``
    # (default 8) and is the warm set; decay_every (default 16 tokens, via tick()).
    # Counters are model-wide (kept for evicted keys too, so a returning expert keeps its
    # history); a speculative admit does not count, its first claim does (+1), like a
    # demand admit. Ties break by least recent use (admit or access); the engine protects
    # the current selection by pinning, not through the policy.

    def __init__(self, capacity, hotlist=None, seed=8, decay_every=16, **options):
        super().__init__(capacity, **options)
        if int(decay_every) < 1:
            raise ValueError(f"ds4 decay_every must be >= 1 token, got {decay_every}")
        self.decay_every = int(decay_every)
        self._hotlist = load_hotlist(hotlist, n_keys=options.get("n_keys"), n_experts=options.get("n_experts"))
        self.hot: dict[int, int] = {k: int(seed) for k in self._hotlist}
        self._last: dict[int, int] = {}  # resident key -> clock of last use
        self._clock = 0
        self._tokens = 0

    def _touch(self, key, count):
        self._clock += 1
        self._last[key] = self._clock
        if count:
            self.hot[key] = self.hot.get(key, 0) + 1

    def admit(self, key, speculative=False):
        self._touch(key, not speculative)

    def access(self, key, speculative=False):
        self._touch(key, True)

    def remove(self, key):
        self._last.pop(key, None)

    def order(self):
        hot, last = self.hot, self._last
        return iter(sorted(last, key=lambda k: (hot.get(k, 0), last[k])))

    def tick(self):
        self._tokens += 1
        if self._tokens % self.decay_every == 0:
            self.hot = {k: v >> 1 for k, v in self.hot.items() if v > 1 or k in self._last}

    def warm_keys(self):
        return list(self._hotlist)

    def replay(self, keys, token_end=None):
        """Demand-only replay with a lazy heap (same result as ``Policy.replay``)."""
        ends = _token_ends(token_end, len(keys))
        last = self._last
        heap = [(self.hot.get(k, 0), t, k) for k, t in last.items()]
        heapq.heapify(heap)
        cap = self.capacity
        out = bytearray(len(keys))
        for i, k in enumerate(np.asarray(keys, dtype=np.int64).tolist()):
            hot = self.hot
            if k in last:
                out[i] = 1
            elif len(last) >= cap:
                while True:
                    h, t, v = heapq.heappop(heap)
                    if last.get(v) == t and hot.get(v, 0) == h:
                        del last[v]
                        break
            self._clock += 1
            last[k] = self._clock
            h = hot[k] = hot.get(k, 0) + 1
            heapq.heappush(heap, (h, self._clock, k))
            if ends is not None and ends[i]:
                before = self._tokens
                self.tick()
                if self._tokens // self.decay_every != before // self.decay_every:
                    hot = self.hot
                    heap = [(hot.get(v, 0), t, v) for v, t in last.items()]
                    heapq.heapify(heap)
            if len(heap) > 4 * cap + 64:  # drop stale entries now and then
                hot = self.hot
                heap = [(hot.get(v, 0), t, v) for v, t in last.items()]
                heapq.heapify(heap)
        return np.frombuffer(bytes(out), dtype=np.bool_).copy()
