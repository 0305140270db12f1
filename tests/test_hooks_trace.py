"""Hook points, run_with_hooks / run_with_cache, counters and the Parquet trace."""

import json
import os
import time

import mlx.core as mx
import numpy as np
import pytest

from workbench.cli import main
from workbench.config import AheadConfig
from workbench.arrays import to_numpy
from workbench.engine.engine import Engine
from workbench.hooks import run_with_cache, run_with_hooks
from workbench.trace.recorder import TraceRecorder
from workbench.trace.schema import TraceError, read_trace, write_trace

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]


@pytest.fixture
def engine(tiny):
    _, store = tiny("qwen3_moe", 4)
    with Engine(store, arena="0.5", progress=False) as eng:
        yield eng


def test_run_with_cache_collects_named_points(engine):
    res, cache = run_with_cache(engine, PROMPT, names_filter=["layer.*.experts.selected", "token.end", "cache.miss"],
                                max_tokens=4)
    assert len(cache["token.end"]) == 4 and cache["token.end"] == res.tokens
    sel = cache["layer.0.experts.selected"]
    assert len(sel) == 1 + 4  # prefill pass + 4 decode steps
    assert sel[0].shape == (1, len(PROMPT) - 1, engine.top_k)
    assert len(cache["cache.miss"]) == res.stats["misses"] + res.stats["prefill"]["misses"]
    assert "layer.0.moe.input" not in cache


def test_run_with_cache_filter_callable(engine):
    _, cache = run_with_cache(engine, PROMPT, names_filter=lambda n: n.endswith("router.logits"), max_tokens=2)
    assert set(cache) == {f"layer.{i}.router.logits" for i in engine.m.moe_layers}
    assert cache["layer.1.router.logits"][-1].shape[-1] == engine.m.n_experts


def test_hook_can_replace_router_logits(engine):
    forced = 5

    def force(logits, **ctx):
        bias = mx.zeros(logits.shape[-1]).at[forced].add(100.0)
        return logits + bias

    with engine.hooks.using([("layer.*.router.logits", force)]):
        _, cache2 = run_with_cache(engine, PROMPT, names_filter="layer.0.experts.selected", max_tokens=1)
    assert all(forced in row for row in cache2["layer.0.experts.selected"][-1].reshape(-1, engine.top_k))
    assert not engine.hooks.active  # hooks are removed after the call


def test_run_with_hooks_observes_io(engine):
    seen, done = [], []
    res = run_with_hooks(engine, PROMPT, [("io.submit", lambda req, **c: seen.append(req.blob.size)),
                                          ("io.done", lambda req, **c: done.append(req.bytes_read))], max_tokens=3)
    assert len(seen) == len(done) == res.stats["misses"] + res.stats["prefill"]["misses"]
    assert all(s == engine.m.expert_bytes for s in seen + done)


def test_counters_per_step_and_layer(engine):
    res = engine.generate(PROMPT, max_tokens=5)
    df = res.counters
    assert set(df["phase"]) == {"prefill", "decode"}
    dec = df[df.phase == "decode"]
    assert len(dec) == 5 * len(engine.m.moe_layers)
    assert (dec.hits + dec.misses == engine.top_k).all()
    assert dec.bytes_read.sum() == res.stats["bytes_read"] == dec.misses.sum() * engine.m.expert_bytes


