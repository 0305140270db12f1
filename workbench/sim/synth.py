"""Synthetic routing traces for tests, benchmarks and notebooks (no model needed).

``synthetic_trace(path, ...)`` writes a workbench trace with ``write_trace``:

* ``kind="random"``: each (token, layer) picks top_k distinct experts uniformly;
* ``kind="zipf"``: experts drawn with Zipf-like popularity per layer (a hot set exists);
* ``kind="sticky"``: each layer keeps most of its previous token's experts (temporal locality);
* ``kind="periodic"``: token t routes like token t mod ``period``.

Optional predictor columns ``pred_d1`` .. ``pred_dD``: noisy predictions of each row's
selection (each true expert kept with probability ``recall``, the rest filled at random),
best first. ``with_logits`` stores float16 router logits consistent with the selection.
"""

from __future__ import annotations

import numpy as np

from ..trace.schema import write_trace

KINDS = ("random", "zipf", "sticky", "periodic")


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
    rows = {k: [] for k in ("step", "token", "phase", "layer", "selected", "weights", "logits", "resident")}
    preds = {f"pred_d{d}": [] for d in predictors}
    for t in range(total):
        prefill = t < prefill_tokens
        for layer in range(n_layers):
            sel = routes[t, layer]
            rows["step"].append(0 if prefill else t - prefill_tokens + 1)
            rows["token"].append(t)
            rows["phase"].append("prefill" if prefill else "decode")
            rows["layer"].append(layer)
            rows["selected"].append(sel.tolist())
            w = np.sort(rng.random(top_k))[::-1]
            rows["weights"].append((w / w.sum()).astype(np.float32).tolist())
            if with_logits:
                z = rng.normal(0, 1, n_experts) - 3.0
                z[sel] = 3.0 - 0.1 * np.arange(top_k)
                rows["logits"].append(z.astype(np.float16).tolist())
            else:
                rows["logits"].append(None)
            rows["resident"].append([])
            for d in predictors:
                preds[f"pred_d{d}"].append(_noisy(sel, n_experts, recall, rng))
    rows.update(preds)
    meta = {
        "model_type": "synthetic",
        "n_layers": n_layers,
        "n_experts": n_experts,
        "top_k": top_k,
        "moe_layers": list(range(n_layers)),
        "expert_bytes": int(expert_bytes),
        "hidden_size": 0,
        "config_hash": f"synthetic-{kind}-{seed}",
        "workbench_version": "0.1.0",
        "synthetic": {"kind": kind, "seed": seed, "predictors": list(predictors), "recall": recall},
    }
    write_trace(path, rows, meta)
    return routes
