"""Compiled replay loops (numba) for the policies whose replay is a recency list: LRU and FIFO.

One implementation of the rule: ``_recency`` is plain Python over the state it is given; numba
compiles it (on numpy arrays) when it is installed and the replay is long enough to pay for importing
numba and loading the cached compiled code (``JIT_MIN``), else the same function runs interpreted on
Python lists. Both are checked against step-by-step driving of
the policy classes by the conformance tests (tests/test_policies.py).
"""

from __future__ import annotations

import importlib.util

import numpy as np

JIT_MIN = 300_000  # lookups below which the interpreted loop beats importing numba and loading the compiled code


def have_numba() -> bool:
    return importlib.util.find_spec("numba") is not None


def _recency(ids, start, capacity, move_on_hit, nxt, prv, inside, hits, order):
    """Replay dense ``ids`` (0..n_ids-1) through a list of ``capacity`` slots holding ``start`` (coldest
    first). A hit moves the id to the hot end when ``move_on_hit`` (LRU) and leaves it (FIFO); a miss
    evicts the coldest when full and appends. Fills ``hits`` (one per request) and ``order`` (the final
    residents, coldest first) and returns how many reside. The caller allocates the state (``nxt``,
    ``prv``: n_ids + 1 zeros; ``inside``: n_ids falses): numpy arrays compiled, lists interpreted."""
    s = len(inside)  # sentinel of a circular doubly linked list: nxt[s] is the coldest, prv[s] the hottest
    nxt[s] = s
    prv[s] = s
    count = 0
    for x in start:
        p = prv[s]
        nxt[p] = x
        prv[x] = p
        nxt[x] = s
        prv[s] = x
        inside[x] = 1
        count += 1
    for i in range(len(ids)):
        x = ids[i]
        if inside[x]:
            hits[i] = 1
            if not move_on_hit or prv[s] == x:
                continue
            nxt[prv[x]] = nxt[x]
            prv[nxt[x]] = prv[x]
        else:
            if count >= capacity:
                v = nxt[s]
                nxt[s] = nxt[v]
                prv[nxt[v]] = s
                inside[v] = 0
            else:
                count += 1
            inside[x] = 1
        p = prv[s]
        nxt[p] = x
        prv[x] = p
        nxt[x] = s
        prv[s] = x
    x = nxt[s]
    for j in range(count):
        order[j] = x
        x = nxt[x]
    return count


_compiled = None


def _kernel():
    """The numba-compiled loop (compiled once, cached on disk)."""
    global _compiled
    if _compiled is None:
        import numba

        _compiled = numba.njit(cache=True, nogil=True)(_recency)
    return _compiled


def recency_replay(keys, start, capacity: int, move_on_hit: bool, compiled: bool | None = None):
    """(hits, final order as keys) of replaying int ``keys`` from resident ``start`` keys (coldest first).
    ``compiled``: force the numba (True) or interpreted (False) loop; None picks by length."""
    keys = np.asarray(keys, dtype=np.int64)
    start = np.asarray(list(start), dtype=np.int64)
    both = np.concatenate([start, keys])
    lo = int(both.min()) if len(both) else 0
    hi = int(both.max()) if len(both) else 0
    if lo >= 0 and hi < 4 * len(both) + (1 << 16):  # small non-negative keys (a trace's): their own dense ids
        uniq, dense = None, both
        n_ids = hi + 1
    else:
        uniq, dense = np.unique(both, return_inverse=True)
        n_ids = len(uniq)
    if compiled is None:
        compiled = len(keys) >= JIT_MIN and have_numba()
    compiled = compiled and have_numba()
    n_req = len(keys)
    if compiled:
        hits, order = np.zeros(n_req, np.bool_), np.zeros(n_ids, np.int64)
        count = _kernel()(dense[len(start):], dense[:len(start)], int(capacity), bool(move_on_hit),
                          np.zeros(n_ids + 1, np.int64), np.zeros(n_ids + 1, np.int64), np.zeros(n_ids, np.bool_), hits, order)
    else:
        dense = dense.tolist()
        hits, order = bytearray(n_req), [0] * n_ids
        count = _recency(dense[len(start):], dense[:len(start)], int(capacity), bool(move_on_hit),
                         [0] * (n_ids + 1), [0] * (n_ids + 1), [False] * n_ids, hits, order)
        hits, order = np.frombuffer(bytes(hits), dtype=np.bool_).copy(), np.asarray(order, dtype=np.int64)
    order = order[:count]
    return hits, (order if uniq is None else uniq[order])
