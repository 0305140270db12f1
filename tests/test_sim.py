"""Replay simulator, virtual-time model and the `workbench replay/simulate` command line."""

import json

import pytest

from workbench.arena.policies.lru import LRU
from workbench.cli import main as cli
from workbench.config import AheadConfig, ArenaConfig
from workbench.sim.replay import NotReplayableError, replay, replay_grid, replay_keys
from workbench.sim.requests import parse_arena, requests_from_trace
from workbench.trace.synthetic import routes_trace, synthetic_trace
from workbench.sim.vtime import OUTCOMES, Timing, simulate
from workbench.trace.schema import TraceError, write_trace


def _trace(path, selections, n_experts=8, layers=None, meta_extra=None, preds=None, expert_bytes=1 << 20):
    """A decode-only trace: selections[t][i] is the list routed at token t, layer layers[i]."""
    layers = layers or [0]
    rows = {k: [] for k in ("step", "token", "phase", "layer", "selected", "weights", "logits", "resident")}
    if preds is not None:
        rows["pred_x"] = []
    for t, per_layer in enumerate(selections):
        for i, sel in enumerate(per_layer):
            rows["step"].append(t + 1)
            rows["token"].append(t)
            rows["phase"].append("decode")
            rows["layer"].append(layers[i])
            rows["selected"].append(list(sel))
            rows["weights"].append([1.0 / len(sel)] * len(sel))
            rows["logits"].append(None)
            rows["resident"].append([])
            if preds is not None:
                rows["pred_x"].append(list(preds[t][i]))
    meta = {"n_layers": len(layers), "n_experts": n_experts, "top_k": len(selections[0][0]), "moe_layers": layers,
            "expert_bytes": expert_bytes}
    meta.update(meta_extra or {})
    write_trace(path, rows, meta)
    return path


# --- replay -----------------------------------------------------------------------

def test_requests_flatten_in_trace_order(tmp_path):
    p = _trace(tmp_path / "t.parquet", [[[1, 2], [3, 0]], [[2, 1], [0, 4]]], layers=[0, 3])
    req = requests_from_trace(p)
    assert req.keys.tolist() == [1, 2, 27, 24, 2, 1, 24, 28]
    assert req.step.tolist() == [1, 1, 1, 1, 2, 2, 2, 2]
    assert req.token_end.tolist() == [False, False, False, True, False, False, False, True]
    assert req.n_routed == 16


def test_replay_closed_form(tmp_path):
    # period 3 over one layer, one expert per token: LRU with 3 slots misses only the first 3;
    # with 2 slots the cyclic pattern misses every time
    p = _trace(tmp_path / "t.parquet", [[[t % 3]] for t in range(30)])
    assert replay(p, "lru", 3).misses == 3
    assert replay(p, "lru", 2).misses == 30
    r = replay(p, "lru", "1.0")  # all 8 routed experts
    assert (r.capacity, r.lookups, r.hits, r.misses) == (8, 30, 27, 3)
    assert r.to_dict()["hit_rate"] == pytest.approx(0.9)
    assert r.per_layer()["hits"].tolist() == [27]


def test_replay_uses_the_engine_class_and_its_fast_path(tmp_path):
    from workbench.sim.cache import SimCache

    p = tmp_path / "z.parquet"
    synthetic_trace(p, n_tokens=40, kind="zipf")
    by_name = replay(p, "lru", 16)
    by_class = replay(p, LRU, 16)
    assert by_name.hits == by_class.hits
    cache = SimCache(LRU(16))
    assert sum(cache.lookup(k) for k in requests_from_trace(p).keys.tolist()) == by_name.hits


