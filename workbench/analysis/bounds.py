"""Offline bounds for expert caching, from a request stream or a trace. All tables are pandas.

* ``knapsack_bound``: the fractional-knapsack upper bound on the hit rate of ANY static
  pinning at a byte budget: sort keys by accesses per byte, take them greedily, the last
  one fractionally. Pinned keys are assumed preloaded (every access to them hits).
* ``belady``: Belady's MIN for uniform sizes (evict the resident key whose next use is
  furthest; never-used-again counts as infinitely far). Default ``bypass=False`` is demand
  paging (every miss is admitted, as every engine policy and libCacheSim's Belady do): the
  minimum misses of any policy that admits every miss. ``bypass=True`` may decline to admit
  a key used later than everything resident: the minimum for caches with admission control.
* ``hit_curves``: hit rate vs slots per layer (each layer its own cache). LRU curves come
  from one pass of Mattson's stack algorithm; Belady and other policies replay each size.
* ``allocate_slots``: split a total slot budget across layers from those curves, greedily
  by marginal gain (optimal when curves are concave) or exactly by dynamic programming.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..arena.policies.kernels import belady_replay
from ..sim.replay import replay_keys
from ..sim.requests import Requests, load, next_use, requests_from_trace
from ..trace.schema import Trace

__all__ = ["knapsack_bound", "knapsack_set", "belady", "belady_misses", "hit_curves", "allocate_slots", "stack_distances"]


def _keys_layers(source, phase=None):
    """(keys, layers, n_experts) from a trace/path, a Requests, or a plain key array (layers None)."""
    if isinstance(source, Requests):
        return source.keys, source.layer, source.n_experts
    if isinstance(source, (Trace, str)) or hasattr(source, "__fspath__"):
        req = requests_from_trace(source, phase=phase)
        return req.keys, req.layer, req.n_experts
    return np.asarray(source, dtype=np.int64), None, None


def _sizes_for(uniq, sizes):
    if np.isscalar(sizes):
        return np.full(len(uniq), float(sizes))
    if isinstance(sizes, dict):
        try:
            return np.array([float(sizes[int(k)]) for k in uniq])
        except KeyError as e:
            raise ValueError(f"sizes has no entry for key {e}; give a size for every key") from None
    arr = np.asarray(sizes, dtype=np.float64)
    if arr.ndim != 1 or (len(uniq) and uniq.max() >= len(arr)):
        raise ValueError("sizes must be a number, a dict key -> bytes, or an array indexed by key")
    return arr[uniq]


def knapsack_set(source, budget_bytes, sizes=None, phase=None) -> pd.DataFrame:
    """Keys in knapsack order (accesses per byte, ties by key) with cumulative bytes and the
    fraction of each taken at ``budget_bytes``: columns key, accesses, bytes, density, cum_bytes, take."""
    keys, _, _ = _keys_layers(source, phase)
    sizes = _default_sizes(source, sizes)
    uniq, counts = np.unique(keys, return_counts=True)
    sz = _sizes_for(uniq, sizes)
    if (sz <= 0).any():
        raise ValueError("every key needs a positive size in bytes")
    dens = counts / sz
    order = np.lexsort((uniq, -dens))
    uniq, counts, sz, dens = uniq[order], counts[order], sz[order], dens[order]
    cum = np.cumsum(sz)
    before = cum - sz
    take = np.clip((float(budget_bytes) - before) / sz, 0.0, 1.0)
    return pd.DataFrame({"key": uniq, "accesses": counts, "bytes": sz, "density": dens, "cum_bytes": cum, "take": take})


def _default_sizes(source, sizes):
    if sizes is not None:
        return sizes
    if isinstance(source, (Trace, str)) or hasattr(source, "__fspath__"):
        eb = load(source).meta.get("expert_bytes")
        if eb:
            return float(eb)
    return 1.0


def knapsack_bound(source, budgets, sizes=None, phase=None) -> pd.DataFrame:
    """Upper bound on static-pinning hit rate at each byte budget.

    ``source``: a trace/path or a key array; ``sizes``: bytes per key (number, dict or
    array by key; default the trace's expert_bytes, else 1 so budgets count slots).
    Columns: budget_bytes, hits (fractional), lookups, hit_rate, keys_pinned (whole keys),
    fraction_last (share of the partly taken key), hit_rate_cold (the same set charged one cold
    miss per pinned key, as a replay that starts empty pays: comparable with LRU and Belady).
    """
    keys, _, _ = _keys_layers(source, phase)
    table = knapsack_set(keys, 0.0, _default_sizes(source, sizes))
    acc = table["accesses"].to_numpy(dtype=np.float64)
    sz = table["bytes"].to_numpy()
    cum = table["cum_bytes"].to_numpy()
    rows = []
    for budget in np.atleast_1d(budgets):
        budget = float(budget)
        if budget < 0:
            raise ValueError(f"budget must be >= 0 bytes, got {budget}")
        take = np.clip((budget - (cum - sz)) / sz, 0.0, 1.0)
        hits = float((take * acc).sum())
        whole = int((take >= 1.0).sum())
        part = take[(take > 0) & (take < 1)]
        cold = hits - float(take.sum())  # every pinned key's first access reads it
        rows.append(dict(budget_bytes=budget, hits=hits, lookups=len(keys), hit_rate=hits / len(keys) if len(keys) else 0.0,
                         keys_pinned=whole, fraction_last=float(part[0]) if len(part) else 0.0,
                         hit_rate_cold=cold / len(keys) if len(keys) else 0.0))
    return pd.DataFrame(rows)


def belady(keys, capacity: int, bypass: bool = False) -> np.ndarray:
    """Hit mask of Belady's MIN with ``capacity`` uniform slots (see module doc for ``bypass``; the loop is
    ``arena.policies.kernels._belady``)."""
    keys = np.asarray(keys, dtype=np.int64)
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1 slot, got {capacity}")
    return belady_replay(keys, next_use(keys), capacity, bypass)


def belady_misses(keys, capacity: int, bypass: bool = False) -> int:
    """Number of misses of Belady's MIN."""
    return int(len(keys) - belady(keys, capacity, bypass).sum())


