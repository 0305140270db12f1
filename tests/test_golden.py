"""Golden tests: what the engine does, recorded once and compared on every later run.

Each case runs one engine call (or a short sequence of calls on one engine) on a tiny random
qwen3_moe and compares a timing-independent projection of what it observed with the record in
``tests/golden/<case>.json.gz``: the tokens, the last step's log-probs (within ``TOL``), the
residency hash, the ``counters`` frame (deterministic columns only) and, in the hook cases, the
ordered hook-event log. The cases cover decode mode x arena x read-ahead with direct slot writes
in full, staged writes and the handshake's host-side stand-in (``HostDevice``, with and without
forced give-ups) over subsets, and prefill in waves, ``score``, ``verify``, speculative decoding,
sampled runs and a sequence of calls on one engine.

Only public behaviour is compared (the Engine constructor, generate, score, verify,
speculative_generate, hooks, Result's fields, ``Engine.handshake`` and HostDevice), so these
tests hold across a restructuring of the engine's internals.

Re-record (on the CPU): ``WORKBENCH_RECORD_GOLDEN=1 pytest tests/test_golden.py`` (``-k`` picks
cases). Recording runs each case twice, with one I/O worker and with eight, and refuses to write
a case whose projection differs between them: everything recorded is independent of I/O timing.
What depends on it is left out or merged:
  - every ``*_ns`` column (time) and ``page_cache_hits`` (the OS's page cache);
  - the split of a read-ahead's outcome: claimed in flight (``useful_late``) or complete
    (``useful_timely``); cancelled before its read, partially read or read and never claimed
    (``cancelled_before_read``, ``partially_read``, ``completed_unused``). Kept: their sums
    ``prefetch_useful`` and ``prefetch_unused`` (and their byte sizes);
  - ``bytes_read``, which counts the bytes a cancelled read-ahead had read when it stopped;
  - the events ``io.done``, ``io.cancel`` and ``prefetch.outcome``: which of them fires, and where
    a claimed read-ahead reports its outcome (at once when complete, after the wait when in
    flight), depends on timing. They are kept as an order-free multiset per (event, layer,
    expert, slot), ``io.done`` and ``io.cancel`` merged as ``io.end`` and the outcomes merged
    into useful / unused.
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import make_sampler

from conftest import DEVICE, TINY, TOL, resident_greedy
from test_handshake_host import HostDevice
from workbench.config import AheadConfig, ArenaConfig, IOConfig
from workbench.engine.engine import Engine
from workbench.engine.speculative import speculative_generate
from workbench.hooks import run_with_hooks

GOLDEN = Path(__file__).resolve().parent / "golden"
RECORD = os.environ.get("WORKBENCH_RECORD_GOLDEN", "") not in ("", "0")
# the I/O configurations a recording must agree across (the comparison runs the default: 8 workers)
RECORD_IO = (IOConfig(workers=1, reserved=0), IOConfig(workers=8))

SHAPE = {"layers": 4, "experts": 16, "top_k": 4}  # 64 routed experts: 10% is 6 slots, one layer's top-k is 4
PROMPT = [5, 17, 3, 99, 42, 8, 77, 1, 64, 23, 11, 90, 31, 7, 56, 2, 88, 14, 70, 45]
LONG = PROMPT + [3, 60, 101, 9, 27, 4, 88, 13, 31, 2, 120, 66, 18, 95, 40, 7, 52, 111, 29, 84]
OTHER = [9, 4, 27, 31, 2, 88, 5, 60, 13, 101]
TOKENS = 8
# a fraction, or a slot count (s4: exactly one layer's top-k)
ARENAS = {"a100": "100%", "a90": "90%", "a50": "50%", "a10": "10%", "s60": 60, "s12": 12, "s4": 4}
DECODES = ("auto", "optimistic", "layer")
AHEADS = ("none", "layer", "prev", "oracle")

# the counters kept as they are, and the prefetch outcomes kept only as sums
KEEP = ("step", "layer", "phase", "hits", "misses", "sync_misses", "evictions", "optimistic", "recomputes",
        "recomputed_layers", "handshake", "prefetch_issued", "prefetch_issued_bytes")
MERGED = {"prefetch_useful": ("useful_late", "useful_timely"),
          "prefetch_unused": ("cancelled_before_read", "partially_read", "completed_unused")}
TIMED_EVENTS = {"io.done": "io.end", "io.cancel": "io.end", "prefetch.outcome": None}
FORWARD = ("moe.input", "router.logits")
NOT_FORWARD = ["layer.*.experts.selected", "cache.*", "io.*", "prefetch.*", "token.end"]

pytestmark = pytest.mark.skipif(DEVICE != "cpu" or TINY != "small",
                                reason="the golden records are of the CPU's float32 and the small tiny models")


# ---- the cases -----------------------------------------------------------------------------
def _case(kind, decode="auto", arena="a50", ahead="none", writes="direct", hs="off", **extra):
    return dict(kind=kind, decode=decode, arena=arena, ahead=ahead, writes=writes, hs=hs, **extra)


def _cases() -> dict:
    cases = {}
    # the full product of decode mode x arena x read-ahead, direct writes, no handshake
    for decode in DECODES:
        for arena in ("a100", "a50", "a10"):
            for ahead in AHEADS:
                cases[f"gen-{decode}-{arena}-{ahead}"] = _case("generate", decode, arena, ahead)
    # 10% (6 slots) leaves no room for read-ahead (which keeps two layers' top-k free): 12 slots read
    # ahead under pressure. Both prefill PROMPT in waves (a layer wants up to 16 experts)
    for decode in DECODES:
        for ahead in ("layer", "prev"):
            cases[f"gen-{decode}-s12-{ahead}"] = _case("generate", decode, "s12", ahead)
    # staged slot writes
    for decode in DECODES:
        cases[f"staged-{decode}-a100-none"] = _case("generate", decode, "a100", "none", writes="staged")
        for arena in ("a50", "a10"):
            for ahead in ("none", "layer"):
                cases[f"staged-{decode}-{arena}-{ahead}"] = _case("generate", decode, arena, ahead, writes="staged")
    for decode in ("optimistic", "layer"):
        cases[f"staged-{decode}-s12-prev"] = _case("generate", decode, "s12", "prev", writes="staged")
    # the handshake's host side: answered, and every token given up at its first MoE layer
    for hs in ("host", "giveup"):
        for arena in ("a100", "a50", "a10"):
            for ahead in ("none", "layer"):
                cases[f"hs_{hs}-layer-{arena}-{ahead}"] = _case("generate", "layer", arena, ahead, hs=hs)
        cases[f"hs_{hs}-layer-s12-layer"] = _case("generate", "layer", "s12", "layer", hs=hs)
        for arena in ("a50", "a10"):
            cases[f"hs_{hs}-auto-{arena}-layer"] = _case("generate", "auto", arena, "layer", hs=hs)
        cases[f"hs_{hs}-layer-a50-prev"] = _case("generate", "layer", "a50", "prev", hs=hs)
    # the ordered hook-event log: every point ("*"), and every point but the forward ones (which the
    # handshake serves)
    for decode in DECODES:
        cases[f"hooks_all-{decode}-a50-layer"] = _case("hooks", decode, "a50", "layer", names="*")
    cases["hooks_all-auto-a10-none"] = _case("hooks", "auto", "a10", "none", names="*")
    cases["hooks_all-optimistic-a100-none"] = _case("hooks", "optimistic", "a100", "none", names="*")
    cases["hooks_all-layer-s4-none-long"] = _case("hooks", "layer", "s4", "none", names="*", prompt="long")
    cases["hooks_claims-layer-a50-layer-hs_host"] = _case("hooks", "layer", "a50", "layer", hs="host",
                                                          names=NOT_FORWARD)
    cases["hooks_claims-layer-a10-none-hs_giveup"] = _case("hooks", "layer", "a10", "none", hs="giveup",
                                                           names=NOT_FORWARD)
    # prefill in waves: a 40-token prompt through arenas whose layers want more experts than fit
    for decode in DECODES:
        cases[f"waves-{decode}-s4-none"] = _case("generate", decode, "s4", "none", prompt="long")
    cases["waves-layer-a10-layer"] = _case("generate", "layer", "a10", "layer", prompt="long")
    cases["waves-auto-a10-prev-staged"] = _case("generate", "auto", "a10", "prev", writes="staged", prompt="long")
    # score, verify, speculative decoding, sampled runs
    for arena in ("a100", "a50", "a10"):
        cases[f"score-{arena}"] = _case("score", arena=arena)
    for arena in ("a50", "a10"):
        cases[f"verify-{arena}"] = _case("verify", arena=arena)
    for arena in ("a50", "a10"):
        cases[f"spec-{arena}-greedy"] = _case("spec", arena=arena, drafts=3)
    # the target as its own draft: every draft accepted, passes of num_draft_tokens + 1 tokens
    cases["spec-a10-greedy-self"] = _case("spec", arena="a10", drafts=3, draft="self")
    cases["spec-a50-sampled-self"] = _case("spec", arena="a50", drafts=3, draft="self", temp=3.0, seed=5)
    cases["spec-a10-sampled"] = _case("spec", arena="a10", drafts=3, temp=3.0, seed=5)
    cases["spec-a50-greedy-staged"] = _case("spec", arena="a50", drafts=2, writes="staged")
    for decode, arena, ahead, hs in (("auto", "a50", "none", "off"), ("layer", "a10", "layer", "off"),
                                     ("optimistic", "a100", "none", "off"), ("layer", "a50", "none", "giveup"),
                                     ("layer", "a10", "layer", "host")):
        name = f"sampled-{decode}-{arena}-{ahead}" + ("" if hs == "off" else f"-hs_{hs}")
        cases[name] = _case("generate", decode, arena, ahead, hs=hs, temp=3.0, seed=11)
    # auto mixing per-layer and optimistic tokens: a dearer host sync (sync_cost) moves auto's controller to
    # optimistic decode once misses are rare. No read-ahead here: the controller counts a layer whose
    # read-ahead was claimed in flight (useful_late) as missed, so with read-ahead its choice near the
    # threshold depends on I/O timing
    cases["mix-auto-a90-none-sync3"] = _case("generate", "auto", "a90", "none", sync=3.0)
    cases["mix-auto-s60-none-sync10"] = _case("generate", "auto", "s60", "none", sync=10.0)
    cases["mix-auto-a90-none-sync10-staged"] = _case("generate", "auto", "a90", "none", writes="staged",
                                                     sync=10.0)
    for hs in ("host", "giveup"):
        cases[f"mix-auto-a90-none-sync3-hs_{hs}"] = _case("generate", "auto", "a90", "none", hs=hs, sync=3.0)
    cases["hooks_all-auto-s60-none-sync3"] = _case("hooks", "auto", "s60", "none", names="*", sync=3.0)
    # several calls on one engine: what one call leaves in the arena is the next one's start
    cases["sequence-auto-a50-layer"] = _case("sequence", "auto", "a50", "layer")
    cases["sequence-layer-a10-none-hs_host"] = _case("sequence", "layer", "a10", "none", hs="host")
    return cases


CASES = _cases()


# ---- running a case ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(tiny):
    return tiny("qwen3_moe", 4, **SHAPE)


@pytest.fixture(scope="module")
def oracle_trace(model, tmp_path_factory):
    """The recorded selections of PROMPT's greedy run (exact: any arena gives the same routes)."""
    from workbench.trace.recorder import TraceRecorder
    from workbench.trace.schema import read_trace

    path = tmp_path_factory.mktemp("golden") / "oracle.parquet"
    with Engine(model[1], arena="100%", decode="layer", progress=False) as eng:
        eng.generate(PROMPT, max_tokens=TOKENS, trace=TraceRecorder(path))
    return read_trace(path)


