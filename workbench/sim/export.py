"""Export a trace's request stream for other tools: libCacheSim oracleGeneral binary and CSV.

Request stream: one request per routed expert in trace order (rows as stored, ``selected``
left to right); object id = ``layer * n_experts + expert``; time = the decode step (0 is
the prefill pass).

oracleGeneral (libCacheSim's binary format, 24 bytes per request, little endian, packed)::

    u32 time      decode step
    u64 obj_id    layer * n_experts + expert
    u32 obj_size  expert blob bytes (the trace's expert_bytes, or ``size=``)
    i64 next      index (0-based request number) of this object's next request, -1 if none

libCacheSim reads it with ``TraceType.ORACLE_GENERAL_TRACE`` (it turns -1 into "never").
With a uniform ``obj_size`` S, a libCacheSim cache of ``N * S`` bytes holds exactly N
experts (object metadata is not counted unless asked for), which is what the
crosscheck tests use. CSV has a header ``time,obj_id,obj_size,next_access_vtime,layer,
expert,phase``; in libCacheSim's CSV reader the first four are columns 1..4.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..fsutil import atomic_write
from .requests import load, next_use, requests_from_trace, select_rows

__all__ = ["ORACLE_GENERAL", "FORMATS", "request_frame", "export_oraclegeneral", "read_oraclegeneral", "export_csv", "export"]

ORACLE_GENERAL = np.dtype([("time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"), ("next_access_vtime", "<i8")])
assert ORACLE_GENERAL.itemsize == 24
FORMATS = ("oraclegeneral", "csv")


def request_frame(trace, size=None, phase=None) -> pd.DataFrame:
    """One row per request: time, obj_id, obj_size, next_access_vtime, layer, expert, phase."""
    tr = load(trace)
    req = requests_from_trace(tr, phase=phase)
    obj_size = _size(tr, size)
    if len(req.step) and (req.step.min() < 0 or req.step.max() >= 2**32):
        raise ValueError("trace steps must fit in u32 (0 .. 4294967295) for export")
    phase_col = select_rows(tr, phase)["phase"].to_numpy()
    return pd.DataFrame({
        "time": req.step.astype(np.uint32),
        "obj_id": req.keys.astype(np.uint64),
        "obj_size": np.full(len(req.keys), obj_size, dtype=np.uint32),
        "next_access_vtime": next_use(req.keys),
        "layer": req.layer,
        "expert": req.expert,
        "phase": phase_col[req.row],
    })


def _size(tr, size) -> int:
    s = size if size is not None else (tr.meta.get("expert_bytes") or 1)
    s = int(s)
    if not 1 <= s < 2**32:
        raise ValueError(f"object size must be in 1 .. 2^32-1 bytes for oracleGeneral, got {s}; pass size=")
    return s


def export_oraclegeneral(trace, out, size=None, phase=None) -> int:
    """Write the oracleGeneral binary to ``out``; returns the number of requests."""
    df = request_frame(trace, size=size, phase=phase)
    arr = np.empty(len(df), dtype=ORACLE_GENERAL)
    for name in ORACLE_GENERAL.names:
        arr[name] = df[name].to_numpy()
    atomic_write(Path(out), lambda tmp: arr.tofile(tmp))
    return len(arr)


def read_oraclegeneral(path) -> pd.DataFrame:
    """Read an oracleGeneral binary back: columns time, obj_id, obj_size, next_access_vtime."""
    path = Path(path)
    n = path.stat().st_size
    if n % ORACLE_GENERAL.itemsize:
        raise ValueError(f"{path} is {n} bytes, not a multiple of 24: not an oracleGeneral trace")
    return pd.DataFrame(np.fromfile(path, dtype=ORACLE_GENERAL))


def export_csv(trace, out, size=None, phase=None) -> int:
    """Write the request stream as CSV with a header; returns the number of requests."""
    df = request_frame(trace, size=size, phase=phase)
    atomic_write(Path(out), lambda tmp: df.to_csv(tmp, index=False))
    return len(df)


def export(trace, fmt: str, out, size=None, phase=None) -> int:
    """Export in ``fmt`` ('oraclegeneral' or 'csv'); returns the number of requests."""
    fmt = fmt.lower().replace("_", "").replace("-", "")
    if fmt == "oraclegeneral":
        return export_oraclegeneral(trace, out, size=size, phase=phase)
    if fmt == "csv":
        return export_csv(trace, out, size=size, phase=phase)
    raise ValueError(f"unknown export format {fmt!r}; valid formats: {', '.join(FORMATS)}")