def stack_distances(keys) -> np.ndarray:
    """LRU stack distance of each request (0 = most recent key), -1 for a first access.

    A request hits an LRU cache of c slots exactly when 0 <= distance < c (Mattson).
    """
    stack: list[int] = []
    out = np.empty(len(keys), dtype=np.int64)
    for i, k in enumerate(np.asarray(keys, dtype=np.int64).tolist()):
        try:
            d = stack.index(k)
        except ValueError:
            d = -1
            stack.insert(0, k)
        else:
            if d:
                del stack[d]
                stack.insert(0, k)
        out[i] = d
    return out


def hit_curves(source, capacities=None, policy="lru", phase=None, per_layer=True) -> pd.DataFrame:
    """Hit rate vs slots, per layer (each layer its own cache of c slots) or over all keys.

    ``capacities``: slot counts (default 1..n_experts for per-layer curves). ``policy``:
    "lru" (stack algorithm, all sizes in one pass), "belady", or any engine policy name
    (one replay per size; FIFO-like policies need not be monotone). Columns: layer (or -1
    for one shared cache), slots, lookups, hits, hit_rate, policy.
    """
    keys, layers, n_experts = _keys_layers(source, phase)
    if not per_layer or layers is None:
        groups = [(-1, keys)]
    else:
        groups = [(int(L), keys[layers == L]) for L in np.unique(layers)]
    if capacities is None:
        top = n_experts if (per_layer and n_experts) else max(1, len(np.unique(keys)))
        capacities = range(1, top + 1)
    caps = np.array(sorted({int(c) for c in capacities}))
    if len(caps) == 0 or caps[0] < 1:
        raise ValueError("capacities must be slot counts >= 1")
    rows = []
    for L, ks in groups:
        n = len(ks)
        if policy == "lru":
            d = stack_distances(ks)
            d = d[d >= 0]
            hist = np.bincount(d, minlength=int(caps.max()) + 1)
            cum = np.cumsum(hist)
            hits = cum[np.minimum(caps - 1, len(cum) - 1)]
        elif policy == "belady":
            ks = np.asarray(ks, dtype=np.int64)
            nu = next_use(ks)  # once per layer, not per capacity
            hits = np.array([int(belady_replay(ks, nu, int(c)).sum()) for c in caps])
        else:
            hits = np.array([replay_keys(ks, policy, int(c), preload=False).hits for c in caps])
        for c, h in zip(caps, hits):
            rows.append(dict(layer=L, slots=int(c), lookups=n, hits=int(h), hit_rate=(h / n) if n else 0.0, policy=policy))
    return pd.DataFrame(rows)


