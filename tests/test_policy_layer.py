"""The live policy layer: read-ahead accounting, cache-aware routing, determinism, fault injection."""

import random
import time

import numpy as np
import pytest

from conftest import TOL, WRITES, resident_greedy
from workbench.config import AheadConfig, ArenaConfig, IOConfig
from workbench.engine.engine import Engine
from workbench.routing.setup import configure
from workbench.store.manifest import StoreError

SHAPE = dict(layers=4, experts=16, top_k=4, hidden=64, expert_width=32)
PROMPT = [9, 4, 27, 31, 2, 88, 5, 60, 13, 101]


@pytest.fixture
def store(tiny):
    return tiny("qwen3_moe", 4, **SHAPE)


def _run(store, arena="0.5", max_tokens=12, delay=None, policy="lru", decode="layer", **cfg):
    with Engine(store[1], arena=ArenaConfig(arena, policy), io=IOConfig(workers=4), ahead=AheadConfig(**cfg),
                decode=decode, progress=False) as eng:
        if delay is not None:
            eng.reader.inject = delay
        return eng.generate(PROMPT, max_tokens=max_tokens)


@pytest.mark.parametrize("mode", [dict(mode="unpert1"), dict(mode="unpert0"), dict(mode="route", moce_protect=2, moce_r1=0.1),
                                  dict(mode="unpert1", decode="optimistic"), dict(mode="unpert1", decode="auto")])
@pytest.mark.parametrize("predictor", ["layer", "prev"])
def test_prefetch_accounting_adds_up(store, predictor, mode):
    res = _run(store, predictor=predictor, lookahead=1, **{"arena": "0.3", **mode})
    pf, pb = res.stats["prefetch"], res.stats["prefetch_bytes"]
    assert pf["issued"] > 0
    assert pf["issued"] == sum(v for k, v in pf.items() if k != "issued")
    assert pb["issued"] == sum(v for k, v in pb.items() if k != "issued") == pf["issued"] * res.stats["expert_bytes"]
    assert res.stats["hits"] + res.stats["misses"] + pf["useful_late"] + pf["useful_timely"] == 12 * 4 * 4


@pytest.mark.parametrize("decode", ["layer", "optimistic"])
def test_exact_read_ahead_keeps_output_exact(store, decode):
    ref, ref_lp = resident_greedy(store[0], PROMPT, 12)
    res = _run(store, arena="0.5", predictor="layer", lookahead=2, mode="unpert1", gate="confidence", decode=decode)
    assert res.tokens == ref
    np.testing.assert_allclose(res.logprobs, ref_lp, atol=TOL)
    assert res.stats["prefetch"]["useful_timely"] + res.stats["prefetch"]["useful_late"] > 0


def test_successor_reads_save_recomputes(store):
    """After a miss, reading the perturbed pass's picks for later layers leaves fewer recomputes."""
    plain = _run(store, arena="0.3", decode="optimistic", max_tokens=16)
    ahead = _run(store, arena="0.3", decode="optimistic", max_tokens=16, predictor="layer")
    assert ahead.tokens == plain.tokens
    assert ahead.stats["recomputes"] < plain.stats["recomputes"]
    assert ahead.stats["prefetch"]["useful_timely"] > 0


def test_oracle_prefetch_removes_sync_misses(store, tmp_path):
    from workbench.trace.recorder import TraceRecorder
    from workbench.trace.schema import read_trace

    path = tmp_path / "oracle.parquet"
    with Engine(store[1], arena="0.5", progress=False) as eng:
        plain = eng.generate(PROMPT, max_tokens=12, trace=TraceRecorder(path))
    res = _run(store, arena="0.5", predictor="oracle", lookahead=1, oracle_trace=read_trace(path))
    assert res.tokens == plain.tokens
    assert res.stats["sync_misses"] < plain.stats["sync_misses"]
    assert res.stats["prefetch"]["completed_unused"] == 0  # the oracle never reads what is not claimed


