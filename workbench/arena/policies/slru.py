from collections import OrderedDict

from .base import Policy, _token_ends, register
from .kernels import segments_replay


@register
class SLRU(Policy):
    """Segmented LRU, cold entry: new keys enter probationary; only a demand hit promotes to protected."""

    name = "slru"
    replay_cost = 1.5

    # Options: protected (fraction of capacity for the protected segment, default 0.8).
    # Victims: probationary LRU end first, then protected LRU end. A protected overflow
    # demotes the protected LRU key to the probationary MRU end. A speculative admit and
    # the first claim of a prefetch both land on the probationary MRU end (no promotion).

    def __init__(self, capacity, protected=0.8, **options):
        super().__init__(capacity, **options)
        if not 0.0 <= float(protected) <= 1.0:
            raise ValueError(f"slru protected must be a fraction in [0, 1], got {protected}")
        self.protected_cap = min(capacity - 1, int(round(float(protected) * capacity)))
        self._prob = OrderedDict()
        self._prot = OrderedDict()

    def admit(self, key, speculative=False):
        self._prot.pop(key, None)
        self._prob[key] = None
        self._prob.move_to_end(key)

    def access(self, key, speculative=False):
        if key in self._prot:
            self._prot.move_to_end(key)
            return
        if speculative or self.protected_cap <= 0:
            self._prob.move_to_end(key)
            return
        del self._prob[key]
        self._prot[key] = None
        while len(self._prot) > self.protected_cap:
            old, _ = self._prot.popitem(last=False)
            self._prob[old] = None

    def remove(self, key):
        self._prob.pop(key, None)
        self._prot.pop(key, None)

    def order(self):
        yield from list(self._prob)
        yield from list(self._prot)

    def segment(self, key) -> str:
        """'probationary' or 'protected' for a resident key."""
        return "protected" if key in self._prot else "probationary"

    def replay(self, keys, token_end=None):
        """Fast demand-only replay (same result as ``Policy.replay``; ``kernels.segments_replay``); ticks are no-ops."""
        _token_ends(token_end, len(keys))
        hits, prob, _, prot = segments_replay(keys, list(self._prob), list(self._prot), [0] * len(self._prob),
                                              self.capacity, twohit=False, pcap=self.protected_cap)
        self._prob, self._prot = OrderedDict.fromkeys(prob.tolist()), OrderedDict.fromkeys(prot.tolist())
        return hits
