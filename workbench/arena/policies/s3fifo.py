from collections import OrderedDict

from .base import Policy, _token_ends, register
from .kernels import s3fifo_replay


@register
class S3FIFO(Policy):
    """S3-FIFO: small FIFO for new keys, main FIFO with reinsertion, ghost FIFO of keys evicted from small."""

    name = "s3fifo"
    replay_cost = 1.65

    # Options: small (fraction of capacity for the small queue, default 0.1), ghost
    # (ghost entries as a fraction of capacity, default 0.9), move_to_main (hits a key in
    # small needs to move to main instead of being evicted, default 1).
    # Frequencies are 2-bit (0..3). Eviction, one victim at a time from one shared pool of
    # slots: from small while it holds more than its share (or main is empty): its oldest
    # key moves to main with freq 0 if freq >= move_to_main, else it is the victim (its
    # key goes to the ghost); otherwise from main: the oldest key is reinserted with
    # freq - 1 if freq > 0, else it is the victim. A miss on a ghost key enters main.
    # (libCacheSim's S3FIFO sizes its two queues separately, so counts differ slightly.)
    #
    # order() is pure: it simulates that scan on a copy, treating keys already yielded as
    # pinned in place. remove() of a key order() just yielded applies the same scan to the
    # real queues (the moves and reinsertions S3-FIFO makes on its way to that victim).

    def __init__(self, capacity, small=0.1, ghost=0.9, move_to_main=1, **options):
        super().__init__(capacity, **options)
        if not 0.0 < float(small) < 1.0:
            raise ValueError(f"s3fifo small must be a fraction in (0, 1), got {small}")
        self.small_cap = max(1, int(float(small) * capacity))
        self.ghost_cap = max(1, int(round(float(ghost) * capacity)))
        self.move_to_main = int(move_to_main)
        self._S = OrderedDict()  # oldest first
        self._M = OrderedDict()
        self._G = OrderedDict()
        self._freq: dict[int, int] = {}
        self._version = 0
        self._yielded = (None, [])

    # --- protocol -------------------------------------------------------------
    def admit(self, key, speculative=False):
        self._version += 1
        self._S.pop(key, None)
        self._M.pop(key, None)
        if key in self._G:
            del self._G[key]
            self._M[key] = None
        else:
            self._S[key] = None
        self._freq[key] = 0

    def access(self, key, speculative=False):
        self._version += 1
        if speculative:  # first claim of a prefetch: as if admitted now
            q = self._S if key in self._S else self._M
            q.move_to_end(key)
            return
        f = self._freq[key]
        if f < 3:
            self._freq[key] = f + 1

    def remove(self, key):
        version, yielded = self._yielded
        if version == self._version and key in yielded:
            skip = set(yielded[: yielded.index(key)])
            for v in self._scan(self._S, self._M, self._freq, skip):
                if v == key:
                    break
                skip.add(v)
        self._version += 1
        self._yielded = (None, [])
        self._drop(key)

    def order(self):
        S, M, freq = OrderedDict(self._S), OrderedDict(self._M), dict(self._freq)
        yielded = []
        self._yielded = (self._version, yielded)
        skip: set[int] = set()
        for v in self._scan(S, M, freq, skip):
            yielded.append(v)
            skip.add(v)
            yield v

    # --- internals ------------------------------------------------------------
    def _drop(self, key):
        if key in self._S:
            del self._S[key]
            self._G[key] = None
            self._G.move_to_end(key)
            while len(self._G) > self.ghost_cap:
                self._G.popitem(last=False)
        else:
            self._M.pop(key, None)
        self._freq.pop(key, None)

    def _scan(self, S, M, freq, skip):
        """Yield victims in S3-FIFO order, mutating S/M/freq as S3-FIFO does.

        The caller adds each yielded key to ``skip``; skipped keys stay where they are.
        """
        thr = self.move_to_main
        while True:
            s_head = next((k for k in S if k not in skip), None)
            m_head = next((k for k in M if k not in skip), None)
            if s_head is None and m_head is None:
                return
            if s_head is not None and (len(S) > self.small_cap or m_head is None):
                if freq[s_head] >= thr:
                    del S[s_head]
                    M[s_head] = None
                    freq[s_head] = 0
                    continue
                yield s_head
            elif freq[m_head] > 0:
                freq[m_head] -= 1
                M.move_to_end(m_head)
            else:
                yield m_head

    def _evict_one(self):
        victim = next(self._scan(self._S, self._M, self._freq, ()))
        self._drop(victim)

    def replay(self, keys, token_end=None):
        """Demand-only replay evicting in place (same result as ``Policy.replay``; ``kernels.s3fifo_replay``);
        ticks are no-ops."""
        _token_ends(token_end, len(keys))
        small, main = list(self._S), list(self._M)
        hits, S, M, G, freq = s3fifo_replay(keys, small, main, list(self._G), [self._freq[k] for k in small + main],
                                            self.capacity, self.small_cap, self.ghost_cap, self.move_to_main)
        self._S, self._M, self._G = (OrderedDict.fromkeys(q.tolist()) for q in (S, M, G))
        self._freq = dict(zip(S.tolist() + M.tolist(), freq.tolist()))
        self._version += 1
        self._yielded = (None, [])
        return hits
