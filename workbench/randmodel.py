"""Seeded random models of real mlx-lm MoE architectures, written as mlx-lm model directories.

Used by the tests (tiny models built from each family's ``ModelArgs``, nothing downloaded),
by benchmarks (bigger experts) and by ``workbench demo`` when no trained model is present.
``moving=True`` keeps greedy tokens moving (a random model otherwise loops on one or two tokens and every cache looks perfect): embeddings
scaled so each token survives the residual, stronger experts, and an output head that is a
noisy successor map over a permutation of the vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map

from .model import build_model


def family_config(family: str, layers=2, experts=8, top_k=2, hidden=64, expert_width=32, vocab=128) -> dict:
    """A small but complete config for ``family`` (any size)."""
    heads = max(2, hidden // 32)
    common = dict(model_type=family, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=heads, rms_norm_eps=1e-5, vocab_size=vocab, rope_theta=10000.0,
                  num_experts_per_tok=top_k, tie_word_embeddings=False, max_position_embeddings=4096)
    if family == "qwen3_moe":
        return {**common, "intermediate_size": 2 * expert_width, "num_experts": experts, "decoder_sparse_step": 1,
                "mlp_only_layers": [], "moe_intermediate_size": expert_width, "head_dim": hidden // heads,
                "norm_topk_prob": True}
    if family == "qwen2_moe":
        return {**common, "intermediate_size": 2 * expert_width, "num_experts": experts,
                "moe_intermediate_size": expert_width, "shared_expert_intermediate_size": 2 * expert_width}
    if family == "olmoe":
        return {**common, "intermediate_size": expert_width, "num_experts": experts, "head_dim": hidden // heads}
    if family == "mixtral":
        return {**common, "intermediate_size": expert_width, "num_local_experts": experts}
    if family == "gpt_oss":
        return {**common, "intermediate_size": expert_width, "num_local_experts": experts, "head_dim": hidden // heads,
                "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"] * (layers // 2) + ["full_attention"] * (layers % 2)}
    if family in ("deepseek_v3", "glm4_moe"):
        cfg = {**common, "intermediate_size": 2 * expert_width, "moe_intermediate_size": expert_width,
               "n_routed_experts": experts, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
               "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "norm_topk_prob": True,
               "num_hidden_layers": layers + 1}
        if family == "deepseek_v3":
            return {**cfg, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "v_head_dim": 16,
                    "qk_nope_head_dim": 16, "moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid"}
        return {**cfg, "head_dim": hidden // heads, "rope_scaling": None, "use_qk_norm": True,
                "attention_bias": False, "partial_rotary_factor": 0.5}
    raise ValueError(f"no random-model recipe for family {family!r}")


FAMILIES = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "gpt_oss", "deepseek_v3", "glm4_moe")


def make_random_model(out_dir, family="qwen3_moe", seed=0, quantize_bits=None, group_size=32, moving=False, **shape):
    """Write a seeded random mlx-lm model directory; returns its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = family_config(family, **shape)
    mx.random.seed(seed)
    model = build_model(config)
    rng = np.random.default_rng(seed)
    params = tree_map(lambda a: mx.array(rng.normal(0, 0.02 if a.ndim > 1 else 0.1, a.shape).astype(np.float32))
                      if a.ndim else a, model.parameters())
    model.update(params)
    for name, a in tree_flatten(model.parameters()):  # keep norms near 1 and biases small
        if "norm" in name and a.ndim == 1:
            model.update(_set(name, mx.ones(a.shape)))
    if moving:
        _keep_tokens_moving(model, config, rng)
    if quantize_bits:
        from mlx_lm.utils import quantize_model

        model, config = quantize_model(model, config, group_size=group_size, bits=quantize_bits)
    mx.eval(model.parameters())
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def _set(name, value):
    from mlx.utils import tree_unflatten

    return tree_unflatten([(name, value)])


def _keep_tokens_moving(model, config, rng):
    """Scale embeddings, strengthen experts, and make the head a noisy successor map."""
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    emb = rng.normal(0, 1.0, (vocab, hidden)).astype(np.float32)
    perm = rng.permutation(vocab)
    head = emb[perm] + rng.normal(0, 0.5, (vocab, hidden)).astype(np.float32)
    updates = []
    for name, a in tree_flatten(model.parameters()):
        if name.endswith("embed_tokens.weight"):
            updates.append((name, mx.array(emb)))
        elif name.endswith("lm_head.weight"):
            updates.append((name, mx.array(head / np.sqrt(hidden))))
        elif ("switch_mlp" in name or "experts" in name) and a.ndim == 3:
            updates.append((name, a * 4))
    from mlx.utils import tree_unflatten

    model.update(tree_unflatten(updates))
