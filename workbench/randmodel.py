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


def _moving_embeddings(config, rng):
    """Embeddings scaled so each token survives the residual, and an output head that is a noisy
    successor map over a permutation of the vocabulary: (embeddings, head), float32."""
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    emb = rng.normal(0, 1.0, (vocab, hidden)).astype(np.float32)
    head = emb[rng.permutation(vocab)] + rng.normal(0, 0.5, (vocab, hidden)).astype(np.float32)
    return emb, head / np.sqrt(hidden)


def _keep_tokens_moving(model, config, rng):
    """Scale embeddings, strengthen experts, and make the head a noisy successor map."""
    emb, head = _moving_embeddings(config, rng)
    updates = []
    for name, a in tree_flatten(model.parameters()):
        if name.endswith("embed_tokens.weight"):
            updates.append((name, mx.array(emb)))
        elif name.endswith("lm_head.weight"):
            updates.append((name, mx.array(head)))
        elif ("switch_mlp" in name or "experts" in name) and a.ndim == 3:
            updates.append((name, a * 4))
    from mlx.utils import tree_unflatten

    model.update(tree_unflatten(updates))


def make_wide_model(out_dir, layers=16, experts=128, top_k=8, hidden=2048, expert_width=768, vocab=4096,
                    bits=4, group_size=64, hot=16, skew=0.15, seed=0):
    """A random 4-bit qwen3_moe at a real model's expert shape (Qwen3-30B-A3B's by default: experts
    of 2.6 MB), written in seconds: the experts as random quantized codes (never built in float), one
    safetensors file per layer, the rest float16. Routers are skewed: the hidden states share one
    direction, which the router rows of ``hot`` experts per layer follow (graded up to ``skew``), so
    those experts take most lookups, as in trained models. Tokens keep moving (``_moving_embeddings``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = family_config("qwen3_moe", layers=layers, experts=experts, top_k=top_k, hidden=hidden,
                           expert_width=expert_width, vocab=vocab)
    config["quantization"] = {"group_size": group_size, "bits": bits}
    rng = np.random.default_rng(seed)
    u = rng.normal(size=hidden).astype(np.float32)
    u /= np.linalg.norm(u)
    emb, head = _moving_embeddings(config, rng)
    emb += np.sqrt(hidden) * u  # the shared direction
    dense = {"model.embed_tokens.weight": emb, "lm_head.weight": head, "model.norm.weight": np.ones(hidden)}
    mx.random.seed(seed)
    for name, a in tree_flatten(build_model(config).parameters()):  # lazy: the experts are never built
        if ".layers." in name and "switch_mlp" not in name and name not in dense:
            dense[name] = np.ones(a.shape) if a.ndim == 1 else np.array(mx.random.normal(a.shape) * 0.02)
    for layer in range(layers):
        pre = f"model.layers.{layer}.mlp"
        gate = rng.normal(0, 0.02, (experts, hidden)).astype(np.float32)
        favoured = rng.permutation(experts)[:hot]
        gate[favoured] += np.linspace(skew, skew / 2, hot)[:, None] * u
        dense[f"{pre}.gate.weight"] = gate
        tensors = {k: mx.array(v.astype(np.float16)) for k, v in dense.items() if f".layers.{layer}." in k}
        for proj, (rows, cols) in (("gate_proj", (expert_width, hidden)), ("up_proj", (expert_width, hidden)),
                                   ("down_proj", (hidden, expert_width))):
            scale = np.full((experts, rows, cols // group_size), 0.02 / 4.6, np.float16)  # codes 0..15: std 4.6
            tensors[f"{pre}.switch_mlp.{proj}.weight"] = mx.array(
                rng.integers(0, 2**32, (experts, rows, cols * bits // 32), dtype=np.uint32))
            tensors[f"{pre}.switch_mlp.{proj}.scales"] = mx.array(scale)
            tensors[f"{pre}.switch_mlp.{proj}.biases"] = mx.array(-7.5 * scale)
        mx.save_safetensors(str(out / f"model-{layer:05d}.safetensors"), tensors)
    rest = {k: mx.array(v.astype(np.float16)) for k, v in dense.items() if ".layers." not in k}
    mx.save_safetensors(str(out / "model-extra.safetensors"), rest)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
