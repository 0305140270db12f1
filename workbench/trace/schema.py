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

import pyarrow as pa

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
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise TraceError(f"trace {path} has no workbench metadata; it was not written by `workbench run --trace`")
    meta = json.loads(raw)
    missing = [k for k in REQUIRED_META if k not in meta]
    cols = [f.name for f in ROUTE_FIELDS if f.name not in table.column_names and f.name != "logits"]
    if missing or cols:
        raise TraceError(f"trace {path} is malformed: missing metadata {missing} / columns {cols}; re-record it")
    io = None
    ip = io_path(path)
    if ip.exists():
        io = pq.read_table(ip).to_pandas()
    return Trace(routes=table.to_pandas(), meta=meta, io=io, path=path)


def write_trace(path, rows: dict, meta: dict, io_rows: dict | None = None) -> None:
    """Write columns ``rows`` (name -> list) atomically (temp file + rename)."""
    import pyarrow.parquet as pq

    path = Path(path)
    fields = list(ROUTE_FIELDS)
    for name in rows:
        if name in OPTIONAL_FIELDS:
            fields.append(pa.field(name, OPTIONAL_FIELDS[name]))
        elif name.startswith("pred_"):
            fields.append(pa.field(name, pa.list_(pa.int16())))
    schema = pa.schema(fields, metadata={META_KEY: json.dumps(meta).encode()})
    table = pa.table({f.name: rows.get(f.name, [None] * len(rows["step"])) for f in fields}, schema=schema)
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    if io_rows is not None:
        io_table = pa.table({f.name: io_rows[f.name] for f in IO_FIELDS}, schema=pa.schema(IO_FIELDS))
        atomic_write(io_path(path), lambda tmp: pq.write_table(io_table, tmp))


def atomic_write(path: Path, write) -> None:
    """Call ``write(tmp)`` on a temp file beside ``path``, then rename it into place."""
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
