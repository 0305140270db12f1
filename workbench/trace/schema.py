"""Trace format: Parquet, one row per (token, layer) of a MoE layer.

A trace ``run.parquet`` holds the routing table below; its key/value metadata
(``workbench`` key, JSON) holds the model shape. I/O events, when recorded, go
to the sibling file ``run.io.parquet`` (see ``IO_COLUMNS``).

Routing columns
  step        int32   decode step (0 = the prefill pass, then 1, 2, ...)
  token       int32   position of the token in the sequence
  phase       string  "prefill" or "decode"
  layer       int16   model layer index (only layers with routed experts)
  selected    list<int16>    routed expert ids, ordered by gate weight (strongest first)
  weights     list<float32>  gate weights of ``selected``, as the model applies them
  logits      list<float16>  router logits over all experts (None if not recorded)
  resident    list<int16>    published resident experts of this layer before routing
  moe_input   list<float16>  MoE block input vector (optional, for lookahead analysis)
  pred_<src>  list<int16>    predictor candidates by source (optional), best first

I/O event columns (run.io.parquet)
  step int32, layer int16, expert int16, slot int32, kind string
  (submit|done|cancel|hit|miss|evict), speculative bool, bytes int64, t_ns int64

Metadata (JSON under key b"workbench"): model_type, n_layers, n_experts, top_k,
moe_layers (list of layer ids), expert_bytes (bytes per expert blob), hidden_size,
config_hash, workbench_version, and anything the recorder adds (policy, arena...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..checks import is_whole, json_kind
from ..fsutil import atomic_write

META_KEY = b"workbench"

ROUTE_FIELDS = [
    pa.field("step", pa.int32()),
    pa.field("token", pa.int32()),
    pa.field("phase", pa.string()),
    pa.field("layer", pa.int16()),
    pa.field("selected", pa.list_(pa.int16())),
    pa.field("weights", pa.list_(pa.float32())),
    pa.field("logits", pa.list_(pa.float16())),
    pa.field("resident", pa.list_(pa.int16())),
]
OPTIONAL_FIELDS = {"moe_input": pa.list_(pa.float16())}  # plus pred_<src>: list<int16>

IO_FIELDS = [
    pa.field("step", pa.int32()),
    pa.field("layer", pa.int16()),
    pa.field("expert", pa.int16()),
    pa.field("slot", pa.int32()),
    pa.field("kind", pa.string()),
    pa.field("speculative", pa.bool_()),
    pa.field("bytes", pa.int64()),
    pa.field("t_ns", pa.int64()),
]
IO_COLUMNS = [f.name for f in IO_FIELDS]
REQUIRED_META = ("n_layers", "n_experts", "top_k", "moe_layers")


class TraceError(ValueError):
    """A trace file is missing, unreadable or not a workbench trace."""


def io_path(path) -> Path:
    p = Path(path)
    return p.with_name(p.name[: -len(".parquet")] + ".io.parquet") if p.name.endswith(".parquet") else p.with_name(p.name + ".io.parquet")


@dataclass
class Trace:
    """A loaded trace: ``routes`` (pandas DataFrame), ``io`` (DataFrame or None), ``meta`` (dict)."""

    routes: "object"
    meta: dict
    io: "object" = None
    path: Path | None = field(default=None)

    @property
    def n_experts(self) -> int:
        return int(self.meta["n_experts"])

    @property
    def top_k(self) -> int:
        return int(self.meta["top_k"])

    @property
    def moe_layers(self) -> list[int]:
        return [int(x) for x in self.meta["moe_layers"]]

    def decode(self):
        """Only the decode rows."""
        return self.routes[self.routes["phase"] == "decode"]


def read_trace(path) -> Trace:
    """Read a workbench trace; a malformed file raises TraceError naming the problem."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise TraceError(f"trace {path} does not exist; record one with `workbench run ... --trace {path}`")
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for bad files
        raise TraceError(f"trace {path} is not a readable Parquet file ({e}); re-record it") from None
    where = f"trace {path}"
    meta = trace_meta(table.schema.metadata, where)
    cols = [f.name for f in ROUTE_FIELDS if f.name not in table.column_names and f.name != "logits"]
    if cols:
        raise TraceError(f"{where} is malformed: missing columns {cols}; re-record it")
    check_columns(table, meta, where)
    io = None
    ip = io_path(path)
    if ip.exists():
        try:
            io_table = pq.read_table(ip)
        except Exception as e:
            raise TraceError(f"I/O table {ip} is not a readable Parquet file ({e}); re-record the trace or delete it") from None
        missing = [c for c in IO_COLUMNS if c not in io_table.column_names]
        if missing:
            raise TraceError(f"I/O table {ip} lacks columns {missing}; re-record the trace or delete it")
        io = io_table.to_pandas()
    return Trace(routes=table.to_pandas(), meta=meta, io=io, path=path)


MAX_EXPERTS = 1 << 15  # expert and layer ids are int16 in the trace


def trace_meta(metadata, where: str) -> dict:
    """The workbench metadata of a Parquet footer's ``metadata`` (bytes to bytes), parsed and checked;
    TraceError naming ``where`` (``trace PATH``) and the fix otherwise."""
    raw = (metadata or {}).get(META_KEY)
    if raw is None:
        raise TraceError(f"{where} has no workbench metadata; it was not written by `workbench run --trace`")
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise TraceError(f"{where} metadata is not valid JSON ({e}); re-record it") from None
    check_meta(meta, where)
    return meta


