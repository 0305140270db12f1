"""Cache-aware ranking of router logits (pure numpy; shared by the live engine and the simulator).

``cache_aware_select`` is cache-aware routing ("moce"): with logits z, resident mask R (published
entries only), protected width p and bonus b, the first p picks are argmax z among the
unselected experts and the later picks argmax (z + b*R). An optional rank-1 bonus r1 adds a
smaller resident preference to the first p picks. b <= 0 is exactly the plain top-k router
(r1 is then ignored). Every tie breaks toward the lower expert id.

The family then recomputes gate weights from the *unboosted* probabilities of the chosen
set (``cache_aware_weights`` shows the arithmetic; the bonus never enters the weights).

``ahead_candidates`` ranks *predicted* logits for a target layer for speculative reads, in
three modes (the seed's audit names them UNPERT=1, UNPERT=0 and route; those spellings,
``unpert1``, ``unpert0``, ``route``, are accepted too):

* ``"raw"``: raw top-k of the predicted logits (the original engine's default);
* ``"resident_bonus"``: ranks beyond 3 use the resident bonus b (p fixed at 3, no r1);
* ``"cache_aware"``: the full cache-aware ranking with p, b, r1; with b <= 0 it is off (raw top-k).

Candidates of a batch are merged (best rank over the batch, ties by expert id), and experts
already mapped (resident or in flight) are skipped.

Constructed check: z_e = -0.1*e over 32 experts, residents 6..19,
p=3, b=0.85, k=6: raw top-6 is {0..5}; cache-aware picks are {0, 1, 2, 6, 7, 8}; so only
{0, 1, 2} need reading.
"""

from __future__ import annotations

import numpy as np

from ..config import AHEAD_MODES, ahead_mode

__all__ = ["topk", "cache_aware_select", "cache_aware_weights", "ahead_candidates", "ahead_mode", "AHEAD_MODES"]



def _rank_rows(score, k, exclude=None):
    """Indices of the k best entries per row (descending score, ties by lower id).

    ``exclude`` (bool, same shape) ranks those entries after every other one.
    """
    score = np.asarray(score, dtype=np.float64)
    neg = -score
    neg = np.where(np.isnan(neg), np.inf, neg)  # NaN ranks last
    if exclude is None:
        order = np.argsort(neg, axis=-1, kind="stable")
    else:
        order = np.lexsort((neg, exclude.astype(np.int8)), axis=-1)
    return order[..., :k]


def _check(z, resident_mask, k, p):
    z = np.asarray(z)
    if z.ndim not in (1, 2):
        raise ValueError(f"router logits must be (n_experts,) or (batch, n_experts), got shape {z.shape}")
    n_experts = z.shape[-1]
    if not 1 <= int(k) <= n_experts:
        raise ValueError(f"k must be in 1..{n_experts} (the number of experts), got {k}")
    if int(p) < 0:
        raise ValueError(f"protected width p must be >= 0, got {p}")
    if resident_mask is not None:
        r = np.asarray(resident_mask, dtype=bool)
        if r.shape[-1] != n_experts:
            raise ValueError(f"resident mask has {r.shape[-1]} experts but the logits have {n_experts}")
        return z, r
    return z, np.zeros(n_experts, dtype=bool)


def topk(z, k) -> np.ndarray:
    """Plain router top-k: ids by descending logit, ties toward the lower id; (k,) or (batch, k)."""
    z, _ = _check(z, None, k, 0)
    return _rank_rows(z, int(k))


def cache_aware_select(z, resident_mask, k, p=3, b=0.85, r1=0.0) -> np.ndarray:
    """Cache-aware routing: ids in pick order, shape (k,) for one token or (batch, k).

    ``z``: router logits (n_experts,) or (batch, n_experts); ``resident_mask``: bool, True
    for published resident experts, (n_experts,) or one row per token. First ``p`` picks:
    argmax of ``z + r1*R``; later picks: argmax of ``z + b*R``; b <= 0 is plain top-k.
    """
    z, R = _check(z, resident_mask, k, p)
    k, p = int(k), int(p)
    if b <= 0 or not R.any():
        return _rank_rows(z, k)
    z = z.astype(np.float64)
    R = np.broadcast_to(R, z.shape).astype(np.float64)
    p = min(p, k)
    first = _rank_rows(z + float(r1) * R if r1 else z, p)  # (.., p)
    if p == k:
        return first
    taken = np.zeros(z.shape, dtype=bool)
    np.put_along_axis(taken, first, True, axis=-1)
    rest = _rank_rows(z + float(b) * R, k - p, exclude=taken)
    return np.concatenate([first, rest], axis=-1)


def cache_aware_weights(probs, ids, normalize=True) -> np.ndarray:
    """Gate weights of a chosen set from the UNBOOSTED router probabilities.

    ``probs``: the family's normal routing probabilities (softmax or sigmoid of the plain
    logits, never of the boosted scores); ``ids``: the chosen experts. Returns
    ``probs[ids]``, renormalized to sum 1 when ``normalize`` (as top-k softmax families do).
    The engine's family adapter applies its own scaling; this helper documents the rule.
    """
    probs = np.asarray(probs, dtype=np.float64)
    w = np.take_along_axis(probs, np.asarray(ids), axis=-1)
    if normalize:
        w = w / np.sum(w, axis=-1, keepdims=True)
    return w


def ahead_candidates(pred_logits, mapped_mask, k, mode="raw", p=3, b=0.85, r1=0.0, resident_mask=None) -> np.ndarray:
    """Ordered expert ids to read ahead for one target layer.

    ``pred_logits``: predicted router logits, (n_experts,) or (batch, n_experts) for the
    tokens of a batch; ``mapped_mask``: bool (n_experts,), experts of the target layer that
    are already mapped (resident or in flight) and so are skipped; ``resident_mask``: the
    published residents that earn the bonus in ``resident_bonus``/``cache_aware`` (default: mapped_mask).
    Each row is ranked to ``k`` picks by ``mode``; the batch is merged by best rank, ties by
    expert id; mapped experts are dropped. Returns int64 ids, best first.
    """
    mode = ahead_mode(mode)
    z = np.asarray(pred_logits)
    if z.ndim == 1:
        z = z[None, :]
    mapped = np.asarray(mapped_mask, dtype=bool)
    if mapped.shape != (z.shape[-1],):
        raise ValueError(f"mapped mask must have shape ({z.shape[-1]},) to match the logits, got {mapped.shape}")
    R = mapped if resident_mask is None else np.asarray(resident_mask, dtype=bool)
    if mode == "raw" or b <= 0:
        picks = topk(z, k)
    elif mode == "resident_bonus":
        picks = cache_aware_select(z, R, k, p=3, b=b, r1=0.0)
    else:
        picks = cache_aware_select(z, R, k, p=p, b=b, r1=r1)
    if len(picks) == 1:  # one token: its picks are distinct, best first
        row = picks[0]
        return row[~mapped[row]].astype(np.int64)
    n_experts = z.shape[-1]
    best = np.full(n_experts, np.iinfo(np.int64).max, dtype=np.int64)
    ranks = np.broadcast_to(np.arange(picks.shape[-1]), picks.shape)
    np.minimum.at(best, picks.ravel(), ranks.ravel())
    chosen = np.flatnonzero((best < np.iinfo(np.int64).max) & ~mapped)
    return chosen[np.lexsort((chosen, best[chosen]))].astype(np.int64)
