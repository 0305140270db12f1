"""Virtual-time model: replay a trace's decode rows through the engine's own arena
(``arena.Arena`` with ``writes="none"``) and virtual-time I/O (``sim.vio``), so that sync
misses, stalls, prefetch outcome classes and time per token come out of a fixed routing trace
under exactly the engine's rules (victims, pins, limbo, publication, outcome classes).

Per routing row (token t, layer L) in trace order, as the engine's per-layer decode and
``workbench ioreplay`` do it:

* the row starts ``pre_moe_s`` (attention, norms, router) after the previous row ended, which
  is the time read-ahead at distance 1 has to land;
* ``Arena.at_layer`` with the row's experts (sorted, distinct): hits, claims of speculative
  reads (``useful_timely`` if complete, else ``useful_late``), sync misses; waiting for reads
  is the row's stall; then ``release`` and ``compute_s`` of expert compute;
* ``Arena.after_layer`` (limbo ends: unused prefetches are unmapped and get their outcome),
  then read-ahead: rows whose prediction becomes available now (``distance`` rows ahead) get
  ``ahead_candidates`` ranked, gated and started with ``Arena.prefetch``;
* after the last row of a decode step: ``policy.tick()``; at the end ``finish_speculation``.

Each issued prefetch gets exactly one outcome, so ``issued`` equals the sum of the five
outcome counts (checked at the end of every run). ``prefetch_bytes`` counts the bytes each
outcome class actually read. Cache-aware routing itself is not replayable (see
``replay.NotReplayableError``); ahead mode ``"cache_aware"`` only reorders prefetch candidates.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..arena.arena import OUTCOMES, Arena, ArenaError
from ..arena.counters import Counters
from ..config import AheadConfig, ArenaConfig, as_arena
from ..hooks import Hooks
from ..routing.gates import make_gate
from ..routing.rank import ahead_candidates
from .cache import NoVictimError
from .replay import build_policy, check_replayable
from .requests import load, parse_arena, requests_from_trace, select_rows
from .vio import TraceManifest, VirtualIO

__all__ = ["Timing", "simulate", "VTimeResult", "OUTCOMES", "PrefetchInvariantError"]



class PrefetchInvariantError(AssertionError):
    """issued != sum of prefetch outcomes: a bookkeeping bug."""


@dataclass
class Timing:
    """Virtual-time parameters (seconds, bytes, bytes per second)."""

    compute_s: float | dict = 1e-3  # expert (MoE block) compute per layer; a dict maps layer id -> s
    pre_moe_s: float | dict = 1e-3  # attention/norms/router before each MoE block (overlaps read-ahead)
    read_latency_s: float = 100e-6
    bandwidth: float = 2.0e9  # device total, bytes/s
    workers: int = 8
    urgent_workers: int = 2
    stream_bandwidth: float | None = None  # one read's rate; default bandwidth / workers
    expert_bytes: int | None = None  # default: the trace's meta expert_bytes
    piece_bytes: int | None = None  # split reads into pieces (queued pieces cancellable)

    def check(self):
        from ..checks import real

        if self.workers < 1 or not 0 <= self.urgent_workers <= self.workers:
            raise ValueError(f"need workers >= 1 and 0 <= urgent_workers <= workers, got {self.workers}, {self.urgent_workers}")
        if not self.bandwidth > 0 or (self.stream_bandwidth is not None and not self.stream_bandwidth > 0):
            raise ValueError("bandwidth must be > 0 bytes/s")
        real("bandwidth", self.bandwidth, 0, open_lo=True)
        real("read_latency_s", self.read_latency_s, 0)
        for name in ("compute_s", "pre_moe_s"):
            value = getattr(self, name)
            for v in (value.values() if isinstance(value, dict) else [value]):
                real(name, v, 0)
        if self.piece_bytes is not None and self.piece_bytes < 1:
            raise ValueError("piece_bytes must be >= 1 (or None for whole reads)")

    def compute(self, layer: int) -> float:
        return _per_layer(self.compute_s, layer, "compute_s")

    def pre(self, layer: int) -> float:
        return _per_layer(self.pre_moe_s, layer, "pre_moe_s")


def _per_layer(value, layer, name):
    if isinstance(value, dict):
        try:
            return float(value[layer])
        except KeyError:
            raise ValueError(f"{name} has no time for layer {layer}; give every MoE layer a time") from None
    return float(value)


@dataclass
class VTimeResult:
    """Summary dict, per-token table and per-layer table of one virtual-time run."""

    summary: dict
    tokens: pd.DataFrame
    layers: pd.DataFrame
    config: dict = field(default_factory=dict)
    counters: pd.DataFrame | None = None  # one row per (step, layer), the engine's counter columns

    def to_dict(self) -> dict:
        return dict(self.summary)


def _distance_for(src, distance, meta, n_layers):
    if distance is not None:
        return int(distance)
    if src == "oracle":
        return 1
    m = re.search(r"d(\d+)$", src)
    if m:
        return int(m.group(1))
    if src in ("prev", "prev_token", "prevtok"):
        return n_layers
    info = (meta.get("predictors") or {}).get(src) or {}
    if "distance" in info:
        return int(info["distance"])
    raise ValueError(f"predictor {src!r}: cannot tell its distance; give a lookahead (--lookahead N, AheadConfig(lookahead=N): "
                     f"rows ahead, {n_layers} = one token)")


def simulate(trace, arena: ArenaConfig | None = None, ahead: AheadConfig | None = None, timing: Timing | None = None,
             max_ahead=None, moce_bonus=None, progress=False) -> VTimeResult:
    """Run the virtual-time model over the decode rows of ``trace``.

    ``arena``: ArenaConfig (or only its size; default 0.25, lru); its policy may also be a Policy
    class or instance, and ``preload=False`` skips loading the policy's hotlist. ``ahead``:
    predictor "none" (no read-ahead), "oracle" (the trace's own selection of the target row,
    ranked by its recorded logits when present) or a source name ``src`` for a ``pred_<src>``
    column (ids, best first; ranked by position); ``lookahead``: rows ahead the prediction is
    available (default: ``d<N>`` in the source name, 1 for the oracle, one token for ``prev``);
    ``mode`` / ``moce_*``: ``ahead_candidates`` ranking; ``width``: candidates per row (default
    top_k); ``gate`` with ``gate_options``. ``max_ahead``: cap on reads issued per target row.
    ``moce_bonus`` > 0 says the routing itself is cache-aware, which fixed routes cannot replay.
    """
    from ..arena.policies.static import require_hotlist

    arena, ahead = as_arena(arena), ahead or AheadConfig()
    policy, predictor, mode = arena.policy, (ahead.predictor if ahead.reads_ahead else None), ahead.mode
    p, b, r1 = ahead.moce_protect, ahead.moce_bonus, ahead.moce_r1
    if isinstance(policy, str):
        require_hotlist(policy, arena.options)
    tr = load(trace)
    warning = check_replayable(tr.meta, moce_bonus)
    timing = timing or Timing()
    timing.check()
    rows = select_rows(tr, "decode").reset_index(drop=True)
    if not len(rows):
        raise ValueError("the trace has no decode rows to simulate")
    req = requests_from_trace(tr, phase="decode")
    E = req.n_experts
    expert_bytes = int(timing.expert_bytes or tr.meta.get("expert_bytes") or 0)
    capacity = parse_arena(arena.size, req.n_routed, expert_bytes or None)
    if expert_bytes <= 0:
        raise ValueError("expert size unknown: the trace has no expert_bytes; pass Timing(expert_bytes=...)")
    popts = arena.options
    if isinstance(policy, (str, type)):
        popts.setdefault("n_keys", req.n_keys)
        popts.setdefault("n_experts", E)
    pol = build_policy(policy, capacity, **popts)
    gate = make_gate(ahead.gate, **(ahead.gate_options or {}))
    k = int(ahead.width or tr.top_k)
    n_layers = len(tr.moe_layers) or 1

    layers = rows["layer"].to_numpy(dtype=np.int64)
    steps = rows["step"].to_numpy(dtype=np.int64)
    selected = [np.asarray(s, dtype=np.int64) for s in rows["selected"]]
    n_rows = len(rows)
    token_end = np.ones(n_rows, dtype=bool)
    token_end[:-1] = steps[1:] != steps[:-1]

    # predictions: per target row, a (1, E) score row or None
    dist = None
    scorer = None
    if predictor is not None:
        if predictor == "oracle":
            col, use_logits = "selected", "logits" in rows.columns and rows["logits"].notna().all()
        else:
            col = predictor if predictor.startswith("pred_") else f"pred_{predictor}"
            use_logits = False
            if col not in rows.columns:
                have = [c[5:] for c in rows.columns if c.startswith("pred_")] + ["oracle"]
                raise ValueError(f"trace has no predictor column {col!r}; available predictors: {', '.join(have)}")
        dist = _distance_for(predictor, ahead.lookahead, tr.meta, n_layers)
        if dist < 1:
            raise ValueError(f"prediction distance must be >= 1 row, got {dist}")
        lists = rows[col].tolist()
        logits = rows["logits"].tolist() if use_logits else None

        def scorer(r):
            if logits is not None:
                return np.asarray(logits[r], dtype=np.float64)
            ids = lists[r]
            if ids is None or len(ids) == 0:
                return None
            z = np.full(E, -np.inf)
            z[np.asarray(ids, dtype=np.int64)] = -np.arange(len(ids), dtype=np.float64)
            return z

    moe_layers = sorted(set(int(x) for x in tr.moe_layers) | set(layers.tolist()))
    counters = Counters()
    io = VirtualIO(timing)
    ar = Arena(TraceManifest(E, moe_layers, expert_bytes), capacity, io, counters, Hooks(), pol, writes="none")
    top_k = int(tr.top_k)
    warm = [int(key) for key in pol.warm_keys()]
    if arena.preload is not False and warm:  # before the clock starts, counted apart
        ar.step = -1
        counters.phase[-1] = "preload"
        ar.preload(warm)
        io.reset()
    eligible_by_target: dict[int, list] = {}
    tok_rows = []
    layer_stats = {}
    cur = dict(lookups=0, stall=0.0, compute=0.0, t0=0.0)
    it = range(n_rows)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="virtual time")
    for r in it:
        L, step = int(layers[r]), int(steps[r])
        wanted = np.unique(selected[r])
        ar.step = step
        counters.phase[step] = "decode"
        pre = timing.pre(L)
        io.advance(io.now + pre)
        if r in eligible_by_target:
            gate.update(L, eligible_by_target.pop(r), wanted.tolist())
        t0 = io.now
        try:
            ar.at_layer(L, wanted)
        except ArenaError as e:
            raise NoVictimError(f"arena of {capacity} slots has no evictable slot for layer {L} at decode step {step}: "
                                f"{e}; use a larger arena or fewer prefetches (max_ahead)") from None
        stall = io.now - t0
        t1 = io.now
        if scorer is not None and r + dist < n_rows:  # read ahead as the engine does: L's slots still pinned
            tgt = r + dist
            TL = int(layers[tgt])
            z = scorer(tgt)
            if z is not None:
                cands = ahead_candidates(z, ar.mapped[TL], k, mode=mode, p=p, b=b, r1=r1, resident_mask=ar.map.resident_mask(TL))
                cands = [int(e) for e in cands if np.isfinite(z[e])]
                eligible_by_target.setdefault(tgt, []).extend(cands)
                issued_here = 0
                for e in gate.filter(TL, cands, bytes=expert_bytes):
                    if max_ahead is not None and issued_here >= max_ahead:
                        break
                    if ar.prefetch(TL, e, top_k) is not None:
                        issued_here += 1
        stall += io.now - t1
        ar.release()
        ar.after_layer()  # the host goes on while L's experts compute
        comp = timing.compute(L)
        io.advance(io.now + comp)
        ls = layer_stats.setdefault(L, [0, 0.0])
        ls[0] += len(wanted)
        ls[1] += stall
        cur["lookups"] += len(wanted)
        cur["stall"] += stall
        cur["compute"] += comp + pre
        if token_end[r]:
            pol.tick()
            tok_rows.append(dict(step=step, lookups=cur["lookups"], stall_s=cur["stall"], compute_s=cur["compute"],
                                 time_s=io.now - cur["t0"],
                                 residency=hashlib.blake2b(ar.map.signature(), digest_size=8).hexdigest()))
            cur = dict(lookups=0, stall=0.0, compute=0.0, t0=io.now)
    now = io.now
    ar.finish_speculation()  # open speculation settles after the last token, off the clock

    frame = counters.frame()
    frame = frame[frame["phase"] == "decode"].reset_index(drop=True)
    for o in ("issued",) + OUTCOMES:
        frame[f"prefetch_{o}_bytes_read"] = [counters.rows[(s_, l_)].get(f"prefetch_{o}_bytes_read", 0)
                                             for s_, l_ in zip(frame["step"], frame["layer"])]
    per_step = frame.groupby("step")[["hits", "sync_misses"]].sum()
    tokens = pd.DataFrame(tok_rows)
    if len(tokens):
        tokens.insert(2, "hits", per_step["hits"].reindex(tokens["step"]).fillna(0).astype(int).to_numpy())
        tokens.insert(3, "sync_misses", per_step["sync_misses"].reindex(tokens["step"]).fillna(0).astype(int).to_numpy())
    counts = {o: int(frame[f"prefetch_{o}"].sum()) for o in ("issued",) + OUTCOMES}
    pbytes = {o: int(frame[f"prefetch_{o}_bytes_read"].sum()) for o in OUTCOMES}
    pbytes["issued"] = sum(pbytes.values())
    if counts["issued"] != sum(counts[o] for o in OUTCOMES):
        raise PrefetchInvariantError(f"issued {counts['issued']} != sum of outcomes {[counts[o] for o in OUTCOMES]}")
    lookups = int(tokens["lookups"].sum()) if len(tokens) else 0
    hits = int(frame["hits"].sum())
    sync = int(frame["sync_misses"].sum())
    summary = {
        "policy": pol.name,
        "capacity": capacity,
        "tokens": len(tokens),
        "lookups": lookups,
        "hits": hits,
        "sync_misses": sync,
        "prefetch_claims": counts["useful_late"] + counts["useful_timely"],
        "hit_rate": hits / lookups if lookups else 0.0,
        "virtual_s": now,
        "s_per_token": now / len(tokens) if len(tokens) else 0.0,
        "tokens_per_s": len(tokens) / now if now > 0 else 0.0,
        "stall_s": float(tokens["stall_s"].sum()) if len(tokens) else 0.0,
        "bytes_read": int(frame["bytes_read"].sum()),
        "prefetch": dict(counts),
        "prefetch_bytes": dict(pbytes),
    }
    if warning:
        summary["warning"] = warning
    per_layer = frame.groupby("layer")[["hits", "sync_misses"]].sum()
    ltab = pd.DataFrame([dict(layer=L, lookups=v[0], hits=int(per_layer.loc[L, "hits"]),
                              sync_misses=int(per_layer.loc[L, "sync_misses"]), stall_s=v[1])
                         for L, v in sorted(layer_stats.items())])
    config = dict(policy=pol.name, arena=str(arena.size), predictor=predictor, distance=dist, mode=mode, k=k, p=p, b=b, r1=r1,
                  gate=gate.name, timing=timing.__dict__.copy())
    return VTimeResult(summary=summary, tokens=tokens, layers=ltab, config=config, counters=frame)
