"""Gate distribution and drop-weakest error (DESIGN section 4).

``gate_by_slot``: mean normalized gate weight by slot (slot 1 = strongest) per layer. Each row's
weights are sorted strongest-first and divided by their sum, so the slots of a row add up to 1.

``drop_weakest_error``: relative L2 error of the routed MoE output when the weakest m experts of
each token (m = 1 .. k-1) are dropped, by re-running the experts on the recorded MoE inputs:

    y      = sum_j w_j y_j                           (all k selected experts, trace weights)
    y_drop = sum_{j kept} w_j y_j                    (renorm=False: the missing experts just vanish)
    y_drop = sum_{j kept} w_j y_j * sum_j w_j / sum_{j kept} w_j   (renorm=True)
    error  = ||y - y_drop|| / ||y||                  (per token, then mean / median over tokens)

Only the routed part is measured; pass ``shared_output(layer, x)`` to add shared experts (they
are never dropped, so they shrink the relative error). Works with any model through
``expert_outputs(layer, x [N, D], ids [N, k]) -> [N, k, D]``; ``mlx_expert_outputs(model)``
builds it for mlx-lm models from ``layer.mlp.switch_mlp``.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import pandas as pd

from ..families import expert_module, moe_blocks
from ._common import as_trace, list_column, phase_rows, require_columns

ExpertOutputs = Callable[[int, np.ndarray, np.ndarray], np.ndarray]


def _sorted_weights(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(ids, weights) with each row ordered strongest-first (stable, so trace order breaks ties)."""
    ids = list_column(rows["selected"], np.int64, name="selected")
    w = list_column(rows["weights"], np.float32, name="weights")
    if ids.shape != w.shape:
        raise ValueError(f"selected {ids.shape} and weights {w.shape} differ in shape; the trace is malformed")
    order = np.argsort(-w, axis=1, kind="stable")
    return np.take_along_axis(ids, order, 1), np.take_along_axis(w, order, 1)


def gate_by_slot(trace, phase: str | None = "decode", normalize: bool = True) -> pd.DataFrame:
    """Per (layer, slot): mean (normalized) gate weight, its std, n tokens. Slot 1 = strongest."""
    tr = as_trace(trace)
    rows = phase_rows(tr, phase)
    require_columns(rows, ["selected", "weights"], "gate distribution")
    if rows.empty:
        raise ValueError(f"trace has no {phase} rows; pass phase='all'")
    out = []
    for l, grp in rows.groupby("layer", sort=True):
        _, w = _sorted_weights(grp)
        if normalize:
            s = w.sum(axis=1, keepdims=True)
            if np.any(s <= 0):
                raise ValueError(f"layer {l}: a token's gate weights sum to <= 0; cannot normalize (pass normalize=False)")
            w = w / s
        for j in range(w.shape[1]):
            out.append(dict(layer=int(l), slot=j + 1, mean_weight=float(w[:, j].mean()),
                            std_weight=float(w[:, j].std()), n=int(len(w)), normalized=normalize))
    return pd.DataFrame(out)


def gate_slot_mean(table: pd.DataFrame) -> pd.DataFrame:
    """Mean over layers per slot (each layer weighs the same)."""
    return (table.groupby("slot").agg(mean_weight=("mean_weight", "mean"), layers=("layer", "nunique"))
            .reset_index())


