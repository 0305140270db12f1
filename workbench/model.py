"""Model plumbing shared by pack and the engine: config spellings, mlx-lm classes, expert modules."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import mlx.nn as nn
from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
TOPK_KEYS = ("num_experts_per_tok", "moe_top_k", "top_k", "num_activated_experts", "n_activated_experts")


class ModelError(ValueError):
    """The model directory or family cannot be used."""


def normalize_config(config: dict) -> dict:
    """Accept both spellings users' checkpoints come with (transformers 5 vs mlx-lm).

    transformers 5 writes ``num_local_experts`` and ``rope_parameters``; mlx-lm 0.32's
    qwen3_moe reads ``num_experts`` and ``rope_theta`` (mixtral the other way round).
    """
    cfg = dict(config)
    if "num_experts" in cfg and "num_local_experts" not in cfg:
        cfg["num_local_experts"] = cfg["num_experts"]
    if "num_local_experts" in cfg and "num_experts" not in cfg:
        cfg["num_experts"] = cfg["num_local_experts"]
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict):
        if "rope_theta" not in cfg and "rope_theta" in rope:
            cfg["rope_theta"] = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default" and "rope_scaling" not in cfg:
            cfg["rope_scaling"] = rope
    return cfg


def config_hash(config: dict) -> str:
    keep = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_config(path: Path) -> dict:
    f = Path(path) / "config.json"
    if not f.exists():
        raise ModelError(f"{path} has no config.json; point at an mlx-lm model directory or a workbench store")
    return normalize_config(json.loads(f.read_text()))


def model_classes(config: dict):
    from mlx_lm.utils import _get_classes

    try:
        return _get_classes(config)
    except (ValueError, KeyError) as e:
        raise ModelError(
            f"model family {config.get('model_type')!r} is not supported by mlx-lm {_mlx_lm_version()} ({e}); "
            "use a model whose mlx-lm module exists in mlx_lm/models"
        ) from None


def build_model(config: dict, quantized: dict | None = None):
    """Instantiate the mlx-lm model (lazy weights); quantize the modules named in ``quantized``."""
    model_class, args_class = model_classes(config)
    model = model_class(args_class.from_dict(config))
    if quantized:
        nn.quantize(model, class_predicate=lambda p, m: quantized.get(p, False))
    return model


def expert_modules(model) -> dict[int, tuple[str, nn.Module]]:
    """{layer: (path, SwitchGLU/SwitchMLP module)} for every layer with routed experts."""
    found = {}
    for path, module in model.named_modules():
        if isinstance(module, (SwitchGLU, SwitchMLP)):
            m = _LAYER_RE.search(path)
            if m is None:
                raise ModelError(f"cannot tell the layer of expert module {path}")
            layer = int(m.group(1))
            if layer in found:
                raise ModelError(f"layer {layer} has two expert modules ({found[layer][0]}, {path})")
            found[layer] = (path, module)
    if not found:
        raise ModelError(
            f"{type(model).__module__} has no routed experts (no SwitchGLU/SwitchMLP); "
            "the workbench streams mixture-of-experts models only"
        )
    return dict(sorted(found.items()))


def quantized_modules(model) -> dict[str, dict]:
    out = {}
    for path, m in model.named_modules():
        if hasattr(m, "group_size") and hasattr(m, "bits") and hasattr(m, "scales"):
            out[path] = {"group_size": m.group_size, "bits": m.bits, "mode": getattr(m, "mode", "affine")}
    return out


def top_k_of(config: dict) -> int:
    for key in TOPK_KEYS:
        if isinstance(config.get(key), int):
            return config[key]
    raise ModelError(f"cannot find the number of routed experts per token in config ({'/'.join(TOPK_KEYS)})")


def _mlx_lm_version() -> str:
    import mlx_lm

    return getattr(mlx_lm, "__version__", "?")
