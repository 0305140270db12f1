"""The simulators against the real arena: `simulate` (virtual time) and `ioreplay` (real reads)
replay a trace through the same rules as the engine."""

import pytest

from test_sim import _trace
from workbench.io.replay import replay_io
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
    io = replay_io(p, store, arena="4", prefetch="x", distance=1, compute_ms=1.0, progress=False)
    sim = simulate(p, "lru", 4, predictor="x", distance=1, timing=Timing(read_latency_s=0))
    tok = sim.tokens.set_index("step")
    assert io["hits"] == 1 and io["sync_misses"] == 3
    assert (tok.loc[2, "hits"], tok.loc[2, "sync_misses"]) == (1, 1)
    assert sim.summary["hits"] == io["hits"] and sim.summary["sync_misses"] == io["sync_misses"]
    assert sim.summary["prefetch"]["completed_unused"] == io["prefetch"]["completed_unused"] == 1
