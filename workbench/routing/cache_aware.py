"""Cache-aware routing ("moce"), opt-in and APPROXIMATE: it changes which experts run.

The first p picks are the router's own; later picks prefer published residents by a bonus b
(optional r1 from rank 1 up to p). Gate weights come from the *unboosted* scores of the
chosen set, with the family's own rule. b <= 0 is the plain router (the engine then keeps
the exact path and never installs this).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..arrays import to_numpy
from ..families import FAMILIES, experts_of, gate_weights, selection_scores, shared_output
from .rank import cache_aware_select


class CacheAwareRouter:
    def __init__(self, engine, p=3, b=0.85, r1=0.0):
        k = engine.top_k
        if engine.family is None:
            raise ValueError(f"cache-aware routing needs the routing rule of family {engine.m.data['model_type']!r}; "
                             f"supported: {', '.join(FAMILIES)}")
        if not 0 <= p <= k:
            raise ValueError(f"--moce-protect p={p} must be between 0 and top-k={k}")
        if b <= 0:
            raise ValueError(f"cache-aware routing with bonus b={b} <= 0 is the plain router; give --moce-bonus > 0 "
                             "or use --mode raw")
        self.p, self.b, self.r1 = p, b, r1

    def forward(self, engine, layer, block, x):
        fam, gate = engine.family, engine.gates[layer]
        logits = engine.routed_logits(layer, x)
        E, k = logits.shape[-1], engine.top_k
        z = to_numpy(logits).reshape(-1, E)
        scores = selection_scores(fam, gate, z)
        inds = cache_aware_select(scores, engine.arena.map.resident_mask(layer), k, self.p, self.b, self.r1)
        w = gate_weights(fam, block, z, inds)
        shape = x.shape[:-1] + (k,)
        y = experts_of(block)(x, mx.array(inds.astype(np.int32)).reshape(shape))
        y = (y * mx.array(w.astype(np.float32)).reshape(shape)[..., None].astype(y.dtype)).sum(axis=-2).astype(y.dtype)
        shared = shared_output(block, x)
        return y if shared is None else y + shared

