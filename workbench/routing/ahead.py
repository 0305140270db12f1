"""Read-ahead in the live engine: predictors feed ``ahead()``, an admission gate filters,
the arena starts speculative reads (never published, never evicting the target layer).

Predictors (``source``):
  layer   the target layer's router applied to the current layer's MoE input (distance d)
  prev    the same layer's router logits at the previous token (target: next token)
  oracle  the selections recorded in a trace of the same run (an upper bound)
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from ..arrays import to_numpy
from ..families import router_logits
from .gates import make_gate
from .rank import ahead_candidates, ahead_mode

PREDICTORS = ("layer", "prev", "oracle")


class Planner:
    def __init__(self, engine, predictor="layer", distance=1, mode="raw", width=None, p=3, b=0.85, r1=0.0,
                 gate="none", gate_options=None, oracle=None):
        if predictor not in PREDICTORS:
            raise ValueError(f"unknown predictor {predictor!r}; valid: {', '.join(PREDICTORS)}")
        mode = ahead_mode(mode)
        layers = engine.m.moe_layers
        if predictor == "layer" and not 1 <= distance < len(layers):
            raise ValueError(f"lookahead distance {distance} is out of range: the model has {len(layers)} MoE layers, "
                             f"use 1..{len(layers) - 1}")
        if predictor in ("layer", "prev") and engine.family is None:
            raise ValueError(f"predictor {predictor!r} needs the router of family {engine.m.data['model_type']!r}, "
                             "which the workbench does not know; use --predictor oracle")
        if predictor == "oracle" and oracle is None:
            raise ValueError("predictor 'oracle' needs a recorded trace of the same prompt (--oracle-trace FILE)")
        self.predictor, self.distance, self.mode = predictor, distance, mode
        # "prev" re-ranks logits whose top-k was just claimed (all mapped): look wider by default
        self.width = width or engine.top_k * (2 if predictor == "prev" else 1)
        self.p, self.b, self.r1 = p, b, r1
        opts = dict(gate_options or {})
        if gate == "cost":
            opts.setdefault("bytes", engine.m.expert_bytes)
        self.gate = make_gate(gate, **opts)
        self.layers = layers
        self.pos = {layer: i for i, layer in enumerate(layers)}
        self.pending: dict[int, np.ndarray] = {}  # target layer -> all eligible candidates
        self.oracle = None if oracle is None else _oracle_table(oracle)

    def on_route(self, run, layer, ids) -> None:
        """The real router chose ``ids`` for ``layer``: teach the gate."""
        cands = self.pending.pop(layer, None)
        if cands is not None and self.gate.learns:
            self.gate.update(layer, cands, np.unique(ids))

    def prediction(self, run, layer, moe_input, logits):
        """Per-layer decode, before ``layer``'s router sync: (target layer, the logits to rank there,
        lazy: the engine evaluates them with the router, so a prediction costs no sync of its own),
        or (None, None). ``run``: the engine's ``Run``."""
        if run.counters.phase.get(run.step) != "decode":
            return None, None
        return self._predict(run, layer, moe_input, logits)

    def after_layer(self, run, layer, target, z) -> None:
        """Per-layer decode, once ``layer``'s experts are launched (their slots still pinned): read
        ``target``'s likely experts, ranking ``z`` (from ``prediction``)."""
        if target is None:
            return
        t0 = time.perf_counter_ns()
        E = run.engine.m.n_experts
        z = to_numpy(z).reshape(-1, E) if isinstance(z, mx.array) else z
        self._read(run, target, z, self.width)
        run.counters.row(run.step, layer)["predict_ns"] += time.perf_counter_ns() - t0

    def next_token(self, run, logits: dict, evict: bool = True) -> None:
        """Optimistic decode, after a token is settled: read the next token's likely experts,
        ranking each MoE layer's router logits of this token (what ``prev`` predicts; a layer
        predictor cannot see the next token's inputs before it runs; ``oracle`` reads the
        recorded selections of the next step)."""
        t0 = time.perf_counter_ns()
        engine = run.engine
        # the layer predictor ranks this token's logits too, whose top-k are mapped now: look wider
        width = 2 * engine.top_k if self.predictor == "layer" else self.width
        for layer in self.layers:
            if self.predictor == "oracle":
                z = self._oracle_logits(run.step + 1, layer, engine.m.n_experts)
            else:
                z = logits.get(layer)
            if z is not None:
                self._read(run, layer, np.asarray(z, dtype=np.float32).reshape(-1, engine.m.n_experts), width,
                           evict)
        run.counters.row(run.step, self.layers[-1])["predict_ns"] += time.perf_counter_ns() - t0

    def _read(self, run, target, z, width, evict=True) -> None:
        arena = run.arena
        cands = ahead_candidates(z, arena.mapped[target], width, self.mode, self.p, self.b, self.r1,
                                 resident_mask=arena.map.resident_mask(target))
        self.pending[target] = cands
        ranks = None
        if getattr(self.gate, "q_table", None) is not None:  # a calibrated gate: each candidate's rank among all experts
            best = np.asarray(z, dtype=np.float64).max(axis=0)
            ranks = [1 + int((best > best[e]).sum()) for e in cands]
        for e in self.gate.filter(target, cands, ranks=ranks):
            arena.prefetch(target, e, run.engine.top_k, evict)

    def _predict(self, run, layer, moe_input, logits):
        engine = run.engine
        E = engine.m.n_experts
        if self.predictor == "layer":
            i = self.pos[layer] + self.distance
            if i >= len(self.layers):
                return None, None
            target = self.layers[i]
            return target, router_logits(engine.family, engine.gates[target], moe_input)
        if self.predictor == "prev":
            return (layer, logits) if logits is not None else (None, None)
        i = self.pos[layer] + self.distance
        step, target = (run.step, self.layers[i]) if i < len(self.layers) else (run.step + 1, self.layers[i - len(self.layers)])
        z = self._oracle_logits(step, target, E)
        return (target, z) if z is not None else (None, None)

    def _oracle_logits(self, step, layer, E):
        sel = self.oracle.get((step, layer))
        if sel is None:
            return None
        z = np.full((1, E), -1e9, dtype=np.float32)
        z[0, sel] = -np.arange(len(sel), dtype=np.float32)  # recorded order: strongest first
        return z

    def candidates(self, layer) -> dict:
        """The candidates read for ``layer`` (before ``on_route`` takes them), one list per row."""
        c = self.pending.get(layer)
        return {} if c is None else {self.predictor: [c.tolist()]}

    def end(self) -> None:
        self.pending.clear()


def _oracle_table(trace) -> dict:
    dec = trace.decode()
    return {(int(s), int(l)): np.asarray(sel, dtype=np.int64) for s, l, sel in zip(dec.step, dec.layer, dec.selected)}