def check_meta(meta, where: str) -> None:
    """The metadata fields readers size things by: types and ranges (TraceError otherwise)."""
    def bad(msg):
        raise TraceError(f"{where} metadata: {msg}; re-record the trace")

    if not isinstance(meta, dict):
        bad(f"a JSON {json_kind(meta)}, not an object")
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        bad(f"missing {missing}")
    n_experts = meta["n_experts"]
    if not is_whole(n_experts) or not 1 <= n_experts <= MAX_EXPERTS:
        bad(f"n_experts is {n_experts!r}, expected a whole number in [1, {MAX_EXPERTS}]")
    if not is_whole(meta["top_k"]) or not 1 <= meta["top_k"] <= n_experts:
        bad(f"top_k is {meta['top_k']!r}, expected a whole number in [1, n_experts={n_experts}]")
    if not is_whole(meta["n_layers"]) or not 1 <= meta["n_layers"] <= MAX_EXPERTS:
        bad(f"n_layers is {meta['n_layers']!r}, expected a whole number in [1, {MAX_EXPERTS}]")
    layers = meta["moe_layers"]
    if not isinstance(layers, list) or not layers or not all(is_whole(x) and 0 <= x < MAX_EXPERTS for x in layers) \
            or len(set(layers)) != len(layers):
        bad(f"moe_layers must be a non-empty list of distinct layer ids in [0, {MAX_EXPERTS})")
    for key in ("expert_bytes",):
        v = meta.get(key)
        if v is not None and (not is_whole(v) or v < 1):
            bad(f"{key} is {v!r}, expected a whole number >= 1")
    if meta.get("stats") is not None and not isinstance(meta["stats"], dict):
        bad(f"stats is a {json_kind(meta['stats'])}, expected an object")


def check_columns(table, meta: dict, where: str) -> None:
    """Column types, no null selections, expert ids in [0, n_experts), layers in moe_layers."""
    import pyarrow.compute as pc

    def bad(msg):
        raise TraceError(f"{where}: {msg}; the trace is corrupt, re-record it")

    n_experts = meta["n_experts"]
    for name in ("step", "token", "layer"):
        if not pa.types.is_integer(table.schema.field(name).type):
            bad(f"column {name!r} has type {table.schema.field(name).type}, expected integers")
    if not pa.types.is_string(table.schema.field("phase").type) and not pa.types.is_large_string(table.schema.field("phase").type):
        bad(f"column 'phase' has type {table.schema.field('phase').type}, expected strings")
    id_cols = ["selected", "resident"] + [n for n in table.column_names if n.startswith("pred_")]
    for name in id_cols:
        if name not in table.column_names:
            continue
        t = table.schema.field(name).type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_integer(t.value_type):
            bad(f"column {name!r} has type {t}, expected a list of expert ids (list<int16>)")
        col = table.column(name)
        if name == "selected" and col.null_count:
            row = pc.index(pc.is_null(col), True).as_py()
            bad(f"row {row} has no selected experts (null)")
        flat = pc.list_flatten(col)
        if flat.null_count:
            bad(f"column {name!r} holds a null expert id")
        if len(flat):
            lo, hi = pc.min_max(flat).values()
            if lo.as_py() < 0 or hi.as_py() >= n_experts:
                e = lo.as_py() if lo.as_py() < 0 else hi.as_py()
                bad(f"column {name!r} routes expert {e}, outside 0..{n_experts - 1} (n_experts={n_experts})")
    layers = pc.unique(table.column("layer")).to_pylist()
    unknown = sorted(set(layers) - set(meta["moe_layers"]), key=lambda x: (x is None, x))
    if unknown:
        bad(f"rows name layers {unknown[:5]} not in its moe_layers metadata {meta['moe_layers'][:8]}")
    phases = set(pc.unique(table.column("phase")).to_pylist()) - {"prefill", "decode"}
    if phases:
        bad(f"column 'phase' holds {sorted(map(str, phases))[:3]}, expected prefill or decode")


def write_trace(path, rows: dict, meta: dict, io_rows: dict | None = None) -> None:
    """Write columns ``rows`` (name -> list, or a 2-D numpy array for a list column: one row each)
    atomically (temp file + rename)."""
    path = Path(path)
    fields = list(ROUTE_FIELDS)
    for name in rows:
        if name in OPTIONAL_FIELDS:
            fields.append(pa.field(name, OPTIONAL_FIELDS[name]))
        elif name.startswith("pred_"):
            fields.append(pa.field(name, pa.list_(pa.int16())))
    schema = pa.schema(fields, metadata={META_KEY: json.dumps(meta).encode()})
    table = pa.table({f.name: _column(rows.get(f.name, [None] * len(rows["step"])), f.type) for f in fields},
                     schema=schema)
    atomic_write(path, lambda tmp: _write(table, tmp))
    if io_rows is not None:
        io_table = pa.table({f.name: io_rows[f.name] for f in IO_FIELDS}, schema=pa.schema(IO_FIELDS))
        atomic_write(io_path(path), lambda tmp: _write(io_table, tmp))


def _column(values, type):
    """A 2-D array as a list column without a Python object per row; anything else as it is."""
    if isinstance(values, np.ndarray) and values.ndim == 2 and pa.types.is_list(type):
        rows, width = values.shape
        flat = pa.array(np.ascontiguousarray(values).reshape(-1), type.value_type)
        return pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * width), flat)
    return values


def _write(table, tmp) -> None:
    """Parquet, with a dictionary and min/max statistics for the columns of ids and names only: on
    columns of floats they help no reader and cost most of the write (about 3x its time on a trace
    with MoE inputs, bench/RESULTS.md)."""
    import pyarrow.parquet as pq

    coded = [f.name for f in table.schema if not _floats(f.type)]
    pq.write_table(table, tmp, use_dictionary=coded, write_statistics=coded)


def _floats(t) -> bool:
    return pa.types.is_floating(t.value_type if pa.types.is_list(t) else t)

