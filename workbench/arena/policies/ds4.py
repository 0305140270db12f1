from .base import Policy, _token_ends, register
from .hotlist import load_hotlist
from .kernels import ds4_replay


@register
class DS4(Policy):
    """ds4 hotness: +1 per routed selection, counters halved every 16 decode tokens; evict coldest, ties LRU."""

    name = "ds4"
    replay_cost = 4.9

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
        """Demand-only replay (same result as ``Policy.replay``; ``kernels.ds4_replay``)."""
        ends = _token_ends(token_end, len(keys))
        resident = list(self._last)
        hits, keys_now, last, self.hot, self._clock, self._tokens = ds4_replay(
            keys, ends, resident, [self._last[k] for k in resident], self.hot, self.capacity, self.decay_every,
            self._clock, self._tokens)
        self._last = dict(zip(keys_now.tolist(), last.tolist()))
        return hits
