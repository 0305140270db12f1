"""Small constructed traces for tests, docs and notebooks (written with trace.schema.write_trace).

``routes_trace(path, selected, ...)``: selected[t][layer_index] -> expert ids, one decode token
per step; weights default to a decreasing gate profile; optional moe_input / pred_<src> columns.
``periodic_routes``: the routing of a period-P trace whose union over g tokens is k * min(g, P).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from workbench.trace.schema import Trace, read_trace, write_trace


def routes_trace(path, selected: Sequence[Sequence[Sequence[int]]], n_experts: int,
                 weights: Sequence[Sequence[Sequence[float]]] | None = None,
                 moe_input: Sequence[Sequence[Sequence[float]]] | None = None,
                 preds: Mapping[str, Sequence[Sequence[Sequence[int]]]] | None = None,
                 layers: Sequence[int] | None = None, prompt_len: int = 0, meta: dict | None = None) -> Trace:
    """Write a decode-only trace: index [token][layer position]; returns the re-read Trace."""
    n_tok = len(selected)
    n_lay = len(selected[0])
    layers = list(range(n_lay)) if layers is None else list(layers)
    k = len(selected[0][0])
    cols: dict[str, list] = {c: [] for c in ("step", "token", "phase", "layer", "selected", "weights", "resident")}
    if moe_input is not None:
        cols["moe_input"] = []
    for s in preds or {}:
        cols[f"pred_{s}"] = []
    prof = np.linspace(1.0, 0.5, k)
    prof = (prof / prof.sum()).tolist()
    for t in range(n_tok):
        for j, layer in enumerate(layers):
            cols["step"].append(t + 1)
            cols["token"].append(prompt_len + t)
            cols["phase"].append("decode")
            cols["layer"].append(layer)
            cols["selected"].append([int(e) for e in selected[t][j]])
            cols["weights"].append([float(w) for w in (weights[t][j] if weights is not None else prof[:len(selected[t][j])])])
            cols["resident"].append([])
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
