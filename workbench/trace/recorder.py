"""Records a trace while the engine runs; writes Parquet atomically when the run ends."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from .. import __version__
from ..engine.engine import to_numpy
from .schema import IO_COLUMNS, write_trace


class TraceRecorder:
    """Pass to ``Engine.generate(trace=...)``. ``moe_input`` also stores the MoE block inputs
    (float16, for lookahead analysis); ``io_events`` records the arena/I/O event table."""

    def __init__(self, path, moe_input=False, io_events=False):
        self.path = Path(path)
        parent = self.path.parent if str(self.path.parent) else Path(".")
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise ValueError(f"cannot write trace {self.path}: folder {parent} does not exist or is not writable")
        if not self.path.name.endswith(".parquet"):
            raise ValueError(f"trace path {self.path} should end in .parquet")
        self.moe_input = moe_input
        self.cols = {k: [] for k in ("step", "token", "phase", "layer", "selected", "weights", "logits", "resident")}
        if moe_input:
            self.cols["moe_input"] = []
        self.io_rows = {k: [] for k in IO_COLUMNS} if io_events else None
        self._hooked = None

    def attach(self, engine):
        """Subscribe to the engine's hook points: every MoE layer's routing decision
        (``experts.selected``) and, with ``io_events``, the arena's events."""
        if self._hooked is not None:
            return
        self._hooked = [("layer.*.experts.selected", lambda ids, name, **ctx: self.add_layer(engine, ids, **ctx))]
        if self.io_rows is not None:
            self._hooked += self._io_hooks(engine)
        for n, fn in self._hooked:
            engine.hooks.add(n, fn)

    def _io_hooks(self, engine):
        t0 = time.perf_counter_ns()

        def event(kind):
            def fn(value, name, layer, expert, slot, **ctx):
                spec = bool(getattr(value, "speculative", False))
                size = getattr(getattr(value, "blob", None), "size", 0) if kind == "submit" else 0
                for k, v in zip(IO_COLUMNS, (engine.step, layer, expert, slot, kind, spec, size,
                                             time.perf_counter_ns() - t0)):
                    self.io_rows[k].append(v)
            return fn

        hooked = [(n, event(k)) for n, k in (("cache.hit", "hit"), ("cache.miss", "miss"),
                                              ("cache.evict", "evict"), ("io.submit", "submit"))]
        hooked.append(("prefetch.outcome", lambda v, name, layer, expert, slot, **c: event(v)(v, name, layer, expert, slot)))
        return hooked

    def add_layer(self, engine, ids, layer, step, phase, position, logits, moe_input, resident, predictions, **ctx):
        """One routing decision (the ``experts.selected`` hook's value and context) as trace rows."""
        ids = ids.reshape(-1, ids.shape[-1])
        n = ids.shape[0]
        w = engine.gate_weights(layer, ids, logits)
        if w is not None:
            order = np.lexsort((ids, -w), axis=-1)  # strongest first, ties by id
            ids, w = np.take_along_axis(ids, order, -1), np.take_along_axis(w, order, -1)
        logits = to_numpy(logits, np.float16).reshape(n, -1) if logits is not None else None
        c = self.cols
        for t in range(n):
            c["step"].append(step)
            c["token"].append(position + t)
            c["phase"].append(phase)
            c["layer"].append(layer)
            c["selected"].append(ids[t].astype(np.int16).tolist())
            c["weights"].append(None if w is None else w[t].astype(np.float32).tolist())
            c["logits"].append(None if logits is None else logits[t])
            c["resident"].append(list(resident))
        if self.moe_input:
            c["moe_input"].extend(list(to_numpy(moe_input, np.float16).reshape(n, -1)))
        for src, cands in predictions.items():
            c.setdefault(f"pred_{src}", [None] * (len(c["step"]) - n)).extend(cands)
        for k, v in c.items():  # rows without a prediction: None, so later predictions stay on their rows
            if k.startswith("pred_") and len(v) < len(c["step"]):
                v.extend([None] * (len(c["step"]) - len(v)))

    def detach(self, engine):
        if self._hooked:
            for n, fn in self._hooked:
                engine.hooks.remove(n, fn)
            self._hooked = None

    def close(self, engine, stats):
        self.detach(engine)
        nrows = len(self.cols["step"])
        for k, v in self.cols.items():  # predictor columns started late are padded
            if len(v) < nrows:
                v.extend([None] * (nrows - len(v)))
        m = engine.m
        meta = {
            "model_type": m.data["model_type"], "n_layers": m.data["n_layers"], "n_experts": m.n_experts,
            "top_k": m.top_k, "moe_layers": m.moe_layers, "expert_bytes": m.expert_bytes,
            "hidden_size": m.config.get("hidden_size"), "config_hash": m.data["config_hash"],
            "workbench_version": __version__, "arena_slots": engine.n_slots, "policy": engine.arena.policy.name,
            "store": str(engine.root), "stats": {k: v for k, v in stats.items() if not isinstance(v, dict)},
        }
        write_trace(self.path, self.cols, meta, self.io_rows)
