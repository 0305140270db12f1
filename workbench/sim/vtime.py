"""Virtual-time model: replay a trace's decode rows through the arena semantics of DESIGN.md
section 3 with simulated I/O, so that sync misses, stalls, prefetch outcome classes and time
per token come out of a fixed routing trace.

Per routing row (token t, layer L) in trace order:

* ``at_layer``: the wanted set is the row's selected experts. Mapped wanted keys are pinned
  first. An unclaimed speculative slot is claimed (``policy.access(key, speculative=True)``):
  outcome ``useful_timely`` if its read had completed, else ``useful_late`` (a queued read is
  promoted to the urgent queue). Other resident keys are hits. The rest are sync misses:
  a victim from the policy's order (skipping pinned, in-flight, limbo and unclaimed
  speculative slots; none left is an error) and an urgent read. Unclaimed speculation aimed
  at this row is then cancelled: a queued read is ``cancelled_before_read``; a running read
  finishes (``completed_unused``) or, with ``piece_bytes``, stops after its current piece
  (``partially_read``); a completed one is ``completed_unused``. Slots that hold data go to
  limbo (not evictable) until the after_layer after next, the rest are freed.
* each row starts ``pre_moe_s`` (attention, norms, router) after the previous row's
  after_layer, which is the time read-ahead at distance 1 has to land; the expert compute
  starts when every wanted read is done (the wait is the row's stall) and lasts ``compute_s``.
* ``after_layer``: the previous limbo generation is released and the current one rotates;
  then read-ahead: rows whose prediction becomes available now (``distance`` rows ahead)
  get ``ahead_candidates`` ranked, gated and submitted as speculative reads (each one takes
  a free slot or a victim that is not in the target layer).
* after the last row of a decode step: ``policy.tick()``.

I/O: ``workers`` threads, the first ``urgent_workers`` serve only the urgent queue, the
others take urgent work first, then speculative. A read takes ``read_latency_s +
bytes / stream_bandwidth`` per piece (pieces of ``piece_bytes``, or one piece); a running
read is never preempted. ``stream_bandwidth`` defaults to ``bandwidth / workers`` (the
device's total is reached when every worker is busy).

Each issued prefetch gets exactly one outcome, so ``issued`` equals the sum of the five
outcome counts (checked at the end of every run). ``prefetch_bytes`` counts the bytes each
outcome class actually read. Cache-aware routing itself is not replayable (see
``replay.NotReplayableError``); ahead mode ``"route"`` only reorders prefetch candidates.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..routing.gates import Gate, make_gate
from ..routing.rank import AHEAD_MODES, ahead_candidates
from .cache import NoVictimError
from .replay import build_policy, check_replayable
from .requests import load, parse_arena, requests_from_trace, select_rows

__all__ = ["Timing", "simulate", "VTimeResult", "OUTCOMES", "PrefetchInvariantError"]

OUTCOMES = ("cancelled_before_read", "partially_read", "completed_unused", "useful_late", "useful_timely")


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


class _Read:
    __slots__ = ("key", "nbytes", "urgent", "enq", "start", "end", "worker", "target", "piece_t", "n_pieces", "state")

    def __init__(self, key, nbytes, urgent, enq, target=None):
        self.key, self.nbytes, self.urgent, self.enq, self.target = key, nbytes, urgent, enq, target
        self.start = self.end = self.worker = None
        self.state = "queued"  # queued | started | cancelled


class _IO:
    """Virtual worker pool with an urgent and a speculative FIFO queue."""

    def __init__(self, t: Timing, expert_bytes: int):
        self.t = t
        self.free_at = [0.0] * t.workers
        self.reserved = [w < t.urgent_workers for w in range(t.workers)]
        self.urgent: deque[_Read] = deque()
        self.spec: deque[_Read] = deque()
        self.bw = t.stream_bandwidth or t.bandwidth / t.workers
        self.bytes_read = 0

    def _duration(self, rd):
        pb = self.t.piece_bytes or rd.nbytes
        n = max(1, -(-rd.nbytes // pb))
        rd.n_pieces = n
        rd.piece_t = self.t.read_latency_s + min(pb, rd.nbytes) / self.bw
        last = rd.nbytes - (n - 1) * pb
        return (n - 1) * rd.piece_t + self.t.read_latency_s + last / self.bw

    def _next(self, limit):
        best = None
        for w in range(len(self.free_at)):
            if self.urgent:
                item = self.urgent[0]
            elif not self.reserved[w] and self.spec:
                item = self.spec[0]
            else:
                continue
            s = max(self.free_at[w], item.enq)
            if s <= limit and (best is None or s < best[0]):
                best = (s, w, item)
        return best

    def _start(self, s, w, item):
        (self.urgent if item.urgent else self.spec).popleft()
        item.start, item.worker, item.state = s, w, "started"
        item.end = s + self._duration(item)
        self.free_at[w] = item.end
        self.bytes_read += item.nbytes

    def advance(self, t):
        """Start every read that a free worker picks up at or before time ``t``."""
        while True:
            nxt = self._next(t)
            if nxt is None:
                return
            self._start(*nxt)

    def submit(self, rd: _Read, now: float):
        self.advance(now)
        (self.urgent if rd.urgent else self.spec).append(rd)
        self.advance(now)

    def promote(self, rd: _Read, now: float):
        """Move a queued speculative read to the urgent queue (kept in urgent FIFO order)."""
        if rd.state == "queued" and not rd.urgent:
            self.spec.remove(rd)
            rd.urgent = True
            self.urgent.append(rd)
            self.advance(now)

    def wait(self, rd: _Read) -> float:
        """Completion time of ``rd`` (starting queued work in time order until it runs)."""
        while rd.state == "queued":
            nxt = self._next(float("inf"))
            if nxt is None:  # cannot happen while rd is queued and some worker can take it
                raise RuntimeError("virtual I/O deadlock: a queued read can never start")
            self._start(*nxt)
        return rd.end

    def cancel(self, rd: _Read, now: float):
        """Cancel unclaimed speculation at ``now``: returns (outcome, bytes read, data_valid_at or None)."""
        self.advance(now)
        if rd.state == "queued":
            self.spec.remove(rd)
            rd.state = "cancelled"
            return "cancelled_before_read", 0, None
        if rd.end <= now or self.t.piece_bytes is None:
            return "completed_unused", rd.nbytes, rd.end
        # running and split into pieces: finish the current piece, drop the rest
        done = int(np.floor((now - rd.start) / rd.piece_t)) + 1 if now > rd.start else 1
        if done >= rd.n_pieces:
            return "completed_unused", rd.nbytes, rd.end
        piece_end = rd.start + done * rd.piece_t
        read = min(rd.nbytes, done * self.t.piece_bytes)
        self.bytes_read -= rd.nbytes - read
        if self.free_at[rd.worker] == rd.end:
            self.free_at[rd.worker] = piece_end
        rd.end = piece_end
        rd.state = "cancelled"
        return "partially_read", read, None


class _Slot:
    """spec: prefetch with an open outcome (not evictable); limbo: unused prefetch held until
    its release; fresh: filled by a prefetch and never claimed (unpublished)."""

    __slots__ = ("read", "spec", "limbo", "fresh")

    def __init__(self, read=None, spec=False):
        self.read, self.spec, self.limbo, self.fresh = read, spec, False, spec


@dataclass
class VTimeResult:
    """Summary dict, per-token table and per-layer table of one virtual-time run."""

    summary: dict
    tokens: pd.DataFrame
    layers: pd.DataFrame
    config: dict = field(default_factory=dict)

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
    raise ValueError(f"predictor {src!r}: cannot tell its distance; pass distance= (rows ahead, {n_layers} = one token)")


def simulate(trace, policy="lru", arena="0.25", timing: Timing | None = None, predictor=None, distance=None,
             mode="unpert1", k=None, p=3, b=0.85, r1=0.0, gate="none", gate_options=None, max_ahead=None,
             preload=True, moce_bonus=None, policy_options=None, progress=False) -> VTimeResult:
    """Run the virtual-time model over the decode rows of ``trace``.

    ``predictor``: None (no read-ahead), ``"oracle"`` (the trace's own selection of the
    target row, ranked by its recorded logits when present) or a source name ``src`` for a
    ``pred_<src>`` column (ids, best first; ranked by position). ``distance``: rows ahead
    the prediction is available (default: ``d<N>`` in the source name, 1 for the oracle,
    one token for ``prev``). ``mode``/``p``/``b``/``r1``: ``ahead_candidates`` ranking;
    ``k``: candidates per row (default top_k); ``gate``: a name or a Gate; ``max_ahead``:
    cap on reads issued per target row.
    """
    from ..arena.policies.static import require_hotlist

    if isinstance(policy, str):
        require_hotlist(policy, policy_options or {})
    tr = load(trace)
    warning = check_replayable(tr.meta, moce_bonus)
    timing = timing or Timing()
    timing.check()
    if mode not in AHEAD_MODES:
        raise ValueError(f"unknown ahead mode {mode!r}; valid modes: {', '.join(AHEAD_MODES)}")
    rows = select_rows(tr, "decode").reset_index(drop=True)
    if not len(rows):
        raise ValueError("the trace has no decode rows to simulate")
    req = requests_from_trace(tr, phase="decode")
    E = req.n_experts
    expert_bytes = int(timing.expert_bytes or tr.meta.get("expert_bytes") or 0)
    capacity = parse_arena(arena, req.n_routed, expert_bytes or None)
    if expert_bytes <= 0:
        raise ValueError("expert size unknown: the trace has no expert_bytes; pass Timing(expert_bytes=...)")
    popts = dict(policy_options or {})
    if isinstance(policy, (str, type)):
        popts.setdefault("n_keys", req.n_keys)
        popts.setdefault("n_experts", E)
    pol = build_policy(policy, capacity, **popts)
    gate = gate if isinstance(gate, Gate) else make_gate(gate, **(gate_options or {}))
    k = int(k or tr.top_k)
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
        dist = _distance_for(predictor, distance, tr.meta, n_layers)
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

    io = _IO(timing, expert_bytes)
    slots: dict[int, _Slot] = {}
    by_layer: dict[int, set] = {}
    spec_by_target: dict[int, list] = {}
    eligible_by_target: dict[int, list] = {}
    limbo_cur: set[int] = set()
    limbo_prev: set[int] = set()
    counts = dict.fromkeys(("issued",) + OUTCOMES, 0)
    pbytes = dict.fromkeys(("issued",) + OUTCOMES, 0)

    def add_slot(key, slot):
        slots[key] = slot
        by_layer.setdefault(key // E, set()).add(key)

    def drop_slot(key):
        del slots[key]
        by_layer[key // E].discard(key)
        pol.remove(key)

    def find_victim(skip, skip_layer=None):
        for v in pol.order():
            s = slots[v]
            if v in skip or s.spec or s.limbo or (s.read is not None and s.read.state == "queued"):
                continue
            if s.read is not None and s.read.end is not None and s.read.end > now:
                continue
            if skip_layer is not None and v // E == skip_layer:
                continue
            return v
        return None

    def outcome(name, nbytes):
        counts[name] += 1
        pbytes[name] += nbytes

    if preload:
        for key in pol.warm_keys()[:capacity]:
            key = int(key)
            if key not in slots:
                pol.admit(key, speculative=True)
                add_slot(key, _Slot())

    now = 0.0
    tok_rows = []
    layer_stats = {}
    cur = dict(hits=0, sync=0, stall=0.0, compute=0.0, t0=0.0, rows=0)
    it = range(n_rows)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="virtual time")
    for r in it:
        L = int(layers[r])
        wanted = list(dict.fromkeys(selected[r].tolist()))
        keys = [L * E + e for e in wanted]
        pre = timing.pre(L)
        now += pre
        io.advance(now)
        if r in eligible_by_target:
            gate.update(L, eligible_by_target.pop(r), wanted)
        # --- at_layer -------------------------------------------------------
        pinned = {key for key in keys if key in slots}
        waits = []
        hits = sync = 0
        for key in keys:
            s = slots.get(key)
            if s is None:
                continue
            if s.spec:  # first claim of a prefetch whose outcome is still open
                rd = s.read
                if rd.state == "started" and rd.end <= now:
                    outcome("useful_timely", rd.nbytes)
                else:
                    outcome("useful_late", rd.nbytes)
                    io.promote(rd, now)
                    waits.append(rd)
                s.spec = s.fresh = False
                pol.access(key, speculative=True)
            else:
                if s.read is not None and s.read.end is not None and s.read.end > now:
                    waits.append(s.read)
                pol.access(key, speculative=s.fresh)
                s.fresh = False
                hits += 1
            if s.limbo:
                s.limbo = False
                limbo_cur.discard(key)
                limbo_prev.discard(key)
        # unclaimed speculation aimed at this row: cancel queued work, keep finished data in limbo
        for key, rd in spec_by_target.pop(r, []):
            s = slots.get(key)
            if s is None or s.read is not rd or not s.spec:
                continue
            name, nbytes, valid_at = io.cancel(rd, now)
            outcome(name, nbytes)
            s.spec = False
            if valid_at is None:
                drop_slot(key)
            else:
                s.limbo = True
                limbo_cur.add(key)
        for key in keys:
            if key in slots:
                continue
            if len(slots) >= capacity:
                v = find_victim(pinned)
                if v is None:
                    raise NoVictimError(
                        f"arena of {capacity} slots has no evictable slot for layer {L} at decode step {int(steps[r])}: "
                        f"{len(pinned)} pinned for this layer, {sum(1 for s in slots.values() if s.spec)} unclaimed speculative, "
                        f"{len(limbo_cur) + len(limbo_prev)} in limbo; use a larger arena or fewer prefetches (max_ahead)"
                    )
                drop_slot(v)
            rd = _Read(key, expert_bytes, True, now)
            io.submit(rd, now)
            pol.admit(key, speculative=False)
            add_slot(key, _Slot(rd))
            pinned.add(key)
            waits.append(rd)
            sync += 1
        t_ready = now
        for rd in waits:
            t_ready = max(t_ready, io.wait(rd))
        stall = t_ready - now
        comp = timing.compute(L)
        now = t_ready + comp
        # --- after_layer ----------------------------------------------------
        for key in limbo_prev:  # released: unmapped, as the arena's after_layer does
            s = slots.get(key)
            if s is not None and s.limbo:
                drop_slot(key)
        limbo_prev, limbo_cur = limbo_cur, set()
        if scorer is not None and r + dist < n_rows:
            tgt = r + dist
            TL = int(layers[tgt])
            z = scorer(tgt)
            if z is not None:
                mapped = np.zeros(E, dtype=bool)
                for key in by_layer.get(TL, ()):
                    mapped[key - TL * E] = True
                resident = np.zeros(E, dtype=bool)
                for key in by_layer.get(TL, ()):
                    s = slots[key]
                    if not (s.spec or s.limbo or s.fresh):
                        resident[key - TL * E] = True
                cands = ahead_candidates(z, mapped, k, mode=mode, p=p, b=b, r1=r1, resident_mask=resident)
                cands = [int(e) for e in cands if np.isfinite(z[e])]
                eligible_by_target.setdefault(tgt, []).extend(cands)
                issued_here = 0
                for e in gate.filter(TL, cands, bytes=expert_bytes):
                    if max_ahead is not None and issued_here >= max_ahead:
                        break
                    key = TL * E + e
                    if key in slots:
                        continue
                    if len(slots) >= capacity:
                        v = find_victim((), skip_layer=TL)
                        if v is None:
                            break
                        drop_slot(v)
                    rd = _Read(key, expert_bytes, False, now, target=tgt)
                    io.submit(rd, now)
                    pol.admit(key, speculative=True)
                    add_slot(key, _Slot(rd, spec=True))
                    spec_by_target.setdefault(tgt, []).append((key, rd))
                    counts["issued"] += 1
                    issued_here += 1
        # --- bookkeeping ----------------------------------------------------
        ls = layer_stats.setdefault(L, [0, 0, 0, 0.0])
        ls[0] += len(keys)
        ls[1] += hits
        ls[2] += sync
        ls[3] += stall
        cur["hits"] += hits
        cur["sync"] += sync
        cur["stall"] += stall
        cur["compute"] += comp + pre
        cur["rows"] += 1
        cur.setdefault("lookups", 0)
        cur["lookups"] += len(keys)
        if token_end[r]:
            pol.tick()
            tok_rows.append(dict(step=int(steps[r]), lookups=cur["lookups"], hits=cur["hits"], sync_misses=cur["sync"],
                                 stall_s=cur["stall"], compute_s=cur["compute"], time_s=now - cur["t0"]))
            cur = dict(hits=0, sync=0, stall=0.0, compute=0.0, t0=now, rows=0, lookups=0)

    pbytes["issued"] = sum(pbytes[o] for o in OUTCOMES)
    outstanding = sum(len(v) for v in spec_by_target.values())
    if counts["issued"] != sum(counts[o] for o in OUTCOMES) + outstanding or outstanding:
        raise PrefetchInvariantError(f"issued {counts['issued']} != sum of outcomes {[counts[o] for o in OUTCOMES]} (+{outstanding} open)")
    tokens = pd.DataFrame(tok_rows)
    lookups = int(tokens["lookups"].sum()) if len(tokens) else 0
    hits = int(tokens["hits"].sum()) if len(tokens) else 0
    sync = int(tokens["sync_misses"].sum()) if len(tokens) else 0
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
        "bytes_read": io.bytes_read,
        "prefetch": dict(counts),
        "prefetch_bytes": dict(pbytes),
    }
    if warning:
        summary["warning"] = warning
    ltab = pd.DataFrame([dict(layer=L, lookups=v[0], hits=v[1], sync_misses=v[2], stall_s=v[3]) for L, v in sorted(layer_stats.items())])
    config = dict(policy=pol.name, arena=str(arena), predictor=predictor, distance=dist, mode=mode, k=k, p=p, b=b, r1=r1,
                  gate=gate.name, timing=timing.__dict__.copy())
    return VTimeResult(summary=summary, tokens=tokens, layers=ltab, config=config)