@pytest.fixture(scope="module")
def greedy(model):
    """Resident mlx-lm's greedy continuation of PROMPT (the verify cases draft from it)."""
    return resident_greedy(model[0], PROMPT, 5)[0]


@pytest.fixture(scope="module")
def draft_model(model, tmp_path_factory):
    """Resident drafts sharing the tiny target's vocabulary (as test_speculative.py builds them): a
    random one ("random") and the target itself ("self")."""
    from mlx_lm.utils import load_model

    from workbench.randmodel import make_random_model

    path = make_random_model(tmp_path_factory.mktemp("draft") / "m", "qwen3_moe", seed=2, moving=True, layers=1,
                             experts=4, top_k=2, hidden=32, expert_width=16, vocab=128)
    return {"random": load_model(path)[0], "self": load_model(model[0])[0]}


def _ahead(name, oracle):
    if name == "none":
        return None
    if name == "layer":
        return AheadConfig(lookahead=1)
    if name == "prev":
        return AheadConfig(predictor="prev")
    return AheadConfig(predictor="oracle", oracle_trace=oracle)


def _engine(case, store, io, oracle):
    eng = Engine(store, arena=ArenaConfig(ARENAS[case["arena"]], writes=case["writes"]), io=io,
                 ahead=_ahead(case["ahead"], oracle), decode=case["decode"], sync_cost=case.get("sync"),
                 progress=False)
    if case["hs"] != "off":
        eng.handshake = HostDevice(eng, give_up=case["hs"] == "giveup")
    return eng