def test_trace_roundtrip(engine, tmp_path):
    path = tmp_path / "run.parquet"
    res = engine.generate(PROMPT, max_tokens=6, trace=TraceRecorder(path, moe_input=True, io_events=True))
    t = read_trace(path)
    r = t.routes
    assert t.meta["n_experts"] == engine.m.n_experts and t.moe_layers == engine.m.moe_layers
    assert len(r) == (len(PROMPT) - 1 + 6) * len(engine.m.moe_layers)
    dec = t.decode()
    assert sorted(dec.step.unique()) == list(range(1, 7))
    row = dec.iloc[0]
    w = np.array(row.weights)
    assert len(row.selected) == engine.top_k and np.all(np.diff(w) <= 0) and abs(w.sum() - 1) < 1e-3
    assert len(row.logits) == engine.m.n_experts and len(row.moe_input) == engine.config["hidden_size"]
    z = np.array(row.logits, dtype=np.float32)
    assert set(np.argsort(-z)[: engine.top_k]) == set(row.selected)  # softmax top-k = logit top-k
    # the resident set is what was published before routing: a claimed expert is resident next step
    later = dec[(dec.layer == row.layer) & (dec.step == row.step + 1)].iloc[0]
    assert set(row.selected) <= set(later.resident)
    assert t.io is not None and set(t.io.kind) >= {"miss", "submit"}
    assert (t.io.kind == "miss").sum() == res.stats["misses"] + res.stats["prefill"]["misses"]


def test_a_prompt_prefilled_in_several_passes_keeps_its_positions(tiny, tmp_path):
    """A prompt longer than ``--prefill-step-size`` is prefilled in passes; the trace's rows carry each
    token's own position (0 to len - 2, then the decode tokens), not each pass's from 0 again."""
    from workbench.config import KVConfig

    _, store = tiny("qwen3_moe", 4)
    prompt = PROMPT * 3  # 24 tokens: 23 prefilled in passes of 5
    with Engine(store, arena="0.5", progress=False, kv=KVConfig(prefill_step=5)) as eng:
        eng.generate(prompt, max_tokens=3, trace=TraceRecorder(tmp_path / "t.parquet"))
    routes = read_trace(tmp_path / "t.parquet").routes
    for layer, rows in routes.groupby("layer"):
        assert rows.token.tolist() == list(range(len(prompt) - 1 + 3)), layer
        assert rows.phase.tolist() == ["prefill"] * (len(prompt) - 1) + ["decode"] * 3


