"""``workbench synth-store``: an expert store with the real expert shapes of a public MoE model
and random contents, written layer by layer (never the whole model in memory).

It is for I/O studies at real sizes (``workbench ioreplay``): the manifest is a normal
``workbench-store/1`` manifest (16 KiB aligned blobs, sizes, crc32, file size), the experts are
mlx affine-quantized tensors (uint32 weights, bfloat16 scales and biases) or bfloat16 at 16 bits.
There are no resident (non-expert) weights, so the engine cannot generate from it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .. import __version__
from ..model import config_hash
from .manifest import ALIGN, EXPERTS, FORMAT, MANIFEST, RESIDENT

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
    width: int  # moe_intermediate_size (expert FFN width)
    top_k: int
    first_moe_layer: int = 0  # leading dense layers (first_k_dense_replace)
    expert_path: str = "mlp.switch_mlp"


PRESETS = {
    # Qwen/Qwen3-30B-A3B config.json: 48 layers, 128 experts, top-8, hidden 2048, moe_intermediate 768
    "qwen3-30b-a3b": Shape("qwen3_moe", 48, 128, 2048, 768, 8),
    # mistralai/Mixtral-8x7B-v0.1: 32 layers, 8 experts, top-2, hidden 4096, intermediate 14336
    "mixtral-8x7b": Shape("mixtral", 32, 8, 4096, 14336, 2, expert_path="block_sparse_moe.switch_mlp"),
    # zai-org/GLM-4.5-Air: 46 layers (first dense), 128 routed experts, top-8, hidden 4096, moe_intermediate 1408
    "glm-4.5-air": Shape("glm4_moe", 45, 128, 4096, 1408, 8, first_moe_layer=1),
    # for tests
    "tiny": Shape("qwen3_moe", 2, 8, 128, 64, 2),
}


def expert_tensors(shape: Shape, bits: int) -> list[dict]:
    """Per-expert tensor specs in pack's order (gate, up, down; weight, scales, biases)."""
    if bits not in BITS:
        raise ValueError(f"--bits must be one of {', '.join(map(str, BITS))}, got {bits}")
    specs = []
    for name, out_dim, in_dim in (("gate_proj", shape.width, shape.hidden), ("up_proj", shape.width, shape.hidden),
                                  ("down_proj", shape.hidden, shape.width)):
        if bits == 16:
            specs.append({"name": f"{name}.weight", "shape": [out_dim, in_dim], "dtype": "bfloat16", "nbytes": out_dim * in_dim * 2})
            continue
        if in_dim % GROUP or (in_dim * bits) % 32:
            raise ValueError(f"{name} input width {in_dim} is not a multiple of the quantization group {GROUP}")
        packed = in_dim * bits // 32
        specs.append({"name": f"{name}.weight", "shape": [out_dim, packed], "dtype": "uint32", "nbytes": out_dim * packed * 4})
        for part in ("scales", "biases"):
            specs.append({"name": f"{name}.{part}", "shape": [out_dim, in_dim // GROUP], "dtype": "bfloat16",
                          "nbytes": out_dim * (in_dim // GROUP) * 2})
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
        shape = Shape(model_type="synthetic", **overrides)
    for k in ("layers", "experts", "hidden", "width", "top_k"):
        if getattr(shape, k) < 1:
            raise ValueError(f"{k} must be >= 1, got {getattr(shape, k)}")
    if shape.top_k > shape.experts:
        raise ValueError(f"top_k {shape.top_k} is larger than the {shape.experts} experts per layer")
    return shape


def store_bytes(shape: Shape, bits: int) -> tuple[int, int]:
    """(bytes per expert, bytes of experts.bin)."""
    expert = sum(t["nbytes"] for t in expert_tensors(shape, bits))
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
    """One expert's tensors: random packed weights, small random bfloat16 scales/biases."""
    out = []
    for t in specs:
        if t["dtype"] == "uint32":
            out.append(rng.bytes(t["nbytes"]))
        else:
            v = rng.standard_normal(t["nbytes"] // 2, dtype=np.float32) * 0.02
            out.append((v.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    return out


def synth_store(out, like: str | None = None, bits: int = 4, seed: int = 0, progress: bool = True, **overrides) -> Path:
    """Write a synthetic store at ``out`` (atomically: temp dir beside it, then rename)."""
    out = Path(out)
    if (out / MANIFEST).exists():
        raise FileExistsError(f"{out} already holds a store; delete it first or pick another OUT")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory; pick another OUT")
    shape = resolve_shape(like, **overrides)
    specs = expert_tensors(shape, bits)
    expert_bytes, total = store_bytes(shape, bits)
    stride = -(-expert_bytes // ALIGN) * ALIGN
    out.parent.mkdir(parents=True, exist_ok=True)
    check_room(out, total)
    layers = [shape.first_moe_layer + i for i in range(shape.layers)]
    rng = np.random.default_rng(seed)
    pad = b"\0" * (stride - expert_bytes)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        blobs, offset = [], 0
        bar = tqdm(total=total, desc="synth store", unit="B", unit_scale=True, disable=not progress)
        with open(tmp / EXPERTS, "wb") as f:
            for layer in layers:
                start = offset
                for e in range(shape.experts):
                    crc = 0
                    for part in _random_expert(rng, specs):
                        f.write(part)
                        crc = zlib.crc32(part, crc)
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
            "quantized": {} if bits == 16 else {f"model.layers.{layer}.{shape.expert_path}.{p}": {"group_size": GROUP, "bits": bits, "mode": "affine"}
                                                 for layer in layers for p in ("gate_proj", "up_proj", "down_proj")},
            "synthetic": {"like": like, "bits": bits, "seed": seed, "shape": asdict(shape), "resident_weights": False},
        }
        _empty_safetensors(tmp / RESIDENT)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / MANIFEST).write_text(json.dumps(manifest))
        if out.exists():
            out.rmdir()  # only an empty directory may stand in the way
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def synthetic_config(shape: Shape, bits: int, like: str | None) -> dict:
    """A config.json in the model's own spelling, for the record (no resident weights exist)."""
    cfg = {
        "model_type": shape.model_type,
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.first_moe_layer + shape.layers,
        "moe_intermediate_size": shape.width,
        "num_experts": shape.experts,
        "num_local_experts": shape.experts,
        "num_experts_per_tok": shape.top_k,
        "workbench_synthetic": like or "explicit",
    }
    if shape.first_moe_layer:
        cfg["first_k_dense_replace"] = shape.first_moe_layer
    if bits != 16:
        cfg["quantization"] = {"group_size": GROUP, "bits": bits, "mode": "affine"}
    return cfg


def _empty_safetensors(path: Path) -> None:
    """A valid safetensors file with no tensors (the store has no resident weights)."""
    header = b"{}      "  # padded to 8 bytes
    path.write_bytes(len(header).to_bytes(8, "little") + header)