def _sampler(case):
    if "temp" not in case:
        return None
    mx.random.seed(case["seed"])  # right before the run, as mlx-lm's generate seeds
    return make_sampler(temp=case["temp"])


def _plain(x):
    """``x`` as JSON values (numpy scalars and arrays to numbers and lists)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, mx.array):
        return np.array(x).tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x


def counters(frame) -> dict:
    """The counters frame's timing-independent columns, column -> values, one per (step, layer) row
    in which one of them is not zero (a row holding only times says nothing here: whether the engine
    keeps one is its bookkeeping)."""
    cols = {c: frame[c].to_numpy() for c in KEEP}
    for name, parts in MERGED.items():
        cols[name] = sum(frame[f"prefetch_{p}"] for p in parts).to_numpy()
        cols[name + "_bytes"] = sum(frame[f"prefetch_{p}_bytes"] for p in parts).to_numpy()
    counted = [v for c, v in cols.items() if c not in ("step", "layer", "phase")]
    rows = np.any(np.stack(counted) != 0, axis=0)
    return {c: _plain(v[rows]) for c, v in cols.items()}


def _result(res) -> dict:
    out = {"tokens": _plain(res.tokens), "residency_hash": res.stats["residency_hash"],
           "counters": counters(res.counters)}
    if res.logprobs is not None:
        out["logprobs"] = _plain(np.asarray(res.logprobs, dtype=np.float32))
    return out


class EventLog:
    """Every hook event in order, projected to what does not depend on I/O timing; the events that
    do (``TIMED_EVENTS``) in an order-free multiset."""

    def __init__(self):
        self.events, self.timed = [], Counter()

    def __call__(self, value, name, **ctx):
        if name in TIMED_EVENTS:
            merged = TIMED_EVENTS[name] or ("prefetch.useful" if str(value).startswith("useful") else "prefetch.unused")
            self.timed[(merged, ctx.get("layer"), ctx.get("expert"), ctx.get("slot"))] += 1
        elif name.endswith(FORWARD):
            self.events.append([name, ctx.get("step"), ctx.get("attempt"), list(np.shape(value))])
        elif name.endswith("experts.selected"):
            self.events.append([name, ctx["step"], ctx["phase"], ctx["position"], _plain(np.asarray(value)),
                                _plain(ctx["resident"]), _plain(ctx["predictions"])])
        elif name == "token.end":
            self.events.append([name, _plain(value), ctx["step"]])
        else:  # cache.hit / miss / evict: the key; io.submit: a request
            key = _plain(value) if name.startswith("cache.") else None
            self.events.append([name, key, ctx.get("layer"), ctx.get("expert"), ctx.get("slot")])

    def record(self) -> dict:
        return {"events": self.events, "timed": sorted([list(k) + [n] for k, n in self.timed.items()])}


def run_case(case, store, io, oracle, draft, ref) -> dict:
    prompt = LONG if case.get("prompt") == "long" else PROMPT
    kind = case["kind"]
    with _engine(case, store, io, oracle) as eng:
        if kind == "generate":
            return _result(eng.generate(prompt, max_tokens=TOKENS, sampler=_sampler(case)))
        if kind == "hooks":
            log = EventLog()
            res = run_with_hooks(eng, prompt, [(n, log) for n in np.atleast_1d(case["names"]).tolist()],
                                 max_tokens=TOKENS)
            return {**_result(res), "hooks": log.record()}
        if kind in ("score", "verify"):  # today's score and verify need an earlier generate (they read its
            warm = _result(eng.generate(OTHER, max_tokens=2))  # prompt): one short one first
            if kind == "score":
                return {"warm": warm, "logprobs": _plain(np.asarray(eng.score(prompt), dtype=np.float32))}
            return {"warm": warm, **{k: v for k, v in _verify(eng, ref).items() if k != "seconds"}}
        if kind == "spec":
            res = speculative_generate(eng, draft[case.get("draft", "random")], prompt, max_tokens=TOKENS,
                                       num_draft_tokens=case["drafts"], sampler=_sampler(case))
            passes = [{k: p[k] for k in ("step", "drafted", "accepted", "emitted")}
                      for p in res.stats["speculative"]["passes"]]
            return {**_result(res), "passes": passes}
        if kind == "sequence":  # generate, score, verify, then generate another prompt, on one engine
            first = _result(eng.generate(prompt, max_tokens=TOKENS))
            scored = _plain(np.asarray(eng.score(OTHER), dtype=np.float32))
            verified = {k: v for k, v in _verify(eng, ref).items() if k != "seconds"}
            log = EventLog()
            second = run_with_hooks(eng, OTHER, [(n, log) for n in NOT_FORWARD], max_tokens=TOKENS)
            return {"first": first, "score_logprobs": scored, "verify": verified,
                    "second": {**_result(second), "hooks": log.record()}}
    raise ValueError(kind)


def _verify(eng, ref):
    """Drafts: the greedy continuation's first three tokens, a wrong fourth, a fifth."""
    drafts = ref[:3] + [(ref[3] + 1) % 128, ref[4]]
    return eng.verify(PROMPT, drafts)


