"""Model plumbing shared by pack and the engine: config spellings, mlx-lm classes, expert modules."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import mlx.nn as nn
from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP

from .checks import is_whole, json_kind, read_json
from .families import EXPERT_COUNT_KEYS, TOPK_KEYS

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


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
    try:
        raw = read_json(f"{path}:", f, fix="restore the model's config.json")  # a FIFO or /dev/zero is refused
    except ValueError as e:
        raise ModelError(str(e)) from None
    return validate_config(raw, f)


def weight_files(model_dir) -> list[Path]:
    """The ``model*.safetensors`` files of an mlx-lm model directory, sorted by name."""
    return sorted(Path(model_dir).glob("model*.safetensors"))


# field -> (smallest, largest) accepted. Bounds are far above any released model and stop a
# damaged config before it sizes an allocation (sizes multiply: keep each factor sane).
CONFIG_BOUNDS = {
    "vocab_size": (1, 1 << 24),
    "hidden_size": (1, 1 << 17),
    "num_hidden_layers": (1, 1024),
    "num_attention_heads": (1, 4096),
    "num_key_value_heads": (1, 4096),
    "head_dim": (1, 1 << 14),
    "max_position_embeddings": (1, 1 << 31),
    "num_experts": (1, 1 << 15),
    "num_local_experts": (1, 1 << 15),
    "n_routed_experts": (1, 1 << 15),
    "n_shared_experts": (0, 1 << 10),
}
REQUIRED_CONFIG = ("model_type",)  # the family's ModelArgs names what else it needs
CORE_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers")  # never null when present


def validate_config(config, where) -> dict:
    """Check the fields that size the model (types and ranges) and return the normalized config.
    Every problem raises ModelError: one line naming ``where``, the field and the fix."""
    fix = "fix the config or download the model again"
    if not isinstance(config, dict):
        raise ModelError(f"{where}: the config is a JSON {json_kind(config)}, not an object; {fix}")
    cfg = normalize_config(config)
    for key in REQUIRED_CONFIG:
        if key not in cfg:
            raise ModelError(f"{where}: field {key!r} is missing; {fix}")
    if not isinstance(cfg["model_type"], str) or not cfg["model_type"]:
        raise ModelError(f"{where}: field 'model_type' is {cfg['model_type']!r}, not a family name; {fix}")
    limits = dict(CONFIG_BOUNDS)
    limits.update({k: (1, 1 << 20) for k in cfg if k.endswith("intermediate_size") and k not in limits})
    for key, (lo, hi) in limits.items():
        if key not in cfg or (cfg[key] is None and key not in CORE_SIZES):
            continue
        v = cfg[key]
        if not is_whole(v) or not lo <= v <= hi:
            raise ModelError(f"{where}: field {key!r} is {v!r}; it must be a whole number in [{lo}, {hi}]; {fix}")
    n_experts = next((cfg[k] for k in EXPERT_COUNT_KEYS if is_whole(cfg.get(k))), None)
    for key in TOPK_KEYS:
        if key in cfg and cfg[key] is not None:
            v = cfg[key]
            hi = n_experts if n_experts is not None else 1 << 15
            if not is_whole(v) or not 1 <= v <= hi:
                raise ModelError(f"{where}: field {key!r} is {v!r}; it must be a whole number in [1, {hi}] "
                                 f"(experts per token, at most the {n_experts or 'number of'} experts); {fix}")
    return cfg


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
    try:
        model = model_class(args_class.from_dict(config))
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        raise ModelError(f"mlx-lm cannot build a {config.get('model_type')} model from this config "
                         f"({type(e).__name__}: {e}); fix the config or download the model again") from None
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
