"""``workbench pack MODEL_DIR STORE_DIR``: split an mlx-lm MoE model into an expert store."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from tqdm.auto import tqdm

from .. import __version__
from ..fsutil import cache_dir, clean_stale, marked_temp_dir, unmark
from ..model import (ModelError, config_hash, expert_modules, load_config, model_classes, quantized_modules, top_k_of,
                     weight_files)
from .locks import file_lock
from .manifest import ALIGN, EXPERTS, FORMAT, MANIFEST, RESIDENT, StoreError, crc32, file_crc32

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "generation_config.json", "chat_template.jinja")


def raw_bytes(a: mx.array) -> memoryview:
    """The bytes of an evaluated array (no copy)."""
    return memoryview(a).cast("B")


def load_mlx_model(model_dir: Path):
    """Load an mlx-lm model directory lazily (weights read on first use)."""
    from mlx_lm.utils import load_model

    model_dir = Path(model_dir)
    config = load_config(model_dir)
    model_classes(config)  # an unsupported family fails here, before any weight is read
    if not weight_files(model_dir):
        raise ModelError(f"{model_dir} has no model*.safetensors; point at an mlx-lm model directory")
    try:
        model, _ = load_model(model_dir, lazy=True, model_config=config)
    except (ValueError, RuntimeError, TypeError, KeyError) as e:
        raise ModelError(f"mlx-lm cannot build a {config.get('model_type')} model from {model_dir} "
                         f"({type(e).__name__}: {e}); fix its config.json or weights, or download it again") from None
    return model, config


def check_target(model_dir: Path, store_dir: Path) -> None:
    """Refuse a STORE_DIR that cannot take a store, before anything is read or copied."""
    if store_dir.resolve() == model_dir.resolve():
        raise StoreError(f"STORE_DIR {store_dir} is the model directory itself; give a new directory for the store")
    if store_dir.exists() and not store_dir.is_dir():
        raise StoreError(f"STORE_DIR {store_dir} is a file; give a new or empty directory")
    if store_dir.is_dir() and not (store_dir / MANIFEST).exists() and any(store_dir.iterdir()):
        raise StoreError(f"STORE_DIR {store_dir} is not empty and holds no store; give a new or empty directory "
                         "(nothing there is touched)")


def pack(model_dir, store_dir, progress: bool = True, reuse: bool = False) -> Path:
    """Write the store atomically: build in a temp dir beside STORE_DIR, then rename.

    One packer per STORE_DIR at a time (a second waits on ``.NAME.lock``); with ``reuse`` a store
    already there (or finished meanwhile by another process) is returned, else FileExistsError."""
    model_dir, store_dir = Path(model_dir), Path(store_dir)
    check_target(model_dir, store_dir)
    if (store_dir / MANIFEST).exists():
        if reuse:
            return store_dir
        raise FileExistsError(f"{store_dir} already holds a store; delete it first or pick another STORE_DIR")
    load_config(model_dir)  # a damaged config is refused before anything is created
    parent = store_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    lock = parent / f".{store_dir.name}.lock"
    try:
        with file_lock(lock, waiting=f"waiting for another process packing into {store_dir}"):
            if (store_dir / MANIFEST).exists():  # the other process finished it
                if reuse:
                    return store_dir
                raise FileExistsError(f"{store_dir} already holds a store (packed by another process meanwhile)")
            check_target(model_dir, store_dir)
            clean_stale(parent, store_dir.name)
            need = sum(f.stat().st_size for f in weight_files(model_dir))
            free = shutil.disk_usage(parent).free
            if need > free:
                raise StoreError(f"packing {model_dir} needs about {need / 1e9:.2f} GB but {parent} has "
                                 f"{free / 1e9:.2f} GB free; free space or set WORKBENCH_CACHE (now {cache_dir()}) "
                                 "or STORE_DIR to a disk with room")
            if progress:
                print(f"packing {model_dir} into {store_dir} (about {need / 1e9:.2f} GB)", file=sys.stderr, flush=True)
            try:
                return _pack_into(model_dir, store_dir, progress)
            except FileExistsError:
                if reuse and (store_dir / MANIFEST).exists():
                    return store_dir
                raise
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()


def _pack_into(model_dir: Path, store_dir: Path, progress: bool) -> Path:
    model, config = load_mlx_model(model_dir)
    experts = expert_modules(model)
    try:
        with marked_temp_dir(store_dir) as tmp:  # a killed packer's folder is recognised and removed later
            manifest = _write(model, config, experts, tmp, progress)
            manifest["source"] = str(model_dir.resolve())
            for name in TOKENIZER_FILES:
                if (model_dir / name).exists():
                    shutil.copy2(model_dir / name, tmp / name)
            (tmp / "config.json").write_text(json.dumps(config, indent=2))
            (tmp / MANIFEST).write_text(json.dumps(manifest))
            unmark(tmp)
            if (store_dir / MANIFEST).exists():
                raise FileExistsError(f"{store_dir} already holds a store (packed by another process meanwhile)")
            if store_dir.exists():
                store_dir.rmdir()  # only an empty directory may stand in the way
            os.replace(tmp, store_dir)
    except OSError as e:
        if e.filename is None and e.errno is not None:  # name the place for the hint (a bare write error has none)
            raise OSError(e.errno, e.strerror or str(e), str(store_dir)) from None
        raise
    return store_dir


def _write(model, config, experts, out: Path, progress: bool) -> dict:
    params = dict(tree_flatten(model.parameters()))
    layers = list(experts)
    first_path, first = experts[layers[0]]
    specs = []
    for name, a in tree_flatten(first.parameters()):
        specs.append({"name": name, "shape": list(a.shape[1:]), "dtype": str(a.dtype).split(".")[-1],
                      "nbytes": a.nbytes // a.shape[0]})
    n_experts = tree_flatten(first.parameters())[0][1].shape[0]
    expert_bytes = sum(s["nbytes"] for s in specs)
    stride = -(-expert_bytes // ALIGN) * ALIGN
    blobs, offset = [], 0
    expert_keys = set()
    with open(out / EXPERTS, "wb") as f:
        for layer in tqdm(layers, desc="pack experts", unit="layer", disable=not progress):
            path, module = experts[layer]
            tensors = tree_flatten(module.parameters())
            names = [n for n, _ in tensors]
            if names != [s["name"] for s in specs] or any(a.shape[0] != n_experts for _, a in tensors):
                raise ModelError(f"layer {layer} experts differ in layout from layer {layers[0]}; cannot pack")
            expert_keys.update(f"{path}.{n}" for n in names)
            mx.eval([a for _, a in tensors])
            views = [raw_bytes(a) for _, a in tensors]
            for e in range(n_experts):
                parts = [v[e * s["nbytes"]:(e + 1) * s["nbytes"]] for v, s in zip(views, specs)]
                crc = 0
                for p in parts:
                    f.write(p)
                    crc = crc32(p, crc)
                f.write(b"\0" * (stride - expert_bytes))
                blobs.append([layer, e, offset, expert_bytes, crc])
                offset += stride
            del tensors, views
        f.flush()
        os.fsync(f.fileno())
    resident = {k: v for k, v in params.items() if k not in expert_keys}
    mx.save_safetensors(str(out / RESIDENT), resident)
    return {
        "resident_crc32": file_crc32(out / RESIDENT),
        "resident_size": (out / RESIDENT).stat().st_size,
        "format": FORMAT,
        "workbench_version": __version__,
        "model_type": config.get("model_type"),
        "config_hash": config_hash(config),
        "config": config,
        "n_layers": len(model.layers),
        "moe_layers": layers,
        "expert_paths": {str(layer): experts[layer][0] for layer in layers},
        "n_experts": n_experts,
        "top_k": top_k_of(config),
        "tensors": specs,
        "alignment": ALIGN,
        "blob_stride": stride,
        "blobs": blobs,
        "experts_file_size": offset,
        "quantized": quantized_modules(model),
    }