# ---- comparing -----------------------------------------------------------------------------
def _differences(got, want, where="", out=None):
    """Where ``got`` differs from ``want``: log-probs within TOL, everything else exactly."""
    out = [] if out is None else out
    if isinstance(want, dict) and isinstance(got, dict):
        for k in sorted(set(want) | set(got)):
            if k not in got or k not in want:
                out.append(f"{where}.{k}: {'missing' if k not in got else 'not in the record'}")
            else:
                _differences(got[k], want[k], f"{where}.{k}", out)
    elif where.endswith("logprobs"):
        g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        if g.shape != w.shape or not np.allclose(g, w, atol=TOL, rtol=0):
            err = np.abs(g - w).max() if g.shape == w.shape else f"shape {g.shape} vs {w.shape}"
            out.append(f"{where}: not within {TOL} (max error {err})")
    elif isinstance(want, list) and isinstance(got, list) and where.split(".")[-1] in ("events", "timed"):
        if got != want:
            i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            out.append(f"{where}: {len(got)} vs {len(want)} recorded; first difference at {i}: "
                       f"{got[i] if i < len(got) else None} vs {want[i] if i < len(want) else None}")
    elif got != want:
        if isinstance(want, list) and isinstance(got, list) and len(got) == len(want):
            i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            out.append(f"{where}: differs first at [{i}]: {got[i]} vs {want[i]} recorded")
        else:
            out.append(f"{where}: {str(got)[:200]} vs {str(want)[:200]} recorded")
    return out


