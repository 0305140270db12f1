"""Compiled replay loops (numba): the recency list (LRU, FIFO), LFU's frequency buckets and Belady's MIN.

One implementation of each rule: ``_recency``, ``_lfu`` and ``_belady`` are plain Python over the
state they are given; numba compiles them (on numpy arrays) when it is installed and the replay is
long enough to pay for importing numba and loading the cached compiled code (``JIT_MIN`` lookups,
counted over every replay of the process: a sweep worker's cells add up); else the same function runs
interpreted on Python lists.
Each is checked against step-by-step driving of the policy classes (or, for Belady, a brute-force
MIN) by the conformance tests (tests/test_policies.py).
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
    ``prv``: n_ids + 1 zeros; ``inside``: n_ids falses)."""
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


def _lfu(ids, start, start_freq, capacity, inext, iprev, grp, fval, gnext, gprev, ghead, gtail, hits):
    """LFU (policies/lfu.py's rule): a miss evicts, when full, the resident of lowest frequency that
    entered that frequency first, and enters at frequency 1; a hit adds 1 and goes last among its new
    frequency. ``start`` (coldest first, frequencies ``start_freq`` non-decreasing) is resident at the
    start. Groups, one per frequency present, form a list in rising frequency (sentinel G, the last
    index of ``fval``); each holds its ids in entry order (``_lfu_residents`` reads them out). Fills
    ``hits``; the caller allocates id state (``inext``, ``iprev``: n_ids; ``grp``: n_ids of -1) and
    group state (``fval``, ``gnext``, ``gprev``, ``ghead``, ``gtail``: residents at most + 2)."""
    G = len(fval) - 1
    gnext[G] = gprev[G] = G
    free = 0  # unused groups, chained through gnext
    for g in range(G):
        gnext[g] = g + 1
    m = len(start)
    count = 0
    for j in range(m + len(ids)):
        g = -1  # the group an id leaves
        out = -1  # that id: x on a hit, the victim on an eviction
        if j < m:  # the start, in order: last in the last group, or in a new last group
            x = start[j]
            f = start_freq[j]
            p = gprev[G]
            h = p
            count += 1
        else:
            i = j - m
            x = ids[i]
            if grp[x] >= 0:  # hit: from group g to the next frequency's group, after g
                hits[i] = 1
                g = grp[x]
                f = fval[g] + 1
                p = g
                out = x
            else:  # miss: when full the lowest group's first id goes; x enters at frequency 1
                if count >= capacity:
                    g = gnext[G]
                    out = ghead[g]
                    grp[out] = -1
                else:
                    count += 1
                f = 1
                p = G
                if gnext[G] != G and fval[gnext[G]] < 1:  # a frequency-0 group (unclaimed prefetches) first
                    p = gnext[G]
            h = gnext[p]
        if out >= 0:  # unlink it from group g
            a = iprev[out]
            b = inext[out]
            if a >= 0:
                inext[a] = b
            else:
                ghead[g] = b
            if b >= 0:
                iprev[b] = a
            else:
                gtail[g] = a
        if h == G or fval[h] != f:  # no group of frequency f where x goes: a new one after p
            h = free
            free = gnext[h]
            fval[h] = f
            ghead[h] = gtail[h] = -1
            gnext[h] = gnext[p]
            gprev[h] = p
            gprev[gnext[p]] = h
            gnext[p] = h
        t = gtail[h]  # x goes last in group h
        iprev[x] = t
        inext[x] = -1
        if t >= 0:
            inext[t] = x
        else:
            ghead[h] = x
        gtail[h] = x
        grp[x] = h
        if g >= 0 and ghead[g] < 0:  # the group left is empty: back to the free chain
            gnext[gprev[g]] = gnext[g]
            gprev[gnext[g]] = gprev[g]
            gnext[g] = free
            free = g
    return count


def _lfu_residents(inext, fval, gnext, ghead):
    """(residents coldest first, their frequencies) of the groups ``_lfu`` left (lists)."""
    order, freqs = [], []
    G = len(fval) - 1
    g = gnext[G]
    while g != G:
        x = ghead[g]
        while x >= 0:
            order.append(x)
            freqs.append(fval[g])
            x = inext[x]
        g = gnext[g]
    return order, freqs


def _belady(ids, next_at, capacity, bypass, heap, pos, nu, hits):
    """Belady's MIN (analysis/bounds.py's rule): a miss when full evicts the resident whose next use
    (``next_at``: the request index of each request's next use, len(ids) when none) is furthest, and
    is admitted; with ``bypass`` a miss whose own next use is no nearer than that victim's is not
    admitted. Which of several residents never used again goes cannot change a hit, so ties are left
    to the heap. Fills ``hits``. The caller allocates a max-heap of next uses (``heap``:
    min(capacity, n_ids) + 1), each id's place in it (``pos``: n_ids of -1) and its next use (``nu``:
    n_ids). Returns how many reside at the end."""
    size = 0
    for i in range(len(ids)):
        x = ids[i]
        u = next_at[i]
        j = pos[x]
        if j >= 0:  # hit: its next use moves later, so it rises in the heap
            hits[i] = 1
            nu[x] = u
        elif size >= capacity:
            top = heap[0]
            if bypass and nu[top] <= u:
                continue
            pos[top] = -1
            nu[x] = u
            j = 0  # x takes the victim's place at the root and sinks below later next uses
            while True:
                c = 2 * j + 1
                if c >= size:
                    break
                if c + 1 < size and nu[heap[c + 1]] > nu[heap[c]]:
                    c += 1
                y = heap[c]
                if nu[y] <= u:
                    break
                heap[j] = y
                pos[y] = j
                j = c
            heap[j] = x
            pos[x] = j
            continue
        else:
            nu[x] = u
            j = size
            size += 1
        while j > 0:  # x rises above parents of nearer next use
            q = (j - 1) // 2
            y = heap[q]
            if nu[y] >= u:
                break
            heap[j] = y
            pos[y] = j
            j = q
        heap[j] = x
        pos[x] = j
    return size


