"""Router lookahead recovery by distance (DESIGN section 4).

Apply layer L's router to the MoE input of layer L-d (same token) and ask how many of the experts
layer L actually selected the prediction recovers:

    recovery = |predicted top-k' ∩ actual top-k| / k

Sources: ``d=1 .. d=D`` (distance counted in MoE layers of the trace, which equals model layers
when every layer is MoE), ``prev_token`` (layer L at the previous token: its actual selection for
k' = k, its router ranking for k' > k) and, if asked, ``d=0`` (the router on its own input: a
self-check that the router weights match the trace; it should be ~1.0).

``k'`` > k gives coverage for extra candidates: how much of the actual set a wider read-ahead
catches. Softmax routers: top-k of logits equals top-k of probabilities, so logits are ranked.
Sigmoid routers with a selection bias (DeepSeek-V3 ``noaux_tc``): pass ``Router(scoring="sigmoid",
selection_bias=..., n_group=..., topk_group=...)`` (``routers_from_model`` fills these in) or a
``score_fn``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from ..families import moe_blocks, router_module
from ._common import as_trace, list_column, membership, module_weight, phase_rows, require_columns, to_numpy, top_ids


@dataclass
class Router:
    """One layer's router: logits = x @ weight.T + bias; ranking score = scoring(logits) + selection_bias."""

    weight: np.ndarray  # [E, D] float32
    bias: np.ndarray | None = None  # [E] linear bias (e.g. gpt-oss)
    scoring: str = "softmax"  # "softmax" | "sigmoid" | "logits"
    selection_bias: np.ndarray | None = None  # [E] added after sigmoid, for selection only (DeepSeek-V3)
    n_group: int = 1  # group-limited selection (DeepSeek-V3): keep the topk_group best groups
    topk_group: int | None = None

    def logits(self, x: np.ndarray) -> np.ndarray:
        z = np.asarray(x, dtype=np.float32) @ self.weight.T
        return z + self.bias if self.bias is not None else z

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Scores whose descending order is the router's selection order."""
        z = self.logits(x)
        if self.scoring in ("softmax", "logits"):  # softmax is monotone per row
            s = z
        elif self.scoring == "sigmoid":
            s = 1.0 / (1.0 + np.exp(-z))
        else:
            raise ValueError(f"Router.scoring must be 'softmax', 'sigmoid' or 'logits', got {self.scoring!r}")
        if self.selection_bias is not None:
            s = s + self.selection_bias
        if self.n_group > 1 and self.topk_group is not None and self.topk_group < self.n_group:
            # as mlx-lm's group_expert_select: group score = sum of its top-2, the weakest
            # n_group - topk_group groups get score 0
            n, e = s.shape
            grp = s.reshape(n, self.n_group, e // self.n_group)
            gs = np.sort(grp, axis=-1)[..., -2:].sum(-1)
            drop = np.argsort(gs, axis=-1, kind="stable")[:, : self.n_group - self.topk_group]
            grp = grp.copy()
            np.put_along_axis(grp, drop[..., None], 0.0, axis=1)
            s = grp.reshape(n, e)
        return s


def as_router(spec) -> Router:
    """np/mx array [E, D], (weight, bias) tuple, quantized dict(weight, scales, biases, group_size, bits) or Router."""
    if isinstance(spec, Router):
        return spec
    if isinstance(spec, tuple):
        w, b = spec
        return Router(to_numpy(w), None if b is None else np.asarray(to_numpy(b), np.float32))
    if isinstance(spec, dict) and "scales" not in spec:
        w = to_numpy(spec["weight"])
        return Router(w, spec.get("bias"), spec.get("scoring", "softmax"), spec.get("selection_bias"))
    w = to_numpy(spec)
    if w.ndim != 2:
        raise ValueError(f"router weight must be [E, D], got shape {w.shape}")
    return Router(w)


def routers_from_model(model) -> dict[int, Router]:
    """{layer: Router} from a loaded mlx-lm MoE model (quantized gates are dequantized)."""
    import mlx.core as mx

    out = {}
    for i, blk in moe_blocks(model).items():
        gate = router_module(blk)
        w, b = module_weight(gate)
        corr = getattr(gate, "e_score_correction_bias", None)
        if corr is not None:  # DeepSeek-V3 style: sigmoid + selection bias (+ group-limited selection)
            out[i] = Router(w, b, "sigmoid", np.array(corr.astype(mx.float32)),
                            int(getattr(gate, "n_group", 1) or 1), getattr(gate, "topk_group", None))
        else:
            out[i] = Router(w, b, "softmax")
    return out


def _index(df: pd.DataFrame) -> dict[tuple[int, int], int]:
    keys = list(zip(df["token"].to_numpy().tolist(), df["layer"].to_numpy().tolist()))
    idx = {k: i for i, k in enumerate(keys)}
    if len(idx) != len(keys):
        raise ValueError("trace has duplicate (token, layer) rows; lookahead needs one sequence per trace "
                         "(split multi-prompt traces first)")
    return idx


def lookahead_recovery(
    trace,
    routers: Mapping[int, object],
    distances: Iterable[int] = (1, 2, 3),
    k_extra: Iterable[int] = (),
    prev_token: bool = True,
    phase: str | None = "decode",
    score_fn: Callable[[int, np.ndarray], np.ndarray] | None = None,
    layers: Iterable[int] | None = None,
) -> pd.DataFrame:
    """Recovery of each layer's actual top-k by its router applied to earlier inputs.

    trace: Trace / path / routes DataFrame with ``selected`` and ``moe_input``.
    routers: {layer: Router | weight [E, D] | (weight, bias) | quantized dict}.
    k_extra: extra candidate counts k' > k (coverage of the actual top-k by the predicted top-k').
    score_fn(layer, logits) -> scores: overrides the routers' ranking (e.g. a custom sigmoid+bias).
    Returns one row per (source, distance, layer, k_pred): n, recovery (mean over tokens), k.
    """
    tr = as_trace(trace)
    df_all = tr.routes
    require_columns(df_all, ["selected", "moe_input"], "lookahead recovery")
    rows = phase_rows(tr, phase)
    if rows.empty:
        raise ValueError(f"trace has no {phase} rows; pass phase='all' or record a decode run")
    routers = {int(l): as_router(r) for l, r in routers.items()}
    idx = _index(df_all)
    k = int(tr.meta.get("top_k") or len(rows["selected"].iloc[0]))
    ks = sorted({k, *[int(x) for x in k_extra]})
    if ks[0] < k:
        raise ValueError(f"k_extra values must be >= top_k={k}, got {list(k_extra)}")
    trace_layers = sorted(int(x) for x in df_all["layer"].unique())
    pos = {l: i for i, l in enumerate(trace_layers)}
    want_layers = trace_layers if layers is None else [int(l) for l in layers]
    missing = [l for l in want_layers if l not in routers]
    if missing:
        raise ValueError(f"no router given for layers {missing[:8]}; pass routers for every trace layer "
                         "(routers_from_model(model) builds them)")

    moe = df_all["moe_input"].to_numpy()
    sel_all = df_all["selected"].to_numpy()
    n_exp = int(tr.meta.get("n_experts") or next(iter(routers.values())).weight.shape[0])

    def rank(layer, x):
        r = routers[layer]
        s = score_fn(layer, r.logits(x)) if score_fn is not None else r.scores(x)
        return top_ids(s, ks[-1])

    out = []
    for L in want_layers:
        lrows = rows[rows["layer"] == L]
        if lrows.empty:
            continue
        tokens = lrows["token"].to_numpy()
        actual = list_column(lrows["selected"], np.int64, name="selected")
        amask = membership(actual, n_exp)
        kk = actual.shape[1]
        sources = [(f"d={d}", d, [(t, trace_layers[pos[L] - d]) if pos[L] - d >= 0 else None for t in tokens])
                   for d in distances]
        for name, d, src_keys in sources:
            have = np.array([sk is not None and sk in idx for sk in src_keys])
            if not have.any():
                continue
            src_idx = [idx[sk] for sk, h in zip(src_keys, have) if h]
            x = np.stack([np.asarray(moe[i], np.float32) for i in src_idx])
            pred = rank(L, x)
            _emit(out, name, d, L, pred, amask[have], ks, kk)
        if prev_token:
            keys = [(int(t) - 1, L) for t in tokens]
            have = np.array([kk_ in idx for kk_ in keys])
            if have.any():
                src_idx = [idx[kk_] for kk_, h in zip(keys, have) if h]
                prev_sel = [np.asarray(sel_all[i], np.int64) for i in src_idx]
                # k' = k: the previous token's actual selection; k' > k: its router ranking
                pred_k = np.stack(prev_sel)
                amask_h = amask[have]
                hit = np.take_along_axis(amask_h, pred_k[:, :kk], axis=1).sum(axis=1) / kk
                out.append(dict(source="prev_token", distance=np.nan, layer=L, k=kk, k_pred=kk,
                                n=int(have.sum()), recovery=float(hit.mean())))
                if len(ks) > 1:
                    x = np.stack([np.asarray(moe[i], np.float32) for i in src_idx])
                    _emit(out, "prev_token", np.nan, L, rank(L, x), amask_h, ks[1:], kk)
    if not out:
        raise ValueError("no (layer, source) pair could be evaluated: the trace needs at least two MoE layers "
                         "or two tokens with moe_input recorded")
    return pd.DataFrame(out)


def _emit(out, name, d, layer, pred, amask, ks, k):
    for kp in ks:
        hit = np.take_along_axis(amask, pred[:, :kp], axis=1).sum(axis=1) / k
        out.append(dict(source=name, distance=d, layer=layer, k=k, k_pred=kp, n=int(len(hit)),
                        recovery=float(hit.mean())))


def lookahead_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Mean over layers (each layer weighs the same) per source and k_pred."""
    g = table.groupby(["source", "k_pred"], sort=False)
    out = g.agg(recovery=("recovery", "mean"), recovery_min=("recovery", "min"), recovery_max=("recovery", "max"),
                layers=("layer", "nunique"), n=("n", "sum"), k=("k", "first"), distance=("distance", "first"))
    out = out.reset_index()
    order = out["distance"].fillna(np.inf)
    return out.assign(_o=order).sort_values(["_o", "k_pred"], kind="stable").drop(columns="_o").reset_index(drop=True)


def lookahead_ci(traces, routers: Mapping[int, object], distances: Iterable[int] = (1, 2, 3),
                 k_extra: Iterable[int] = (), phase: str | None = "decode", **ci) -> pd.DataFrame:
    """Mean-over-layers recovery per source and k_pred over a workload ({prompt: trace}), with a
    95% bootstrap interval over prompts: source, distance, k, k_pred, recovery, low, high, n_prompts."""
    from .uncertainty import over_prompts

    routers = {int(l): as_router(r) for l, r in routers.items()}

    def one(tr):
        s = lookahead_summary(lookahead_recovery(tr, routers, distances, k_extra, phase=phase))
        return s[["source", "distance", "k", "k_pred", "recovery"]]

    return over_prompts(traces, one, ["source", "distance", "k", "k_pred"], "recovery", **ci)
