"""Constructed routing traces for tests, benchmarks, docs and notebooks (no model needed).

``routes_trace(path, selected, ...)`` is the one writer: selected[t][layer position] -> expert ids,
prefill tokens first (step 0), then one decode token per step; weights default to a decreasing gate
profile; optional logits, moe_input and pred_<src> columns. It returns the re-read Trace.

``synthetic_trace(path, ...)`` draws the routing and writes it with ``routes_trace``:

* ``kind="random"``: each (token, layer) picks top_k distinct experts uniformly;
* ``kind="zipf"``: experts drawn with Zipf-like popularity per layer (a hot set exists);
* ``kind="sticky"``: each layer keeps most of its previous token's experts (temporal locality);
* ``kind="periodic"``: token t routes like token t mod ``period``.

Its optional predictor columns ``pred_d1`` .. ``pred_dD`` are noisy predictions of each row's
selection (each true expert kept with probability ``recall``, the rest filled at random), best
first; ``with_logits`` stores float16 router logits consistent with the selection.
``periodic_routes``: the routing of a period-P trace whose union over g tokens is k * min(g, P).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .schema import Trace, read_trace, write_trace

KINDS = ("random", "zipf", "sticky", "periodic")


def routes_trace(path, selected: Sequence[Sequence[Sequence[int]]], n_experts: int,
                 weights: Sequence[Sequence[Sequence[float]]] | None = None,
                 moe_input: Sequence[Sequence[Sequence[float]]] | None = None,
                 preds: Mapping[str, Sequence[Sequence[Sequence[int]]]] | None = None,
                 layers: Sequence[int] | None = None, prompt_len: int = 0, meta: dict | None = None,
                 logits: Sequence[Sequence[Sequence[float]]] | None = None, prefill_tokens: int = 0) -> Trace:
    """Write a trace: index [token][layer position]; tokens below ``prefill_tokens`` are the prefill
    pass (step 0), later ones decode one per step; token ids count from ``prompt_len``. Returns the
    re-read Trace."""
    selected = selected.tolist() if isinstance(selected, np.ndarray) else selected
    weights = weights.tolist() if isinstance(weights, np.ndarray) else weights
    n_tok = len(selected)
    n_lay = len(selected[0])
    layers = list(range(n_lay)) if layers is None else list(layers)
    k = len(selected[0][0])
    cols: dict[str, list] = {c: [] for c in ("step", "token", "phase", "layer", "selected", "weights", "resident")}
    if logits is not None:
        cols["logits"] = []
    if moe_input is not None:
        cols["moe_input"] = []
    for s in preds or {}:
        cols[f"pred_{s}"] = []
    prof = np.linspace(1.0, 0.5, k)
    prof = (prof / prof.sum()).tolist()
    for t in range(n_tok):
        prefill = t < prefill_tokens
        for j, layer in enumerate(layers):
            cols["step"].append(0 if prefill else t - prefill_tokens + 1)
            cols["token"].append(prompt_len + t)
            cols["phase"].append("prefill" if prefill else "decode")
            cols["layer"].append(layer)
            cols["selected"].append([int(e) for e in selected[t][j]])
            cols["weights"].append([float(w) for w in (weights[t][j] if weights is not None else prof[:len(selected[t][j])])])
            cols["resident"].append([])
            if logits is not None:
                cols["logits"].append(None if logits[t][j] is None else np.asarray(logits[t][j], np.float16).tolist())
            if moe_input is not None:
                cols["moe_input"].append(np.asarray(moe_input[t][j], np.float16).tolist())
            for s, p in (preds or {}).items():
                cols[f"pred_{s}"].append([int(e) for e in p[t][j]])
    m = dict(model_type="synthetic", n_layers=max(layers) + 1, n_experts=n_experts, top_k=k, moe_layers=layers,
             expert_bytes=1 << 20, hidden_size=len(moe_input[0][0]) if moe_input is not None else 0)
    m.update(meta or {})
    write_trace(Path(path), cols, m)
    return read_trace(path)


def periodic_routes(n_tokens: int, n_layers: int, k: int, period: int, offset_per_layer: int = 0) -> list:
    """Token t of layer j selects the disjoint block (t mod period) of k experts (+ a layer offset)."""
    return [[[((t % period) * k + i + j * offset_per_layer) % (period * k) for i in range(k)]
             for j in range(n_layers)] for t in range(n_tokens)]


def synthetic_routes(n_tokens=64, n_layers=4, n_experts=32, top_k=4, kind="zipf", seed=0, period=4, alpha=1.1, stick=0.75):
    """(n_tokens, n_layers, top_k) int array of routed expert ids, strongest first."""
    if kind not in KINDS:
        raise ValueError(f"unknown synthetic kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k must be in 1..n_experts ({n_experts}), got {top_k}")
    rng = np.random.default_rng(seed)
    out = np.zeros((n_tokens, n_layers, top_k), dtype=np.int64)
    if kind == "zipf":
        perms = np.stack([rng.permutation(n_experts) for _ in range(n_layers)])
        w = 1.0 / np.arange(1, n_experts + 1) ** alpha
        w /= w.sum()
    for t in range(n_tokens):
        for layer in range(n_layers):
            if kind == "random" or (kind == "periodic" and t < period) or (kind == "sticky" and t == 0):
                out[t, layer] = rng.choice(n_experts, top_k, replace=False)
            elif kind == "periodic":
                out[t, layer] = out[t % period, layer]
            elif kind == "zipf":
                out[t, layer] = perms[layer][rng.choice(n_experts, top_k, replace=False, p=w)]
            else:  # sticky
                prev = out[t - 1, layer]
                keep = prev[rng.random(top_k) < stick]
                rest = np.setdiff1d(np.arange(n_experts), keep)
                new = rng.choice(rest, top_k - len(keep), replace=False)
                out[t, layer] = np.concatenate([keep, new])
    return out


def _noisy(sel, n_experts, recall, rng):
    keep = [int(e) for e in sel if rng.random() < recall]
    pool = np.setdiff1d(np.arange(n_experts), keep)
    fill = rng.choice(pool, len(sel) - len(keep), replace=False).tolist()
    return keep + fill


def synthetic_trace(path, n_tokens=64, n_layers=4, n_experts=32, top_k=4, kind="zipf", seed=0, prefill_tokens=0,
                    predictors=(), recall=0.7, with_logits=False, expert_bytes=1 << 20, **kind_opts):
    """Write a synthetic trace to ``path``; returns the routes array (tokens, layers, top_k).

    ``prefill_tokens`` > 0 adds a prefill step 0 with that many tokens (rows token-major);
    decode tokens then take steps 1..n_tokens. ``predictors``: distances d for pred_d<d> columns.
    """
    total = prefill_tokens + n_tokens
    routes = synthetic_routes(total, n_layers, n_experts, top_k, kind=kind, seed=seed, **kind_opts)
    rng = np.random.default_rng(seed + 1)
    grid = lambda: [[None] * n_layers for _ in range(total)]  # noqa: E731  [token][layer]
    weights, logits, preds = grid(), grid(), {f"d{d}": grid() for d in predictors}
    for t in range(total):
        for layer in range(n_layers):
            sel = routes[t, layer]
            w = np.sort(rng.random(top_k))[::-1]
            weights[t][layer] = (w / w.sum()).astype(np.float32)
            if with_logits:
                z = rng.normal(0, 1, n_experts) - 3.0
                z[sel] = 3.0 - 0.1 * np.arange(top_k)
                logits[t][layer] = z
            for d in predictors:
                preds[f"d{d}"][t][layer] = _noisy(sel, n_experts, recall, rng)
    meta = {"expert_bytes": int(expert_bytes), "config_hash": f"synthetic-{kind}-{seed}", "workbench_version": "0.1.0",
            "synthetic": {"kind": kind, "seed": seed, "predictors": list(predictors), "recall": recall}}
    routes_trace(path, routes, n_experts, weights=weights, preds=preds, meta=meta, prefill_tokens=prefill_tokens,
                 logits=logits if with_logits else None)
    return routes