@pytest.mark.parametrize("writes", WRITES)
def test_optimistic_decode_reads_the_next_tokens_experts(store, tmp_path, writes):
    """In optimistic decode the planner reads the next token's experts once a token is settled:
    with the oracle (the next step's recorded picks) most claims that were sync misses become
    prefetch hits, and the output stays exact in every slot-write mode (direct and mapped writes
    never evict a slot that the token already running on the device reads)."""
    from workbench.trace.recorder import TraceRecorder
    from workbench.trace.schema import read_trace

    path = tmp_path / "oracle.parquet"
    ref, ref_lp = resident_greedy(store[0], PROMPT, 16)
    with Engine(store[1], arena=ArenaConfig("0.5", writes=writes), decode="optimistic", progress=False) as eng:
        plain = eng.generate(PROMPT, max_tokens=16, trace=TraceRecorder(path))
    runs = {}
    for predictor in ("oracle", "prev"):
        ahead = AheadConfig(predictor=predictor, lookahead=1, oracle_trace=read_trace(path) if predictor == "oracle" else None)
        with Engine(store[1], arena=ArenaConfig("0.5", writes=writes), io=IOConfig(workers=4), ahead=ahead,
                    decode="optimistic", progress=False) as eng:
            res = runs[predictor] = eng.generate(PROMPT, max_tokens=16)
        assert res.tokens == ref == plain.tokens, predictor
        np.testing.assert_allclose(res.logprobs, ref_lp, atol=TOL)
        assert res.stats["optimistic_tokens"] == 16 and res.stats["lookups"] == plain.stats["lookups"]
        pf = res.stats["prefetch"]
        assert pf["issued"] == sum(v for k, v in pf.items() if k != "issued") > 0
        assert pf["useful_timely"] + pf["useful_late"] > 0, predictor
    oracle, prev = runs["oracle"].stats, runs["prev"].stats
    assert oracle["sync_misses"] < plain.stats["sync_misses"] / 2
    # the oracle reads only recorded picks; what it leaves unused is the perturbed successors' guesses
    assert oracle["prefetch"]["completed_unused"] < prev["prefetch"]["completed_unused"]


def test_cache_aware_routing_trades_quality_for_hits(store):
    exact = _run(store, arena="0.35")
    moce = _run(store, arena="0.35", mode="route", moce_bonus=4.0, moce_protect=1)
    assert moce.stats["hit_rate"] > exact.stats["hit_rate"]


def test_cache_aware_routing_with_tiny_bonus_matches_exact(store):
    """The override path reproduces the family's routing: with a negligible bonus, same tokens."""
    exact = _run(store, arena="1.0")
    moce = _run(store, arena="1.0", mode="route", moce_bonus=1e-9)
    assert moce.tokens == exact.tokens
    np.testing.assert_allclose(moce.logprobs, exact.logprobs, atol=max(TOL, 2e-3))


@pytest.mark.parametrize("cfg", [
    dict(arena="0.4", predictor="layer", lookahead=1, mode="route", moce_protect=2, moce_bonus=0.85, gate="confidence"),
    dict(arena="0.4", predictor="layer", lookahead=1, gate="confidence", decode="auto"),
    dict(arena="0.3", predictor="prev", decode="optimistic"),
], ids=["cache-aware", "auto", "optimistic"])
def test_residency_is_deterministic_under_random_io_delays(store, cfg):
    """Read-ahead in every decode mode: identical tokens and residency however long reads take."""
    base = _run(store, **cfg)
    for seed in (1, 2):
        rng = random.Random(seed)

        def delay(blob):
            time.sleep(rng.random() * 0.004)

        res = _run(store, delay=delay, **cfg)
        assert res.tokens == base.tokens
        assert res.stats["residency_hash"] == base.stats["residency_hash"]


def _slots_holding_wrong_bytes(eng, keys=None) -> list:
    """Published slots (or the slots of ``keys``) whose tensors differ from their blob in the store."""
    import mlx.core as mx

    data = (eng.root / "experts.bin").read_bytes()
    bad = []
    for key, s in sorted(eng.arena.smap.items()):
        if eng.arena.published[s] if keys is None else key in keys:
            b = eng.m.blob(*divmod(key, eng.m.n_experts))
            got = b"".join(np.array(eng.arena.tensors[t.name][s].view(mx.uint8)).tobytes() for t in eng.m.tensors)
            if got != data[b.offset:b.offset + b.size]:
                bad.append(divmod(key, eng.m.n_experts))
    return bad


