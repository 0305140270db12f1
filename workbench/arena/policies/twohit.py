from collections import OrderedDict

from .base import Policy, _token_ends, register
from .kernels import segments_replay


@register
class TwoHit(Policy):
    """Two-hit: a slot is promoted to LRU order only on its second demand reuse; cold slots go first."""

    name = "twohit"
    replay_cost = 1.45

    # A fresh slot (demand miss, or prefetch at its first claim) has reuse 0. The first
    # demand hit sets reuse 1 and leaves the slot where it is (at the cold tail); the
    # second sets 2 and promotes it to the hot LRU list. Victims: cold slots (reuse < 2)
    # in admission order first, then hot slots in LRU order. Speculation never counts:
    # a speculative admit is a fresh cold slot and its first claim leaves reuse at 0.
    # Hot slots stay hot until evicted.

    def __init__(self, capacity, **options):
        super().__init__(capacity, **options)
        self._cold = OrderedDict()  # key -> reuse (0 or 1), admission order
        self._hot = OrderedDict()  # LRU order

    def admit(self, key, speculative=False):
        self._hot.pop(key, None)
        self._cold.pop(key, None)
        self._cold[key] = 0

    def access(self, key, speculative=False):
        if key in self._hot:
            self._hot.move_to_end(key)
            return
        if speculative:  # first claim of a prefetch: becomes a fresh slot now
            self._cold.pop(key)
            self._cold[key] = 0
            return
        reuse = self._cold[key] + 1
        if reuse >= 2:
            del self._cold[key]
            self._hot[key] = None
        else:
            self._cold[key] = reuse

    def remove(self, key):
        self._cold.pop(key, None)
        self._hot.pop(key, None)

    def order(self):
        yield from list(self._cold)
        yield from list(self._hot)

    def reuse(self, key) -> int:
        """Reuse count of a resident key (2 means promoted)."""
        return 2 if key in self._hot else self._cold[key]

    def replay(self, keys, token_end=None):
        """Fast demand-only replay (same result as ``Policy.replay``; ``kernels.segments_replay``); ticks are no-ops."""
        _token_ends(token_end, len(keys))
        hits, cold, reuse, hot = segments_replay(keys, list(self._cold), list(self._hot), list(self._cold.values()),
                                                 self.capacity, twohit=True)
        self._cold = OrderedDict(zip(cold.tolist(), reuse.tolist()))
        self._hot = OrderedDict.fromkeys(hot.tolist())
        return hits
