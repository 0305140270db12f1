from collections import OrderedDict

import numpy as np

from .base import Policy, _token_ends, register


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

    def replay(self, keys, token_end=None):
        """Fast demand-only replay (same result as ``Policy.replay``); ticks are no-ops."""
        _token_ends(token_end, len(keys))
        od = self._od
        cap = self.capacity
        move = od.move_to_end
        pop = od.popitem
        out = bytearray(len(keys))
        n = len(od)
        for i, k in enumerate(np.asarray(keys, dtype=np.int64).tolist()):
            if k in od:
                move(k)
                out[i] = 1
            elif n >= cap:
                pop(last=False)
                od[k] = None
            else:
                od[k] = None
                n += 1
        return np.frombuffer(bytes(out), dtype=np.bool_).copy()