@pytest.mark.parametrize("writes", WRITES)
def test_io_fault_surfaces_and_engine_recovers(store, writes):
    """A read error ends the run; the reads that did complete keep their data (staged writes copy
    them in), so the next run is exact and every published slot holds its blob's bytes."""
    with Engine(store[1], arena=ArenaConfig("0.5", writes=writes), io=IOConfig(workers=3), ahead=AheadConfig("layer"),
                progress=False) as eng:
        calls = {"n": 0}

        def fault(blob):
            calls["n"] += 1
            if calls["n"] == 40:
                raise OSError(f"injected EIO on layer {blob.layer} expert {blob.expert}")

        eng.reader.inject = fault
        with pytest.raises(OSError, match="injected EIO on layer"):
            eng.generate(PROMPT, max_tokens=30)
        arena = eng.arena
        assert not any(arena.pinned) and not arena.spec and not arena.limbo
        assert all(arena.key_of[s] == k for k, s in arena.smap.items())
        assert sorted(arena.free + list(arena.smap.values())) == list(range(arena.n_slots))
        eng.reader.inject = None
        ref, ref_lp = resident_greedy(store[0], PROMPT, 6)
        res = eng.generate(PROMPT, max_tokens=6)
        assert res.tokens == ref
        np.testing.assert_allclose(res.logprobs, ref_lp, atol=TOL)
        assert _slots_holding_wrong_bytes(eng) == []


def test_staged_reads_of_the_waiting_thread_land_before_the_next_claim(store):
    """The decode thread reads small misses itself and defers their landing in the slots to the
    compute that uses them (``Staging.landed``); by the next layer's route nothing is left
    pending: every published slot holds its blob's bytes and the rows are reused."""
    seen = []
    with Engine(store[1], arena=ArenaConfig("0.3", writes="staged"), io=IOConfig(workers=2, reserved=1),
                decode="layer", progress=False) as eng:
        staging = eng.arena.slots.staging

        def selected(ids, **ctx):
            seen.append(len(staging.pending))

        eng.hooks.add("layer.*.experts.selected", selected)
        res = eng.generate(PROMPT, max_tokens=8)
        grown = len(staging.free)
        reads = res.stats["misses"] + res.stats["prefill"]["misses"]
        assert _slots_holding_wrong_bytes(eng) == []
    ref, _ = resident_greedy(store[0], PROMPT, 8)
    assert res.tokens == ref
    assert len(seen) >= 32 and not any(seen), seen
    assert reads > 2 * grown, (reads, grown)


def test_a_workers_staged_read_is_done_in_its_row_and_lands_on_the_decode_thread(store):
    """An I/O worker's staged read counts as done once its row is full; the slot is written only by
    the decode thread's next ``landed`` or ``flush``, and a slot's earlier reads never land over its
    last one."""
    from workbench.arena.staging import _last_per_slot

    with Engine(store[1], arena=ArenaConfig("0.5", preload=False, writes="staged"), io=IOConfig(workers=2, reserved=0),
                progress=False) as eng:
        arena, staging = eng.arena, eng.arena.slots.staging
        layer = eng.m.moe_layers[1]
        reqs = [arena.prefetch(layer, e, eng.top_k) for e in (2, 5)]  # speculative: read by the workers
        for req in reqs:
            req.event.wait()
        assert [r.state for r in reqs] == ["done", "done"]
        assert sorted(slot for _, slot in staging.pending) == sorted(r.slot for r in reqs)
        keys = {layer * eng.m.n_experts + e for e in (2, 5)}
        assert len(_slots_holding_wrong_bytes(eng, keys)) == 2  # not in their slots yet
        free, how = len(staging.free), "_launch" if staging.kernel else "_copy"  # the landing kernel, or copies

        def interrupted(*args):
            delattr(staging, how)  # once
            raise KeyboardInterrupt

        setattr(staging, how, interrupted)
        with pytest.raises(KeyboardInterrupt):  # an interrupted landing leaves its rows pending
            arena.slots.flush()
        assert len(staging.pending) == 2 and len(staging.free) == free
        arena.slots.flush()
        assert staging.pending == [] and len(staging.free) == free + 2
        assert _slots_holding_wrong_bytes(eng, keys) == []
        arena.finish_speculation()
    assert _last_per_slot([("a", 1), ("b", 2), ("c", 1), ("d", 3), ("e", 2)]) == [("c", 1), ("d", 3), ("e", 2)]


