"""Compiled replay loops (numba): the recency list (LRU, FIFO), LFU's frequency buckets, S3-FIFO's
queues, ds4's hotness heap, the two-segment lists (SLRU, TwoHit) and Belady's MIN.

One implementation of each rule: ``_recency``, ``_lfu``, ``_s3fifo``, ``_ds4``, ``_segments`` and
``_belady`` are plain Python over the state they are given; numba compiles them (on numpy arrays)
when it is installed and the replay is long enough to pay for importing numba and loading the cached compiled code (``JIT_MIN`` lookups,
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


_HELPERS = {"_ds4": ("_sift",)}  # kernels -> the functions of this module they call (compiled with them)


def _jit(fn):
    """``fn`` compiled by numba (once per process; numba caches it on disk), calling its helpers compiled."""
    kernel = _COMPILED.get(fn.__name__)
    if kernel is None:
        import types

        import numba

        helpers = {name: _jit(globals()[name]) for name in _HELPERS.get(fn.__name__, ())}
        if helpers:
            fn = types.FunctionType(fn.__code__, {**fn.__globals__, **helpers}, fn.__name__)
        kernel = _COMPILED[fn.__name__] = numba.njit(cache=True, nogil=True)(fn)
    return kernel


def _call(fn, n_req: int, compiled, *args):
    """Run ``fn`` compiled (numba, on the numpy ``args``) or interpreted (on lists of them); returns
    (its return value, the arguments it filled, as numpy arrays)."""
    global _replayed
    _replayed += n_req
    if compiled is None:
        compiled = _replayed >= JIT_MIN
    if compiled and have_numba():
        return _jit(fn)(*args), args
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


def _s3fifo(ids, sn, mn, gn, capacity, small_cap, ghost_cap, thr, sq, mq, gq, gpos, where, freq, hits):
    """S3-FIFO (policies/s3fifo.py's rule) over dense ``ids``: a resident hit adds 1 to its 2-bit
    frequency; a miss, when full, evicts one: from the small queue while it holds more than
    ``small_cap`` (or the main queue is empty), whose oldest key moves to main at frequency 0 if it
    reached ``thr``, else goes (to the ghost queue, which keeps ``ghost_cap``); otherwise from main,
    whose oldest key goes back to its end one frequency lower, or goes at 0. The miss then enters main
    if it was a ghost, else small, at frequency 0. In a replay keys leave small and main only at their
    heads, so both are rings (``sq``, ``mq``: n_ids + 1, holding ``sn`` and ``mn`` keys from index 0 at
    the start); a ghost hit leaves the ghost queue anywhere, so it is a list (``gq``: ``gn`` at the
    start, plus one per request) whose live entries ``gpos`` marks (id -> its entry + 1, 0: no ghost).
    ``where``: 0 out, 1 small, 2 main. Fills ``hits``; returns (small head, small size, main head, main
    size, ghost head, ghost end)."""
    R = len(sq)
    sh = 0
    mh = 0
    gh = 0
    gt = gn
    for i in range(len(ids)):
        x = ids[i]
        if where[x] != 0:
            hits[i] = 1
            if freq[x] < 3:
                freq[x] += 1
            continue
        if sn + mn >= capacity:
            while True:
                if sn > 0 and (sn > small_cap or mn == 0):
                    y = sq[sh]
                    sh = (sh + 1) % R
                    sn -= 1
                    if freq[y] >= thr:  # to main, at frequency 0
                        mq[(mh + mn) % R] = y
                        mn += 1
                        where[y] = 2
                        freq[y] = 0
                        continue
                    where[y] = 0  # the victim: to the ghost queue
                    gq[gt] = y
                    gt += 1
                    gpos[y] = gt
                    gn += 1
                    while gn > ghost_cap:
                        z = gq[gh]
                        gh += 1
                        if gpos[z] == gh:  # a live entry (a ghost hit left the others behind)
                            gpos[z] = 0
                            gn -= 1
                    break
                y = mq[mh]
                mh = (mh + 1) % R
                if freq[y] > 0:  # back to main's end, one lower
                    freq[y] -= 1
                    mq[(mh + mn - 1) % R] = y
                    continue
                mn -= 1
                where[y] = 0
                break
        if gpos[x] > 0:  # a ghost: into main
            gpos[x] = 0
            gn -= 1
            mq[(mh + mn) % R] = x
            mn += 1
            where[x] = 2
        else:
            sq[(sh + sn) % R] = x
            sn += 1
            where[x] = 1
        freq[x] = 0
    return sh, sn, mh, mn, gh, gt


def s3fifo_replay(keys, small, main, ghost, freq, capacity: int, small_cap: int, ghost_cap: int, thr: int,
                  compiled: bool | None = None):
    """(hits, small, main, ghost, frequencies of small then main) after S3-FIFO over int ``keys`` from
    the queues ``small``, ``main``, ``ghost`` (keys, oldest first) and ``freq`` (of small then main).
    ``compiled`` as in ``recency_replay``."""
    small, main, ghost = list(small), list(main), list(ghost)
    dense, n_ids, uniq = _dense(keys, small + main + ghost)
    a, b, c = len(small), len(small) + len(main), len(small) + len(main) + len(ghost)
    n = len(dense) - c
    sq, mq, gq = np.zeros(n_ids + 1, np.int64), np.zeros(n_ids + 1, np.int64), np.zeros(len(ghost) + n + 1, np.int64)
    gpos, where, fr = np.zeros(n_ids, np.int64), np.zeros(n_ids, np.int8), np.zeros(n_ids, np.int64)
    sq[:a], mq[:b - a], gq[:c - b] = dense[:a], dense[a:b], dense[b:c]  # the queues at the start
    where[dense[:a]], where[dense[a:b]] = 1, 2
    fr[dense[:b]] = np.asarray(freq, dtype=np.int64).reshape(b)
    gpos[dense[b:c]] = np.arange(1, c - b + 1)
    (sh, sn, mh, mn, gh, gt), (*_, sq, mq, gq, gpos, _, fr, hits) = _call(
        _s3fifo, n, compiled, dense[c:], a, b - a, c - b, int(capacity), int(small_cap), int(ghost_cap), int(thr),
        sq, mq, gq, gpos, where, fr, np.zeros(n, np.bool_))
    R = n_ids + 1
    s_ids = sq[(sh + np.arange(sn)) % R]
    m_ids = mq[(mh + np.arange(mn)) % R]
    g_ids = gq[gh:gt][gpos[gq[gh:gt]] == np.arange(gh, gt) + 1]
    back = (lambda ids: ids) if uniq is None else (lambda ids: uniq[ids])
    return hits, back(s_ids), back(m_ids), back(g_ids), fr[np.concatenate([s_ids, m_ids])]


def _sift(hh, ht, hv, n, j):
    """Sink entry ``j`` of a min-heap of (``hh``, ``ht``) pairs (ids ``hv``) of ``n`` entries into place."""
    while True:
        c = 2 * j + 1
        if c >= n:
            return
        if c + 1 < n and (hh[c + 1] < hh[c] or (hh[c + 1] == hh[c] and ht[c + 1] < ht[c])):
            c += 1
        if hh[j] < hh[c] or (hh[j] == hh[c] and ht[j] < ht[c]):
            return
        hh[j], hh[c] = hh[c], hh[j]
        ht[j], ht[c] = ht[c], ht[j]
        hv[j], hv[c] = hv[c], hv[j]
        j = c


def _ds4(ids, ends, start, start_last, capacity, decay_every, clock, tokens, hot, last, hh, ht, hv, hits):
    """ds4 (policies/ds4.py's rule) over dense ``ids``: every request adds 1 to its key's hotness
    (``hot``, kept for evicted keys too) and makes it the most recent use; a miss, when full, evicts
    the resident of lowest (hotness, last use); after every ``decay_every``-th token end (``ends``)
    every hotness halves. ``start`` are resident at the start, last used at ``start_last``; ``clock``
    and ``tokens`` go on from the policy's. A min-heap of (hotness, last use, id) entries (``hh``,
    ``ht``, ``hv``: at least capacity + len(start) + 1), one a resident, made from the residents at the
    start and after each decay: a hit only raises its key's (hotness, last use), so an entry holds at
    most its key's current value; an entry that surfaces stale is pushed again with it, and the first
    current one is the least resident. ``last``: n_ids of -1 (resident: its last use). Fills
    ``hits``; returns (clock, tokens, the heap's size)."""
    n = 0
    count = 0
    for j in range(len(start)):
        last[start[j]] = start_last[j]
        count += 1
    rebuild = True
    for i in range(len(ids) + 1):
        if rebuild:  # the heap from the residents: (hotness, last use) ordered, sifted down
            n = 0
            for v in range(len(last)):
                if last[v] >= 0:
                    hh[n] = hot[v]
                    ht[n] = last[v]
                    hv[n] = v
                    n += 1
            for r in range(n // 2 - 1, -1, -1):
                _sift(hh, ht, hv, n, r)
            rebuild = False
        if i == len(ids):
            break
        x = ids[i]
        clock += 1
        if last[x] >= 0:  # a hit: its entry stays, below its key's new value
            hits[i] = 1
            last[x] = clock
            hot[x] += 1
        else:
            if count >= capacity:
                while True:  # the least entry: a current one is the victim, a stale one goes back with its key
                    v = hv[0]
                    if last[v] == ht[0] and hot[v] == hh[0]:
                        last[v] = -1
                        n -= 1
                        hh[0], ht[0], hv[0] = hh[n], ht[n], hv[n]
                        _sift(hh, ht, hv, n, 0)
                        break
                    hh[0], ht[0] = hot[v], last[v]
                    _sift(hh, ht, hv, n, 0)
            else:
                count += 1
            last[x] = clock
            hot[x] += 1
            j = n  # push (hotness, clock, x): it rises above parents that are greater
            n += 1
            while j > 0:
                q = (j - 1) // 2
                if hh[q] < hot[x] or (hh[q] == hot[x] and ht[q] < clock):
                    break
                hh[j], ht[j], hv[j] = hh[q], ht[q], hv[q]
                j = q
            hh[j], ht[j], hv[j] = hot[x], clock, x
        if ends[i]:
            tokens += 1
            if tokens % decay_every == 0:
                for v in range(len(hot)):
                    hot[v] >>= 1
                rebuild = True
    return clock, tokens, n


def ds4_replay(keys, ends, resident, last_use, hot: dict, capacity: int, decay_every: int, clock: int, tokens: int,
               compiled: bool | None = None):
    """(hits, residents as keys, their last uses, hotness as a dict, clock, tokens) after ds4 over int
    ``keys`` (``ends``: token ends, or None) from ``resident`` keys last used at ``last_use`` and
    hotness ``hot`` (key -> count). ``compiled`` as in ``recency_replay``."""
    resident, known = list(resident), list(hot)
    dense, n_ids, uniq = _dense(keys, resident + known)
    m, k = len(resident), len(resident) + len(known)
    n = len(dense) - k
    heat = np.zeros(n_ids, np.int64)
    heat[dense[m:k]] = np.asarray([hot[x] for x in known], dtype=np.int64)
    ends = np.zeros(n, np.bool_) if ends is None else np.asarray(ends, dtype=np.bool_)
    size = int(capacity) + m + 2
    (clock, tokens, _), (*_, heat, last, _, _, _, hits) = _call(
        _ds4, n, compiled, dense[k:], ends, dense[:m], np.asarray(last_use, dtype=np.int64).reshape(m), int(capacity),
        int(decay_every), int(clock), int(tokens), heat, np.full(n_ids, -1, np.int64), np.zeros(size, np.int64),
        np.zeros(size, np.int64), np.zeros(size, np.int64), np.zeros(n, np.bool_))
    res = np.flatnonzero(last >= 0)
    seen = np.flatnonzero((heat > 0) | (last >= 0))
    key = (lambda ids: ids) if uniq is None else (lambda ids: uniq[ids])
    return (hits, key(res), last[res], dict(zip(key(seen).tolist(), heat[seen].tolist())), clock, tokens)


def _segments(ids, start_a, start_b, start_reuse, capacity, twohit, pcap, nxt, prv, seg, reuse, hits):
    """The two-segment rules over dense ``ids``: a probationary or cold list A (entry order) before a
    protected or hot list B (LRU), victims from A's head first, then B's; a miss enters A's tail; a hit
    in B moves to B's tail. SLRU (``twohit`` False, policies/slru.py): a hit in A moves to B's tail
    (to A's tail when ``pcap`` is 0), and B over ``pcap`` gives its head back to A's tail. TwoHit
    (policies/twohit.py): a hit in A counts a reuse, and the second moves it to B's tail. ``start_a``
    (reuses ``start_reuse``) and ``start_b`` are the lists at the start, oldest first. Lists are
    circular, linked through ``nxt`` and ``prv`` (n_ids + 2: the sentinels of A and B last); ``seg``:
    0 out, 1 in A, 2 in B. Fills ``hits``; returns how many reside in A and in B."""
    A = len(seg)
    B = A + 1
    nxt[A] = prv[A] = A
    nxt[B] = prv[B] = B
    size = [0, 0, 0]  # by segment (index 1: A, 2: B)
    for j in range(len(start_a) + len(start_b) + len(ids)):
        if j < len(start_a):
            x, s = start_a[j], 1
            reuse[x] = start_reuse[j]
        elif j < len(start_a) + len(start_b):
            x, s = start_b[j - len(start_a)], 2
        else:
            i = j - len(start_a) - len(start_b)
            x = ids[i]
            s = seg[x]
            if s == 2:  # a hit in B: to B's tail
                hits[i] = 1
            elif s == 1:
                hits[i] = 1
                if twohit and reuse[x] == 0:
                    reuse[x] = 1
                    continue
                if not twohit and pcap <= 0:
                    s = 1  # to A's tail
                else:
                    s = 2
            else:  # a miss: when full, A's head goes (B's when A is empty); x enters A
                if size[1] + size[2] >= capacity:
                    v = nxt[A] if size[1] > 0 else nxt[B]
                    size[seg[v]] -= 1
                    seg[v] = 0
                    nxt[prv[v]] = nxt[v]
                    prv[nxt[v]] = prv[v]
                s = 1
                reuse[x] = 0
            if seg[x] != 0:  # unlink x from where it is
                size[seg[x]] -= 1
                nxt[prv[x]] = nxt[x]
                prv[nxt[x]] = prv[x]
        for _ in range(2):  # x to the tail of segment s; then, in SLRU, B's overflow to A's tail
            h = A if s == 1 else B
            p = prv[h]
            nxt[p] = x
            prv[x] = p
            nxt[x] = h
            prv[h] = x
            seg[x] = s
            size[s] += 1
            if twohit or s != 2 or size[2] <= pcap or j < len(start_a) + len(start_b):
                break
            x, s = nxt[B], 1  # B's head, demoted
            size[2] -= 1
            nxt[prv[x]] = nxt[x]
            prv[nxt[x]] = prv[x]
    return size[1], size[2]


def segments_replay(keys, a, b, a_reuse, capacity: int, twohit: bool, pcap: int = 0, compiled: bool | None = None):
    """(hits, list A, reuses of A, list B) after SLRU (``twohit`` False; ``pcap``: its protected
    capacity) or TwoHit over int ``keys`` from lists ``a`` (reuses ``a_reuse``) and ``b`` (keys, oldest
    first). ``compiled`` as in ``recency_replay``."""
    a, b = list(a), list(b)
    dense, n_ids, uniq = _dense(keys, a + b)
    m = len(a) + len(b)
    n = len(dense) - m
    (na, nb), (*_, nxt, _, _, reuse, hits) = _call(
        _segments, n, compiled, dense[m:], dense[:len(a)], dense[len(a):m], np.asarray(a_reuse, np.int64).reshape(len(a)),
        int(capacity), bool(twohit), int(pcap), np.zeros(n_ids + 2, np.int64), np.zeros(n_ids + 2, np.int64),
        np.zeros(n_ids, np.int8), np.zeros(n_ids, np.int64), np.zeros(n, np.bool_))
    lists = []
    for head, count in ((n_ids, na), (n_ids + 1, nb)):
        ids, x = [], int(nxt[head])
        for _ in range(count):
            ids.append(x)
            x = int(nxt[x])
        lists.append(np.asarray(ids, dtype=np.int64))
    key = (lambda ids: ids) if uniq is None else (lambda ids: uniq[ids])
    return hits, key(lists[0]), reuse[lists[0]], key(lists[1])
