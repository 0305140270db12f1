"""A frozen arena's fast path. Once every routed expert is published nothing is ever evicted, so
residency is frozen: optimistic tokens compute each layer's experts on views of its slots with the
router's own ids (no table lookup, no miss to verify), and, while nothing listens, run mlx-lm's
own model with those views as its experts (no probe, no hook point)."""

from __future__ import annotations

import copy

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..model import build_model, expert_modules
from .streamed import set_path


def frozen_views(engine) -> dict:
    """Once every routed expert is published nothing is ever evicted, so residency is frozen.
    Each layer's experts then sit in consecutive slots in id order (``Arena.preload``): layer ->
    a copy of its expert module computing on views of those slots with the router's own ids,
    for optimistic decode (no table lookup, no miss to verify). {} otherwise."""
    if not engine.arena.map.frozen:
        return {}
    views = {}
    for layer, inner in engine.inners.items():
        row = engine.arena.lut[layer]
        first = int(row[0])
        if not np.array_equal(row, first + np.arange(engine.m.n_experts)):
            return {}
        shared = {id(a): a for _, a in tree_flatten(inner.parameters())}  # the copy shares every array...
        view = copy.deepcopy(inner, shared)
        view.update(tree_unflatten([(t.name, engine.arena.tensors[t.name][first:first + engine.m.n_experts])
                                    for t in engine.m.tensors]))  # ...but computes on its layer's slots
        views[layer] = view
    mx.eval([a for v in views.values() for _, a in tree_flatten(v.parameters())])
    return views


def fast_model(engine):
    """mlx-lm's own model, sharing every array, with the frozen views as its experts: a frozen
    arena decodes with it while nothing listens (no probe, no hook point, no table)."""
    model = build_model(engine.config, engine.m.data.get("quantized") or None)
    for layer, (path, _) in expert_modules(model).items():
        set_path(model, path, engine.views[layer])
    model.load_weights(engine.resident, strict=False)
    return model