def test_short_read_names_the_blob(tiny, tmp_path):
    import shutil

    from workbench.store.manifest import EXPERTS

    _, src = tiny("qwen3_moe", 4, **SHAPE)
    dst = tmp_path / "s"
    shutil.copytree(src, dst)
    size = (dst / EXPERTS).stat().st_size
    with Engine(dst, arena=ArenaConfig("1.0", preload=False), progress=False) as eng, \
            pytest.raises(StoreError, match="short read of layer 3 expert"):
        with open(dst / EXPERTS, "r+b") as f:  # cut the file after the open (a cut manifest is refused at open)
            f.truncate(size - 50000)
        for start in range(0, 120, 5):
            eng.generate(list(range(start, start + 10)), max_tokens=3)


@pytest.mark.parametrize("bad, msg", [
    (dict(mode="route", moce_bonus=0.0), "plain router"),
    (dict(mode="route", moce_protect=9), "between 0 and top-k"),
    (dict(predictor="layer", lookahead=4), "out of range"),
    (dict(predictor="psychic"), "unknown predictor"),
    (dict(predictor="layer", gate="vibes"), "unknown gate"),
    (dict(gate="confidence"), "also give --predictor"),
    (dict(mode="unpert2"), "unknown ahead mode"),
])
def test_invalid_combinations(store, bad, msg):
    with Engine(store[1], arena="0.5", progress=False) as eng, pytest.raises(ValueError, match=msg):
        configure(eng, AheadConfig(**bad))


def test_prefill_streams_hottest_experts_first_and_keeps_counters_apart(store):
    from collections import Counter

    prompt = [int(t) for t in np.random.default_rng(3).integers(0, 128, 40)]
    with Engine(store[1], arena="0.25", progress=False) as eng:
        submitted = []
        with eng.hooks.using([("io.submit", lambda req, layer, **c: submitted.append((eng.step, layer, req.blob.expert)))]):
            from workbench.hooks import run_with_cache

            res, cache = run_with_cache(eng, prompt, names_filter="layer.0.experts.selected", max_tokens=3)
        counts = Counter(cache["layer.0.experts.selected"][0].ravel().tolist())
        first = [e for s, l, e in submitted if s == 0 and l == 0]
        ranked = sorted(counts, key=lambda e: (-counts[e], e))
        assert first == ranked  # layer-ranked: most-routed expert read first
        assert res.stats["prefill"]["misses"] >= len(counts) and res.stats["prefill"]["misses"] > res.stats["misses"]
        df = res.counters
        assert set(df[df.step == 0].phase) == {"prefill"}


def test_compare_and_ioreplay_cli(store, tmp_path, capsys):
    import json as js

    from workbench.cli import main

    capsys.readouterr()
    assert main(["compare", str(store[1]), "--prompt-ids", "1,2,3,4,5", "--max-tokens", "6", "--common", "--arena 0.5",
                 "--variant", "exact=--predictor layer", "--variant", "route=--predictor layer --mode route", "--json"]) == 0
    exact, route = js.loads(capsys.readouterr().out)
    assert exact["mean_kl"] == 0 and exact["same_tokens"]
    assert route["mean_kl"] >= 0 and set(exact["prefetch"]) == {"issued", "cancelled_before_read", "partially_read",
                                                               "completed_unused", "useful_late", "useful_timely"}
    trace = tmp_path / "t.parquet"
    assert main(["run", str(store[1]), "--prompt-ids", "1,2,3,4,5", "--max-tokens", "8", "--trace", str(trace),
                 "--predictor", "layer", "--json"]) == 0
    capsys.readouterr()
    assert main(["ioreplay", str(trace), str(store[1]), "--arena", "0.5", "--predictor", "layer", "--compute-ms", "0.2",
                 "--json"]) == 0
    st = js.loads(capsys.readouterr().out)
    assert st["tokens"] == 8 and st["prefetch"]["issued"] > 0
    assert st["hits"] + st["misses"] + st["prefetch"]["useful_late"] + st["prefetch"]["useful_timely"] == 8 * 4 * 4


