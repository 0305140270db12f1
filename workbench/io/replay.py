"""Trace-driven I/O replay at real expert sizes.

Replays a recorded routing trace through the *real* arena, I/O scheduler, read modes and
eviction policies against a store of any expert size (for example a random model with
MiniMax-like 1.2 MB experts), with per-layer compute time given or taken from the trace's
run. This is how the SSD regime of a 200B model is studied on a small machine: routing
from a real (small) model, bytes and timing from the big store.
"""

from __future__ import annotations

import time

import numpy as np
from tqdm.auto import tqdm

from ..arena.arena import Arena
from ..engine.arena_size import arena_slots
from ..engine.counters import Counters, summarize
from ..hooks import Hooks
from ..store.manifest import Manifest
from ..store.reader import BlobReader
from .scheduler import IOScheduler


def replay_io(trace, store, arena="0.25", policy="lru", compute_ms=None, prefetch=None, distance=1,
              io_mode="buffered", io_workers=8, io_reserved=2, max_steps=None, progress=True,
              policy_options=None) -> dict:
    """Replay ``trace`` (workbench.trace.schema.Trace) against ``store``.

    compute_ms: per-layer compute time in ms (default: the trace run's compute_s spread evenly).
    prefetch: None, "oracle" (the trace's own next selections at ``distance``), or a recorded
    predictor source ``SRC`` (the trace's ``pred_SRC`` column), issued ``distance`` layers early.
    ``trace`` is a Trace or a path. The store needs at least the trace's experts per layer.
    """
    from ..arena.policies.static import require_hotlist
    from ..checks import io_workers as check_workers
    from ..checks import real, whole
    from ..trace.schema import Trace, read_trace

    real("--compute-ms", compute_ms, 0, none_ok=True)
    whole("--lookahead", distance, 1)
    whole("--max-steps", max_steps, 1, none_ok=True)
    check_workers("--io-workers", io_workers, io_reserved)
    require_hotlist(policy, policy_options or {}, "--hotlist FILE")
    trace = trace if isinstance(trace, Trace) else read_trace(trace)
    m = Manifest.load(store)
    if trace.n_experts > m.n_experts:
        raise ValueError(f"trace {trace.path or ''} routes {trace.n_experts} experts per layer but store {store} has "
                         f"{m.n_experts}; replay onto a store with at least {trace.n_experts} experts per layer")
    dec = trace.decode().sort_values(["step", "layer"])
    if not len(dec):
        raise ValueError(f"trace {trace.path or ''} has no decode rows to replay; record a run with --max-tokens 1 or more")
    steps = sorted(dec.step.unique())[:max_steps]
    t_layers = trace.moe_layers
    s_layers = m.moe_layers
    layer_map = {t: s_layers[i % len(s_layers)] for i, t in enumerate(t_layers)}
    if compute_ms is None:
        st = trace.meta.get("stats") or {}
        try:
            n = max(1, whole("stats.tokens", st.get("tokens", 0), 0)) * len(t_layers)
            compute_ms = 1e3 * real("stats.compute_s", st.get("compute_s", 0.0), 0) / n
        except ValueError as e:
            raise ValueError(f"trace {trace.path or ''} metadata {e}; pass --compute-ms") from None
    column = None
    if prefetch not in (None, "oracle"):
        column = f"pred_{prefetch}"
        if column not in dec.columns:
            have = [c[5:] for c in dec.columns if c.startswith("pred_")]
            raise ValueError(f"trace has no predictor column {column}; recorded sources: {have or 'none'} (or use oracle)")
    sel = {(int(s), int(l)): np.asarray(v, dtype=np.int64) for s, l, v in zip(dec.step, dec.layer, dec.selected)}
    pred = {}
    if column is not None:  # ids were checked against n_experts when the trace was read
        pred = {(int(s), int(l)): np.asarray(v, dtype=np.int64) for s, l, v in zip(dec.step, dec.layer, dec[column]) if v is not None}
    missing = next(((s, tl) for s in steps for tl in t_layers if (s, tl) not in sel), None)
    if missing is not None:
        raise ValueError(f"trace {trace.path or ''} has no row for step {missing[0]} layer {missing[1]}; "
                         "every decode step needs one row per MoE layer: re-record it")
    k = max(len(v) for v in sel.values())
    n_slots = arena_slots(arena, m.n_routed, m.expert_bytes, k)
    counters, hooks = Counters(), Hooks()
    reader = BlobReader(store, m, mode=io_mode, verify="never")
    io = IOScheduler(reader, workers=io_workers, reserved=min(io_reserved, io_workers))
    ar = Arena(m, n_slots, io, counters, hooks, policy, policy_options)
    order = [(s, l) for s in steps for l in t_layers]
    pos = {x: i for i, x in enumerate(order)}
    times = []
    try:
        for s in tqdm(steps, desc="io replay", unit="tok", disable=not progress):
            t0 = time.perf_counter()
            ar.step = s
            counters.phase[s] = "decode"
            for i, tl in enumerate(t_layers):
                ar.at_layer(layer_map[tl], np.unique(sel[(s, tl)]))
                ar.release()
                _busy(compute_ms / 1e3)
                counters.row(s, layer_map[tl])["compute_ns"] += int(compute_ms * 1e6)
                ar.after_layer()
                if prefetch is not None:
                    j = pos[(s, tl)] + distance
                    if j < len(order):
                        target = order[j]
                        cands = sel.get(target) if prefetch == "oracle" else pred.get(target)
                        for e in ([] if cands is None else cands):
                            ar.prefetch(layer_map[target[1]], int(e), k)
            ar.policy.tick()
            times.append(time.perf_counter() - t0)
        ar.finish_speculation()
    finally:
        io.close()
        reader.close()
    stats = summarize(counters.totals("decode"))
    med = float(np.median(times)) if times else 0.0
    stats.update(tokens=len(times), median_token_ms=med * 1e3, compute_ms_per_token=compute_ms * len(t_layers),
                 bytes_per_token=stats["bytes_read"] / max(1, len(times)), arena_slots=n_slots,
                 expert_bytes=m.expert_bytes, policy=policy, prefetch_source=prefetch or "none", io_mode=io_mode)
    return stats


def _busy(seconds: float) -> None:
    """Stand-in for per-layer compute: sleep (releases the GIL, as MLX compute does)."""
    if seconds > 0:
        time.sleep(seconds)
