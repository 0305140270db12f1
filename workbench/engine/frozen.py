"""Expert modules computing on other arrays than the arena's slot tensors.

A frozen arena's fast path: once every routed expert is published nothing is ever evicted, so
residency is frozen: optimistic tokens compute each layer's experts on views of its slots with the
router's own ids (no table lookup, no miss to verify), and, while nothing listens, run mlx-lm's
own model with those views as its experts (no probe, no hook point).

A long batch on slots the device reads over the bus (``mapped``): its layer claimed whole computes
on one device copy of the layer's slots (``DeviceCopies``), not on the host's memory once per use."""

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
        views[layer] = computing_on(inner, {name: a[first:first + engine.m.n_experts]
                                            for name, a in engine.arena.tensors.items()})
    mx.eval([a for v in views.values() for _, a in tree_flatten(v.parameters())])
    return views


def computing_on(inner, tensors: dict):
    """A copy of expert module ``inner`` sharing every array, but computing on ``tensors`` (name ->
    [experts, ...]) as its expert weights."""
    shared = {id(a): a for _, a in tree_flatten(inner.parameters())}
    view = copy.deepcopy(inner, shared)
    view.update(tree_unflatten(list(tensors.items())))
    return view


class DeviceCopies:
    """Each layer's expert module computing on a device copy of slots ``ids`` (one per expert, in
    id order): for a long batch on slot memory the device reads over the bus, where a batch's
    matmuls would read each expert from the host many times. One copy of the layer (its experts'
    bytes, once) instead; ``after`` lets the copy go once the layer's compute is built. The modules
    are made with the engine where its slots are off the device (not in a first prompt's time)."""

    def __init__(self, engine):
        self.engine, self.views = engine, {}
        if not engine.arena.slots.on_device:
            for layer in engine.inners:
                self.view(layer)

    def view(self, layer):
        """The layer's module (made once)."""
        if layer not in self.views:
            self.views[layer] = computing_on(self.engine.inners[layer], self.engine.arena.tensors)
        return self.views[layer]

    def __call__(self, layer, ids: mx.array):
        view = self.view(layer)
        view.update(tree_unflatten([(name, mx.take(a, ids, axis=0)) for name, a in self.engine.arena.tensors.items()]))
        return view

    def after(self, layer) -> None:
        """The layer's compute is built: the view gives its copy back (the graph holds it until computed)."""
        self.views[layer].update(tree_unflatten(list(self.engine.arena.tensors.items())))


def fast_model(engine):
    """mlx-lm's own model, sharing every array, with the frozen views as its experts: a frozen
    arena decodes with it while nothing listens (no probe, no hook point, no table)."""
    model = build_model(engine.config, engine.m.data.get("quantized") or None)
    for layer, (path, _) in expert_modules(model).items():
        set_path(model, path, engine.views[layer])
    model.load_weights(engine.resident, strict=False)
    return model