def _path(case_id) -> Path:
    return GOLDEN / f"{case_id}.json.gz"


def _write(case_id, record):
    GOLDEN.mkdir(exist_ok=True)
    data = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    # mtime 0: the same record is the same bytes
    with open(_path(case_id), "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as z:
        z.write(data)


def _read(case_id) -> dict:
    with gzip.open(_path(case_id), "rb") as f:
        return json.loads(f.read())


@pytest.mark.parametrize("case_id", list(CASES))
def test_golden(case_id, model, oracle_trace, draft_model, greedy):
    case = CASES[case_id]
    _, store = model

    def run(io):
        return _plain(run_case(case, store, io, oracle_trace, draft_model, greedy))

    if RECORD:
        first, second = (run(io) for io in RECORD_IO)
        diff = _differences(second, first)
        assert not diff, f"{case_id} depends on I/O timing (8 workers vs 1): " + "; ".join(diff[:5])
        _write(case_id, first)
        return
    if not _path(case_id).exists():
        pytest.fail(f"no golden record {_path(case_id).name}; record with WORKBENCH_RECORD_GOLDEN=1")
    diff = _differences(run(IOConfig()), _read(case_id))
    assert not diff, f"{case_id} differs from its golden record:\n  " + "\n  ".join(diff[:10])


def test_every_record_has_its_case():
    """A case dropped from CASES leaves its record behind: delete it with the case, never silently."""
    stray = sorted(p.name for p in GOLDEN.glob("*.json.gz") if p.name[:-len(".json.gz")] not in CASES)
    assert not stray, f"golden records without a case: {stray}"
