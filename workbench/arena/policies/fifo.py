import numpy as np

from .base import _token_ends, register
from .lru import LRU


@register
class FIFO(LRU):
    """First in, first out: evict the key admitted longest ago; hits change nothing."""

    name = "fifo"

    def access(self, key, speculative=False):
        if speculative:  # first claim of a prefetch: it enters the queue now, as a demand admit would
            self._od.move_to_end(key)

    def access_many(self, keys):
        pass

    def replay(self, keys, token_end=None):
        """Fast demand-only replay (same result as ``Policy.replay``)."""
        _token_ends(token_end, len(keys))
        od = self._od
        cap = self.capacity
        pop = od.popitem
        out = bytearray(len(keys))
        n = len(od)
        for i, k in enumerate(np.asarray(keys, dtype=np.int64).tolist()):
            if k in od:
                out[i] = 1
            elif n >= cap:
                pop(last=False)
                od[k] = None
            else:
                od[k] = None
                n += 1
        return np.frombuffer(bytes(out), dtype=np.bool_).copy()
