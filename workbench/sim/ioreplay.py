"""Trace-driven I/O replay at real expert sizes.

Replays a recorded routing trace through the *real* arena, I/O scheduler, read modes and
eviction policies against a store of any expert size (for example a random model with
MiniMax-like 1.2 MB experts), with per-layer compute time given or taken from the trace's
run. This is how the SSD regime of a 200B model is studied on a small machine: routing
from a real (small) model, bytes and timing from the big store. The arena starts as the engine's
does and replays the prefill as the engine ran it, then decode (``sim.drive``, ``arena.claims``).
"""

from __future__ import annotations

import os
import time

import numpy as np
from tqdm.auto import tqdm

from ..arena.arena import Arena
from ..arena.claims import Claims
from ..arena.counters import Counters, summarize
from ..config import AheadConfig, ArenaConfig, IOConfig, as_arena
from ..hooks import Hooks
from ..io.scheduler import IOScheduler
from ..sizes import arena_slots
from ..store.manifest import Manifest
from ..store.reader import BlobReader
from .drive import ResidencyHash, check_phase, decisions, preload


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
              map_layers=None, map_experts=None, hooks=None, phase="all", cache=None) -> dict:
    """Replay ``trace`` (workbench.trace.schema.Trace, or a path) against ``store``.

    ``arena``: ArenaConfig (default 0.25, lru; ``preload`` as in the engine); ``io``: IOConfig
    (default: no checksums, so reads time as reads). ``ahead``: read-ahead from the trace: predictor
    "oracle" (the trace's own next selections) or a recorded source ``SRC`` (the trace's ``pred_SRC``
    column), issued ``lookahead`` layers early; every recorded candidate is read (no ranking mode,
    gate or width: those are ``simulate``'s). compute_ms: per-layer compute time in ms (default: the
    trace run's compute_s spread evenly). map_layers / map_experts: how a trace of another model maps
    onto the store (``layer_plan``, ``expert_map``); without them a mismatch is refused. Each token
    runs every store MoE layer. ``max_steps``: decode steps. ``phase``: "all" replays the prefill
    first, as the engine ran it (waves, prompt-hot protection; untimed, no compute, not in the
    stats), "decode" the decode rows only. ``hooks``: a ``Hooks`` whose subscribers see the arena's
    points and, as in the engine, ``layer.{i}.experts.selected`` before each layer and ``token.end``
    after each token (both also given ``arena=``). ``cache``: "cold" drops the store's pages from the
    page cache first and turns kernel read-ahead off (buffered reads fetch what they ask for; cold at
    the start: an expert read again later may come from the cache), "warm" and None leave the page
    cache as it is. Every result says which (``cache``) and splits the bytes
    read into ``disk_bytes`` (this process's storage reads, Linux /proc/self/io; None elsewhere) and
    ``cache_bytes`` (the rest, served from the page cache).
    """
    from ..arena.policies.static import require_hotlist
    from ..checks import real, whole
    from ..trace.schema import Trace, read_trace

    arena, io, ahead, phase = as_arena(arena), io or IOConfig(verify="never"), ahead or AheadConfig(), check_phase(phase)
    if (ahead.mode, ahead.gate, ahead.width, ahead.oracle_trace) != ("raw", "none", None, None):
        raise ValueError("ioreplay reads every recorded candidate of --predictor at --lookahead: a ranking --mode, "
                         "--gate, --ahead-width or --oracle-trace is not replayed here; use workbench simulate for those")
    real("--compute-ms", compute_ms, 0, none_ok=True)
    whole("--max-steps", max_steps, 1, none_ok=True)
    require_hotlist(arena.policy, arena.options, "--hotlist FILE")
    trace = trace if isinstance(trace, Trace) else read_trace(trace)
    m = Manifest.load(store)
    plan = layer_plan(trace.moe_layers, m.moe_layers, map_layers)
    to_store = expert_map(int(trace.meta["n_experts"]), m.n_experts, map_experts)
    compute_ms = _compute_ms(trace, compute_ms)
    routes = _Routes(trace, to_store, ahead.predictor if ahead.reads_ahead else None, phase, max_steps)
    routes.check(plan, trace)
    k = max(v.shape[-1] for v in routes.sel.values())
    n_slots = arena_slots(arena.size, m.n_routed, m.expert_bytes, k)
    counters, hooks = Counters(), hooks or Hooks()
    if cache not in (None, "cold", "warm"):
        raise ValueError(f"cache {cache!r} is not known; give cold or warm")
    reader = BlobReader(store, m, mode=io.mode, verify=io.verify)
    cold = cache == "cold" and hasattr(os, "posix_fadvise")
    if cold:
        from ..io.readpath import drop_cache

        drop_cache(reader.path)
        os.posix_fadvise(reader.fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead: disk bytes are the bytes asked for
    disk0 = disk_read_bytes()
    sched = IOScheduler(reader, workers=io.workers, reserved=io.reserved)
    ar = Arena(m, n_slots, sched, counters, hooks, arena.policy, arena.options, arena.writes)
    run = _Replay(ar, k, plan, routes, ahead.distance, compute_ms, hooks)
    try:
        preload(ar, counters, arena.preload)
        run.prefill()
        times = run.decode(progress)
    finally:
        sched.close()
        ar.close()
        reader.close()
    disk = disk_read_bytes()
    disk = None if disk is None or disk0 is None else disk - disk0
    stats = summarize(counters.totals("decode"))
    med = float(np.median(times)) if times else 0.0
    stats.update(tokens=len(times), median_token_ms=med * 1e3, compute_ms_per_token=compute_ms * len(plan),
                 bytes_per_token=stats["bytes_read"] / max(1, len(times)), arena_slots=n_slots,
                 expert_bytes=m.expert_bytes, policy=arena.policy, prefetch_source=routes.source or "none",
                 io_mode=io.mode, wall_s=float(sum(times)), layers_per_token=len(plan), map_layers=map_layers or "none",
                 map_experts=map_experts or "none", residency_hash=run.residency.hexdigest(),
                 cache="as found (cold needs posix_fadvise)" if cache == "cold" and not cold else cache or "as found",
                 disk_bytes=disk)
    total = sum(r.get("bytes_read", 0) for r in counters.rows.values())  # preload, prefill and decode, as disk_bytes
    stats["cache_bytes"] = None if disk is None else max(0, total - disk)
    return stats


def disk_read_bytes() -> int | None:
    """Bytes this process has had read from storage (Linux ``/proc/self/io`` read_bytes); None elsewhere."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _compute_ms(trace, compute_ms) -> float:
    """The per-layer compute to sleep: given, or the trace run's compute spread evenly."""
    from ..checks import real, whole

    if compute_ms is not None:
        return compute_ms
    st = trace.meta.get("stats") or {}
    try:
        n = max(1, whole("stats.tokens", st.get("tokens", 0), 0)) * len(trace.moe_layers)
        return 1e3 * real("stats.compute_s", st.get("compute_s", 0.0), 0) / n
    except ValueError as e:
        raise ValueError(f"trace {trace.path or ''} metadata {e}; pass --compute-ms") from None


class _Routes:
    """A trace's decisions by (step, trace layer) as store ids (``sel``: [tokens, k] each), the
    read-ahead candidates of its decode rows (``pred``), and the steps to replay."""

    def __init__(self, trace, to_store, source, phase, max_steps):
        dec = trace.decode()
        if not len(dec):
            raise ValueError(f"trace {trace.path or ''} has no decode rows to replay; record a run with --max-tokens 1 "
                             "or more")
        self.source = source
        column = {None: None, "oracle": "selected"}.get(source, f"pred_{source}")
        if column is not None and column not in dec.columns:
            have = [c[5:] for c in dec.columns if c.startswith("pred_")]
            raise ValueError(f"trace has no predictor column {column}; recorded sources: {have or 'none'} (or use oracle)")
        rows = trace.routes if phase == "all" else dec
        self.sel = {}
        for d in decisions(rows):
            ids = to_store(d.ids)
            self.sel[(d.step, d.layer)] = np.unique(ids)[None] if len(ids) == 1 else ids  # a map may repeat an id
        self.pred = {}
        if column is not None:  # ids were checked against n_experts when the trace was read
            self.pred = {(int(s), int(l)): to_store(np.asarray(v, dtype=np.int64))
                         for s, l, v in zip(dec.step, dec.layer, dec[column]) if v is not None}
        self.steps = sorted(int(s) for s in dec.step.unique())[:max_steps]
        pre = trace.routes[trace.routes["phase"] == "prefill"]
        self.prefill = sorted(int(s) for s in pre.step.unique()) if phase == "all" else []

    def check(self, plan, trace) -> None:
        missing = next(((s, tl) for s in self.prefill + self.steps for _, tl in plan if (s, tl) not in self.sel), None)
        if missing is not None:
            raise ValueError(f"trace {trace.path or ''} has no row for step {missing[0]} layer {missing[1]}; "
                             "every step needs its rows at every MoE layer: re-record it")


class _Replay:
    """The replay loop: every decision through ``Claims``, read-ahead from the recorded candidates."""

    def __init__(self, ar, k, plan, routes, distance, compute_ms, hooks):
        self.ar, self.k, self.plan, self.routes, self.distance = ar, k, plan, routes, distance
        self.compute_ms, self.hooks, self.residency = compute_ms, hooks, ResidencyHash()
        self.claims = Claims(ar, k, on_begin=self._selected)
        self.order = [(s, i) for s in routes.steps for i in range(len(plan))]  # (step, index into plan)

    def _selected(self, layer, ids) -> None:
        if self.hooks.active:
            self.hooks.fire(f"layer.{layer}.experts.selected", np.unique(ids), layer=layer, step=self.ar.step,
                            arena=self.ar)

    def prefill(self) -> None:
        """The prefill, as the engine runs it: no read-ahead (its planner predicts in decode only)."""
        for s in self.routes.prefill:
            self.ar.step = s
            self.ar.counters.phase[s] = "prefill"
            for sl, tl in self.plan:
                self.claims.route(sl, self.routes.sel[(s, tl)])
        if self.routes.prefill:
            self.claims.protect_prompt_hot()

    def decode(self, progress) -> list:
        """The decode steps; each one's wall time."""
        ar, counters, times = self.ar, self.ar.counters, []
        ahead = self._read_ahead if self.routes.source is not None else None
        for pos, s in enumerate(tqdm(self.routes.steps, desc="io replay", unit="tok", disable=not progress)):
            t0 = time.perf_counter()
            ar.step = s
            counters.phase[s] = "decode"
            for i, (sl, tl) in enumerate(self.plan):
                at = pos * len(self.plan) + i
                self.claims.route(sl, self.routes.sel[(s, tl)], ahead and (lambda: ahead(at)))
                _busy(self.compute_ms / 1e3)
                counters.row(s, sl)["compute_ns"] += int(self.compute_ms * 1e6)
            ar.policy.tick()
            times.append(time.perf_counter() - t0)
            self.residency.update(ar)
            if self.hooks.active:
                self.hooks.fire("token.end", None, step=s, counters=counters.rows, arena=ar)
        ar.finish_speculation()
        return times

    def _read_ahead(self, at) -> None:
        """Read the candidates recorded for the layer ``distance`` after position ``at``, as the
        engine does: this layer's slots still pinned."""
        j = at + self.distance
        if j >= len(self.order):
            return
        ts, ti = self.order[j]
        cands = self.routes.pred.get((ts, self.plan[ti][1]))
        for e in ([] if cands is None else cands):
            self.ar.prefetch(self.plan[ti][0], int(e), self.k)


def _busy(seconds: float) -> None:
    """Stand-in for per-layer compute: sleep (releases the GIL, as MLX compute does)."""
    if seconds > 0:
        time.sleep(seconds)
