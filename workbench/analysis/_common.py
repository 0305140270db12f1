"""Shared helpers for the analyses: trace access, list columns, dequantization, mlx-lm models.

Where a family keeps its router and experts is ``workbench.families``; the rest lives here so each
analysis file reads as the measurement itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.trace.schema import Trace, read_trace


# --------------------------------------------------------------------------- traces
def as_trace(trace: Any, meta: dict | None = None) -> Trace:
    """Accept a Trace, a path to a trace, or a routes DataFrame (+ ``meta``); return a Trace."""
    if isinstance(trace, Trace):
        return trace
    if isinstance(trace, (str, Path)):
        return read_trace(trace)
    if isinstance(trace, pd.DataFrame):
        meta = dict(meta or {})
        if "top_k" not in meta and "selected" in trace.columns and len(trace):
            meta["top_k"] = len(trace["selected"].iloc[0])
        if "moe_layers" not in meta and "layer" in trace.columns:
            meta["moe_layers"] = sorted(int(x) for x in trace["layer"].unique())
        return Trace(routes=trace, meta=meta)
    raise TypeError(
        f"expected a Trace, a trace path or a routes DataFrame, got {type(trace).__name__}; "
        "load one with workbench.trace.schema.read_trace(path)"
    )


def phase_rows(trace: Trace, phase: str | None) -> pd.DataFrame:
    """Rows of one phase ("decode", "prefill") or all rows (phase None / "all")."""
    df = trace.routes
    if phase in (None, "all"):
        return df
    if phase not in ("decode", "prefill"):
        raise ValueError(f"phase must be 'decode', 'prefill' or 'all', got {phase!r}")
    return df[df["phase"] == phase]


RECORD_FLAG = {"moe_input": "--trace-moe-input"}  # the `workbench run` flag that records a trace column


def _how_to_record(cols) -> str:
    flags = " ".join(dict.fromkeys(RECORD_FLAG[c] for c in cols if c in RECORD_FLAG))
    return f"record it again: workbench run ... --trace FILE {flags}".rstrip()


def require_columns(df: pd.DataFrame, cols, what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{what} needs trace columns {missing}, which this trace lacks; {_how_to_record(missing)}")
    for c in cols:
        if len(df) and df[c].isna().all():
            raise ValueError(f"{what} needs trace column {c!r}, but it is empty (None) in every row; "
                             f"{_how_to_record([c])}")


def list_column(series: pd.Series, dtype=np.float32, width: int | None = None, name: str = "") -> np.ndarray:
    """Stack a list column into an [N, width] array; ragged or missing entries raise ValueError."""
    vals = series.to_numpy()
    if len(vals) == 0:
        return np.zeros((0, width or 0), dtype=dtype)
    if any(v is None for v in vals):
        raise ValueError(f"column {name or series.name!r} has missing (None) entries; re-record the trace with it on")
    lens = {len(v) for v in vals}
    if len(lens) != 1:
        raise ValueError(f"column {name or series.name!r} has rows of different lengths {sorted(lens)[:5]}; expected one width")
    out = np.stack([np.asarray(v) for v in vals]).astype(dtype, copy=False)
    if width is not None and out.shape[1] != width:
        raise ValueError(f"column {name or series.name!r} has width {out.shape[1]}, expected {width}")
    return out


def ragged_sets(series: pd.Series) -> list[np.ndarray]:
    """A list column as a list of int arrays (ragged allowed, None -> empty)."""
    return [np.asarray(v, dtype=np.int64) if v is not None else np.zeros(0, np.int64) for v in series.to_numpy()]


def membership(ids: np.ndarray, n_experts: int) -> np.ndarray:
    """[N, k] expert ids -> [N, E] boolean mask (ids < 0 are ignored)."""
    n = ids.shape[0]
    mask = np.zeros((n, n_experts), dtype=bool)
    rows = np.repeat(np.arange(n), ids.shape[1])
    flat = ids.reshape(-1)
    ok = flat >= 0
    if flat.size and flat[ok].max(initial=-1) >= n_experts:
        raise ValueError(f"expert id {int(flat.max())} >= n_experts {n_experts}; pass the right n_experts")
    mask[rows[ok], flat[ok]] = True
    return mask


def top_ids(scores: np.ndarray, k: int) -> np.ndarray:
    """Top-k column indices of each row, best first (ties broken by lower id)."""
    n, e = scores.shape
    k = min(k, e)
    # stable sort on -score keeps lower ids first among ties
    order = np.argsort(-scores, axis=1, kind="stable")
    return order[:, :k]


# --------------------------------------------------------------------------- dequantization
@dataclass
class QuantizedTensor:
    """A quantized weight as stored by MLX: packed ``weight`` + ``scales`` (+ ``biases``).

    Leading axis is the expert axis for expert tensors ([E, out, in_packed]).
    """

    weight: Any
    scales: Any
    biases: Any = None
    group_size: int = 64
    bits: int = 4
    mode: str = "affine"

    @property
    def n(self) -> int:
        return int(self.weight.shape[0])

    def dequantize(self, start: int | None = None, stop: int | None = None) -> np.ndarray:
        import mlx.core as mx

        sl = slice(start, stop)
        w = mx.array(self.weight)[sl]
        s = mx.array(self.scales)[sl]
        b = None if self.biases is None else mx.array(self.biases)[sl]
        out = mx.dequantize(w, s, b, group_size=self.group_size, bits=self.bits, mode=self.mode)
        return np.array(out.astype(mx.float32))


def dequantize(weight, scales, biases=None, group_size: int = 64, bits: int = 4, mode: str = "affine") -> np.ndarray:
    """Dequantize an MLX-quantized matrix (any leading dims) to float32 numpy via mlx.core.dequantize."""
    return QuantizedTensor(weight, scales, biases, group_size, bits, mode).dequantize()


def to_numpy(x, start: int | None = None, stop: int | None = None) -> np.ndarray:
    """numpy / mlx array / QuantizedTensor / dict(weight, scales, ...) -> float32 numpy (rows start:stop)."""
    if isinstance(x, dict) and "scales" in x:
        x = QuantizedTensor(**{k: v for k, v in x.items() if k in QuantizedTensor.__dataclass_fields__})
    if isinstance(x, QuantizedTensor):
        return x.dequantize(start, stop)
    if type(x).__module__.startswith("mlx"):
        from ..arrays import to_numpy as mlx_to_numpy

        return mlx_to_numpy(x[start:stop])
    return np.asarray(x[start:stop], dtype=np.float32)


def leading_dim(x) -> int:
    if isinstance(x, dict) and "weight" in x:
        return int(x["weight"].shape[0])
    if isinstance(x, QuantizedTensor):
        return x.n
    return int(x.shape[0])


# --------------------------------------------------------------------------- mlx-lm models
def module_weight(mod) -> tuple[np.ndarray, np.ndarray | None]:
    """Float32 (weight [out, in], bias [out] or None) of a Linear / QuantizedLinear / gate module."""
    import mlx.core as mx

    w = mod.weight
    if hasattr(mod, "scales"):
        w = QuantizedTensor(w, mod.scales, getattr(mod, "biases", None), mod.group_size, mod.bits,
                            getattr(mod, "mode", "affine")).dequantize()
    else:
        w = np.array(w.astype(mx.float32))
    b = getattr(mod, "bias", None) if "bias" in mod else None
    b = None if b is None else np.array(b.astype(mx.float32))
    return w, b


def load_mlx_model(model_dir):
    """Load an mlx-lm model from a local directory (no tokenizer, no download)."""
    from mlx_lm.utils import load_model

    p = Path(model_dir)
    if not (p / "config.json").exists():
        raise ValueError(f"{p} is not an mlx-lm model directory (no config.json); pass --model DIR of a converted model")
    model, _ = load_model(p)
    return model