def allocate_slots(curves: pd.DataFrame, budget: int, min_slots: int = 0, method: str = "greedy") -> pd.DataFrame:
    """Split ``budget`` slots across layers to maximize total hits, from ``hit_curves`` output.

    ``method="greedy"``: marginal-gain greedy with lookahead: each step gives the layer with
    the best gain per slot over its next j slots (j chosen per layer) those j slots, ties to
    the lower layer id; plain one-slot greedy stalls on curves that start flat (a top-k
    layer gains nothing from its first slots). Optimal at the curves' concave-hull points;
    slots nobody gains from are left unassigned. ``method="exact"``: dynamic
    programming over layers (optimal for any curves). ``min_slots`` per layer are given
    first (e.g. top_k, which the engine must hold at once). A layer's curve must cover every
    slot count from 1 up to the largest it may get; beyond its last point it stays flat.
    Columns: layer, slots, hits, lookups, hit_rate, marginal (gain of that layer's last slot).
    """
    if method not in ("greedy", "exact"):
        raise ValueError(f"unknown method {method!r}; valid: greedy, exact")
    layers = sorted(int(x) for x in curves["layer"].unique())
    if budget < min_slots * len(layers):
        raise ValueError(f"budget of {budget} slots cannot give {len(layers)} layers min_slots={min_slots} each")
    tabs = {}
    for L in layers:
        c = curves[curves["layer"] == L].sort_values("slots")
        slots = c["slots"].to_numpy()
        if len(slots) and not np.array_equal(slots, np.arange(1, len(slots) + 1)):
            raise ValueError(f"layer {L}: the curve must have every slot count 1..{slots.max()} (got {slots[:8].tolist()}...)")
        h = np.concatenate([[0], c["hits"].to_numpy(dtype=np.float64)])
        tabs[L] = (h, int(c["lookups"].iloc[0]) if len(c) else 0)

    def hits_at(L, s):
        h = tabs[L][0]
        return h[min(s, len(h) - 1)]

    if method == "greedy":
        alloc = {L: min_slots for L in layers}
        left = budget - min_slots * len(layers)
        while left > 0:
            best = None  # (gain per slot, -layer, layer, step)
            for L in layers:
                a = alloc[L]
                cap = len(tabs[L][0]) - 1
                for j in range(1, min(left, max(cap - a, 1)) + 1):
                    rate = (hits_at(L, a + j) - hits_at(L, a)) / j
                    if best is None or (rate, -L) > best[:2]:
                        best = (rate, -L, L, j)
            if best[0] <= 0:
                break  # no layer gains from more slots
            alloc[best[2]] += best[3]
            left -= best[3]
    else:
        extra = budget - min_slots * len(layers)
        NEG = -np.inf
        dp = np.zeros(extra + 1)
        choice = []
        for L in layers:
            smax = max(0, min(extra, len(tabs[L][0]) - 1 - min_slots))  # flat beyond the curve
            gain = np.array([hits_at(L, min_slots + s) for s in range(smax + 1)])
            new = np.full(extra + 1, NEG)
            arg = np.zeros(extra + 1, dtype=np.int64)
            for s in range(smax + 1):  # new[b] = max_s dp[b - s] + gain[s]
                cand = dp[: extra + 1 - s] + gain[s]
                better = cand > new[s:]
                new[s:] = np.where(better, cand, new[s:])
                arg[s:] = np.where(better, s, arg[s:])
            choice.append(arg)
            dp = new
        alloc = {}
        b = int(np.argmax(dp))
        for L, arg in zip(reversed(layers), reversed(choice)):
            s = int(arg[b])
            alloc[L] = min_slots + s
            b -= s
    rows = []
    for L in layers:
        s = alloc[L]
        h = hits_at(L, s)
        n = tabs[L][1]
        rows.append(dict(layer=L, slots=s, hits=h, lookups=n, hit_rate=h / n if n else 0.0,
                         marginal=h - hits_at(L, s - 1) if s > 0 else 0.0))
    return pd.DataFrame(rows)
