"""Turn a trace's routing table into the cache request stream the simulator and exporters use.

One request per routed expert, in trace order (rows as stored, ``selected`` left to right),
key = ``layer * n_experts + expert``. ``token_end`` marks the last request of each decode
step (where the engine calls ``policy.tick()``).
``next_use`` gives each request's next request for the same key (Belady, oracleGeneral).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.schema import Trace, TraceError, read_trace

PHASES = ("prefill", "decode")


@dataclass
class Requests:
    """The flattened request stream of a trace (all arrays have one entry per request)."""

    keys: np.ndarray  # int64, layer * n_experts + expert
    layer: np.ndarray  # int64
    expert: np.ndarray  # int64
    step: np.ndarray  # int64
    row: np.ndarray  # int64, index of the routing row (after phase filtering)
    token_end: np.ndarray  # bool
    n_experts: int
    n_keys: int  # layer-id span * n_experts (every key is < n_keys)
    n_routed: int  # routed experts of the model: len(moe_layers) * n_experts

    def __len__(self):
        return len(self.keys)


def load(trace) -> Trace:
    """A Trace from a Trace or a path (paths go through ``read_trace``)."""
    return trace if isinstance(trace, Trace) else read_trace(trace)


def select_rows(trace: Trace, phase=None):
    """The routing rows of ``phase`` ('prefill', 'decode', or None/'all' for both), in trace order."""
    routes = trace.routes
    if phase in (None, "all"):
        return routes
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; valid phases: prefill, decode, all")
    return routes[routes["phase"] == phase]


def requests_from_trace(trace, phase=None) -> Requests:
    """Flatten ``trace`` (a Trace or a path) into a ``Requests`` stream; malformed rows raise TraceError."""
    trace = load(trace)
    where = f"trace {trace.path}" if trace.path else "trace"
    try:
        n_experts = int(trace.meta["n_experts"])
        moe_layers = [int(x) for x in trace.meta["moe_layers"]]
    except (KeyError, TypeError, ValueError) as e:
        raise TraceError(f"{where} metadata lacks a valid n_experts/moe_layers ({e}); re-record it") from None
    if n_experts < 1:
        raise TraceError(f"{where} metadata has n_experts={n_experts}; it must be >= 1")
    rows = select_rows(trace, phase)
    for col in ("step", "layer", "selected", "phase"):
        if col not in rows.columns:
            raise TraceError(f"{where} has no {col!r} column; it is not a workbench routing trace")
    col = rows["selected"]
    if len(col) and col.isna().any():
        bad = int(np.flatnonzero(col.isna().to_numpy())[0])
        raise TraceError(f"{where} row {bad} has no selected experts (null); re-record the trace")
    sel = col.to_numpy()
    lens = np.fromiter(map(len, sel), dtype=np.int64, count=len(sel))
    experts = np.concatenate(sel).astype(np.int64) if len(sel) and lens.sum() else np.zeros(0, np.int64)
    layer_rows = rows["layer"].to_numpy(dtype=np.int64)
    step_rows = rows["step"].to_numpy(dtype=np.int64)
    if len(experts) and (experts.min() < 0 or experts.max() >= n_experts):
        i = int(np.flatnonzero((experts < 0) | (experts >= n_experts))[0])
        raise TraceError(f"{where} routes expert {int(experts[i])}, outside 0..{n_experts - 1} (n_experts={n_experts}); the trace is corrupt")
    if len(layer_rows) and layer_rows.min() < 0:
        raise TraceError(f"{where} has a negative layer id; the trace is corrupt")
    if moe_layers and len(layer_rows):
        unknown = sorted(set(np.unique(layer_rows).tolist()) - set(moe_layers))
        if unknown:
            raise TraceError(f"{where} routes layers {unknown[:5]} not in its moe_layers metadata {moe_layers[:8]}...; the trace is corrupt")
    layer = np.repeat(layer_rows, lens)
    step = np.repeat(step_rows, lens)
    row = np.repeat(np.arange(len(sel), dtype=np.int64), lens)
    # last request of each decode step
    phase_rows = rows["phase"].to_numpy()
    last_row_of_step = np.ones(len(sel), dtype=bool)
    if len(sel) > 1:
        last_row_of_step[:-1] = step_rows[1:] != step_rows[:-1]
    ends_row = last_row_of_step & (phase_rows == "decode") & (lens > 0)
    token_end = np.zeros(len(experts), dtype=bool)
    if len(experts):
        last_req = np.cumsum(lens) - 1
        token_end[last_req[ends_row]] = True
    span = (max(moe_layers + [int(layer_rows.max()) if len(layer_rows) else 0]) + 1) if (moe_layers or len(layer_rows)) else 1
    return Requests(
        keys=layer * n_experts + experts,
        layer=layer,
        expert=experts,
        step=step,
        row=row,
        token_end=token_end,
        n_experts=n_experts,
        n_keys=span * n_experts,
        n_routed=max(1, len(moe_layers)) * n_experts,
    )


def next_use(keys) -> np.ndarray:
    """Index of each request's next request for the same key, or -1 if none (vectorized)."""
    keys = np.asarray(keys, dtype=np.int64)
    n = len(keys)
    nxt = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return nxt
    span = int(keys.max()) - int(keys.min())
    # a trace's keys span fewer than 2^16 values: numpy's stable sort of uint16 is a radix sort (6x faster)
    order = np.argsort((keys - keys.min()).astype(np.uint16) if span < 1 << 16 else keys, kind="stable")
    sk = keys[order]
    same = sk[1:] == sk[:-1]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def parse_arena(arena, n_routed: int, expert_bytes: int | None = None) -> int:
    """Slots from ``--arena`` (see ``workbench.sizes``: fraction, percentage, slot count or size)."""
    from ..sizes import arena_slots

    return arena_slots(arena, n_routed, expert_bytes)