def mlx_expert_outputs(model, batch: int = 256) -> ExpertOutputs:
    """``expert_outputs`` for a loaded mlx-lm MoE model: runs ``layer.mlp.switch_mlp(x, ids)``
    (``experts`` for gpt-oss); returns the un-weighted per-expert outputs [N, k, D]."""
    import mlx.core as mx

    blocks = moe_blocks(model)

    def expert_outputs(layer: int, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        if layer not in blocks:
            raise ValueError(f"model layer {layer} has no routed experts (MoE layers: {sorted(blocks)[:8]}...)")
        sw = expert_module(blocks[layer])
        dtype = getattr(getattr(sw.down_proj, "scales", None), "dtype", None) or sw.down_proj.weight.dtype
        outs = []
        for s in range(0, len(x), batch):
            xb = mx.array(np.asarray(x[s:s + batch], np.float32)).astype(dtype)
            ib = mx.array(np.asarray(ids[s:s + batch], np.int32))
            y = sw(xb, ib)  # [n, k, D]
            outs.append(np.array(y.astype(mx.float32)))
        return np.concatenate(outs, axis=0)

    return expert_outputs


def drop_weakest_error(
    trace,
    expert_outputs: ExpertOutputs,
    drop: Iterable[int] | None = None,
    layers: Iterable[int] | None = None,
    phase: str | None = "decode",
    max_rows_per_layer: int | None = None,
    renorm: Iterable[bool] = (False, True),
    shared_output: Callable[[int, np.ndarray], np.ndarray] | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Relative L2 error of the MoE block output when dropping the weakest m = 1..k-1 experts.

    Returns one row per (layer, dropped, renorm): n, rel_error (mean over tokens), rel_error_median,
    dropped_weight (mean normalized gate weight removed).
    """
    tr = as_trace(trace)
    rows = phase_rows(tr, phase)
    require_columns(rows, ["selected", "weights", "moe_input"], "drop-weakest error")
    if rows.empty:
        raise ValueError(f"trace has no {phase} rows; pass phase='all'")
    want = sorted(int(l) for l in rows["layer"].unique()) if layers is None else [int(l) for l in layers]
    groups = list(rows.groupby("layer", sort=True))
    groups = [(int(l), g) for l, g in groups if int(l) in want]
    if progress:
        from tqdm.auto import tqdm

        groups = tqdm(groups, desc="drop-weakest", unit="layer")
    out = []
    for l, grp in groups:
        if max_rows_per_layer is not None:
            grp = grp.iloc[:max_rows_per_layer]
        ids, w = _sorted_weights(grp)
        k = ids.shape[1]
        ms = list(range(1, k)) if drop is None else [int(m) for m in drop]
        if any(not 1 <= m < k for m in ms):
            raise ValueError(f"drop counts must be in 1..{k - 1} (top_k={k}), got {ms}")
        x = list_column(grp["moe_input"], np.float32, name="moe_input")
        y = np.asarray(expert_outputs(l, x, ids), np.float64)  # [N, k, D]
        if y.shape[:2] != ids.shape:
            raise ValueError(f"expert_outputs returned shape {y.shape}, expected [N={len(ids)}, k={k}, D]")
        wd = w.astype(np.float64)
        full = np.einsum("nk,nkd->nd", wd, y)
        base = shared_output(l, x).astype(np.float64) if shared_output is not None else 0.0
        norm = np.linalg.norm(full + base, axis=1)
        for m in ms:
            kept_w = wd.copy()
            kept_w[:, k - m:] = 0.0
            wsum = wd.sum(axis=1)
            for rn in renorm:
                kw = kept_w * (wsum / kept_w.sum(axis=1))[:, None] if rn else kept_w
                part = np.einsum("nk,nkd->nd", kw, y)
                with np.errstate(invalid="ignore", divide="ignore"):
                    err = np.linalg.norm(full - part, axis=1) / norm
                out.append(dict(layer=l, dropped=m, renorm=bool(rn), n=int(len(err)),
                                rel_error=float(np.nanmean(err)), rel_error_median=float(np.nanmedian(err)),
                                dropped_weight=float((wd[:, k - m:].sum(axis=1) / wsum).mean())))
    if not out:
        raise ValueError(f"none of layers {want[:8]} is in the trace")
    return pd.DataFrame(out)


def gate_slots_ci(traces, phase: str | None = "decode", **ci) -> pd.DataFrame:
    """Mean normalized gate weight by slot (mean over layers) over a workload ({prompt: trace}):
    slot, mean_weight, low, high, n_prompts."""
    from .uncertainty import over_prompts

    return over_prompts(traces, lambda tr: gate_slot_mean(gate_by_slot(tr, phase))[["slot", "mean_weight"]],
                        ["slot"], "mean_weight", **ci)


def drop_weakest_ci(traces, expert_outputs: ExpertOutputs, phase: str | None = "decode", drop: Iterable[int] = (1,),
                    max_rows_per_layer: int | None = 64, **ci) -> pd.DataFrame:
    """Drop-weakest error (mean over layers), renormalised and not, over a workload:
    dropped, renorm, rel_error, low, high, n_prompts."""
    from .uncertainty import over_prompts

    def one(tr):
        t = drop_weakest_error(tr, expert_outputs, drop=drop, phase=phase, max_rows_per_layer=max_rows_per_layer)
        return t.groupby(["dropped", "renorm"], as_index=False)["rel_error"].mean()

    return over_prompts(traces, one, ["dropped", "renorm"], "rel_error", **ci)