def test_self_draft_and_verify_union_cost(store):
    from workbench.analysis.drafters import acceptance_table, self_draft_drafter, verify_union_cost

    with Engine(store[1], arena="0.5", progress=False) as eng:
        target = eng.generate(PROMPT, max_tokens=10).tokens
        df = acceptance_table(PROMPT, target, {"self_draft": self_draft_drafter(eng)}, g_values=(3,))
        assert 0 <= df.acceptance.iloc[0] <= 1 and df.passes.iloc[0] >= 4
        one = verify_union_cost(eng, PROMPT, target[:1])
        four = verify_union_cost(eng, PROMPT, target[:4])
        assert one["accepted"] == 1 and four["accepted"] == 4  # drafts equal to greedy output all pass
        assert eng.top_k <= one["union_experts"] <= four["union_experts"] <= 4 * eng.top_k * len(eng.m.moe_layers)


def test_static_hotlist_is_preloaded_and_pinned(store, tmp_path):
    hot = tmp_path / "hot.txt"
    hot.write_text("# layer expert\n0 1\n0 2\n3 7\n")
    with Engine(store[1], arena=ArenaConfig("0.25", "static", {"hotlist": str(hot)}), progress=False) as eng:
        E = eng.m.n_experts
        assert {0 * E + 1, 0 * E + 2, 3 * E + 7} <= set(eng.arena.smap)
        eng.generate(PROMPT, max_tokens=12)
        assert {0 * E + 1, 0 * E + 2, 3 * E + 7} <= set(eng.arena.smap)  # never evicted
    bad = tmp_path / "bad.txt"
    bad.write_text("9 1\n")
    with pytest.raises(ValueError, match="outside the model"):
        Engine(store[1], arena=ArenaConfig("0.25", "static", {"hotlist": str(bad)}), progress=False)


@pytest.mark.parametrize("family", ["deepseek_v3", "mixtral", "gpt_oss"])
def test_cache_aware_override_reproduces_family_routing(tiny, family):
    """With a negligible bonus the engine's routing override picks what the family's own code picks
    (group-limited sigmoid routing included) and the output matches exact decoding."""
    _, store = tiny(family, 4)
    with Engine(store, arena="1.0", progress=False) as eng:
        exact = eng.generate(PROMPT, max_tokens=8)
        _, router, planner = configure(eng, AheadConfig(mode="route", moce_bonus=1e-9, moce_protect=1))
        with eng.routing(router, planner):
            moce = eng.generate(PROMPT, max_tokens=8)
    assert moce.tokens == exact.tokens
    np.testing.assert_allclose(moce.logprobs, exact.logprobs, atol=max(TOL, 2e-3))


def test_failed_run_writes_no_trace_and_leaves_no_hooks(store, tmp_path):
    from workbench.trace.recorder import TraceRecorder

    path = tmp_path / "t.parquet"
    with Engine(store[1], arena="0.5", progress=False) as eng:
        calls = {"n": 0}

        def fault(blob):
            calls["n"] += 1
            if calls["n"] == 20:
                raise OSError("injected EIO")

        eng.reader.inject = fault
        with pytest.raises(OSError, match="injected EIO"):
            eng.generate(PROMPT, max_tokens=20, trace=TraceRecorder(path, io_events=True))
        assert not path.exists() and list(tmp_path.iterdir()) == []
        assert not eng.hooks.active
        with pytest.raises(ValueError, match="max_tokens"):
            eng.generate(PROMPT, max_tokens=0)


def _consistent(arena):
    assert not any(arena.pinned) and not arena.spec and not arena.limbo
    assert all(arena.key_of[s] == k for k, s in arena.smap.items())
    assert sorted(arena.free + list(arena.smap.values())) == list(range(arena.n_slots))
    published = {k for k, s in arena.smap.items() if arena.published[s]}
    assert published == {layer * arena.E + e for layer in range(arena.lut.shape[0])
                         for e in np.flatnonzero(arena.lut[layer] != arena.placeholder)}


