"""Virtual-time model: replay a trace through the engine's own arena (``arena.Arena`` with
``writes="none"``) and virtual-time I/O (``sim.vio``), so that sync misses, stalls, prefetch
outcome classes and time per token come out of a fixed routing trace under exactly the engine's
rules (victims, pins, limbo, publication, outcome classes).

The arena starts as the engine's does (``arena.claims.preload``); the prefill decisions are
replayed as the engine ran them (waves, prompt-hot protection), off the clock; then, per decode
decision (token t, layer L) in trace order (``sim.drive``):

* it starts ``pre_moe_s`` (attention, norms, router) after the previous one ended, which is the
  time read-ahead at distance 1 has to land;
* ``Claims.route`` with its experts: hits, claims of speculative reads (``useful_timely`` if
  complete, else ``useful_late``), sync misses, whose wait is its stall; then, L's slots still
  pinned, read-ahead: the decision ``distance`` ahead gets ``ahead_candidates`` ranked, gated
  and started with ``Arena.prefetch``; release; limbo turns (unused prefetches get their outcome);
* ``compute_s`` of expert compute; after a step's last decision ``policy.tick()``; at the end
  ``finish_speculation``.

Each issued prefetch gets exactly one outcome, so ``issued`` equals the sum of the five
outcome counts (checked at the end of every run). ``prefetch_bytes`` counts the bytes each
outcome class actually read. Cache-aware routing itself is not replayable (see
``replay.NotReplayableError``); ahead mode ``"cache_aware"`` only reorders prefetch candidates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..arena.arena import OUTCOMES, Arena, ArenaError
from ..arena.claims import Claims
from ..arena.counters import Counters
from ..config import AheadConfig, ArenaConfig, as_arena
from ..hooks import Hooks
from ..routing.gates import make_gate
from ..routing.rank import ahead_candidates
from .cache import NoVictimError
from .replay import build_policy, check_replayable
from .drive import ResidencyHash, check_phase, decisions, preload
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
    """Summary dict, per-token table and per-layer table of one virtual-time run (decode only; a
    token's ``residency`` is the engine's ``residency_hash`` after it)."""

    summary: dict
    tokens: pd.DataFrame
    layers: pd.DataFrame
    config: dict = field(default_factory=dict)
    counters: pd.DataFrame | None = None  # per (step, layer) of every phase, as the engine's Result.counters

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
             max_ahead=None, moce_bonus=None, progress=False, phase="all") -> VTimeResult:
    """Run the virtual-time model over ``trace``; its numbers are the decode rows'.

    ``arena``: ArenaConfig (or only its size; default 0.25, lru); its policy may also be a Policy
    class or instance; ``preload`` as in the engine (``arena.claims.preload``). ``ahead``:
    predictor "none" (no read-ahead), "oracle" (the trace's own selection of the target row,
    ranked by its recorded logits when present) or a source name ``src`` for a ``pred_<src>``
    column (ids, best first; ranked by position); ``lookahead``: rows ahead the prediction is
    available (default: ``d<N>`` in the source name, 1 for the oracle, one token for ``prev``);
    ``mode`` / ``moce_*``: ``ahead_candidates`` ranking; ``width``: candidates per row (default
    top_k); ``gate`` with ``gate_options``. ``max_ahead``: cap on reads issued per target row.
    ``moce_bonus`` > 0 says the routing itself is cache-aware, which fixed routes cannot replay.
    ``phase``: "all" replays the prefill rows first, as the engine ran them (off the clock, not in
    the summary: decode starts from the arena prefill left), "decode" the decode rows only.
    """
    from ..arena.policies.static import require_hotlist

    arena, ahead, phase = as_arena(arena), ahead or AheadConfig(), check_phase(phase)
    if isinstance(arena.policy, str):
        require_hotlist(arena.policy, arena.options)
    tr = load(trace)
    warning = check_replayable(tr.meta, moce_bonus)
    timing = timing or Timing()
    timing.check()
    run = _Run(tr, arena, ahead, timing, max_ahead)
    if phase == "all":
        run.prefill(decisions(select_rows(tr, "prefill")))
    run.decode(progress)
    return run.result(warning)


class _Run:
    """One simulation: the arena driven through ``Claims`` on virtual I/O, read-ahead, the tallies."""

    def __init__(self, tr, cfg: ArenaConfig, ahead: AheadConfig, timing: Timing, max_ahead):
        rows = select_rows(tr, "decode").reset_index(drop=True)
        if not len(rows):
            raise ValueError("the trace has no decode rows to simulate")
        req = requests_from_trace(tr, phase="decode")
        self.E, self.top_k, self.timing, self.max_ahead, self.cfg = req.n_experts, int(tr.top_k), timing, max_ahead, cfg
        self.expert_bytes = int(timing.expert_bytes or tr.meta.get("expert_bytes") or 0)
        self.capacity = parse_arena(cfg.size, req.n_routed, self.expert_bytes or None)
        if self.expert_bytes <= 0:
            raise ValueError("expert size unknown: the trace has no expert_bytes; pass Timing(expert_bytes=...)")
        popts = cfg.options
        if isinstance(cfg.policy, (str, type)):
            popts.setdefault("n_keys", req.n_keys)
            popts.setdefault("n_experts", self.E)
        self.pol = build_policy(cfg.policy, self.capacity, **popts)
        self.ahead, self.gate = ahead, make_gate(ahead.gate, **(ahead.gate_options or {}))
        self.k = int(ahead.width or tr.top_k)
        self.predictor = ahead.predictor if ahead.reads_ahead else None
        self.dist = self.scorer = None
        if self.predictor is not None:
            self.scorer = _scorer(rows, self.predictor, self.E)
            self.dist = _distance_for(self.predictor, ahead.lookahead, tr.meta, len(tr.moe_layers) or 1)
            if self.dist < 1:
                raise ValueError(f"prediction distance must be >= 1 row, got {self.dist}")
        self.dec = decisions(rows)  # the decode decisions
        moe_layers = sorted(set(int(x) for x in tr.moe_layers) | set(tr.routes["layer"].astype(int).tolist()))
        self.counters, self.io = Counters(), VirtualIO(timing)
        self.ar = Arena(TraceManifest(self.E, moe_layers, self.expert_bytes), self.capacity, self.io, self.counters,
                        Hooks(), self.pol, writes="none")
        self.claims = Claims(self.ar, self.top_k)
        preload(self.ar, self.counters, cfg.preload)
        self.io.reset()  # preloaded before the clock starts
        self.eligible: dict[int, list] = {}  # target decision -> candidates ranked for it (the gate learns)
        self.tok_rows, self.layer_stats, self.residency = [], {}, ResidencyHash()

    def _route(self, d, read_ahead=None) -> None:
        self.ar.step = d.step
        self.counters.phase[d.step] = d.phase
        try:
            self.claims.route(d.layer, d.ids, read_ahead)
        except ArenaError as e:
            raise NoVictimError(f"arena of {self.capacity} slots has no evictable slot for layer {d.layer} at {d.phase} "
                                f"step {d.step}: {e}; use a larger arena or fewer prefetches (max_ahead)") from None

    def prefill(self, prefill) -> None:
        """The prefill decisions, as the engine runs them (no read-ahead: its planner predicts in
        decode only), then the prompt-hot protection; off the clock."""
        if not prefill:
            return
        for d in prefill:
            self._route(d)
        self.claims.protect_prompt_hot()
        self.io.reset()  # every read has been waited for: decode's clock starts at 0

    def decode(self, progress=False) -> None:
        it = range(len(self.dec))
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc="virtual time")
        cur = dict(lookups=0, stall=0.0, compute=0.0, t0=self.io.now)
        for r in it:
            d = self.dec[r]
            n, stall, busy = self._decode_one(r, d)
            ls = self.layer_stats.setdefault(d.layer, [0, 0.0])
            ls[0] += n
            ls[1] += stall
            cur["lookups"] += n
            cur["stall"] += stall
            cur["compute"] += busy
            if r + 1 == len(self.dec) or self.dec[r + 1].step != d.step:
                self.pol.tick()
                self.tok_rows.append(dict(step=d.step, lookups=cur["lookups"], stall_s=cur["stall"],
                                          compute_s=cur["compute"], time_s=self.io.now - cur["t0"],
                                          residency=self.residency.update(self.ar)))
                cur = dict(lookups=0, stall=0.0, compute=0.0, t0=self.io.now)
        self.now = self.io.now
        self.ar.finish_speculation()  # open speculation settles after the last token, off the clock

    def _decode_one(self, r, d):
        """Decision ``r``: (lookups, stall, pre-MoE + compute time)."""
        io, pre = self.io, self.timing.pre(d.layer)
        io.advance(io.now + pre)
        wanted = np.unique(d.ids)
        if r in self.eligible:
            self.gate.update(d.layer, self.eligible.pop(r), wanted.tolist())
        t0 = mark = io.now

        def read_ahead():  # as the engine does: L's slots still pinned
            nonlocal mark
            self._read_ahead(r)
            mark = io.now

        self._route(d, read_ahead)
        comp = self.timing.compute(d.layer)
        io.advance(io.now + comp)  # the host goes on while L's experts compute
        return len(wanted), mark - t0, pre + comp

    def _read_ahead(self, r) -> None:
        tgt = r + (self.dist or 0)
        if self.scorer is None or tgt >= len(self.dec):
            return
        z = self.scorer(self.dec[tgt].row)
        if z is None:
            return
        TL, ar, a = self.dec[tgt].layer, self.ar, self.ahead
        cands = ahead_candidates(z, ar.mapped[TL], self.k, mode=a.mode, p=a.moce_protect, b=a.moce_bonus, r1=a.moce_r1,
                                 resident_mask=ar.map.resident_mask(TL))
        cands = [int(e) for e in cands if np.isfinite(z[e])]
        self.eligible.setdefault(tgt, []).extend(cands)
        issued = 0
        for e in self.gate.filter(TL, cands, bytes=self.expert_bytes):
            if self.max_ahead is not None and issued >= self.max_ahead:
                break
            if ar.prefetch(TL, e, self.top_k) is not None:
                issued += 1

    def result(self, warning) -> VTimeResult:
        frame = self.counters.frame()
        frame = frame[frame["step"] >= 0].reset_index(drop=True)  # not the preload
        for o in ("issued",) + OUTCOMES:
            frame[f"prefetch_{o}_bytes_read"] = [self.counters.rows[(s_, l_)].get(f"prefetch_{o}_bytes_read", 0)
                                                 for s_, l_ in zip(frame["step"], frame["layer"])]
        dec = frame[frame["phase"] == "decode"]
        tokens = pd.DataFrame(self.tok_rows)
        per_step = dec.groupby("step")[["hits", "sync_misses"]].sum()
        for i, col in ((2, "hits"), (3, "sync_misses")):
            tokens.insert(i, col, per_step[col].reindex(tokens["step"]).fillna(0).astype(int).to_numpy())
        summary = self._summary(dec, tokens)
        if warning:
            summary["warning"] = warning
        per_layer = dec.groupby("layer")[["hits", "sync_misses"]].sum()
        ltab = pd.DataFrame([dict(layer=L, lookups=v[0], hits=int(per_layer.loc[L, "hits"]),
                                  sync_misses=int(per_layer.loc[L, "sync_misses"]), stall_s=v[1])
                             for L, v in sorted(self.layer_stats.items())])
        a = self.ahead
        config = dict(policy=self.pol.name, arena=str(self.cfg.size), predictor=self.predictor, distance=self.dist,
                      mode=a.mode, k=self.k, p=a.moce_protect, b=a.moce_bonus, r1=a.moce_r1, gate=self.gate.name,
                      timing=self.timing.__dict__.copy())
        return VTimeResult(summary=summary, tokens=tokens, layers=ltab, config=config, counters=frame)

    def _summary(self, dec, tokens) -> dict:
        counts = {o: int(dec[f"prefetch_{o}"].sum()) for o in ("issued",) + OUTCOMES}
        pbytes = {o: int(dec[f"prefetch_{o}_bytes_read"].sum()) for o in OUTCOMES}
        pbytes["issued"] = sum(pbytes.values())
        if counts["issued"] != sum(counts[o] for o in OUTCOMES):
            raise PrefetchInvariantError(f"issued {counts['issued']} != sum of outcomes {[counts[o] for o in OUTCOMES]}")
        lookups, hits, n, now = int(tokens["lookups"].sum()), int(dec["hits"].sum()), len(tokens), self.now
        return {
            "policy": self.pol.name, "capacity": self.capacity, "tokens": n, "lookups": lookups, "hits": hits,
            "sync_misses": int(dec["sync_misses"].sum()),
            "prefetch_claims": counts["useful_late"] + counts["useful_timely"],
            "hit_rate": hits / lookups if lookups else 0.0, "virtual_s": now, "s_per_token": now / n,
            "tokens_per_s": n / now if now > 0 else 0.0, "stall_s": float(tokens["stall_s"].sum()),
            "bytes_read": int(dec["bytes_read"].sum()), "prefetch": dict(counts), "prefetch_bytes": dict(pbytes),
            "residency_hash": self.residency.hexdigest(),
        }


def _scorer(rows, predictor, E):
    """Decode row r's prediction as a (E,) score row, or None: the oracle's selection (ranked by
    its recorded logits when present), else the ``pred_<src>`` ids ranked by position."""
    if predictor == "oracle":
        col, use_logits = "selected", "logits" in rows.columns and rows["logits"].notna().all()
    else:
        col = predictor if predictor.startswith("pred_") else f"pred_{predictor}"
        use_logits = False
        if col not in rows.columns:
            have = [c[5:] for c in rows.columns if c.startswith("pred_")] + ["oracle"]
            raise ValueError(f"trace has no predictor column {col!r}; available predictors: {', '.join(have)}")
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

    return scorer
