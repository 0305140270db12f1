"""``workbench synth-store``: an expert store with the real expert shapes of a public MoE model
and random contents, written layer by layer (never the whole model in memory).

It is for I/O studies at real sizes (``workbench ioreplay``): the manifest is a normal
``workbench-store/1`` manifest (16 KiB aligned blobs, sizes, crc32, file size), the experts are
mlx affine-quantized tensors (uint32 weights; bfloat16 scales and biases, as published MLX
checkpoints have them, or ``dtype``) or unquantized ``dtype`` weights at 16 bits.
There are no resident (non-expert) weights, so the engine cannot generate from it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .. import __version__
from ..checks import whole
from ..fsutil import marked_temp_dir, unmark
from ..model import config_hash, normalize_config
from .manifest import ALIGN, EXPERTS, FORMAT, MANIFEST, RESIDENT, crc32

BITS = (2, 3, 4, 5, 6, 8, 16)
GROUP = 64
MARGIN = 1 << 30  # free disk kept beyond the store itself


@dataclass(frozen=True)
class Shape:
    """Routed-expert geometry of a model (from its published config.json)."""

    model_type: str
    layers: int  # MoE layers
    experts: int  # routed experts per layer
    hidden: int  # hidden_size
    width: int  # expert FFN width
    top_k: int
    first_moe_layer: int = 0  # leading dense layers (first_k_dense_replace)
    expert_path: str = "mlp.switch_mlp"


# The rest of each published config.json (attention, vocabulary, norms): the manifest's config
# builds the real mlx-lm model, so the engine's checks of expert tensors against it apply.
CONFIGS = {
    "qwen3-30b-a3b": {  # Qwen/Qwen3-30B-A3B
        "model_type": "qwen3_moe", "vocab_size": 151936, "intermediate_size": 6144, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 40960, "tie_word_embeddings": False, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "torch_dtype": "bfloat16"},
    "mixtral-8x7b": {  # mistralai/Mixtral-8x7B-v0.1
        "model_type": "mixtral", "vocab_size": 32000, "num_attention_heads": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16"},
    "glm-4.5-air": {  # zai-org/GLM-4.5-Air
        "model_type": "glm4_moe", "vocab_size": 151552, "intermediate_size": 10944, "num_attention_heads": 96,
        "num_key_value_heads": 8, "head_dim": 128, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
        "routed_scaling_factor": 1.0, "norm_topk_prob": True, "rms_norm_eps": 1e-5, "rope_theta": 1000000,
        "rope_scaling": None, "max_position_embeddings": 131072, "partial_rotary_factor": 0.5, "use_qk_norm": False,
        "attention_bias": True, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
}
PRESETS = {
    "qwen3-30b-a3b": Shape("qwen3_moe", 48, 128, 2048, 768, 8),
    "mixtral-8x7b": Shape("mixtral", 32, 8, 4096, 14336, 2, expert_path="block_sparse_moe.switch_mlp"),
    "glm-4.5-air": Shape("glm4_moe", 45, 128, 4096, 1408, 8, first_moe_layer=1),  # 46 layers, the first dense
    "tiny": Shape("qwen3_moe", 2, 8, 128, 64, 2),  # for tests
}
# family -> (config key of the expert width, of the expert count)
MOE_KEYS = {"qwen3_moe": ("moe_intermediate_size", "num_experts"), "mixtral": ("intermediate_size", "num_local_experts"),
            "glm4_moe": ("moe_intermediate_size", "n_routed_experts")}


DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}
SHAPE_FLAGS = {"layers": "--layers", "experts": "--experts", "hidden": "--hidden", "width": "--expert-width",
               "top_k": "--top-k"}


def expert_tensors(shape: Shape, bits: int, dtype: str = "bfloat16") -> list[dict]:
    """Per-expert tensor specs in pack's order (gate, up, down; weight, scales, biases)."""
    if bits not in BITS:
        raise ValueError(f"--bits must be one of {', '.join(map(str, BITS))}, got {bits}")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    specs = []
    for name, out_dim, in_dim in (("gate_proj", shape.width, shape.hidden), ("up_proj", shape.width, shape.hidden),
                                  ("down_proj", shape.hidden, shape.width)):
        if bits == 16:
            specs.append({"name": f"{name}.weight", "shape": [out_dim, in_dim], "dtype": dtype,
                          "nbytes": out_dim * in_dim * DTYPES[dtype]})
            continue
        if in_dim % GROUP or (in_dim * bits) % 32:
            flag = "--hidden" if in_dim == shape.hidden else "--expert-width"
            raise ValueError(f"{flag} {in_dim} is not a multiple of the quantization group {GROUP} ({name}'s input "
                             f"at --bits {bits}); give a multiple of {GROUP}, or --bits 16")
        packed = in_dim * bits // 32
        specs.append({"name": f"{name}.weight", "shape": [out_dim, packed], "dtype": "uint32", "nbytes": out_dim * packed * 4})
        for part in ("scales", "biases"):
            specs.append({"name": f"{name}.{part}", "shape": [out_dim, in_dim // GROUP], "dtype": dtype,
                          "nbytes": out_dim * (in_dim // GROUP) * DTYPES[dtype]})
    return specs


def resolve_shape(like: str | None = None, **overrides) -> Shape:
    """A preset (``like``) with explicit fields replaced, or a shape from explicit fields alone."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if like is not None:
        if like not in PRESETS:
            raise ValueError(f"unknown --like {like!r}; presets: {', '.join(PRESETS)}")
        shape = replace(PRESETS[like], **overrides)
    else:
        need = ("layers", "experts", "hidden", "width", "top_k")
        missing = [k for k in need if k not in overrides]
        if missing:
            raise ValueError(f"give --like NAME or all of --layers --experts --hidden --expert-width --top-k (missing {missing})")
        shape = Shape(model_type="qwen3_moe", **overrides)
    for k, flag in SHAPE_FLAGS.items():
        whole(flag, getattr(shape, k), 1)
    if shape.top_k > shape.experts:
        raise ValueError(f"--top-k {shape.top_k} is larger than the {shape.experts} experts per layer (--experts); "
                         f"give --top-k {shape.experts} or less")
    return shape


def store_bytes(shape: Shape, bits: int, dtype: str = "bfloat16") -> tuple[int, int]:
    """(bytes per expert, bytes of experts.bin)."""
    expert = sum(t["nbytes"] for t in expert_tensors(shape, bits, dtype))
    stride = -(-expert // ALIGN) * ALIGN
    return expert, stride * shape.layers * shape.experts


def check_room(out: Path, need: int) -> None:
    """Refuse before writing when the disk under ``out`` lacks ``need`` bytes plus a margin."""
    probe = out.parent if not out.exists() else out
    free = shutil.disk_usage(probe).free
    if free < need + MARGIN:
        raise OSError(f"not enough disk for the store at {out}: it needs {need / 1e9:.2f} GB (+{MARGIN / 1e9:.1f} GB margin), "
                      f"{free / 1e9:.2f} GB free; free space or choose fewer --layers or lower --bits")


def _random_expert(rng, specs) -> list[bytes]:
    """One expert's tensors: random packed weights, small random floats (scales, biases, weights)."""
    out = []
    for t in specs:
        if t["dtype"] == "uint32":
            out.append(rng.bytes(t["nbytes"]))
            continue
        v = rng.standard_normal(t["nbytes"] // DTYPES[t["dtype"]], dtype=np.float32) * 0.02
        if t["dtype"] == "bfloat16":  # the top half of each float32
            out.append((v.view(np.uint32) >> 16).astype(np.uint16).tobytes())
        else:
            out.append(v.astype(t["dtype"]).tobytes())
    return out


def synth_store(out, like: str | None = None, bits: int = 4, seed: int = 0, progress: bool = True, dtype: str = "bfloat16",
                **overrides) -> Path:
    """Write a synthetic store at ``out`` (atomically: temp dir beside it, then rename)."""
    out = Path(out)
    if (out / MANIFEST).exists():
        raise FileExistsError(f"{out} already holds a store; delete it first or pick another OUT")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory; pick another OUT")
    shape = resolve_shape(like, **overrides)
    specs = expert_tensors(shape, bits, dtype)
    expert_bytes, total = store_bytes(shape, bits, dtype)
    stride = -(-expert_bytes // ALIGN) * ALIGN
    out.parent.mkdir(parents=True, exist_ok=True)
    check_room(out, total)
    layers = moe_layers(shape)
    rng = np.random.default_rng(seed)
    pad = b"\0" * (stride - expert_bytes)
    with marked_temp_dir(out) as tmp:  # a killed writer's folder is removed by the next synth-store of OUT
        blobs, offset = [], 0
        bar = tqdm(total=total, desc="synth store", unit="B", unit_scale=True, disable=not progress)
        with open(tmp / EXPERTS, "wb") as f:
            for layer in layers:
                start = offset
                for e in range(shape.experts):
                    crc = 0
                    for part in _random_expert(rng, specs):
                        f.write(part)
                        crc = crc32(part, crc)
                    f.write(pad)
                    blobs.append([layer, e, offset, expert_bytes, crc])
                    offset += stride
                    bar.update(stride)
                f.flush()
                os.fsync(f.fileno())
                if hasattr(os, "posix_fadvise"):  # written layers need not crowd the page cache
                    os.posix_fadvise(f.fileno(), start, offset - start, os.POSIX_FADV_DONTNEED)
        bar.close()
        config = synthetic_config(shape, bits, like)
        manifest = {
            "format": FORMAT,
            "workbench_version": __version__,
            "model_type": shape.model_type,
            "config_hash": config_hash(config),
            "config": config,
            "n_layers": shape.first_moe_layer + shape.layers,
            "moe_layers": layers,
            "expert_paths": {str(layer): f"model.layers.{layer}.{shape.expert_path}" for layer in layers},
            "n_experts": shape.experts,
            "top_k": shape.top_k,
            "tensors": specs,
            "alignment": ALIGN,
            "blob_stride": stride,
            "blobs": blobs,
            "experts_file_size": offset,
            "quantized": quantized_experts(shape, bits),
            "synthetic": {"like": like, "bits": bits, "dtype": dtype, "seed": seed, "shape": asdict(shape),
                          "resident_weights": False},
        }
        resident = _empty_safetensors(tmp / RESIDENT)
        manifest.update(resident_size=len(resident), resident_crc32=crc32(resident))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / MANIFEST).write_text(json.dumps(manifest))
        unmark(tmp)
        if out.exists():
            out.rmdir()  # only an empty directory may stand in the way
        os.replace(tmp, out)
    return out


def moe_layers(shape: Shape) -> list[int]:
    return [shape.first_moe_layer + i for i in range(shape.layers)]


def quantized_experts(shape: Shape, bits: int) -> dict:
    """The manifest's ``quantized`` map: every expert projection at ``bits`` (others stay unquantized)."""
    if bits == 16:
        return {}
    return {f"model.layers.{layer}.{shape.expert_path}.{p}": {"group_size": GROUP, "bits": bits, "mode": "affine"}
            for layer in moe_layers(shape) for p in ("gate_proj", "up_proj", "down_proj")}


def synthetic_config(shape: Shape, bits: int, like: str | None) -> dict:
    """A config.json in the family's own spelling that builds the model with these experts."""
    head_dim = min(128, shape.hidden)
    cfg = dict(CONFIGS.get(like) or {
        "model_type": "qwen3_moe", "vocab_size": 32000, "intermediate_size": 4 * shape.hidden,
        "num_attention_heads": max(1, shape.hidden // head_dim), "num_key_value_heads": 1, "head_dim": head_dim,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []})
    width_key, experts_key = MOE_KEYS[shape.model_type]
    cfg.update({"hidden_size": shape.hidden, "num_hidden_layers": shape.first_moe_layer + shape.layers, width_key: shape.width,
                experts_key: shape.experts, "num_experts_per_tok": shape.top_k, "workbench_synthetic": like or "explicit"})
    if shape.first_moe_layer:
        cfg["first_k_dense_replace"] = shape.first_moe_layer
    if bits != 16:
        cfg["quantization"] = {"group_size": GROUP, "bits": bits, "mode": "affine"}
    return normalize_config(cfg)


def _empty_safetensors(path: Path) -> bytes:
    """A valid safetensors file with no tensors (the store has no resident weights); returns its bytes."""
    header = b"{}      "  # padded to 8 bytes
    data = len(header).to_bytes(8, "little") + header
    path.write_bytes(data)
    return data