@pytest.mark.parametrize("decode", ["layer", "optimistic"])
@pytest.mark.parametrize("point", ["cache.hit", "cache.miss", "cache.evict", "io.submit", "io.done", "prefetch.outcome"])
def test_an_error_at_any_step_of_a_claim_or_prefetch_ends_the_run_and_leaves_the_engine_usable(store, point, decode):
    """A hook that raises inside at_layer / prefetch (the arena's every step fires one): the run ends
    with that error, never hangs on a read that was not submitted, and the arena stays consistent."""
    import threading

    ref, _ = resident_greedy(store[0], PROMPT, 6)
    with Engine(store[1], arena="0.4", io=IOConfig(workers=3), ahead=AheadConfig("layer"), decode=decode,
                progress=False) as eng:
        for nth in (1, 7):
            calls = {"n": 0}

            def boom(value, **ctx):
                calls["n"] += 1
                if calls["n"] == nth:
                    raise RuntimeError(f"injected at {point}")

            out = {}

            def run():
                try:
                    with eng.hooks.using([(point, boom)]):
                        eng.generate(PROMPT, max_tokens=12)
                except RuntimeError as e:
                    out["error"] = str(e)

            t = threading.Thread(target=run, daemon=True)
            t.start()
            t.join(timeout=60)
            assert not t.is_alive(), f"generate hung after an error at {point}"
            if calls["n"] >= nth:
                assert out.get("error", "").endswith(f"RuntimeError: injected at {point}; fix the hook or remove it "
                                                     "(engine.hooks.remove)")
            _consistent(eng.arena)
        assert eng.generate(PROMPT, max_tokens=6).tokens == ref


def test_a_failed_open_leaves_no_thread_or_file(tiny, tmp_path):
    import os
    import shutil
    import threading

    from workbench.store.manifest import EXPERTS

    _, src = tiny("qwen3_moe", 4, **SHAPE)
    dst = tmp_path / "s"
    shutil.copytree(src, dst)
    with open(dst / EXPERTS, "r+b") as f:  # a blob's bytes flipped: the full arena's preload fails at open
        f.seek(100)
        f.write(b"\xff\xfe\xfd")
    threads, fds = threading.active_count(), len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(StoreError, match="checksum mismatch"):
            Engine(dst, arena="1.0", io=IOConfig(workers=8, verify="always"), progress=False)
    assert threading.active_count() == threads
    assert len(os.listdir("/proc/self/fd")) == fds


@pytest.mark.parametrize("writes", WRITES)
def test_an_interrupt_among_a_claims_own_reads_keeps_the_reads_it_made(store, writes, monkeypatch):
    """Ctrl-C while the decode thread reads a claim's misses itself (in ``submit_many``): the claim
    ends with it, a read that completed keeps its slot (mapped, unpublished, its bytes in place),
    the ones never read give theirs back, and the next run is exact."""
    from tests.hostile_util import interrupt_reads_at

    ref, _ = resident_greedy(store[0], PROMPT, 6)
    with Engine(store[1], arena=ArenaConfig("0.5", writes=writes), progress=False) as eng:
        arena, layer = eng.arena, eng.m.moe_layers[0]
        wanted = [e for e in range(eng.m.n_experts) if not arena.map.is_mapped(layer, e)][:eng.top_k]
        interrupt_reads_at(monkeypatch, 4)  # at the second read's start
        with pytest.raises(KeyboardInterrupt):
            arena.at_layer(layer, wanted)
        monkeypatch.undo()
        keys = [layer * arena.E + e for e in wanted]
        assert keys[0] in arena.smap and not arena.published[arena.smap[keys[0]]]
        assert not any(k in arena.smap for k in keys[1:])
        _consistent(arena)
        assert _slots_holding_wrong_bytes(eng) == [] and _slots_holding_wrong_bytes(eng, keys[:1]) == []
        assert eng.generate(PROMPT, max_tokens=6).tokens == ref
