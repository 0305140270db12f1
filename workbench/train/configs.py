"""Model shapes of the reference models and the Hugging Face <-> mlx-lm config mapping.

Pure Python (no torch, no mlx): imported on the GPU machine and here.

transformers 5 writes a qwen3_moe config with ``num_local_experts`` and ``rope_parameters``;
mlx-lm 0.32 reads ``num_experts`` and ``rope_theta``. :func:`mlx_config` writes the keys
mlx-lm reads (and keeps the transformers spellings beside them), :func:`normalize_config`
accepts either spelling from a user's checkpoint.
"""

from __future__ import annotations

import copy
from typing import Any

EOS_TOKEN = "<|endoftext|>"

# The reference MoE: ~41M parameters, 12 layers x 64 routed experts, top-8.
MOE_SHAPE: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "vocab_size": 4096,
    "hidden_size": 256,
    "num_hidden_layers": 12,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,  # dense MLP width (unused: every layer is MoE)
    "moe_intermediate_size": 64,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "router_aux_loss_coef": 0.01,
    "initializer_range": 0.02,
}

# The dense draft (qwen3 family, same tokenizer), for speculative-decoding measurements.
DRAFT_SHAPE: dict[str, Any] = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 4096,
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 768,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "initializer_range": 0.02,
}


def hf_kwargs(shape: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for transformers 5 ``Qwen3MoeConfig`` / ``Qwen3Config``."""
    kw = {k: v for k, v in shape.items() if k not in ("model_type", "architectures", "rope_theta")}
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": float(shape["rope_theta"])}
    return kw


def normalize_config(config: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of a qwen3 / qwen3_moe config with the keys mlx-lm 0.32 reads.

    Accepts transformers 5 spellings (``num_local_experts``, ``rope_parameters``) as well as
    the classic ones (``num_experts``, ``rope_theta``).
    """
    cfg = copy.deepcopy(config)
    if "model_type" not in cfg:
        raise ValueError("config has no 'model_type': write e.g. \"model_type\": \"qwen3_moe\"")
    if cfg["model_type"] == "qwen3_moe":
        if "num_experts" not in cfg:
            if "num_local_experts" not in cfg:
                raise ValueError(
                    "qwen3_moe config names neither 'num_experts' nor 'num_local_experts': "
                    "add the number of routed experts per layer"
                )
            cfg["num_experts"] = cfg["num_local_experts"]
        cfg.setdefault("decoder_sparse_step", 1)
        if cfg.get("mlp_only_layers") is None:
            cfg["mlp_only_layers"] = []
        cfg.setdefault("norm_topk_prob", False)
    rp = cfg.get("rope_parameters") or {}
    if "rope_theta" not in cfg or cfg["rope_theta"] is None:
        if "rope_theta" not in rp:
            raise ValueError("config has neither 'rope_theta' nor 'rope_parameters.rope_theta'")
        cfg["rope_theta"] = rp["rope_theta"]
    if rp.get("rope_type", "default") not in ("default", None) and not cfg.get("rope_scaling"):
        cfg["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
    cfg.setdefault(
        "head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]
    )
    cfg.setdefault("tie_word_embeddings", False)
    return cfg


def mlx_config(shape: dict[str, Any], eos_token_id: int) -> dict[str, Any]:
    """The config.json we ship: mlx-lm keys plus the transformers 5 spellings beside them."""
    cfg = normalize_config(shape)
    cfg["eos_token_id"] = eos_token_id
    cfg["bos_token_id"] = None
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": float(cfg["rope_theta"])}
    if cfg["model_type"] == "qwen3_moe":
        cfg["num_local_experts"] = cfg["num_experts"]
    cfg["torch_dtype"] = "bfloat16"
    return cfg


def count_params(shape: dict[str, Any]) -> dict[str, int]:
    """Parameter counts by group (embedding counted once when tied)."""
    h, v, L = shape["hidden_size"], shape["vocab_size"], shape["num_hidden_layers"]
    hd, nh, nkv = shape["head_dim"], shape["num_attention_heads"], shape["num_key_value_heads"]
    attn = h * nh * hd * 2 + h * nkv * hd * 2 + 2 * hd
    norms = 2 * h
    out = {"embedding": v * h * (1 if shape["tie_word_embeddings"] else 2), "attention": attn * L}
    if shape["model_type"] == "qwen3_moe":
        e, mi = shape["num_experts"], shape["moe_intermediate_size"]
        out["router"] = e * h * L
        out["experts"] = 3 * e * mi * h * L
        out["active_experts"] = 3 * shape["num_experts_per_tok"] * mi * h * L
    else:
        out["mlp"] = 3 * h * shape["intermediate_size"] * L
    out["norms"] = norms * L + h
    out["total"] = sum(v for k, v in out.items() if k != "active_experts")
    return out
