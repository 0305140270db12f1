"""Local converter: compact export from the GPU machine -> quantized mlx-lm model directories.

Reads the files ``device-run`` writes (``experts_*.safetensors`` int8 rows, ``moe_dense`` and
``draft`` float16, ``meta.tar.gz``), rebuilds float weights, quantizes them with mlx-lm's own
``quantize_model`` (affine, group size 64: routed experts 4-bit, router 8-bit, the rest 8-bit
by default) and saves ``ref-moe/`` and ``ref-draft/`` with their config.json and tokenizer.
Also unpacks the eval sets and prompt workloads to ``data/workloads/``.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import numpy as np

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def unpack_meta(export_dir: Path) -> Path:
    """Extract ``meta.tar.gz`` next to itself (into ``meta/``); returns that folder."""
    export_dir = Path(export_dir)
    meta = export_dir / "meta"
    tgz = export_dir / "meta.tar.gz"
    if not tgz.is_file():
        if (meta / "metrics.json").is_file():
            return meta
        raise ValueError(f"{tgz} not found: copy the files device-run wrote to $OUT into {export_dir}")
    meta.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tgz) as tf:
        for m in tf.getmembers():
            if m.name.startswith("/") or ".." in Path(m.name).parts:
                raise ValueError(f"unsafe member {m.name} in {tgz}")
        tf.extractall(meta, filter="data")
    return meta


def _load_np(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def float_weights(export_dir: Path, which: str) -> dict[str, np.ndarray]:
    """float32 weights under mlx-lm names for ``which`` in {"moe", "draft"}."""
    export_dir = Path(export_dir)
    if which == "draft":
        return {k: v.astype(np.float32) for k, v in _load_np(export_dir / "draft.safetensors").items()}
    if which != "moe":
        raise ValueError(f"which must be 'moe' or 'draft', not {which!r}")
    w = {k: v.astype(np.float32) for k, v in _load_np(export_dir / "moe_dense.safetensors").items()}
    parts = sorted(export_dir.glob("experts_*.safetensors"))
    if not parts:
        raise ValueError(f"no experts_*.safetensors in {export_dir}")
    for p in parts:
        t = _load_np(p)
        for k in t:
            if k.endswith(".q"):
                base = k[: -len(".q")]
                w[base + ".weight"] = t[k].astype(np.float32) * t[base + ".scale"].astype(np.float32)[..., None]
    return w


def build_model(config: dict, weights: dict[str, np.ndarray], dtype: str = "bfloat16"):
    """An mlx-lm model object from a config and float weights (strict: every tensor present)."""
    import mlx.core as mx
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    dt = getattr(mx, dtype)
    arrays = [(k, mx.array(v).astype(dt)) for k, v in weights.items()]
    if hasattr(model, "sanitize"):
        arrays = list(model.sanitize(dict(arrays)).items())
    model.load_weights(arrays, strict=True)
    mx.eval(model.parameters())
    model.eval()
    return model


def quant_predicate(expert_bits: int, other_bits: int, router_bits: int = 8, group_size: int = 64):
    def pred(path: str, module) -> bool | dict:
        if "switch_mlp" in path:
            bits = expert_bits
        elif path.endswith("mlp.gate"):
            bits = router_bits
        else:
            bits = other_bits
        if bits >= 16:
            return False
        return {"group_size": group_size, "bits": bits, "mode": "affine"}

    return pred


def save_mlx_dir(model, config: dict, tokenizer_dir: Path, out_dir: Path, expert_bits: int, other_bits: int,
                 group_size: int = 64) -> dict:
    """Quantize with mlx-lm's ``quantize_model`` and save an mlx-lm directory (atomic rename)."""
    from mlx_lm.utils import quantize_model, save_config, save_model

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model, qconfig = quantize_model(model, dict(config), group_size, expert_bits,
                                    quant_predicate=quant_predicate(expert_bits, other_bits, group_size=group_size))
    save_model(tmp, model)
    save_config(qconfig, tmp / "config.json")
    for fn in TOKENIZER_FILES:
        shutil.copy2(tokenizer_dir / fn, tmp / fn)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return qconfig


def convert(export_dir: str | Path, models_dir: str | Path, workloads_dir: str | Path,
            expert_bits: int = 4, other_bits: int = 8, draft_bits: int = 8, dtype: str = "float32") -> dict:
    export_dir, models_dir, workloads_dir = Path(export_dir), Path(models_dir), Path(workloads_dir)
    meta = unpack_meta(export_dir)
    out = {}
    for which, cfg_name, name, eb, ob in (
        ("moe", "moe_config.json", "ref-moe", expert_bits, other_bits),
        ("draft", "draft_config.json", "ref-draft", draft_bits, draft_bits),
    ):
        config = json.loads((meta / cfg_name).read_text())
        config["torch_dtype"] = dtype
        model = build_model(config, float_weights(export_dir, which), dtype)
        save_mlx_dir(model, config, meta, models_dir / name, eb, ob)
        out[name] = str(models_dir / name)
    workloads_dir.mkdir(parents=True, exist_ok=True)
    for p in sorted((meta / "sets").glob("*.jsonl")):
        shutil.copy2(p, workloads_dir / p.name)
    return out
