from .base import register
from .lru import LRU


@register
class FIFO(LRU):
    """First in, first out: evict the key admitted longest ago; hits change nothing."""

    name = "fifo"
    replay_cost = 0.8
    move_on_hit = False  # replay: LRU's loop without the move

    def access(self, key, speculative=False):
        if speculative:  # first claim of a prefetch: it enters the queue now, as a demand admit would
            self._od.move_to_end(key)

    def access_many(self, keys):
        pass
