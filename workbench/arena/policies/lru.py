from collections import OrderedDict

from .base import Policy, _token_ends, register
from .kernels import recency_replay


@register
class LRU(Policy):
    """Least recently used: evict the key whose last admit or access is oldest."""

    name = "lru"

    def __init__(self, capacity, **options):
        super().__init__(capacity, **options)
        self._od = OrderedDict()

    def admit(self, key, speculative=False):
        self._od[key] = None
        self._od.move_to_end(key)

    def access(self, key, speculative=False):
        self._od.move_to_end(key)

    def access_many(self, keys):
        move = self._od.move_to_end
        for key in keys:
            move(key)

    def remove(self, key):
        self._od.pop(key, None)

    def order(self):
        return iter(self._od)

    move_on_hit = True  # FIFO: False

    def replay(self, keys, token_end=None):
        """Fast demand-only replay (same result as ``Policy.replay``; ``kernels.recency_replay``); ticks are no-ops."""
        _token_ends(token_end, len(keys))
        hits, order = recency_replay(keys, self._od, self.capacity, self.move_on_hit)
        self._od = OrderedDict.fromkeys(order.tolist())
        return hits
