"""The store cache: ``workbench run MODEL_DIR`` packs a model once into ``$WORKBENCH_CACHE/stores``.

A cached store is named ``<model dir name>-<key>``. The key is the model's content as far as it
can be read cheaply: the config hash, and for each ``model*.safetensors`` its name, size, tensor
header (names, shapes, dtypes, offsets) and its bytes: whole up to 64 MiB, else 17 samples of
4 KiB spread over the file (its tail included). Touching or copying a model keeps its store;
re-trained weights of the same shapes get a new one.

Packing is safe to interrupt and to race: one process packs a key at a time (an ``flock`` on
``stores/.KEY.lock``; a second waits, then reuses the result), and a packer's temp folder holds a
locked ``.packing`` file, so a folder whose lock is free belongs to a dead packer and is removed
(``locks``, which ``pack`` shares).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import struct
from pathlib import Path

from ..checks import output_dir
from ..fsutil import cache_dir, clean_stale, is_stale, stale_temps
from ..model import ModelError, config_hash, load_config, weight_files
from .locks import file_lock
from .manifest import MANIFEST

SAMPLES, SAMPLE_BYTES = 16, 4096
WHOLE_FILE = 64 << 20  # weight files up to this size are hashed whole
MAX_HEADER = 100 << 20


def stores_dir() -> Path:
    root = cache_dir()
    if root.exists() and not root.is_dir():
        raise ValueError(f"WORKBENCH_CACHE {root} is a file, not a folder; set WORKBENCH_CACHE to a folder")
    return root / "stores"


def safetensors_header(path: Path) -> bytes:
    """The raw JSON header of a safetensors file (validated: length inside the file, JSON object)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelError(f"{path} is not a safetensors file ({size} bytes); download the model again")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, MAX_HEADER):
            raise ModelError(f"{path}: header length {n} does not fit the file ({size} bytes); download the model again")
        raw = f.read(n)
    try:
        if not isinstance(json.loads(raw), dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: the safetensors header is not valid JSON ({e}); download the model again") from None
    return raw


def store_key(model_dir) -> str:
    """Content key of a model directory (see the module doc)."""
    model_dir = Path(model_dir)
    h = hashlib.sha256(config_hash(load_config(model_dir)).encode())
    for f in weight_files(model_dir):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}:".encode())
        h.update(safetensors_header(f))
        with open(f, "rb") as fh:
            if size <= WHOLE_FILE:
                while block := fh.read(16 << 20):
                    h.update(block)
                continue
            for i in range(SAMPLES + 1):  # evenly spread, the last one the file's tail
                fh.seek(min(size * i // SAMPLES, size - SAMPLE_BYTES))
                h.update(fh.read(SAMPLE_BYTES))
    return h.hexdigest()[:16]


def cached_store_path(model_dir) -> Path:
    model_dir = Path(model_dir)
    return stores_dir() / f"{model_dir.resolve().name}-{store_key(model_dir)}"


def resolve_store(path, progress=True, store=None) -> Path:
    """A store directory as is; an mlx-lm model directory is packed once, into ``store`` if given,
    else into the cache (a second process packing the same model waits and reuses the result)."""
    path = Path(path)
    if (path / MANIFEST).exists():
        return path
    if not path.exists():
        raise ModelError(f"{path} does not exist; give an mlx-lm model directory or a workbench store")
    load_config(path)  # a damaged config fails here, before any key is computed
    target = Path(store) if store is not None else cached_store_path(path)
    if (target / MANIFEST).exists():
        return target
    from .pack import pack

    if store is None:
        output_dir("WORKBENCH_CACHE", stores_dir(), fix="set WORKBENCH_CACHE to a writable folder, or give --store DIR")
    if store is None and stores_dir().is_dir():
        clean_stale(stores_dir())  # dead packers of any model in the cache
    return pack(path, target, progress=progress, reuse=True)


def list_stores() -> list[dict]:
    """Cached stores: name, path, bytes, source model, plus stale temp folders (stale=True)."""
    root = stores_dir()
    out = []
    if not root.is_dir():
        return out
    for p in sorted(root.iterdir()):
        if p.is_dir() and (p / MANIFEST).exists():
            try:
                source = json.loads((p / MANIFEST).read_text()).get("source")
            except (ValueError, OSError):
                source = None
            out.append({"name": p.name, "path": str(p), "bytes": _du(p), "source": source, "stale": False})
    for p in (p for p in stale_temps(root) if p.is_dir()):
        out.append({"name": p.name, "path": str(p), "bytes": _du(p), "source": None, "stale": True})
    return out


def remove_store(name: str) -> Path:
    """Remove one cached store (or a dead packer's temp folder) by name; refuses anything else."""
    root = stores_dir()
    p = root / name
    if "/" in name or name in ("", ".", "..") or not p.is_dir():
        have = ", ".join(s["name"] for s in list_stores()) or "none"
        raise ValueError(f"no cached store {name!r} in {root}; cached: {have}")
    if p.is_symlink():  # a link the user made: the link goes, what it points at stays
        p.unlink()
    elif (p / MANIFEST).exists():
        with file_lock(root / f".{name}.lock"):
            shutil.rmtree(p)
        with contextlib.suppress(OSError):  # a packer racing this unlink still ends well (see pack)
            (root / f".{name}.lock").unlink()
    elif is_stale(p):
        shutil.rmtree(p)
    else:
        raise ValueError(f"{p} is not a cached store (no {MANIFEST}) nor a dead packer's folder; left as it is")
    return p


def _du(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
