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
from ..arena.counters import Counters, summarize
from ..config import AheadConfig, ArenaConfig, IOConfig, as_arena
from ..hooks import Hooks
from ..io.scheduler import IOScheduler
from ..sizes import arena_slots
from ..store.manifest import Manifest
from ..store.reader import BlobReader


MAP_LAYERS = ("modulo", "spread")
MAP_EXPERTS = ("modulo",)


def layer_plan(t_layers, s_layers, how=None) -> list[tuple[int, int]]:
    """(store layer, trace layer) pairs, one per store MoE layer, in order.

    Without ``how`` the trace must have the store's MoE layers. ``modulo``: store layer j replays
    trace layer j mod n_trace; ``spread``: trace layer floor(j * n_trace / n_store) (contiguous runs).
    """
    t_layers, s_layers = list(t_layers), list(s_layers)
    if how is None:
        if t_layers != s_layers:
            raise ValueError(f"the trace's MoE layers ({len(t_layers)}: {t_layers[:4]}...) differ from the store's "
                             f"({len(s_layers)}: {s_layers[:4]}...); map them explicitly with --map-layers modulo|spread")
        return list(zip(s_layers, t_layers))
    if how == "modulo":
        return [(s, t_layers[j % len(t_layers)]) for j, s in enumerate(s_layers)]
    if how == "spread":
        return [(s, t_layers[j * len(t_layers) // len(s_layers)]) for j, s in enumerate(s_layers)]
    raise ValueError(f"unknown layer map {how!r}; valid: {', '.join(MAP_LAYERS)}")


def expert_map(n_trace: int, n_store: int, how=None):
    """A function from trace expert ids (array) to store expert ids."""
    if how is None:
        if n_trace != n_store:
            raise ValueError(f"the trace routes over {n_trace} experts per layer, the store has {n_store}; "
                             f"map them explicitly with --map-experts modulo")
        return lambda e: e
    if how == "modulo":
        return lambda e: e % n_store
    raise ValueError(f"unknown expert map {how!r}; valid: {', '.join(MAP_EXPERTS)}")


def replay_io(trace, store, arena: ArenaConfig | None = None, io: IOConfig | None = None,
              ahead: AheadConfig | None = None, compute_ms=None, max_steps=None, progress=True,
              map_layers=None, map_experts=None, hooks=None) -> dict:
    """Replay ``trace`` (workbench.trace.schema.Trace, or a path) against ``store``.

    ``arena``: ArenaConfig (default 0.25, lru); ``io``: IOConfig (default: no checksums, so reads
    time as reads). ``ahead``: read-ahead from the trace: predictor "oracle" (the trace's own next
    selections) or a recorded source ``SRC`` (the trace's ``pred_SRC`` column), issued
    ``lookahead`` layers early; every recorded candidate is read (no ranking mode, gate or width:
    those are ``simulate``'s). compute_ms: per-layer compute time in ms (default: the trace run's
    compute_s spread evenly). map_layers / map_experts: how a trace of another model maps onto the
    store (``layer_plan``, ``expert_map``); without them a mismatch is refused. Each token runs
    every store MoE layer. ``hooks``: a ``Hooks`` whose subscribers see the arena's points and, as in
    the engine, ``layer.{i}.experts.selected`` before each layer and ``token.end`` after each token
    (both also given ``arena=``).
    """
    from ..arena.policies.static import require_hotlist
    from ..checks import real, whole
    from ..trace.schema import Trace, read_trace

    arena = as_arena(arena)
    io = io or IOConfig(verify="never")
    ahead = ahead or AheadConfig()
    if (ahead.mode, ahead.gate, ahead.width, ahead.oracle_trace) != ("raw", "none", None, None):
        raise ValueError("ioreplay reads every recorded candidate of --predictor at --lookahead: a ranking --mode, "
                         "--gate, --ahead-width or --oracle-trace is not replayed here; use workbench simulate for those")
    prefetch = ahead.predictor if ahead.reads_ahead else None
    distance = ahead.distance
    real("--compute-ms", compute_ms, 0, none_ok=True)
    whole("--max-steps", max_steps, 1, none_ok=True)
    require_hotlist(arena.policy, arena.options, "--hotlist FILE")
    trace = trace if isinstance(trace, Trace) else read_trace(trace)
    m = Manifest.load(store)
    dec = trace.decode().sort_values(["step", "layer"])
    if not len(dec):
        raise ValueError(f"trace {trace.path or ''} has no decode rows to replay; record a run with --max-tokens 1 or more")
    steps = sorted(dec.step.unique())[:max_steps]
    t_layers = trace.moe_layers
    plan = layer_plan(t_layers, m.moe_layers, map_layers)
    to_store = expert_map(int(trace.meta["n_experts"]), m.n_experts, map_experts)
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
    sel = {(int(s), int(l)): to_store(np.asarray(v, dtype=np.int64)) for s, l, v in zip(dec.step, dec.layer, dec.selected)}
    pred = {}
    if column is not None:  # ids were checked against n_experts when the trace was read
        pred = {(int(s), int(l)): to_store(np.asarray(v, dtype=np.int64))
                for s, l, v in zip(dec.step, dec.layer, dec[column]) if v is not None}
    missing = next(((s, tl) for s in steps for tl in t_layers if (s, tl) not in sel), None)
    if missing is not None:
        raise ValueError(f"trace {trace.path or ''} has no row for step {missing[0]} layer {missing[1]}; "
                         "every decode step needs one row per MoE layer: re-record it")
    k = max(len(v) for v in sel.values())
    n_slots = arena_slots(arena.size, m.n_routed, m.expert_bytes, k)
    counters, hooks = Counters(), hooks or Hooks()
    reader = BlobReader(store, m, mode=io.mode, verify=io.verify)
    sched = IOScheduler(reader, workers=io.workers, reserved=io.reserved)
    ar = Arena(m, n_slots, sched, counters, hooks, arena.policy, arena.options, arena.writes)
    order = [(s, i) for s in steps for i in range(len(plan))]  # (step, index into plan)
    times = []
    try:
        for step_index, s in enumerate(tqdm(steps, desc="io replay", unit="tok", disable=not progress)):
            t0 = time.perf_counter()
            ar.step = s
            counters.phase[s] = "decode"
            for i, (sl, tl) in enumerate(plan):
                ids = np.unique(sel[(s, tl)])
                if hooks.active:
                    hooks.fire(f"layer.{sl}.experts.selected", ids, layer=sl, step=s, arena=ar)
                ar.at_layer(sl, ids)
                if prefetch is not None:  # read ahead as the engine does: this layer's slots still pinned
                    j = step_index * len(plan) + i + distance
                    if j < len(order):
                        ts, ti = order[j]
                        target = (ts, plan[ti][1])
                        cands = sel.get(target) if prefetch == "oracle" else pred.get(target)
                        for e in ([] if cands is None else cands):
                            ar.prefetch(plan[ti][0], int(e), k)
                ar.release()
                ar.after_layer()
                _busy(compute_ms / 1e3)
                counters.row(s, sl)["compute_ns"] += int(compute_ms * 1e6)
            ar.policy.tick()
            times.append(time.perf_counter() - t0)
            if hooks.active:
                hooks.fire("token.end", None, step=s, counters=counters.rows, arena=ar)
        ar.finish_speculation()
    finally:
        sched.close()
        ar.close()
        reader.close()
    stats = summarize(counters.totals("decode"))
    med = float(np.median(times)) if times else 0.0
    stats.update(tokens=len(times), median_token_ms=med * 1e3, compute_ms_per_token=compute_ms * len(plan),
                 bytes_per_token=stats["bytes_read"] / max(1, len(times)), arena_slots=n_slots,
                 expert_bytes=m.expert_bytes, policy=arena.policy, prefetch_source=prefetch or "none", io_mode=io.mode,
                 wall_s=float(sum(times)), layers_per_token=len(plan), map_layers=map_layers or "none",
                 map_experts=map_experts or "none")
    return stats


def _busy(seconds: float) -> None:
    """Stand-in for per-layer compute: sleep (releases the GIL, as MLX compute does)."""
    if seconds > 0:
        time.sleep(seconds)
