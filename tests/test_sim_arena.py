"""The simulators against the real arena: `simulate` (virtual time) and `ioreplay` (real reads)
replay a trace through the same rules as the engine."""

from test_sim import _trace
from workbench.arena.arena import OUTCOMES
from workbench.config import AheadConfig, ArenaConfig, IOConfig
from workbench.sim.drive import ResidencyHash
from workbench.sim.ioreplay import replay_io
from workbench.sim.vtime import Timing, simulate


def _limbo_trace(path, n_experts):
    # two layers, one expert per row; the prediction for token 1, layer 1 is wrong (5, not 1);
    # token 2 then routes to 5 at layer 1, after its unused prefetch's limbo ended
    sel = [[[0], [1]], [[0], [5]]]
    preds = [[[], [5]], [[], []]]
    return _trace(path, sel, n_experts=n_experts, layers=[0, 1], preds=preds, expert_bytes=1 << 10)


def test_unused_prefetch_is_unmapped_after_its_limbo(tmp_path, tiny):
    """The 2-token limbo case: after its limbo an unused, finished prefetch is unmapped (as the
    arena's ``after_layer`` does), so token 2's lookup of it is a sync miss, not a hit."""
    _, store = tiny("qwen3_moe")
    p = _limbo_trace(tmp_path / "limbo.parquet", n_experts=8)
    from workbench.hooks import Hooks

    hooks = Hooks()
    _timely(hooks, [0, 1])  # the prefetch lands before its layer, as in simulate's timing
    arena, ahead = ArenaConfig("4"), AheadConfig("x", 1)
    io = replay_io(p, store, arena, ahead=ahead, compute_ms=1.0, progress=False, hooks=hooks)
    sim = simulate(p, arena, ahead, timing=Timing(read_latency_s=0))
    tok = sim.tokens.set_index("step")
    assert io["hits"] == 1 and io["sync_misses"] == 3
    assert (tok.loc[2, "hits"], tok.loc[2, "sync_misses"]) == (1, 1)
    assert sim.summary["hits"] == io["hits"] and sim.summary["sync_misses"] == io["sync_misses"]
    assert sim.summary["prefetch"]["completed_unused"] == io["prefetch"]["completed_unused"] == 1


SHAPE = dict(layers=4, experts=16, top_k=4, hidden=64, expert_width=32)
COLS = ["hits", "misses", "sync_misses"] + [f"prefetch_{o}" for o in ("issued",) + OUTCOMES]


def _timely(hooks, layers):
    """Subscribe to ``hooks`` so every speculative read has landed before its layer is served
    (every prefetch is timely); returns a dict for the residency hash after each token."""
    reads, residency = [], {}

    def submitted(req, **ctx):
        if req.speculative:
            reads.append(req)

    def before_layer(value, **ctx):
        for req in reads:
            req.event.wait()
        reads.clear()

    hooks.add("io.submit", submitted)
    for layer in layers:
        hooks.add(f"layer.{layer}.experts.selected", before_layer)
    return residency


def _per_step(frame):
    frame = frame[frame["phase"] == "decode"]
    return frame.groupby(["step", "layer"])[COLS].sum().astype(int)


def test_engine_ioreplay_and_simulate_agree(tmp_path, tiny):
    """One recorded run with per-layer read-ahead, through the live engine, ``replay_io`` and
    ``simulate``, every prefetch timely: the same counters per (step, layer) and the same
    residency after every token."""
    from workbench.arena.counters import Counters
    from workbench.engine.engine import Engine
    from workbench.hooks import Hooks
    from workbench.trace.recorder import TraceRecorder

    _, store = tiny("qwen3_moe", 4, **SHAPE)
    path = tmp_path / "run.parquet"
    arena, io, ahead = ArenaConfig("0.4"), IOConfig(workers=4), AheadConfig("layer", lookahead=1)
    with Engine(store, arena=arena, io=io, ahead=ahead, decode="layer", progress=False) as eng:
        layers = eng.m.moe_layers
        live_res, live_hash = _timely(eng.hooks, layers), ResidencyHash()
        eng.hooks.add("token.end", lambda v, step, **ctx: live_res.__setitem__(step, live_hash.update(eng.arena)))
        live = eng.generate([9], max_tokens=10, trace=TraceRecorder(path))
    pf = live.stats["prefetch"]
    assert pf["issued"] > 0 and pf["useful_timely"] > 0 and pf["completed_unused"] > 0
    assert pf["useful_late"] == pf["cancelled_before_read"] == pf["partially_read"] == 0

    hooks, seen, io_hash = Hooks(), {}, ResidencyHash()
    io_res = _timely(hooks, layers)

    def token_end(value, step, counters, arena, **ctx):
        io_res[step] = io_hash.update(arena)
        seen["rows"] = counters

    hooks.add("token.end", token_end)
    replay_io(path, store, arena, io, ahead, compute_ms=0.0, progress=False, hooks=hooks)
    io_counters = Counters()
    io_counters.rows = seen["rows"]
    sim = simulate(path, arena, ahead, timing=Timing(pre_moe_s=1e-3, compute_s=1e-3, read_latency_s=1e-5, bandwidth=1e10))
    sim_res = dict(zip(sim.tokens["step"], sim.tokens["residency"]))

    want = _per_step(live.counters)
    assert _per_step(io_counters.frame()).equals(want)
    assert _per_step(sim.counters).equals(want)
    assert io_res == live_res and sim_res == live_res and len(live_res) == 10
    assert sim_res[10] == live.stats["residency_hash"]
