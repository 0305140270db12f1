"""What differs between model families, in one place: config key spellings, where a MoE block
keeps its router, experts and shared experts, and how gate weights are formed.

The family's own mlx-lm module still does all the math on the exact path; these rules
are used to record gate weights in traces, to compute predictor logits, and to rebuild
weights from unboosted probabilities under cache-aware routing. A family that is not
listed still streams exactly (any SwitchGLU/SwitchMLP model); it just records no gate
weights and cannot use cache-aware routing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np


# config keys: the experts per token, and the number of routed experts, as the families spell them
TOPK_KEYS = ("num_experts_per_tok", "moe_top_k", "top_k", "num_activated_experts", "n_activated_experts")
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


@dataclass(frozen=True)
class Family:
    gate: str  # attribute of the MoE block holding the router
    rule: str  # softmax_topk | topk_softmax | sigmoid_group


SOFTMAX_TOPK = Family("gate", "softmax_topk")  # softmax over all experts, then top-k (optional renorm)
TOPK_SOFTMAX = Family("gate", "topk_softmax")  # top-k of logits, softmax over the chosen
SIGMOID_GROUP = Family("gate", "sigmoid_group")  # deepseek-v3 style: sigmoid + bias + groups

FAMILIES = {
    "qwen3_moe": SOFTMAX_TOPK, "qwen2_moe": SOFTMAX_TOPK, "olmoe": SOFTMAX_TOPK, "qwen3_next": SOFTMAX_TOPK,
    "mixtral": TOPK_SOFTMAX, "phimoe": TOPK_SOFTMAX, "gpt_oss": Family("router", "topk_softmax"),
    "deepseek_v3": SIGMOID_GROUP, "glm4_moe": SIGMOID_GROUP, "kimi_k2": SIGMOID_GROUP, "dots1": SIGMOID_GROUP,
}


def family_of(model_type: str) -> Family | None:
    return FAMILIES.get(model_type)


# --------------------------------------------------------------------------- modules of a model
def model_layers(model) -> list:
    """The decoder layers of an mlx-lm model."""
    for path in ("layers", "model.layers", "language_model.model.layers", "model.model.layers"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return list(obj)
        except AttributeError:
            continue
    raise ValueError(f"cannot find decoder layers on {type(model).__name__}; expected model.layers")


EXPERT_ATTRS = ("switch_mlp", "experts")  # the routed-experts module of a MoE block (experts: gpt-oss)


def experts_of(block) -> Any | None:
    """The module a MoE block keeps its routed experts in (as loaded, or as the engine swapped it)."""
    return next((block[name] for name in EXPERT_ATTRS if name in block), None)


def expert_module(block) -> Any | None:
    """The stacked-experts module of a MoE block as loaded (SwitchGLU / SwitchMLP), or None."""
    m = experts_of(block)
    return m if m is not None and (hasattr(m, "down_proj") or hasattr(m, "fc2")) else None


def router_module(block) -> Any:
    """The router of a MoE block (``gate``, or ``router`` for gpt-oss)."""
    for name in ("gate", "router"):
        m = getattr(block, name, None)
        if m is not None:
            return m
    raise ValueError(f"MoE block {type(block).__name__} has no gate/router module")


def find_moe_block(layer) -> Any | None:
    """The routed-expert block of a decoder layer, or None for dense layers."""
    for name in ("mlp", "block_sparse_moe", "feed_forward", "moe"):
        blk = getattr(layer, name, None)
        if blk is not None and expert_module(blk) is not None:
            return blk
    return None


def moe_blocks(model) -> dict[int, Any]:
    """{model layer index: MoE block} for every layer with routed experts."""
    out = {i: find_moe_block(l) for i, l in enumerate(model_layers(model))}
    out = {i: b for i, b in out.items() if b is not None}
    if not out:
        raise ValueError(f"{type(model).__name__} has no layer with routed experts (switch_mlp); not an mlx-lm MoE model")
    return out


def shared_output(block, x):
    """Shared (always-on) experts of qwen2_moe / deepseek-style blocks, or None."""
    if "shared_expert" in block:
        out = block.shared_expert(x)
        if "shared_expert_gate" in block:
            out = mx.sigmoid(block.shared_expert_gate(x)) * out
        return out
    if "shared_experts" in block:
        return block.shared_experts(x)
    return None


# --------------------------------------------------------------------------- routing rules


def router_logits(fam: Family, gate, x: mx.array) -> mx.array:
    """Raw router logits for input ``x`` (works for the live gate and for predictors)."""
    if fam.rule == "sigmoid_group":
        return x @ gate.weight.T
    return gate(x)


def selection_scores(fam: Family, gate, logits: np.ndarray) -> np.ndarray:
    """The scores the family ranks experts by (what cache-aware routing boosts)."""
    if fam.rule != "sigmoid_group":
        return logits
    s = 1 / (1 + np.exp(-logits)) + np.asarray(gate.e_score_correction_bias, dtype=np.float32)
    n_group, keep = getattr(gate, "n_group", 1), getattr(gate, "topk_group", 1)
    if n_group > 1:  # group-limited: zero the groups whose best-two sum is lowest, as mlx-lm does
        g = s.reshape(*s.shape[:-1], n_group, -1)
        group_scores = np.sort(g, axis=-1)[..., -2:].sum(-1)
        drop = np.argsort(group_scores, axis=-1, kind="stable")[..., : n_group - keep]
        np.put_along_axis(g, drop[..., None], 0.0, axis=-2)
        s = g.reshape(s.shape)
    return s


def gate_weights(fam: Family, block, logits: np.ndarray, inds: np.ndarray) -> np.ndarray:
    """Weights the family applies to experts ``inds`` (rows of ``logits``), from unboosted scores."""
    logits = logits.astype(np.float32)
    chosen = np.take_along_axis(logits, inds, axis=-1)
    if fam.rule == "softmax_topk":
        p = _softmax(logits)
        w = np.take_along_axis(p, inds, axis=-1)
        if getattr(block, "norm_topk_prob", False):
            w = w / w.sum(-1, keepdims=True)
        return w
    if fam.rule == "topk_softmax":
        return _softmax(chosen)
    gate = block[fam.gate]
    w = 1 / (1 + np.exp(-chosen))
    if inds.shape[-1] > 1 and gate.norm_topk_prob:
        w = w / w.sum(-1, keepdims=True)
    return w * gate.routed_scaling_factor


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)
