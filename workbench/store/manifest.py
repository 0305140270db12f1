"""The expert store on disk: ``manifest.json``, ``experts.bin``, ``resident.safetensors``.

experts.bin holds one contiguous blob per (layer, expert): that expert's tensors
(e.g. gate_proj.weight, .scales, .biases, up_proj..., down_proj...) back to back,
each blob starting at a multiple of ``alignment`` (16 KiB).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..checks import is_whole, json_kind, read_json

try:  # zlib's CRC-32, computed about 14x faster (2.6 MB: 45 us against 617; bench/RESULTS.md, "checksums")
    from zlib_ng.zlib_ng import crc32
except ImportError:  # a platform without its wheels: zlib's own
    from zlib import crc32

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


# bytes per element of every dtype a store may hold (the arena allocates these)
DTYPE_BYTES = {"uint32": 4, "uint8": 1, "float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "int32": 4, "uint16": 2}
REPACK = "delete the store and pack the model again"


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
    def load(cls, root, check_resident: bool = True) -> "Manifest":
        """Read and validate ``root/manifest.json`` against its config and the files' real sizes,
        before anything is allocated; ``check_resident`` also verifies resident.safetensors' crc32."""
        root = Path(root)
        f = root / MANIFEST
        if not f.exists():
            raise StoreError(f"{root} is not a workbench store (no {MANIFEST}); create one with `workbench pack MODEL_DIR {root}`")
        try:
            data = read_json(f"store {root}:", f, fix=REPACK)  # a FIFO or /dev/zero in its place is refused
        except ValueError as e:
            raise StoreError(str(e)) from None
        if not isinstance(data, dict):
            raise StoreError(f"{f} is corrupt (a JSON {json_kind(data)}, not an object); {REPACK}")
        if data.get("format") != FORMAT:
            raise StoreError(f"{root} has store format {data.get('format')!r}, expected {FORMAT!r}; pack the model again")
        validate(data, f)
        m = cls(data, root)
        m.check_model()
        m.check_files()
        if check_resident:
            m.check_resident()
        return m

    def check_files(self) -> None:
        for name in (EXPERTS, RESIDENT):
            p = self.root / name
            if not p.exists():
                raise StoreError(f"store {self.root} is missing {name}; delete it and pack the model again")
            if not p.is_file():
                raise StoreError(f"store {self.root}: {name} is not a regular file; {REPACK}")
        size = (self.root / EXPERTS).stat().st_size
        if size < self.data["experts_file_size"]:
            raise StoreError(
                f"store {self.root} is truncated: {EXPERTS} has {size} bytes, manifest expects "
                f"{self.data['experts_file_size']}; delete it and pack the model again"
            )

    def check_model(self) -> None:
        """The per-expert tensors must be exactly those of the model the config builds (lazily:
        nothing is allocated), so a crafted shape cannot size the arena."""
        from ..model import ModelError, build_model, expert_modules

        where = self.root / MANIFEST
        try:
            model = build_model(self.config, self.data.get("quantized") or None)
            experts = expert_modules(model)
        except (ModelError, ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
            raise StoreError(f"{where}: its config does not build a model ({e}); {REPACK}") from None
        if sorted(experts) != self.moe_layers:
            raise StoreError(f"{where}: moe_layers {self.moe_layers[:8]} differ from the model's {sorted(experts)[:8]}; {REPACK}")
        from mlx.utils import tree_flatten

        want = []
        for name, a in tree_flatten(experts[self.moe_layers[0]][1].parameters()):
            if a.shape[0] != self.n_experts:
                raise StoreError(f"{where}: n_experts {self.n_experts} differs from the model's {a.shape[0]}; {REPACK}")
            want.append((name, tuple(a.shape[1:]), _kind(str(a.dtype).split(".")[-1])))
        have = [(t.name, t.shape, _kind(t.dtype)) for t in self.tensors]  # float width is the checkpoint's
        if want != have:
            bad = next((h, w) for h, w in zip(have + [None] * len(want), want + [None] * len(have)) if h != w)
            raise StoreError(f"{where}: expert tensor {bad[0]} does not match the model's {bad[1]}; {REPACK}")

    def check_resident(self) -> None:
        """crc32 of resident.safetensors against the manifest (stores packed before the
        checksum existed are accepted with a warning)."""
        p = self.root / RESIDENT
        want = self.data.get("resident_crc32")
        size = p.stat().st_size
        if want is None:
            import warnings

            warnings.warn(f"store {self.root} predates resident checksums: {RESIDENT} is not verified; "
                          "pack the model again to verify it", stacklevel=3)
            return
        if size != self.data.get("resident_size"):
            raise StoreError(f"store {self.root}: {RESIDENT} does not match the manifest ({size} bytes, "
                             f"expected {self.data.get('resident_size')}); {REPACK}")
        if file_crc32(p) != want:
            raise StoreError(f"checksum mismatch in {p} (manifest crc32 {want:08x}); the store is corrupt: {REPACK}")


def _kind(dtype: str) -> str:
    return "float" if "float" in dtype else dtype


def file_crc32(path, chunk: int = 16 << 20) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = crc32(block, crc)
    return crc


def validate(data: dict, where) -> None:
    """Types, ranges and consistency of every manifest field the engine trusts (no file access)."""
    from ..model import ModelError, config_hash, top_k_of, validate_config

    def bad(msg):
        raise StoreError(f"{where}: {msg}; {REPACK}")

    def need_int(key, lo, hi=None, v=None):
        v = data.get(key) if v is None else v
        if not is_whole(v) or v < lo or (hi is not None and v > hi):
            bad(f"{key} is {v!r}, expected a whole number in [{lo}, {'inf' if hi is None else hi}]")
        return v

    for key in ("config", "tensors", "blobs", "moe_layers", "n_experts", "top_k", "n_layers", "experts_file_size",
                "config_hash", "model_type"):
        if key not in data:
            bad(f"field {key!r} is missing")
    if not isinstance(data["config"], dict):
        bad(f"config is a {json_kind(data['config'])}, not an object")
    try:
        cfg = validate_config(data["config"], f"{where} (config)")
    except ModelError as e:
        raise StoreError(f"{e}") from None
    if data["config_hash"] != config_hash(data["config"]):
        bad("its config does not match config_hash (edited?)")
    if data["model_type"] != cfg["model_type"]:
        bad(f"model_type {data['model_type']!r} differs from the config's {cfg['model_type']!r}")
    declared = cfg.get("num_hidden_layers")
    n_layers = need_int("n_layers", 1, (declared if is_whole(declared) else 1024) + 1)
    n_experts = need_int("n_experts", 1, 1 << 15)
    top_k = need_int("top_k", 1, n_experts)
    try:
        if top_k != top_k_of(cfg):
            bad(f"top_k {top_k} differs from the config's {top_k_of(cfg)}")
    except ModelError as e:
        bad(str(e))
    layers = data["moe_layers"]
    if not isinstance(layers, list) or not layers or not all(is_whole(x) and 0 <= x < n_layers for x in layers) \
            or layers != sorted(set(layers)):
        bad(f"moe_layers must be a sorted non-empty list of distinct layer ids in [0, {n_layers})")
    q = data.get("quantized")
    if q is not None and not (isinstance(q, dict) and all(
            isinstance(v, dict) and is_whole(v.get("group_size")) and is_whole(v.get("bits")) for v in q.values())):
        bad("quantized must map module paths to {group_size, bits}")
    tensors = data["tensors"]
    if not isinstance(tensors, list) or not tensors:
        bad("tensors must be a non-empty list")
    names = set()
    for i, t in enumerate(tensors):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or t["name"] in names:
            bad(f"tensors[{i}] must be an object with a distinct name")
        names.add(t["name"])
        shape, dtype = t.get("shape"), t.get("dtype")
        if not isinstance(shape, list) or not shape or not all(is_whole(d) and 1 <= d <= 1 << 24 for d in shape):
            bad(f"tensors[{i}] ({t['name']}) shape {shape!r} must be a list of whole numbers in [1, 2^24]")
        if dtype not in DTYPE_BYTES:
            bad(f"tensors[{i}] ({t['name']}) dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        if t.get("nbytes") != n:
            bad(f"tensors[{i}] ({t['name']}) nbytes {t.get('nbytes')!r} != {n} (shape {shape} x {dtype})")
    expert_bytes = sum(t["nbytes"] for t in tensors)
    file_size = need_int("experts_file_size", expert_bytes)
    blobs = data["blobs"]
    if not isinstance(blobs, list) or len(blobs) != len(layers) * n_experts:
        bad(f"blobs must list one entry per (layer, expert): {len(layers) * n_experts}, "
            f"found {len(blobs) if isinstance(blobs, list) else 'a JSON ' + json_kind(blobs)}")
    seen, extents = set(), []
    lset = set(layers)
    for i, b in enumerate(blobs):
        if not (isinstance(b, list) and len(b) == 5 and all(is_whole(x) for x in b)):
            bad(f"blobs[{i}] must be [layer, expert, offset, size, crc32] of whole numbers, got {b!r}"[:300])
        layer, expert, offset, size, crc = b
        if layer not in lset or not 0 <= expert < n_experts or (layer, expert) in seen:
            bad(f"blobs[{i}] names layer {layer} expert {expert}: not a MoE layer/expert, or listed twice")
        seen.add((layer, expert))
        if size != expert_bytes:
            bad(f"blobs[{i}] size {size} != the tensors' {expert_bytes} bytes")
        if not 0 <= offset <= file_size - size:
            bad(f"blobs[{i}] extent [{offset}, {offset + size}) lies outside experts.bin's {file_size} bytes")
        if not 0 <= crc < 1 << 32:
            bad(f"blobs[{i}] crc32 {crc} is not a 32-bit value")
        extents.append((offset, i))
    extents.sort()
    for (a, i), (b, j) in zip(extents, extents[1:]):
        if b < a + expert_bytes:
            bad(f"blobs[{i}] and blobs[{j}] overlap in experts.bin (offsets {a} and {b}, {expert_bytes} bytes each)")
    if "resident_crc32" in data:
        need_int("resident_crc32", 0, (1 << 32) - 1)
        need_int("resident_size", 0)