def test_replay_grid_and_preload(tmp_path):
    p = tmp_path / "g.parquet"
    synthetic_trace(p, n_tokens=30, kind="zipf", prefill_tokens=2)
    g = replay_grid(p, ["lru", "fifo", "ds4"], ["0.25", 8])
    assert len(g) == 6 and set(g.columns) >= {"policy", "arena", "lookups", "hits", "misses", "hit_rate"}
    assert (g["hits"] + g["misses"] == g["lookups"]).all()
    hot = [0, 1, 2]
    r = replay_keys([0, 1, 2, 0], "static", 4, keys=hot)
    assert r.preloaded == 3 and r.hits == 4
    assert replay_keys([0, 1, 2, 0], "static", 4, keys=hot, preload=False).hits == 1


def test_decode_phase_filter(tmp_path):
    p = tmp_path / "pf.parquet"
    synthetic_trace(p, n_tokens=5, prefill_tokens=3, n_layers=2, top_k=2)
    assert replay(p, "lru", 4, phase="decode").lookups == 5 * 2 * 2
    assert replay(p, "lru", 4).lookups == 8 * 2 * 2


def test_arena_parsing():
    assert parse_arena("0.25", 256) == 64
    assert parse_arena(0.5, 10) == 5
    assert parse_arena("1.0", 256) == 256
    assert parse_arena("12", 256) == 12
    assert parse_arena(1, 256) == 1
    for bad in ("0", "1.5", "-3", "abc", "0.0"):
        with pytest.raises(ValueError, match="fraction"):
            parse_arena(bad, 256)