def test_malformed_trace(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(TraceError, match="not a readable Parquet"):
        read_trace(bad)
    with pytest.raises(TraceError, match="does not exist"):
        read_trace(tmp_path / "missing.parquet")


def test_cli_run_json_and_trace(tiny, tmp_path, capsys):
    _, store = tiny("deepseek_v3", 4)
    path = tmp_path / "t.parquet"
    capsys.readouterr()
    assert main(["run", str(store), "--prompt-ids", "1,2,3,4", "--max-tokens", "5", "--arena", "0.5",
                 "--json", "--trace", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["tokens"]) == 5
    for key in ("hits", "misses", "bytes_read", "tokens_per_s"):
        assert key in out["stats"]
    t = read_trace(path)
    assert t.moe_layers == [1, 2]  # deepseek's first layer is dense
    assert t.routes.weights.notna().all()


def test_page_cache_hits_are_counted_apart(tiny):
    from workbench.io.readpath import drop_cache

    _, store = tiny("qwen3_moe", 4)
    with Engine(store, arena="0.5", progress=False) as eng:
        warm = eng.generate(PROMPT, max_tokens=6)
        assert warm.stats["misses"] > 0 and warm.stats["page_cache_hits"] == warm.stats["misses"]
        drop_cache(store / "experts.bin")
        probe = eng.reader.page_cache
        blob = next(iter(eng.m.blobs.values()))
        assert probe.cached(blob.offset, blob.size) in (False, None)  # some filesystems ignore DONTNEED


def test_optimistic_trace_and_hooks_equal_per_layer(tiny, tmp_path):
    """Settled once per token from the device's records, the trace and the hook stream of optimistic
    decode are those of per-layer decode (selected, weights, logits, resident sets, MoE inputs)."""
    _, store = tiny("qwen3_moe", 4, layers=4, experts=16, top_k=4)
    frames, caches = {}, {}
    for decode in ("optimistic", "layer"):
        with Engine(store, arena="0.3", decode=decode, progress=False) as eng:
            path = tmp_path / f"{decode}.parquet"
            res, caches[decode] = run_with_cache(eng, PROMPT, names_filter=["layer.*", "cache.*"], max_tokens=8,
                                                 trace=TraceRecorder(path, moe_input=True))
            frames[decode] = read_trace(path).routes
        if decode == "optimistic":
            assert res.stats["recomputes"] > 0
    a, b = frames["optimistic"], frames["layer"]
    assert len(a) == len(b) and a[["step", "layer"]].equals(b[["step", "layer"]])
    for col in ("selected", "resident"):
        assert [list(x) for x in a[col]] == [list(x) for x in b[col]], col
    for col in ("weights", "logits", "moe_input"):
        np.testing.assert_allclose(np.stack(a[col].map(np.asarray)), np.stack(b[col].map(np.asarray)), atol=1e-3)
    assert set(caches["optimistic"]) == set(caches["layer"])
    for name in caches["layer"]:
        x, y = caches["optimistic"][name], caches["layer"][name]
        assert len(x) == len(y), name
        if name.endswith("experts.selected"):
            assert all(np.array_equal(u.reshape(-1), v.reshape(-1)) for u, v in zip(x, y)), name


class PerCallRecorder(TraceRecorder):
    """Also makes each call's rows at once, the way the recorder did before it kept references."""

    def __init__(self, path, engine):
        super().__init__(path, moe_input=True)
        self.engine = engine
        self.old = {k: [] for k in ("step", "token", "phase", "layer", "selected", "weights", "logits", "resident",
                                    "moe_input")}

    def add_layer(self, ids, name, layer, step, phase, position, logits, moe_input, resident, predictions, **ctx):
        super().add_layer(ids, name, layer, step, phase, position, logits, moe_input, resident, predictions, **ctx)
        ids = ids.reshape(-1, ids.shape[-1])
        n = ids.shape[0]
        w = self.engine.gate_weights(layer, ids, logits)
        if w is not None:
            order = np.lexsort((ids, -w), axis=-1)
            ids, w = np.take_along_axis(ids, order, -1), np.take_along_axis(w, order, -1)
        logits = to_numpy(logits, np.float16).reshape(n, -1) if logits is not None else None
        c = self.old
        for t in range(n):
            c["step"].append(step)
            c["token"].append(position + t)
            c["phase"].append(phase)
            c["layer"].append(layer)
            c["selected"].append(ids[t].astype(np.int16).tolist())
            c["weights"].append(None if w is None else w[t].astype(np.float32).tolist())
            c["logits"].append(None if logits is None else logits[t])
            c["resident"].append(list(resident))
        c["moe_input"].extend(list(to_numpy(moe_input, np.float16).reshape(n, -1)))
        for src, cands in predictions.items():
            c.setdefault(f"pred_{src}", [None] * (len(c["step"]) - n)).extend(cands)
        for k, v in c.items():
            if k.startswith("pred_") and len(v) < len(c["step"]):
                v.extend([None] * (len(c["step"]) - len(v)))


@pytest.mark.parametrize("family, decode, weights", [("qwen3_moe", "layer", True), ("qwen3_moe", "optimistic", True),
                                                     ("deepseek_v3", "layer", True), ("qwen3_moe", "layer", False)])
def test_trace_columns_equal_per_call_conversion(tiny, tmp_path, monkeypatch, family, decode, weights):
    """Rows made in bulk at close are the rows made per call, column by column (deepseek_v3: sigmoid-group
    logits, lazy until close; ``weights=False``: gate_weights returns None, as for a family not listed in
    families.py; every family the tests build has weights)."""
    import pyarrow.parquet as pq

    _, store = tiny(family, 4, layers=4, experts=16, top_k=4)
    with Engine(store, arena="0.3", decode=decode, ahead=AheadConfig("layer", lookahead=1), progress=False) as eng:
        if not weights:
            monkeypatch.setattr(eng, "gate_weights", lambda layer, ids, logits: None)
        rec = PerCallRecorder(tmp_path / "new.parquet", eng)
        res = eng.generate(PROMPT, max_tokens=8, trace=rec)
    if decode == "optimistic":
        assert res.stats["optimistic_tokens"] > 0 and res.stats["recomputes"] > 0
    write_trace(tmp_path / "old.parquet", rec.old, {})
    new, old = (pq.read_table(tmp_path / f"{v}.parquet") for v in ("new", "old"))
    assert new.column_names == old.column_names and "pred_layer" in new.column_names
    for name in old.column_names:
        assert new.column(name).equals(old.column(name)), name
    assert new.column("weights").null_count == (0 if weights else len(new))
    assert 0 < new.column("pred_layer").null_count < len(new)  # prefill rows have no prediction


def test_page_cache_probe_answers_the_same_from_several_threads(tiny):
    """I/O workers ask the page-cache probe concurrently: each call has its own vector."""
    from concurrent.futures import ThreadPoolExecutor

    from workbench.store.manifest import Manifest
    from workbench.store.reader import BlobReader

    _, store = tiny("qwen3_moe", 4)
    m = Manifest.load(store)
    blobs = [m.blob(layer, e) for layer in m.moe_layers for e in range(m.n_experts)]
    reader = BlobReader(store, m)
    try:
        probe = reader.page_cache
        if probe.cached(blobs[0].offset, blobs[0].size) is None:
            pytest.skip("this OS cannot say what is in the page cache")
        half = {id(b) for b in blobs[::2]}
        for b in blobs:  # half of the blobs in the page cache, half out
            os.posix_fadvise(reader.fd, b.offset, b.size,
                             os.POSIX_FADV_WILLNEED if id(b) in half else os.POSIX_FADV_DONTNEED)
        def alone():
            return [probe.cached(b.offset, b.size) for b in blobs]

        settled, seen = time.monotonic() + 5, None  # WILLNEED reads ahead in the background: let it finish
        while time.monotonic() < settled and seen != (seen := alone()):
            time.sleep(0.05)
        if all(alone()):
            pytest.skip("this file system keeps every page cached (e.g. tmpfs): no mix to tell apart")
        with ThreadPoolExecutor(4) as pool:
            for _ in range(20):  # compared where the page cache did not change around the concurrent calls
                before = alone()
                together = list(pool.map(lambda b: probe.cached(b.offset, b.size), blobs))
                after = alone()
                stable = [i for i in range(len(blobs)) if before[i] == after[i]]
                assert len(stable) > len(blobs) // 2
                assert [together[i] for i in stable] == [before[i] for i in stable]
    finally:
        reader.close()


def test_probed_reads_say_what_mincore_says_and_read_the_same_bytes(tiny):
    """Demand reads learn whether their blob was in the page cache from the read itself (RWF_NOWAIT
    where the kernel takes it): the same answer as mincore on warm blobs, the same bytes as a read."""
    from workbench.store.manifest import Manifest
    from workbench.store.reader import BlobReader

    _, store = tiny("qwen3_moe", 4)
    m = Manifest.load(store)
    reader = BlobReader(store, m)
    try:
        for blob in list(m.blobs.values())[:8]:
            plain, probed = bytearray(blob.size), bytearray(blob.size)
            assert reader.read(blob, [memoryview(plain)]) == blob.size  # now in the page cache
            before = reader.page_cache.cached(blob.offset, blob.size)
            n, cached = reader.read_probed(blob, [memoryview(probed)])
            assert n == blob.size and probed == plain
            assert cached == before or before is None
    finally:
        reader.close()


def test_a_refused_nowait_read_now_and_then_keeps_the_free_probe(tiny):
    """A kernel may refuse an RWF_NOWAIT read of a cached page now and then (a page locked or marked
    for read-ahead): mincore answers that read, and the reader keeps asking the read itself; only
    ``NOWAIT_REFUSALS`` cached refusals in a row turn the free probe off."""
    from workbench.store.manifest import Manifest
    from workbench.store.reader import NOWAIT_REFUSALS, BlobReader

    _, store = tiny("qwen3_moe", 4)
    m = Manifest.load(store)
    reader = BlobReader(store, m)
    try:
        if not reader._nowait:
            pytest.skip("this kernel or file system takes no RWF_NOWAIT reads")
        blobs = list(m.blobs.values())
        for blob in blobs:  # all in the page cache
            reader.read(blob, [memoryview(bytearray(blob.size))])
        if not all(reader.page_cache.cached(b.offset, b.size) for b in blobs):
            pytest.skip("the page cache did not keep the store")
        honest, refuse = reader._try_cached, {"left": 1}

        def sometimes(*args):
            if refuse["left"]:
                refuse["left"] -= 1
                return 0
            return honest(*args)

        reader._try_cached = sometimes
        for blob in blobs[:4]:
            assert reader.read_probed(blob, [memoryview(bytearray(blob.size))]) == (blob.size, True)
        assert reader._nowait and refuse["left"] == 0
        refuse["left"] = NOWAIT_REFUSALS
        for blob in blobs[:NOWAIT_REFUSALS]:
            assert reader.read_probed(blob, [memoryview(bytearray(blob.size))]) == (blob.size, True)
        assert not reader._nowait
    finally:
        reader.close()


def test_small_demand_misses_are_read_by_the_claiming_thread_unqueued(tiny):
    """Blobs below ``inline_below``: the thread that claims them reads them all itself, in
    ``submit_many``, without queueing them for a worker; each ends done, with its bytes."""
    import threading

    from workbench.io.scheduler import DONE, IOScheduler, ReadRequest
    from workbench.store.manifest import Manifest
    from workbench.store.reader import BlobReader

    _, store = tiny("qwen3_moe", 4)
    m = Manifest.load(store)
    reader = BlobReader(store, m)
    io = IOScheduler(reader, workers=2, reserved=1)
    readers = []
    reader.inject = lambda blob: readers.append(threading.current_thread().name)
    try:
        data = (store / "experts.bin").read_bytes()
        blobs = list(m.blobs.values())[:6]
        reqs = [ReadRequest(b, [memoryview(bytearray(b.size))], i) for i, b in enumerate(blobs)]
        io.submit_many(reqs)
        assert not io.urgent and all(r.state == DONE and r.event.is_set() for r in reqs)
        assert readers == [threading.current_thread().name] * len(blobs)
        assert all(bytes(r.views[0]) == data[b.offset:b.offset + b.size] for r, b in zip(reqs, blobs))
        io.inline_below = 0  # larger blobs are queued: a worker may read them, the claimer helps
        reqs = [ReadRequest(b, [memoryview(bytearray(b.size))], i) for i, b in enumerate(blobs)]
        io.submit_many(reqs)
        for r in reqs:
            io.wait(r)
        assert all(bytes(r.views[0]) == data[b.offset:b.offset + b.size] for r, b in zip(reqs, blobs))
    finally:
        io.close()
        reader.close()


def test_workers_are_woken_for_every_read_they_can_take(tiny):
    """One wake-up per read, to a worker that can take it: speculative reads wake only workers
    that take them (never one reserved for urgent reads), urgent ones the reserved workers first.
    No read is left queued while a worker that could take it sleeps (nobody helps here)."""
    import threading

    from workbench.io.scheduler import IOScheduler, ReadRequest
    from workbench.store.manifest import Manifest
    from workbench.store.reader import BlobReader

    _, store = tiny("qwen3_moe", 4)
    m = Manifest.load(store)
    reader = BlobReader(store, m)
    io = IOScheduler(reader, workers=3, reserved=1)
    blobs = list(m.blobs.values())
    spec_blobs, readers = {id(b) for b in blobs[:8]}, []
    reader.inject = lambda blob: (readers.append((id(blob) in spec_blobs, threading.current_thread().name)),
                                  time.sleep(0.002))
    try:
        for round_ in range(3):
            spec = [io.submit(ReadRequest(b, [memoryview(bytearray(b.size))], i, speculative=True))
                    for i, b in enumerate(blobs[:8])]
            urgent = [io.submit(ReadRequest(b, [memoryview(bytearray(b.size))], i)) for i, b in enumerate(blobs[8:10])]
            deadline = time.monotonic() + 10
            while not all(r.event.is_set() for r in spec + urgent) and time.monotonic() < deadline:
                time.sleep(0.001)
            assert all(r.event.is_set() and r.bytes_read == r.blob.size for r in spec + urgent)
        assert ("wb-io-0" not in {name for spec, name in readers if spec}), readers  # reserved: urgent reads only
        assert {name for _, name in readers} <= {"wb-io-0", "wb-io-1", "wb-io-2"} and len(readers) == 30
        reader.inject = lambda blob: time.sleep(0.1)
        for trial in range(8):  # all idle; the urgent read may go to the worker woken for the speculative one
            urgent = io.submit(ReadRequest(blobs[0], [memoryview(bytearray(blobs[0].size))], 0))
            spec = io.submit(ReadRequest(blobs[1], [memoryview(bytearray(blobs[1].size))], 1, speculative=True))
            for r in (urgent, spec):
                r.event.wait()
            assert spec.t_start < urgent.t_done, f"trial {trial}: a speculative read waited while a worker slept"
    finally:
        io.close()
        reader.close()


def test_a_demand_read_of_several_pieces_is_split_over_idle_workers(tiny):
    """A demand read of a blob of several pieces: the waiting thread and the idle workers read its
    pieces at once (the same bytes, checksummed); a speculative one stays on one thread; a piece that
    fails fails the read only once no piece is still being written, with nothing left queued."""
    import threading

    from workbench.io.scheduler import DONE, FAILED, IOScheduler, ReadRequest
    from workbench.store.manifest import Manifest, StoreError
    from workbench.store.reader import BlobReader

    _, store = tiny("qwen3_moe")  # float32: blobs of several pages
    m = Manifest.load(store)
    reader = BlobReader(store, m, verify="always", piece_bytes=4096)
    io = IOScheduler(reader, workers=3, reserved=1, inline_below=0)
    data = (store / "experts.bin").read_bytes()
    blob = max(m.blobs.values(), key=lambda b: b.size)
    assert len(reader.pieces([memoryview(bytearray(blob.size))])) >= 4
    lock, seen, writing = threading.Lock(), [], [0]

    def slow(b, fail_at=None):
        with lock:
            seen.append(threading.current_thread().name)
            n = len(seen)
            writing[0] += 1
        try:
            time.sleep(0.01)
            if n == fail_at:
                raise StoreError("injected")
        finally:
            with lock:
                writing[0] -= 1

    try:
        for speculative in (False, True):
            seen.clear()
            reader.inject = slow
            req = io.submit(ReadRequest(blob, [memoryview(bytearray(blob.size))], 0, speculative=speculative))
            io.wait(req)
            assert req.state == DONE and bytes(req.views[0]) == data[blob.offset:blob.offset + blob.size]
            assert len(seen) == len(reader.pieces(req.views)) and (len(set(seen)) == 1) == speculative, seen
            assert not io.urgent and not io.spec
        reader.inject = lambda b: slow(b, fail_at=2)
        seen.clear()
        req = io.submit(ReadRequest(blob, [memoryview(bytearray(blob.size))], 0))
        with pytest.raises(StoreError, match="injected"):
            io.wait(req)
        assert req.state == FAILED and writing[0] == 0 and not io.urgent
    finally:
        io.close()
        reader.close()


def test_an_interrupt_between_inline_reads_leaves_none_unsettled(tiny, monkeypatch):
    """Ctrl-C while the claiming thread reads its misses itself: the reads it made are done, the
    rest cancelled, every one settled (nothing is left for an error path to wait on forever)."""
    from tests.hostile_util import interrupt_reads_at
    from workbench.io.scheduler import CANCELLED, DONE, IOScheduler, ReadRequest
    from workbench.store.manifest import Manifest
    from workbench.store.reader import BlobReader

    _, store = tiny("qwen3_moe", 4)
    m = Manifest.load(store)
    reader = BlobReader(store, m)
    io = IOScheduler(reader, workers=2, reserved=1)
    try:
        reqs = [ReadRequest(b, [memoryview(bytearray(b.size))], i) for i, b in enumerate(list(m.blobs.values())[:4])]
        interrupt_reads_at(monkeypatch, 4)  # at the second read's start
        with pytest.raises(KeyboardInterrupt):
            io.submit_many(reqs)
        monkeypatch.undo()
        assert all(r.event.is_set() for r in reqs)
        assert [r.state for r in reqs] == [DONE, CANCELLED, CANCELLED, CANCELLED]
    finally:
        io.close()
        reader.close()


def test_direct_reads_land_straight_in_page_aligned_buffers(tiny):
    """O_DIRECT reads go straight into buffers that start and end on a page (pinned staging rows,
    Metal's slots) with no bounce copy, and through the bounce buffer otherwise; same bytes."""
    import mmap

    from workbench.store.manifest import Manifest
    from workbench.store.reader import DIRECT_ALIGN, BlobReader, available_modes

    if "direct" not in available_modes():
        pytest.skip("no O_DIRECT here")
    _, store = tiny("qwen3_moe")  # float32: every tensor of a blob is a whole number of pages
    m = Manifest.load(store)
    assert all(t.nbytes % DIRECT_ALIGN == 0 for t in m.tensors)
    try:
        direct = BlobReader(store, m, mode="direct", verify="always")
    except OSError:
        pytest.skip("this file system takes no O_DIRECT reads")
    plain = BlobReader(store, m, verify="always")
    try:
        for shift in (0, 64):  # page-aligned views, then views 64 bytes off a page
            memory = mmap.mmap(-1, m.expert_bytes + DIRECT_ALIGN)
            raw = memoryview(memory)[shift:]
            views, pos = [], 0
            for t in m.tensors:
                views.append(raw[pos:pos + t.nbytes])
                pos += t.nbytes
            assert all(aligned == (shift == 0) for _, _, aligned in direct.pieces(views))
            want = [memoryview(bytearray(t.nbytes)) for t in m.tensors]
            for blob in [m.blob(layer, e) for layer in m.moe_layers for e in (0, m.n_experts - 1)]:
                assert direct.read(blob, views) == plain.read(blob, want) == blob.size  # both checksummed
                assert b"".join(bytes(v) for v in views) == b"".join(want)
            assert hasattr(direct._local, "buf") == (shift != 0)  # the bounce buffer, only when misaligned
    finally:
        direct.close()
        plain.close()


def test_hooks_are_host_only_while_every_subscriber_was_added_so():
    """``Hooks.host_only``: true with no subscriber or only host-only ones (exact names and
    patterns), false once any other is added, true again once it is removed."""
    from workbench.hooks import Hooks

    hooks, keep, call_mlx = Hooks(), lambda v, **c: None, lambda v, **c: None
    assert hooks.host_only and not hooks.active
    hooks.add("layer.*.experts.selected", keep, host_only=True)
    hooks.add("cache.hit", keep, host_only=True)
    assert hooks.host_only and hooks.active
    hooks.add("layer.0.router.logits", call_mlx)
    assert not hooks.host_only
    hooks.remove("layer.0.router.logits", call_mlx)
    assert hooks.host_only
    hooks.remove("cache.hit", keep)
    hooks.add("cache.hit", keep)  # the same function again, not host-only this time
    assert not hooks.host_only
    hooks.clear()
    assert hooks.host_only and not hooks.active
