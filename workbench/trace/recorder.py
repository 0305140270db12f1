"""Records a trace while the engine runs; writes Parquet atomically when the run ends."""

from __future__ import annotations

import time
from typing import NamedTuple

import mlx.core as mx
import numpy as np

from .. import __version__
from ..checks import output_file
from ..arrays import to_numpy
from .schema import IO_COLUMNS, write_trace


class TraceRecorder:
    """Pass to ``Engine.generate(trace=...)``. ``moe_input`` also stores the MoE block inputs
    (float16, for lookahead analysis; they stay in device memory until the run ends: a 2048-token
    prompt at 48 layers of hidden 2048 holds about 400 MB); ``io_events`` records the arena/I/O event
    table. Routing decisions are kept as the engine gives them and converted once, when the run ends."""

    def __init__(self, path, moe_input=False, io_events=False):
        self.path = output_file("--trace", path)
        if not self.path.parent.is_dir():
            raise ValueError(f"--trace {self.path}: folder {self.path.parent} does not exist; create it or give another path")
        if not self.path.name.endswith(".parquet"):
            raise ValueError(f"trace path {self.path} should end in .parquet")
        self.moe_input = moe_input
        self.calls = []  # fields of _Call
        self._resident = {}  # MoE layer -> its last resident list
        self.io_rows = {k: [] for k in IO_COLUMNS} if io_events else None
        self._hooked = None

    def attach(self, engine):
        """Subscribe to the engine's hook points: every MoE layer's routing decision
        (``experts.selected``) and, with ``io_events``, the arena's events. Host-only: they keep
        references and numbers, no MLX call (the handshake may answer on its server thread)."""
        if self._hooked is not None:
            return
        self._hooked = [("layer.*.experts.selected", self.add_layer)]
        if self.io_rows is not None:
            self._hooked += self._io_hooks(engine)
        for n, fn in self._hooked:
            engine.hooks.add(n, fn, host_only=True)

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

    def add_layer(self, ids, name, layer, step, phase, position, logits, moe_input, resident, predictions, **ctx):
        """One routing decision (the ``experts.selected`` hook's value and context), kept as given;
        ``close`` makes the rows. References are enough: MLX arrays are immutable, and the engine's
        ids and numpy values are fresh host copies it never writes again. A resident set equal to the
        layer's last one is kept as that list (a full arena's never changes): fewer objects live on
        for the garbage collector to scan."""
        if resident == self._resident.get(layer):
            resident = self._resident[layer]
        else:
            self._resident[layer] = resident
        self.calls.append((layer, step, phase, position, ids, logits, moe_input if self.moe_input else None,
                           resident, predictions))  # a plain tuple: the cheapest to make

    def detach(self, engine):
        if self._hooked:
            for n, fn in self._hooked:
                engine.hooks.remove(n, fn)
            self._hooked = None

    def close(self, engine, stats):
        self.detach(engine)
        m = engine.m
        meta = {
            "model_type": m.data["model_type"], "n_layers": m.data["n_layers"], "n_experts": m.n_experts,
            "top_k": m.top_k, "moe_layers": m.moe_layers, "expert_bytes": m.expert_bytes,
            "hidden_size": m.config.get("hidden_size"), "config_hash": m.data["config_hash"],
            "workbench_version": __version__, "arena_slots": engine.n_slots, "policy": engine.arena.policy.name,
            "store": str(engine.root), "stats": {k: v for k, v in stats.items() if not isinstance(v, dict)},
        }
        try:
            write_trace(self.path, self._columns(engine), meta, self.io_rows)
        finally:  # the run's values go now: the engine's Run, which refers to this recorder, is freed only
            self.calls, self._resident = [], {}  # when the garbage collector finds its cycle

    def _columns(self, engine) -> dict:
        """The kept calls as trace columns: one row per token, in call order. Gate weights, the
        strongest-first order and float16 values are computed in bulk, per MoE layer; every MLX value
        comes to the host in one evaluation, and list cells are numpy rows (no Python int per value)."""
        calls = [_Call(*c) for c in self.calls]
        n = [c.ids.size // c.ids.shape[-1] for c in calls]  # rows per call
        first = np.cumsum([0] + n)
        rows = int(first[-1])
        selected, weights, logits = [None] * rows, [None] * rows, [None] * rows
        groups = {}  # (layer, has logits) -> indices of its calls
        for i, c in enumerate(calls):
            groups.setdefault((c.layer, c.logits is not None), []).append(i)
        wanted = [[(calls[i].logits, n[i]) for i in idx] for (_, has_logits), idx in groups.items() if has_logits]
        dtypes = [mx.float32] * len(wanted)
        if self.moe_input:  # float16 all the way: the column's type
            wanted.append([(c.moe_input, k) for c, k in zip(calls, n)])
            dtypes.append(mx.float16)
        host = iter(_stacks(wanted, dtypes))
        for (layer, has_logits), idx in groups.items():
            at = np.concatenate([np.arange(first[i], first[i + 1]) for i in idx])  # the group's rows
            ids = np.concatenate([calls[i].ids.reshape(n[i], -1) for i in idx])
            w = None
            if has_logits:
                z = next(host)
                w = engine.gate_weights(layer, ids, z)
                _put(logits, at, z.astype(np.float16))
            if w is not None:
                order = np.lexsort((ids, -w), axis=-1)  # strongest first, ties by id
                ids, w = np.take_along_axis(ids, order, -1), np.take_along_axis(w, order, -1)
                _put(weights, at, w.astype(np.float32))
            _put(selected, at, ids.astype(np.int16))

        def per_row(values):
            return [v for v, k in zip(values, n) for _ in range(k)]

        cols = {"step": per_row(c.step for c in calls),
                "token": [c.position + t for c, k in zip(calls, n) for t in range(k)],
                "phase": per_row(c.phase for c in calls), "layer": per_row(c.layer for c in calls),
                "selected": selected, "weights": weights, "logits": logits,
                "resident": per_row(np.asarray(c.resident, dtype=np.int16) for c in calls)}
        if self.moe_input:
            cols["moe_input"] = next(host)  # one row each (``write_trace``)
        for src in dict.fromkeys(src for c in calls for src in c.predictions):  # in the order first seen
            col = cols[f"pred_{src}"] = []
            for c, k in zip(calls, n):  # rows without a prediction: None
                p = c.predictions.get(src, [])
                col += [*p, *[None] * (k - len(p))]
        return cols


class _Call(NamedTuple):
    """One ``experts.selected`` event, as the hook gave it."""
    layer: int
    step: int
    phase: str
    position: int
    ids: np.ndarray
    logits: object  # numpy or MLX array, or None
    moe_input: object
    resident: list
    predictions: dict


def _stacks(groups, dtypes) -> list:
    """Each group, [(numpy or MLX array, its row count), ...], as one numpy array of its rows, of its
    dtype (MLX's). The groups of MLX arrays only are evaluated together: one transfer for the whole trace."""
    lazy = [mx.concatenate([v.reshape(-1) for v, _ in g]).astype(t)
            if all(isinstance(v, mx.array) for v, _ in g) else None for g, t in zip(groups, dtypes)]
    mx.eval([x for x in lazy if x is not None])
    return [np.array(x).reshape(sum(k for _, k in g), -1) if x is not None else
            np.concatenate([to_numpy(v).reshape(k, -1) for v, k in g]).astype(_NP[t], copy=False)
            for g, x, t in zip(groups, lazy, dtypes)]


_NP = {mx.float32: np.float32, mx.float16: np.float16}


def _put(col, at, values):
    """col[at[i]] = values[i]"""
    for row, v in zip(at, values):
        col[row] = v
