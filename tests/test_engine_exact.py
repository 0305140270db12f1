"""Streamed output equals resident mlx-lm output, for every family, plain and 4-bit, at 10/50/100% arenas."""

import numpy as np
import pytest

from mlx.utils import tree_flatten

from conftest import TOL, WRITES, resident_greedy
from workbench.config import ArenaConfig, IOConfig
from workbench.engine.engine import Engine

FAMILIES = ["qwen3_moe", "mixtral", "deepseek_v3", "qwen2_moe", "olmoe", "gpt_oss", "glm4_moe"]
PROMPT = [5, 17, 3, 99, 42, 8, 77, 1, 64, 23, 11, 90, 31, 7, 56, 2, 88, 14, 70, 45]  # 19 prefill tokens


@pytest.mark.parametrize("bits", [None, 4])
@pytest.mark.parametrize("family", FAMILIES)
def test_streamed_equals_resident(tiny, family, bits):
    """Both decode modes, at arenas where most tokens miss, some do, and none do."""
    model_dir, store = tiny(family, bits)
    ref_tokens, ref_logprobs = resident_greedy(model_dir, PROMPT, 10)
    assert len(set(ref_tokens)) > 3, "the random model must keep tokens moving for the test to mean anything"
    for arena in ("0.1", "0.5", "1.0"):
        for decode in ("optimistic", "layer"):
            with Engine(store, arena=arena, decode=decode, progress=False) as eng:
                res = eng.generate(PROMPT, max_tokens=10)
            where = f"{family} bits={bits} arena={arena} decode={decode}"
            assert (eng.fast is not None) == (arena == "1.0"), where  # a full arena is frozen: mlx-lm's own model
            assert res.tokens == ref_tokens, where
            np.testing.assert_allclose(res.logprobs, ref_logprobs, atol=TOL, rtol=TOL, err_msg=where)
            assert res.stats["lookups"] == 10 * len(eng.m.moe_layers) * eng.top_k
            if decode == "optimistic" and family != "gpt_oss":  # gpt_oss's sliding-window caches cannot roll back
                assert res.stats["optimistic_tokens"] == 10, where
            if arena == "0.1":  # the prefill batch needed more experts than the arena holds: waves
                assert eng.n_slots < eng.m.n_experts and res.stats["prefill"]["misses"] > eng.n_slots


def test_small_arena_is_not_silently_wrong(tiny):
    """The smallest legal arena (k slots) evicts constantly and still matches exactly."""
    model_dir, store = tiny("qwen3_moe", 4)
    ref, _ = resident_greedy(model_dir, PROMPT, 8)
    with Engine(store, arena="2", progress=False) as eng:
        res = eng.generate(PROMPT, max_tokens=8)
    assert res.tokens == ref
    assert res.stats["evictions"] > 0 and res.stats["misses"] > res.stats["hits"]


