"""Modules the engine swaps into an mlx-lm model. The family's own code keeps doing the math.

They read their wrapped module as ``self["inner"]``: an MLX module keeps its children as dict items,
and ``self.inner`` finds one only after a failed instance lookup (an AttributeError, about 1 us a call
on every layer of every token)."""

from __future__ import annotations

import mlx.nn as nn


class StreamedExperts(nn.Module):
    """Stands in for a SwitchGLU/SwitchMLP: same module, weights are the arena's slots.

    ``inner`` is the original module whose weight arrays were replaced by the arena
    tensors ([n_slots, ...]); the engine maps expert ids to slot ids before calling it.
    """

    def __init__(self, engine, layer: int, inner: nn.Module):
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_layer", layer)

    def __call__(self, x, indices):
        return self._engine.run_experts(self._layer, self["inner"], x, indices)


class MoEProbe(nn.Module):
    """Wraps a MoE block: exposes its input (hook ``layer.{i}.moe.input``), and lets the engine
    take over routing when cache-aware routing is on (approximate, opt-in)."""

    def __init__(self, engine, layer: int, block: nn.Module):
        super().__init__()
        self.block = block
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_layer", layer)

    def __call__(self, x, *args, **kwargs):
        return self._engine.run_block(self._layer, self["block"], x, *args, **kwargs)


class _Delegating(nn.Module):
    """A wrapper that answers attribute reads the model's code makes on the module it wraps."""

    def __init__(self, engine, index: int, inner: nn.Module):
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_index", index)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if "inner" not in self:
                raise
            return getattr(self["inner"], name)


class GateProbe(_Delegating):
    """Wraps a router: records its logits (hook ``layer.{i}.router.logits``, may replace them);
    families read gate attributes (e.g. weight, bias) through it."""

    def __call__(self, x):
        return self._engine.run_gate(self._index, self["inner"], x)


class LayerProbe(_Delegating):
    """Wraps a decoder layer: lets verified optimistic decode and the handshake skip layers whose
    output they already have (a recompute starts at the layer that missed or was given up) and
    record what they computed; models read layer attributes (e.g. is_linear, layer_type) through it."""

    def __call__(self, x, *args, **kwargs):
        p = self._engine.current  # the running pass (passes.py): it may keep its layers' outputs
        if p is None or p.saved is None:
            return self["inner"](x, *args, **kwargs)
        if self._index < p.first:
            return p.saved[self._index]
        out = p.saved[self._index] = self["inner"](x, *args, **kwargs)
        return out


def get_path(root, path: str):
    node = root
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else getattr(node, part)
    return node


def set_path(root, path: str, value) -> None:
    parent, _, name = path.rpartition(".")
    node = get_path(root, parent) if parent else root
    if isinstance(node, list):
        node[int(name)] = value
    else:
        setattr(node, name, value)
