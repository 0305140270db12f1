"""The expert store on disk: ``manifest.json``, ``experts.bin``, ``resident.safetensors``.

experts.bin holds one contiguous blob per (layer, expert): that expert's tensors
(e.g. gate_proj.weight, .scales, .biases, up_proj..., down_proj...) back to back,
each blob starting at a multiple of ``alignment`` (16 KiB).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FORMAT = "workbench-store/1"
ALIGN = 16 * 1024
MANIFEST = "manifest.json"
EXPERTS = "experts.bin"
RESIDENT = "resident.safetensors"


class StoreError(ValueError):
    """The expert store is missing, corrupt, or does not match the model."""


@dataclass(frozen=True)
class TensorSpec:
    name: str  # path inside the expert module, e.g. "gate_proj.weight"
    shape: tuple  # per-expert shape
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class Blob:
    layer: int
    expert: int
    offset: int
    size: int
    crc32: int


class Manifest:
    def __init__(self, data: dict, root: Path):
        self.data = data
        self.root = Path(root)
        self.tensors = [TensorSpec(t["name"], tuple(t["shape"]), t["dtype"], t["nbytes"]) for t in data["tensors"]]
        self.moe_layers = [int(x) for x in data["moe_layers"]]
        self.n_experts = int(data["n_experts"])
        self.top_k = int(data["top_k"])
        self.expert_bytes = sum(t.nbytes for t in self.tensors)
        self.blobs = {}
        for layer, expert, offset, size, crc in data["blobs"]:
            self.blobs[(layer, expert)] = Blob(layer, expert, offset, size, crc)

    @property
    def config(self) -> dict:
        return self.data["config"]

    @property
    def n_routed(self) -> int:
        return len(self.moe_layers) * self.n_experts

    def blob(self, layer: int, expert: int) -> Blob:
        return self.blobs[(layer, expert)]

    @classmethod
    def load(cls, root) -> "Manifest":
        root = Path(root)
        f = root / MANIFEST
        if not f.exists():
            raise StoreError(f"{root} is not a workbench store (no {MANIFEST}); create one with `workbench pack MODEL_DIR {root}`")
        try:
            data = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            raise StoreError(f"{f} is corrupt ({e}); delete {root} and pack the model again") from None
        if data.get("format") != FORMAT:
            raise StoreError(f"{root} has store format {data.get('format')!r}, expected {FORMAT!r}; pack the model again")
        m = cls(data, root)
        m.check_files()
        return m

    def check_files(self) -> None:
        for name in (EXPERTS, RESIDENT):
            if not (self.root / name).exists():
                raise StoreError(f"store {self.root} is missing {name}; delete it and pack the model again")
        size = (self.root / EXPERTS).stat().st_size
        if size < self.data["experts_file_size"]:
            raise StoreError(
                f"store {self.root} is truncated: {EXPERTS} has {size} bytes, manifest expects "
                f"{self.data['experts_file_size']}; delete it and pack the model again"
            )