def test_malformed_traces(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(TraceError, match="not a readable Parquet"):
        replay(bad, "lru", 4)
    p = _trace(tmp_path / "e.parquet", [[[9]]], n_experts=8)
    with pytest.raises(TraceError, match="outside 0..7"):
        replay(p, "lru", 4)
    with pytest.raises(TraceError, match="does not exist"):
        replay(tmp_path / "missing.parquet", "lru", 4)


def test_closed_loop_routing_is_flagged(tmp_path):
    p = _trace(tmp_path / "t.parquet", [[[t % 3]] for t in range(6)])
    with pytest.raises(NotReplayableError, match="closed-loop"):
        replay(p, "lru", 2, moce_bonus=0.85)
    with pytest.raises(NotReplayableError, match="cannot be replayed from fixed routes"):
        simulate(p, ArenaConfig(2), moce_bonus=0.85)
    q = _trace(tmp_path / "r.parquet", [[[t % 3]] for t in range(6)], meta_extra={"route": True, "moce_bonus": 0.85})
    with pytest.warns(UserWarning, match="cache-aware routing on"):
        r = replay(q, "lru", 2)
    assert "warning" in r.to_dict()


# --- virtual time -------------------------------------------------------------------

MB = 1 << 20


def test_vtime_no_prefetch_closed_form(tmp_path):
    # one layer, a new expert every token, 2 slots: every token is one sync miss
    p = _trace(tmp_path / "t.parquet", [[[t % 8]] for t in range(8)])
    tm = Timing(compute_s=1e-3, pre_moe_s=2e-3, read_latency_s=1e-4, stream_bandwidth=1e9, expert_bytes=MB)
    r = simulate(p, ArenaConfig(2), timing=tm)
    read = 1e-4 + MB / 1e9
    assert r.summary["sync_misses"] == 8
    assert r.summary["s_per_token"] == pytest.approx(2e-3 + read + 1e-3)
    assert r.tokens["stall_s"].tolist() == pytest.approx([read] * 8)
    assert r.summary["bytes_read"] == 8 * MB


def test_vtime_oracle_prefetch_timely_and_late(tmp_path):
    # two layers (a prefetch never evicts its own target layer), a new expert every token
    p = _trace(tmp_path / "t.parquet", [[[t % 8], [t % 8]] for t in range(8)], layers=[0, 1])
    read = MB / 1e9
    timely = simulate(p, ArenaConfig(4), AheadConfig("oracle", 1),
                      timing=Timing(compute_s=1e-3, pre_moe_s=2e-3, read_latency_s=0, stream_bandwidth=1e9))
    s = timely.summary
    assert s["sync_misses"] == 1 and s["prefetch"]["useful_timely"] == 15 and s["prefetch"]["issued"] == 15
    assert s["stall_s"] == pytest.approx(read)
    assert s["virtual_s"] == pytest.approx(16 * 3e-3 + read)
    # a prefetch starts as its layer's experts are launched: late when compute + the next pre-MoE take less than a read
    late = simulate(p, ArenaConfig(4), AheadConfig("oracle", 1),
                    timing=Timing(compute_s=0.25 * read, pre_moe_s=0.25 * read, read_latency_s=0, stream_bandwidth=1e9))
    s = late.summary
    assert s["prefetch"]["useful_late"] == 15 and s["sync_misses"] == 1
    assert s["stall_s"] == pytest.approx(read + 15 * 0.5 * read)


def test_vtime_prefetch_never_evicts_its_target_layer(tmp_path):
    p = _trace(tmp_path / "t.parquet", [[[t % 8]] for t in range(8)])
    r = simulate(p, ArenaConfig(3), AheadConfig("oracle", 1), timing=Timing(read_latency_s=0))
    assert r.summary["prefetch"]["issued"] == 2  # two free slots, then only layer-0 victims exist


def test_vtime_wrong_predictions_outcomes(tmp_path):
    # the routes repeat, so target rows are hits: a target row with a sync miss cancels its
    # unused prefetch only after waiting for that miss (as the arena does), when it has finished
    sel = [[[t % 2], [t % 2]] for t in range(10)]
    wrong = [[[7], [7]] for _ in range(10)]
    p = _trace(tmp_path / "w.parquet", sel, preds=wrong, layers=[0, 1])
    piece = MB // 4
    t_piece = piece / 1e9
    # pieces: at a target row that hits, the read (started as the layer's experts were launched) is in
    # its 2nd piece -> partially_read
    r = simulate(p, ArenaConfig(6), AheadConfig("x", 1),
                 timing=Timing(compute_s=0.5 * t_piece, pre_moe_s=t_piece, read_latency_s=0, stream_bandwidth=1e9,
                               piece_bytes=piece))
    pf = r.summary["prefetch"]
    assert pf["partially_read"] >= 1 and pf["useful_late"] == pf["useful_timely"] == 0
    assert r.summary["prefetch_bytes"]["partially_read"] == pf["partially_read"] * 2 * piece
    # no pieces: a running read finishes -> completed_unused, and the slot waits in limbo
    r = simulate(p, ArenaConfig(6), AheadConfig("x", 1),
                 timing=Timing(compute_s=1e-3, pre_moe_s=1.5 * t_piece, read_latency_s=0, stream_bandwidth=1e9))
    assert r.summary["prefetch"]["completed_unused"] >= 1
    # one worker reserved for urgent work: speculative reads never start
    r = simulate(p, ArenaConfig(6), AheadConfig("x", 1), timing=Timing(workers=1, urgent_workers=1))
    pf = r.summary["prefetch"]
    assert pf["issued"] >= 1 and pf["cancelled_before_read"] == pf["issued"]


@pytest.mark.parametrize("policy", ["lru", "twohit", "ds4", "s3fifo"])
@pytest.mark.parametrize("pred,mode,gate", [("oracle", "raw", "none"), ("d1", "cache_aware", "confidence"),
                                            ("d2", "resident_bonus", "none"), ("d1", "unpert1", "cost")])
def test_vtime_accounting_invariants(tmp_path, policy, pred, mode, gate):
    p = tmp_path / "s.parquet"
    synthetic_trace(p, n_tokens=12, n_layers=4, n_experts=16, top_k=2, kind="sticky", predictors=(1, 2), with_logits=True)
    ahead = AheadConfig(pred, mode=mode, gate=gate,
                        gate_options={"bytes": MB, "stall_saved": 1e-2} if gate == "cost" else None)
    r = simulate(p, ArenaConfig("0.5", policy), ahead, timing=Timing(piece_bytes=MB // 4))
    s = r.summary
    assert s["prefetch"]["issued"] == sum(s["prefetch"][o] for o in OUTCOMES)
    assert s["prefetch_bytes"]["issued"] == sum(s["prefetch_bytes"][o] for o in OUTCOMES)
    assert s["lookups"] == s["hits"] + s["sync_misses"] + s["prefetch_claims"]
    assert s["tokens"] == 12 and len(r.layers) == 4
    assert s["virtual_s"] == pytest.approx(r.tokens["time_s"].sum())


def test_vtime_replays_the_prefill_first(tmp_path):
    # the prefill (step 0, 2 tokens) reads experts 0..3 into the 4 slots: decode then hits them all;
    # phase="decode" replays decode from a cold arena
    p = tmp_path / "p.parquet"
    routes_trace(p, [[[0, 1]], [[2, 3]], [[0, 1]], [[2, 3]]], n_experts=8, prefill_tokens=2)
    r = simulate(p, ArenaConfig(4))
    assert (r.summary["hits"], r.summary["sync_misses"], r.summary["tokens"]) == (4, 0, 2)
    pre = r.counters[r.counters.phase == "prefill"]
    assert pre.step.tolist() == [0] and pre.sync_misses.tolist() == [4]
    cold = simulate(p, ArenaConfig(4), phase="decode")
    assert (cold.summary["hits"], cold.summary["sync_misses"]) == (0, 4) and set(cold.counters.phase) == {"decode"}
    with pytest.raises(ValueError, match="unknown phase"):
        simulate(p, ArenaConfig(4), phase="prefill")


def test_vtime_errors(tmp_path):
    p = _trace(tmp_path / "t.parquet", [[[0, 1, 2]]])
    with pytest.raises(ValueError, match="no evictable slot"):
        simulate(p, ArenaConfig(2))
    with pytest.raises(ValueError, match="available predictors"):
        simulate(p, ArenaConfig(4), AheadConfig("nope"))
    with pytest.raises(ValueError, match="unknown ahead mode"):
        simulate(p, ArenaConfig(4), AheadConfig("oracle", mode="x"))
    with pytest.raises(ValueError, match="unknown gate"):
        simulate(p, ArenaConfig(4), AheadConfig("oracle", gate="x"))


# --- command line -------------------------------------------------------------------

def test_cli_replay_json(tmp_path, capsys):
    p = _trace(tmp_path / "t.parquet", [[[t % 3]] for t in range(30)])
    assert cli(["replay", str(p), "--policy", "lru", "--arena", "3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {k: d[k] for k in ("lookups", "hits", "misses", "policy")} == {"lookups": 30, "hits": 27, "misses": 3, "policy": "lru"}
    assert d["hit_rate"] == pytest.approx(0.9)
    assert cli(["replay", str(p), "--policy", "lru,fifo", "--arena", "0.25", "--json"]) == 0
    assert [x["policy"] for x in json.loads(capsys.readouterr().out)] == ["lru", "fifo"]


def test_cli_errors_exit_nonzero(tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"garbage")
    assert cli(["replay", str(bad), "--arena", "4"]) == 2
    assert "not a readable Parquet" in capsys.readouterr().err
    p = _trace(tmp_path / "t.parquet", [[[1]]])
    assert cli(["replay", str(p), "--policy", "mru"]) == 2
    assert "valid policies" in capsys.readouterr().err
    assert cli(["export", str(bad), "--format", "csv", str(tmp_path / "o.csv")]) == 2


def test_cli_simulate(tmp_path, capsys):
    p = tmp_path / "s.parquet"
    synthetic_trace(p, n_tokens=6, n_layers=2, n_experts=8, top_k=2, predictors=(1,))
    assert cli(["simulate", str(p), "--arena", "0.5", "--predictor", "d1", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d["prefetch"]) == {"issued", *OUTCOMES}
