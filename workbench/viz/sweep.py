"""Heatmaps of a sweep dataset (``workbench.sim.sweep.load_sweep``): a metric over policy x arena,
one slice of the other axes (predictor, workload, gate, distance) at a time."""

from __future__ import annotations

import altair as alt
import pandas as pd

from .charts import _title

METRICS = {
    "sync_misses": "sync misses",
    "bytes_per_token": "bytes per token",
    "hit_rate": "hit rate",
    "s_per_token": "seconds per token (virtual)",
    "stall_s": "stall seconds (virtual)",
}
SLICE_AXES = ("kind", "workload", "predictor", "gate", "distance")


def axis_values(df: pd.DataFrame, axis: str) -> list:
    """The values of one slicing axis, in a stable order ('none' first)."""
    vals = sorted({str(v) for v in df[axis].tolist()}, key=lambda v: (v != "none", v))
    return vals


def sweep_slice(df: pd.DataFrame, metric: str, **where) -> pd.DataFrame:
    """policy, arena, slots, value, cells: ``metric`` over policy x arena for the rows matching
    ``where`` (axis=value; None keeps every value). Cells left with several rows per
    (policy, arena), e.g. several workloads, are averaged and counted in ``cells``."""
    if metric not in df.columns:
        raise ValueError(f"the sweep has no {metric!r} column (kind {sorted(set(df['kind']))}); "
                         f"columns: {', '.join(c for c in METRICS if c in df.columns)}")
    sel = df
    for axis, value in where.items():
        if axis not in SLICE_AXES:
            raise ValueError(f"cannot slice by {axis!r}; axes: {', '.join(SLICE_AXES)}")
        if value is not None:
            sel = sel[sel[axis].astype(str) == str(value)]
    if not len(sel):
        raise ValueError(f"no sweep cells match {where}")
    out = (sel.groupby(["policy", "arena"], as_index=False)
           .agg(value=(metric, "mean"), slots=("slots", "first"), cells=(metric, "size")))
    return out.sort_values(["slots", "policy"]).reset_index(drop=True)


def heatmap(table: pd.DataFrame, metric: str, title: str | None = None, subtitle=None) -> alt.LayerChart:
    """Rect heatmap of ``sweep_slice`` output: arena (by slots) across, policy down, value as colour and text."""
    label = METRICS.get(metric, metric)
    reverse = metric == "hit_rate"  # darker = worse for every metric
    table = table.assign(column=[f"{a} ({s} slots)" for a, s in zip(table["arena"], table["slots"])])
    lo, hi = table["value"].min(), table["value"].max()
    mid = (lo + hi) / 2
    table["dark"] = (table["value"] < mid) if reverse else (table["value"] > mid)
    order = table.drop_duplicates("column").sort_values("slots")["column"].tolist()
    base = alt.Chart(table).encode(x=alt.X("column:O", sort=order, title="arena", axis=alt.Axis(labelAngle=0)),
                                   y=alt.Y("policy:N", title="policy"))
    rect = base.mark_rect().encode(
        color=alt.Color("value:Q", title=label, scale=alt.Scale(scheme="orangered", reverse=reverse)),
        tooltip=["policy", "arena", "slots", alt.Tooltip("value:Q", title=label, format=",.4g"), "cells"])
    text = base.mark_text(fontSize=10).encode(text=alt.Text("value:Q", format=",.3~s"),
                                             color=alt.condition("datum.dark", alt.value("white"), alt.value("black")))
    return (rect + text).properties(title=_title(title or f"{label} by policy and arena", subtitle),
                                    width=max(160, 60 * len(order)), height=max(80, 26 * table["policy"].nunique()))


def slice_heatmap(df: pd.DataFrame, metric: str, **where) -> alt.LayerChart:
    """``heatmap(sweep_slice(...))`` with the slice named in the subtitle."""
    t = sweep_slice(df, metric, **where)
    named = ", ".join(f"{k} {v}" for k, v in where.items() if v is not None) or "all cells"
    sub = ["mean over the axes not fixed (cells per square in the tooltip)"] if t["cells"].max() > 1 else None
    return heatmap(t, metric, title=f"{METRICS.get(metric, metric)} by policy and arena: {named}", subtitle=sub)
