"""Per-family routing facts: where the router lives and how gate weights are formed.

The family's own mlx-lm module still does all the math on the exact path; these rules
are used to record gate weights in traces, to compute predictor logits, and to rebuild
weights from unboosted probabilities under cache-aware routing. A family that is not
listed still streams exactly (any SwitchGLU/SwitchMLP model); it just records no gate
weights and cannot use cache-aware routing.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np


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