_COMPILED: dict = {}
_replayed = 0  # lookups this process has replayed: once they reach JIT_MIN, loading numba has paid


def _call(fn, n_req: int, compiled, *args):
    """Run ``fn`` compiled (numba, on the numpy ``args``) or interpreted (on lists of them); returns
    (its return value, the arguments it filled, as numpy arrays)."""
    global _replayed
    _replayed += n_req
    if compiled is None:
        compiled = _replayed >= JIT_MIN
    if compiled and have_numba():
        kernel = _COMPILED.get(fn.__name__)
        if kernel is None:
            import numba

            kernel = _COMPILED[fn.__name__] = numba.njit(cache=True, nogil=True)(fn)
        return kernel(*args), args
    lists = [a.tolist() if isinstance(a, np.ndarray) else a for a in args]
    out = fn(*lists)
    return out, [np.asarray(x, dtype=a.dtype) if isinstance(a, np.ndarray) else x for x, a in zip(lists, args)]


def _dense(keys, start=()):
    """(dense ids of ``start`` then ``keys``, n_ids, the key of each id or None when ids are the keys)."""
    keys = np.asarray(keys, dtype=np.int64)
    both = np.concatenate([np.asarray(list(start), dtype=np.int64), keys])
    lo = int(both.min()) if len(both) else 0
    hi = int(both.max()) if len(both) else 0
    if lo >= 0 and hi < 4 * len(both) + (1 << 16):  # small non-negative keys (a trace's): their own ids
        return both, hi + 1, None
    uniq, dense = np.unique(both, return_inverse=True)
    return dense.astype(np.int64), len(uniq), uniq


def recency_replay(keys, start, capacity: int, move_on_hit: bool, compiled: bool | None = None):
    """(hits, final order as keys) of replaying int ``keys`` from resident ``start`` keys (coldest first).
    ``compiled``: force the numba (True) or interpreted (False) loop; None picks by ``JIT_MIN``."""
    start = list(start)
    dense, n_ids, uniq = _dense(keys, start)
    n, m = len(dense) - len(start), len(start)
    count, (*_, hits, order) = _call(_recency, n, compiled, dense[m:], dense[:m], int(capacity), bool(move_on_hit),
                                     np.zeros(n_ids + 1, np.int64), np.zeros(n_ids + 1, np.int64),
                                     np.zeros(n_ids, np.bool_), np.zeros(n, np.bool_), np.zeros(n_ids, np.int64))
    order = order[:count]
    return hits, (order if uniq is None else uniq[order])


def lfu_replay(keys, start, start_freq, capacity: int, compiled: bool | None = None):
    """(hits, final order as keys, their frequencies) of LFU over int ``keys`` from resident ``start``
    keys (coldest first) at frequencies ``start_freq``. ``compiled`` as in ``recency_replay``."""
    start = list(start)
    dense, n_ids, uniq = _dense(keys, start)
    n, m = len(dense) - len(start), len(start)
    groups = min(max(int(capacity), m), n_ids) + 2  # residents at most (never more than the ids), + 2
    _, (*_, inext, _, _, fval, gnext, _, ghead, _, hits) = _call(
        _lfu, n, compiled, dense[m:], dense[:m], np.asarray(start_freq, dtype=np.int64).reshape(m), int(capacity),
        np.zeros(n_ids, np.int64), np.zeros(n_ids, np.int64), np.full(n_ids, -1, np.int64),
        *(np.zeros(groups, np.int64) for _ in range(5)), np.zeros(n, np.bool_))
    order, freqs = _lfu_residents(inext.tolist(), fval.tolist(), gnext.tolist(), ghead.tolist())
    order = np.asarray(order, dtype=np.int64)
    return hits, (order if uniq is None else uniq[order]), np.asarray(freqs, dtype=np.int64)


def belady_replay(keys, next_at, capacity: int, bypass: bool = False, compiled: bool | None = None):
    """Hit mask of Belady's MIN over int ``keys`` from an empty cache; ``next_at``: each request's
    next request for the same key, negative when none. ``compiled`` as in ``recency_replay``."""
    dense, n_ids, _ = _dense(keys)
    n = len(dense)
    next_at = np.asarray(next_at, dtype=np.int64)
    next_at = np.where(next_at < 0, n, next_at)
    _, (*_, hits) = _call(_belady, n, compiled, dense, next_at, int(capacity), bool(bypass),
                          np.zeros(min(int(capacity), n_ids) + 1, np.int64), np.full(n_ids, -1, np.int64),
                          np.zeros(n_ids, np.int64), np.zeros(n, np.bool_))
    return hits
