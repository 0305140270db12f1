"""The three drivers of the arena agree per step: a live run of the engine (per-layer decode),
``simulate`` (virtual time) and ``replay_io`` (real reads) of the run's own trace. Prompts of 1
token (no prefill), 8 (prefill as one batch) and 200 (a layer-ranked prefill, then prompt-hot
protection); with and without the layer read-ahead; two policies; an arena of half the experts
(misses, prompt-hot protection) and one of 10 slots (prefill in waves)."""

import pytest

from workbench.arena.counters import Counters
from workbench.config import AheadConfig, ArenaConfig, IOConfig
from workbench.hooks import Hooks
from workbench.sim.drive import ResidencyHash
from workbench.sim.ioreplay import replay_io
from workbench.sim.vtime import simulate

SHAPE = dict(layers=4, experts=32, top_k=4)  # 128 routed experts: 50% leaves room to protect 24 prompt-hot ones
TOKENS = 8
AHEAD = {"none": AheadConfig(), "layer": AheadConfig("layer", lookahead=1)}
# Which claims hit, miss or take a speculative read, which reads are issued and which slots are
# evicted follow from the arena's rules alone: the same in all three. Whether a claimed read had
# landed (timely) or not (late), and whether an unused one was cancelled before, during or after
# its read, depends on when reads run (threads in the engine and ioreplay, a virtual clock in
# simulate): so useful = late + timely and unused = the other three are compared, not the split
# (tests/test_sim_arena.py forces every read timely and compares the split too).
COUNTS = ["hits", "misses", "sync_misses", "evictions", "prefetch_issued"]


def _table(frame):
    f = frame[frame["step"] >= 0].set_index(["step", "layer"]).sort_index()
    t = f[COUNTS].copy()
    t["useful"] = f["prefetch_useful_late"] + f["prefetch_useful_timely"]
    t["unused"] = f["prefetch_cancelled_before_read"] + f["prefetch_partially_read"] + f["prefetch_completed_unused"]
    return t[(t != 0).any(axis=1)].astype(int)  # rows of timing counters only (ioreplay's compute) dropped


def _hashes(hooks, arena=None):
    """Residency hash after each token, from ``token.end``, and the counters it passes; ``arena``:
    the engine's (ioreplay passes its own)."""
    out, seen, h = {}, {}, ResidencyHash()

    def token_end(value, step, counters, **ctx):
        out[step] = h.update(ctx.get("arena", arena))
        seen["rows"] = counters

    hooks.add("token.end", token_end)
    return out, seen


def _live(store, arena, ahead, prompt, path):
    from workbench.engine.engine import Engine
    from workbench.trace.recorder import TraceRecorder

    with Engine(store, arena=arena, io=IOConfig(workers=4), ahead=ahead, decode="layer", progress=False) as eng:
        hashes, _ = _hashes(eng.hooks, eng.arena)
        res = eng.generate(prompt, max_tokens=TOKENS, trace=TraceRecorder(path))
        width = None if eng.planner is None else eng.planner.width
    return res, hashes, width


@pytest.mark.parametrize("size", ["50%", "10"])
@pytest.mark.parametrize("policy", ["lru", "fifo"])
@pytest.mark.parametrize("ahead", ["none", "layer"])
@pytest.mark.parametrize("n_prompt", [1, 8, 200])
def test_engine_simulate_and_ioreplay_agree_per_step(tiny, tmp_path, size, policy, ahead, n_prompt):
    _agree(tiny, tmp_path, size, policy, ahead, n_prompt)


@pytest.mark.parametrize("size", ["75%", "60%"])
def test_the_three_drivers_agree_on_whole_layer_prefill(tiny, tmp_path, size):
    """A 200-token prompt: every layer claimed whole, in an arena with room for three layers (75%: each
    layer held through the next one's claim) and for two and a decode token's (60%: released at its end)."""
    live = _agree(tiny, tmp_path, size, "lru", "none", 200)
    pre = live.counters[live.counters.phase == "prefill"]
    assert int((pre.hits + pre.misses + pre.prefetch_useful_late + pre.prefetch_useful_timely).sum()) == \
        SHAPE["layers"] * SHAPE["experts"]


def _agree(tiny, tmp_path, size, policy, ahead, n_prompt):
    _, store = tiny("qwen3_moe", 4, **SHAPE)
    arena, ahead = ArenaConfig(size, policy), AHEAD[ahead]
    path = tmp_path / "run.parquet"
    live, live_res, width = _live(store, arena, ahead, [(7 * i + 3) % 128 for i in range(n_prompt)], path)
    sim = simulate(path, arena, ahead)
    hooks = Hooks()
    io_res, seen = _hashes(hooks)
    io = replay_io(path, store, arena, IOConfig(workers=4), ahead, compute_ms=0.0, progress=False, hooks=hooks)
    io_counters = Counters()
    io_counters.rows = seen["rows"]

    want = _table(live.counters)
    assert _table(sim.counters).equals(want)
    assert _table(io_counters.frame()).equals(want)
    assert set(sim.counters[sim.counters.step == 0].phase) <= {"prefill"} and (n_prompt > 1) == (0 in want.index)
    assert dict(zip(sim.tokens["step"], sim.tokens["residency"])) == live_res == io_res and len(live_res) == TOKENS
    assert sim.summary["residency_hash"] == io["residency_hash"] == live.stats["residency_hash"]
    for key in ("hits", "sync_misses"):  # the reported numbers are decode's, from the arena prefill left
        assert sim.summary[key] == io[key] == live.stats[key]
    if width is not None:  # the engine's layer predictor ranks top_k candidates, as simulate does by default
        assert width == sim.config["k"] == SHAPE["top_k"] and live.stats["prefetch"]["issued"] > 0
    return live