def test_model_dir_is_packed_on_first_use(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    model_dir, _ = tiny("mixtral", None)
    with Engine.open(model_dir, arena="1.0", progress=False) as eng:
        first = eng.generate([1, 2, 3], max_tokens=3).tokens
    stores = list((tmp_path / "stores").iterdir())
    assert len(stores) == 1
    with Engine.open(model_dir, arena="1.0", progress=False) as eng:  # reuses the cached store
        assert eng.generate([1, 2, 3], max_tokens=3).tokens == first
    assert list((tmp_path / "stores").iterdir()) == stores


@pytest.mark.parametrize("bits", [4, None])  # float32: a blob's tensors are whole pages (O_DIRECT reads into rows)
def test_read_modes_agree(tiny, bits):
    from workbench.store.reader import available_modes

    _, store = tiny("qwen3_moe", bits)
    outs = {}
    for mode in available_modes():
        for writes in WRITES:
            with Engine(store, arena=ArenaConfig("0.25", writes=writes), io=IOConfig(mode=mode, verify="always"),
                        progress=False) as eng:
                outs[mode, writes] = eng.generate(PROMPT, max_tokens=6).tokens
                if (bits, mode, writes) == (None, "direct", "staged"):  # page-aligned rows: no bounce copy
                    assert not hasattr(eng.reader._local, "buf")  # (the decode thread made every read)
    assert len(set(map(tuple, outs.values()))) == 1, outs


def test_demand_reads_split_over_workers_agree(tiny):
    """Blobs of several pieces (here pages): each demand miss is read by the claiming thread and the
    idle workers at once; every read mode and slot write gives the same tokens as whole reads."""
    import threading

    from workbench.store.reader import DIRECT_ALIGN, available_modes

    _, store = tiny("qwen3_moe")  # float32: a blob is several pages
    outs = {}
    for mode in [m for m in available_modes() if m in ("buffered", "direct")]:
        for writes in WRITES:
            for split in (False, True):
                with Engine(store, arena=ArenaConfig("0.25", writes=writes), io=IOConfig(mode=mode, verify="always"),
                            progress=False) as eng:
                    readers = {}
                    if split:
                        eng.reader.piece_bytes = DIRECT_ALIGN
                        eng.reader.inject = lambda b: readers.setdefault(id(b), set()).add(threading.get_ident())
                    outs[mode, writes, split] = eng.generate(PROMPT, max_tokens=6).tokens
                    assert not split or any(len(r) > 1 for r in readers.values()), (mode, writes)
    assert len(set(map(tuple, outs.values()))) == 1, outs


def test_full_arena_is_preloaded_and_never_syncs_per_layer(tiny):
    """An arena that holds every expert is filled at open: every token is optimistic, none misses.
    It is frozen: optimistic decode computes on views of each layer's slots, with or without a hook
    reading the ids, and neither mode touches the policy."""
    from workbench.hooks import run_with_cache

    model_dir, store = tiny("qwen3_moe", 4)
    ref, ref_lp = resident_greedy(model_dir, PROMPT, 40)
    with Engine(store, arena="1.0", progress=False) as eng, \
            Engine(store, arena="1.0", decode="layer", progress=False) as slow:
        assert eng.arena.map.frozen and set(eng.views) == set(eng.m.moe_layers) and eng.fast is not None
        before = list(eng.arena.policy.order())
        res, res_slow = eng.generate(PROMPT, max_tokens=40), slow.generate(PROMPT, max_tokens=40)
        assert list(eng.arena.policy.order()) == list(slow.arena.policy.order()) == before
        hooked, cache = run_with_cache(eng, PROMPT, names_filter="layer.*.experts.selected", max_tokens=8)
        _, slow_cache = run_with_cache(slow, PROMPT, names_filter="layer.*.experts.selected", max_tokens=8)
        assert hooked.tokens == ref[:8]
        for name, values in slow_cache.items():
            assert [v.tolist() for v in cache[name]] == [v.tolist() for v in values], name
    assert res.stats["optimistic_tokens"] == 40 and res_slow.stats["optimistic_tokens"] == 0
    assert res.tokens == ref == res_slow.tokens
    np.testing.assert_allclose(res.logprobs, ref_lp, atol=TOL)
    assert res.stats["hits"] == res_slow.stats["hits"] == 40 * 2 * 2 and res.stats["misses"] == 0
    assert res.stats["recomputes"] == 0


@pytest.mark.parametrize("arena", ["4", "0.3", "0.6"])
def test_optimistic_and_per_layer_decode_are_one_result(tiny, arena):
    """Without read-ahead the two modes run the same arena events in the same order: same tokens,
    log-probs, counters and residency; optimistic decode recomputes where a layer missed. Per-layer
    decode that leaves each layer's experts to the next sync (``pipeline`` off), and with a sync per
    layer instead of the handshake (CUDA), is the same run."""
    _, store = tiny("qwen3_moe", 4, layers=4, experts=16, top_k=4)
    out = {}
    for decode, pipeline, handshake in (("optimistic", True, True), ("layer", True, True), ("layer", False, False)):
        with Engine(store, arena=arena, decode=decode, progress=False) as eng:
            eng.pipeline = pipeline
            if not handshake:
                eng.handshake = None  # a sync per layer (the handshake runs on CUDA only)
            out[decode, pipeline] = eng.generate(PROMPT, max_tokens=12)
    opt, lay, unpiped = out["optimistic", True], out["layer", True], out["layer", False]
    assert opt.tokens == lay.tokens == unpiped.tokens
    np.testing.assert_allclose(opt.logprobs, lay.logprobs, atol=TOL)
    np.testing.assert_allclose(unpiped.logprobs, lay.logprobs, atol=TOL)
    assert unpiped.stats["handshake_tokens"] == 0
    for key in ("hits", "misses", "sync_misses", "evictions", "bytes_read", "residency_hash"):
        assert opt.stats[key] == lay.stats[key] == unpiped.stats[key], key
    assert opt.stats["recomputes"] > 0 and opt.stats["recomputed_layers"] >= opt.stats["recomputes"]
    cols = ["step", "layer", "hits", "misses", "evictions"]
    assert opt.counters[cols].equals(lay.counters[cols])


def test_auto_mode_switches_on_the_miss_pattern(tiny):
    """The controller runs optimistic tokens while layers hit and per-layer tokens under heavy misses."""
    _, store = tiny("qwen3_moe", 4, layers=4, experts=16, top_k=4)
    with Engine(store, arena="1.0", progress=False) as eng:
        full = eng.generate(PROMPT, max_tokens=12)
    with Engine(store, arena="4", progress=False, sync_cost=1.0) as eng:
        tight = eng.generate(PROMPT, max_tokens=40)
    assert full.stats["optimistic_tokens"] == 12
    assert 0 < tight.stats["optimistic_tokens"] < 40  # probes only


@pytest.mark.parametrize("decode", ["optimistic", "layer"])
def test_slot_write_modes_agree_with_read_ahead(tiny, decode):
    """Staged writes (bounce rows copied into slots by the reading thread) and direct writes give
    the resident output, with read-ahead (speculative reads cancelled, unused or claimed), and
    bounce rows are reused rather than grown per read."""
    from workbench.config import AheadConfig, ArenaConfig

    model_dir, store = tiny("qwen3_moe", 4, layers=4, experts=16, top_k=4)
    ref, ref_lp = resident_greedy(model_dir, PROMPT, 24)
    outs = {}
    for writes in WRITES:
        with Engine(store, arena=ArenaConfig("0.3", writes=writes), ahead=AheadConfig(predictor="layer", lookahead=1),
                    decode=decode, progress=False) as eng:
            res = eng.generate(PROMPT, max_tokens=24)
            outs[writes] = (tuple(res.tokens), res.stats["residency_hash"])
            assert res.tokens == ref, writes
            np.testing.assert_allclose(res.logprobs, ref_lp, atol=TOL, err_msg=writes)
            if writes == "staged":
                rows = len(eng.arena.slots.staging.free)  # every row is back once the run ended
                reads = res.stats["misses"] + res.stats["prefill"]["misses"] + res.stats["prefetch"]["issued"]
                assert reads > 2 * rows, (reads, rows)  # rows were reused
                assert rows <= 2 * eng.n_slots
    assert len(set(outs.values())) == 1, outs


def _preferred_location(array) -> int:
    """CUDA's preferred location type of an MLX array's managed memory: 1 the GPU, 2 the host, 0 none."""
    import ctypes

    from workbench import cuda
    from workbench.arrays import address

    view = memoryview(array).cast("B")
    kind = ctypes.c_int(-1)
    rc = cuda.runtime().cudaMemRangeGetAttribute(ctypes.byref(kind), ctypes.c_size_t(4), 5,  # ...PreferredLocationType
                                                 ctypes.c_void_p(address(view)), ctypes.c_size_t(view.nbytes))
    assert rc == 0, f"cudaMemRangeGetAttribute failed (CUDA error {rc})"
    return kind.value


def test_slot_writes_default_by_backend_and_arena_size(tiny):
    """direct on the CPU and Metal; on CUDA mapped for a partial arena of small experts (these tiny
    ones) and staged for a full one (``slots.default_mode``), and a mapped arena's memory is back on the GPU once the engine is
    closed, before MLX hands it to another array."""
    from workbench.cuda import in_use

    _, store = tiny("qwen3_moe", 4)
    cuda = in_use()
    for arena, want in (("0.25", "mapped"), ("1.0", "staged")):
        with Engine(store, arena=arena, progress=False) as eng:
            assert eng.arena.writes == (want if cuda else "direct")
            tensor = next(iter(eng.arena.tensors.values()))
            if cuda:
                assert _preferred_location(tensor) == (2 if want == "mapped" else 1)
        if cuda:
            assert _preferred_location(tensor) == 1
    with Engine(store, arena=ArenaConfig("0.25", writes="mapped"), progress=False) as eng:
        assert eng.arena.writes == ("mapped" if cuda else "direct")  # the mode that runs, in stats too
        assert eng.generate(PROMPT, max_tokens=2).stats["slot_writes"] == eng.arena.writes


def test_controller_probes_less_often_while_probes_lose():
    """Per-layer decode probes optimistic decode; a probe that recomputed more than per-layer decode
    would have cost doubles the interval, a probe that paid resets it (misses only, never timings)."""
    from workbench.engine.optimistic import Controller

    c = Controller("auto", n_layers=12, sync=1.0, probe=4, expect_misses=True, max_probe=16)
    picks = []
    for _ in range(60):
        opt = c.optimistic()
        picks.append(opt)
        c.observe(12 if opt else 12, probe=c.probed if opt else False)  # every layer misses
    probes = [i for i, p in enumerate(picks) if p]
    assert [b - a for a, b in zip(probes, probes[1:])][:3] == [8, 16, 16]
    c.observe(0, probe=True)  # a probe that needed no recompute
    assert c.interval == 4
    # with the handshake's hit-through a per-layer token pays a sync only where a layer missed: it is
    # chosen as soon as optimistic tokens recompute at all, and optimistic decode while nothing misses
    hit = Controller("auto", n_layers=12, sync=1.0, probe=1000, through=True)
    synced = Controller("auto", n_layers=12, sync=1.0, probe=1000)
    assert hit.optimistic() and synced.optimistic()  # nothing has missed yet
    hit.observe(1)
    synced.observe(1)
    assert not hit.optimistic()  # one recompute in four tokens: per-layer through the table costs less
    assert synced.optimistic()  # against a sync per layer it is still cheaper optimistic


@pytest.mark.parametrize("decode", ["optimistic", "layer"])
def test_non_finite_logits_stop_the_run_naming_the_layer(tiny, decode):
    """A NaN that enters at one MoE layer (a forward hook writes it, as a broken kernel would) stops
    the run with an error naming that layer, instead of emitting token 0; the engine stays usable."""
    import mlx.core as mx

    from workbench.engine.engine import EngineError

    model_dir, store = tiny("qwen3_moe", 4, layers=4, experts=16, top_k=4)
    ref, _ = resident_greedy(model_dir, PROMPT, 4)

    def poison(x, step=0, **ctx):
        return x * mx.array(float("nan")) if step == 2 else None

    with Engine(store, arena="1.0", decode=decode, progress=False) as eng:
        with eng.hooks.using([("layer.2.moe.input", poison)]):
            with pytest.raises(EngineError, match="decode step 2: first seen in layer 2's MoE input"):
                eng.generate(PROMPT, max_tokens=4)
        assert eng.generate(PROMPT, max_tokens=4).tokens == ref


def test_the_handshake_serves_per_layer_tokens_on_cuda_only(tiny):
    """On CUDA, per-layer decode learns each layer's ids through the handshake, with no sync per
    layer, with slot memory the host writes (direct, mapped), with or without read-ahead (the
    planner's prediction travels with the ids): every decode token after the first, the same tokens,
    log-probs, claims, read-ahead and residency as a sync per layer. Hooks at the claim's points
    (``experts.selected``, a trace) fire in the answer, with the same values; a forward hook (a
    layer's MoE input or router logits, which it sees while the graph is built) syncs per layer
    instead; so do staged writes. Elsewhere there is no handshake."""
    from workbench.config import AheadConfig
    from workbench.cuda import in_use
    from workbench.hooks import run_with_cache

    model_dir, store = tiny("qwen3_moe", 4, layers=4, experts=16, top_k=4)
    ref, ref_lp = resident_greedy(model_dir, PROMPT, 16)
    cuda = in_use()
    combos = [(w, a) for w in (("mapped", "staged") if cuda else ("mapped",)) for a in (None, "layer", "prev")
              if w == "mapped" or a is None]  # staged slots with a read-ahead planner sync per layer: below
    for writes, ahead in combos:
        runs, hooked = {}, {}
        ahead = ahead and AheadConfig(predictor=ahead, lookahead=1)
        for handshake in (True, False):
            with Engine(store, arena=ArenaConfig("0.3", writes=writes), decode="layer", ahead=ahead,
                        progress=False) as eng:
                assert (eng.handshake is not None) == cuda
                if not handshake:
                    eng.handshake = None
                runs[handshake] = res = eng.generate(PROMPT, max_tokens=16)
                if handshake and cuda:  # hit-through without a planner (layers pass where every expert hits)
                    passed = eng.handshake.passed
                    assert (passed < 15 * 4) if ahead is None else passed == 0, (writes, passed)
                assert res.tokens == ref, ahead
                np.testing.assert_allclose(res.logprobs, ref_lp, atol=TOL, err_msg=str(ahead))
                hooked[handshake] = run_with_cache(eng, PROMPT, names_filter="layer.*.experts.selected", max_tokens=4)
                assert hooked[handshake][0].tokens == ref[:4]
                forward, _ = run_with_cache(eng, PROMPT, names_filter="layer.*.router.logits", max_tokens=4)
                assert forward.tokens == ref[:4] and forward.stats["handshake_tokens"] == 0
        assert runs[True].stats["handshake_tokens"] == (15 if cuda else 0)  # the first decode step syncs
        assert hooked[True][0].stats["handshake_tokens"] == (3 if cuda else 0)
        seen = {h: [np.asarray(v).tolist() for v in hooked[h][1]["layer.0.experts.selected"]] for h in hooked}
        assert seen[True] == seen[False] and len(seen[True]) == 5  # prefill, then one per decode step
        np.testing.assert_array_equal(runs[True].logprobs, runs[False].logprobs)  # same kernels, same slots
        for key in ("hits", "misses", "evictions", "residency_hash") + (("bytes_read",) if ahead is None else ()):
            assert runs[True].stats[key] == runs[False].stats[key], (ahead, key)
        assert runs[True].stats["prefetch"]["issued"] == runs[False].stats["prefetch"]["issued"]
        assert (runs[True].stats["prefetch"]["issued"] > 0) == (ahead is not None)
    with Engine(store, arena=ArenaConfig("0.3", writes="staged"), decode="layer", progress=False,
                ahead=AheadConfig(predictor="layer", lookahead=1)) as eng:
        planned = eng.generate(PROMPT, max_tokens=8)  # the planner's reads would not fit an answer's copies
        assert planned.tokens == ref[:8] and planned.stats["handshake_tokens"] == 0
    with Engine(store, arena=ArenaConfig("1.0", writes="staged"), decode="layer", progress=False) as eng:
        full = eng.generate(PROMPT, max_tokens=8)  # nothing misses: every layer passes through
        assert full.tokens == ref[:8]
        assert eng.handshake is None or eng.handshake.passed == 7 * 4


@pytest.mark.parametrize("writes", ["mapped", "staged"])
def test_the_handshake_launched_in_parts_or_served_aside_is_one_result(tiny, writes, tmp_path):
    """CUDA: a token launched every few MoE layers as it is built, answered from the server's thread
    while a launch runs or only from the decoding thread, traced or not (a recorder's hooks are
    host-only: still served aside): the same tokens, log-probs, claims and residency as a sync per
    layer, greedy and sampled, and the same trace."""
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    from workbench.cuda import in_use
    from workbench.trace.recorder import TraceRecorder
    from workbench.trace.schema import read_trace

    if not in_use():
        pytest.skip("the handshake runs on CUDA only")
    _, store = tiny("qwen3_moe", 4, layers=4, experts=16, top_k=4)
    seen, routes = {}, {}
    for mode in ("sync", (0, True), (0, False), (1, True), (3, True), (3, False), "traced"):
        with Engine(store, arena=ArenaConfig("0.3", writes=writes), decode="layer", progress=False) as eng:
            if mode == "sync":
                eng.handshake = None
            elif mode != "traced":
                eng.handshake.launch_every, eng.handshake.serve_thread = mode
            trace = TraceRecorder(tmp_path / f"{len(seen)}.parquet") if mode in ("sync", "traced") else None
            res = eng.generate(PROMPT, max_tokens=16, trace=trace)
            if mode == "traced":
                assert eng.handshake.server is not None  # answered aside
            mx.random.seed(5)
            sampled = eng.generate(PROMPT, max_tokens=16, sampler=make_sampler(temp=1.0))
        assert mode == "sync" or res.stats["handshake_tokens"] == 15, mode
        seen[mode] = (res.tokens, sampled.tokens, res.logprobs,
                      [res.stats[k] for k in ("hits", "misses", "evictions", "residency_hash")])
        if trace is not None:
            routes[mode] = read_trace(trace.path).routes
    want = seen.pop("sync")
    for mode, got in seen.items():
        assert got[:2] == want[:2] and got[3] == want[3], mode
        np.testing.assert_array_equal(got[2], want[2], err_msg=str(mode))
    a, b = routes["traced"], routes["sync"]
    assert len(a) == len(b) and a[["step", "layer"]].equals(b[["step", "layer"]])
    for col in ("selected", "resident"):
        assert [list(x) for x in a[col]] == [list(x) for x in b[col]], col


def test_a_device_that_gives_up_waiting_costs_time_not_exactness(tiny):
    """If the host does not answer in time, the device computes that layer on the placeholder and
    skips the token's later mailboxes; the engine computes the token again from that layer with a
    sync per layer, on the slots it answered: the same tokens, log-probs, claims and residency as a
    sync per layer, with one recompute per token; a sampled token is drawn again with its first draw's
    key. A model whose KV cache cannot roll back (a full sliding window) syncs per layer instead. CUDA only."""
    import mlx.core as mx

    from workbench.cuda import in_use

    if not in_use():
        pytest.skip("the handshake runs on CUDA only")
    from mlx_lm.sample_utils import make_sampler

    _, store = tiny("qwen3_moe", 4, layers=4, experts=16, top_k=4)
    runs, sampled = {}, {}
    for mode in ("gives up", "staged gives up", "sync"):
        writes = "staged" if mode.startswith("staged") else "mapped"  # staged: its reads land again after
        with Engine(store, arena=ArenaConfig("0.3", writes=writes), decode="layer", progress=False) as eng:
            if mode == "sync":
                eng.handshake = None
            else:
                eng.handshake.set_timeout(0)  # the device never waits: every token is given up at its first layer
            runs[mode] = eng.generate(PROMPT, max_tokens=8)
            mx.random.seed(11)
            sampled[mode] = eng.generate(PROMPT, max_tokens=8, sampler=make_sampler(temp=3.0))
    sync = runs["sync"]
    for mode in ("gives up", "staged gives up"):
        assert sampled[mode].stats["recomputes"] == 7
        assert sampled[mode].tokens == sampled["sync"].tokens  # a token drawn again is drawn with its own key
        gave = runs[mode]
        assert gave.tokens == sync.tokens
        np.testing.assert_allclose(gave.logprobs, sync.logprobs, atol=TOL)
        for key in ("hits", "misses", "evictions", "bytes_read", "residency_hash"):
            assert gave.stats[key] == sync.stats[key], (mode, key)
        assert gave.stats["handshake_tokens"] == 7 and gave.stats["recomputes"] == 7  # from the second decode step
    model_dir, store = tiny("gpt_oss", None)  # its sliding-window cache is full after the prompt: it cannot roll back
    ref, _ = resident_greedy(model_dir, PROMPT, 6)
    with Engine(store, arena=ArenaConfig("0.3", writes="mapped"), decode="layer", progress=False) as eng:
        eng.handshake.set_timeout(0)  # would give every token up: a token it cannot compute again syncs instead
        res = eng.generate(PROMPT, max_tokens=6)
    assert res.tokens == ref and res.stats["handshake_tokens"] == 0 and res.stats["recomputes"] == 0


@pytest.mark.parametrize("where", ["waiting", "landing", "reading ahead"])
def test_a_prefill_that_fails_while_a_layer_is_held_leaves_nothing_pinned(tiny, where, monkeypatch):
    """An interrupt while whole layers are held through the next claim: waiting for the layer before
    (``Claims.end``'s ``computed``), landing staged reads as a layer is held (``Arena.release``), or
    reading the next layer ahead on the claiming thread (small blobs: ``IOScheduler.submit_many``).
    The run fails (the interrupt is never taken for a failed read), no slot stays pinned, and the
    engine's next run equals resident mlx-lm's."""
    from workbench.arena.arena import Arena
    from workbench.arena.claims import Claims

    model_dir, store = tiny("qwen3_moe", 4, layers=4)
    prompt = [int(t) for t in np.random.default_rng(3).integers(1, 128, 40)]
    ref, _ = resident_greedy(model_dir, prompt, 4)
    fired = []

    def interrupt():
        fired.append(where)
        raise KeyboardInterrupt

    end, release = Claims.end, Arena.release
    if where == "reading ahead":
        pass  # below: the reader's test hook, on the first read of the second MoE layer (read ahead)
    elif where == "waiting":
        monkeypatch.setattr(Claims, "end", lambda self, read_ahead=None, computed=None: end(
            self, read_ahead, interrupt if computed is not None and self.held and not fired else computed))
    else:
        def failing(self, hold=False, held=()):
            if hold and not fired:  # this flush, once
                flush = self.slots.flush
                monkeypatch.setattr(self.slots, "flush", lambda: monkeypatch.setattr(self.slots, "flush", flush)
                                    or interrupt())
            return release(self, hold, held)
        monkeypatch.setattr(Arena, "release", failing)
    with Engine(store, arena=ArenaConfig("0.75", writes="staged" if where == "landing" else "direct"),
                decode="layer", progress=False) as eng:
        if where == "reading ahead":
            second = eng.m.moe_layers[1]
            eng.reader.inject = lambda blob: interrupt() if blob.layer == second and not fired else None
        with pytest.raises(KeyboardInterrupt):
            eng.generate(prompt, max_tokens=4)
        eng.reader.inject = None
        assert fired == [where] and not any(eng.arena.pinned)
        monkeypatch.undo()
        assert eng.generate(prompt, max_tokens=4).tokens == ref


@pytest.mark.parametrize("writes", (*WRITES, "copied", "queued"))
def test_a_long_prompt_claims_its_layers_whole_without_a_sync(tiny, writes, monkeypatch):
    """A prompt long enough to read the next layer ahead, in an arena with room for three layers: each
    layer is claimed whole (every expert) before its route is known, with no sync on the ids, and held
    pinned through the next layer's claim (which then need not wait for its compute); the
    tokens equal resident mlx-lm's, and the residency, counters and prompt-hot order equal the run
    whose listening hook makes it sync per layer (the same claims). "copied": direct slots taken
    for slots the device reads over the bus, so each whole layer computes on a copy of its slots;
    "queued": the quiet run's read-ahead goes to the I/O workers (as large blobs do), the synced
    run's is read by the claiming thread."""
    import workbench.engine.passes as passes

    model_dir, store = tiny("qwen3_moe", 4, layers=4)
    prompt = [int(t) for t in np.random.default_rng(3).integers(1, 128, 40)]
    ref, _ = resident_greedy(model_dir, prompt, 6)
    from workbench.arena.arena import Arena

    unsynced, real = [], passes.BatchPass._unsynced
    monkeypatch.setattr(passes.BatchPass, "_unsynced", lambda self, layer, *a: unsynced.append(layer) or real(self, layer, *a))
    held, release = [], Arena.release
    monkeypatch.setattr(Arena, "release", lambda self, hold=False, **kw: (hold and held.append(self.step))
                        or release(self, hold, **kw))
    runs = []
    for listen in (False, True):
        with Engine(store, arena=ArenaConfig("0.75", writes="direct" if writes in ("copied", "queued") else writes),
                    decode="layer", progress=False) as eng:
            if writes == "copied":
                monkeypatch.setattr(eng.arena.slots, "on_device", False)
            if writes == "queued" and not listen:
                eng.io.inline_below = 0
            if listen:
                eng.hooks.add("token.end", lambda *a, **k: None)
            before = len(unsynced)
            res = eng.generate(prompt, max_tokens=6)
            order = list(eng.arena.policy.order())
            copied = sorted(eng.copies.views)
            runs.append((res, len(unsynced) - before, order, eng.m))
            if writes == "copied":  # each layer of the quiet prefill on a copy, given back once built
                assert copied == ([] if listen else eng.m.moe_layers)
                for view in eng.copies.views.values():
                    assert all(any(a is b for b in eng.arena.tensors.values()) for _, a in tree_flatten(view.parameters()))
    (quiet, n_quiet, order_quiet, m), (synced, n_synced, order_synced, _) = runs
    assert n_quiet == len(m.moe_layers) and n_synced == 0  # every layer of the prefill, and only there
    assert held == [0] * 2 * (len(m.moe_layers) - 1)  # room for three layers: each but the last held through the next
    for res in (quiet, synced):
        assert res.tokens == ref
    np.testing.assert_allclose(quiet.logprobs, synced.logprobs, atol=TOL)
    assert quiet.stats["residency_hash"] == synced.stats["residency_hash"] and order_quiet == order_synced
    pre, timed = quiet.stats["prefill"], ("compute_s", "io_wait_s", "prefetch", "prefetch_bytes")
    assert {k: v for k, v in pre.items() if k not in timed} == {k: v for k, v in synced.stats["prefill"].items()
                                                                if k not in timed}  # a read done before its claim or not: timing
    assert pre["lookups"] == len(m.moe_layers) * m.n_experts  # whole layers: every expert looked up once
    assert pre["prefetch"]["issued"] > 0  # the next layer read ahead while a layer computes
