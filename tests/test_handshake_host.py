"""The handshake's host side on any backend: the engine's answers, read-ahead, hooks and the recovery
after a give-up, with the device's part (a CUDA kernel, ``engine/handshake.py``) played on the host.

``HostDevice`` stands in for the kernel only: it evaluates a layer's ids as the graph is built and
has the engine claim them at once (the kernel would wait in the device's stream for that claim), or
gives the token up at its first MoE layer, as a device does that waited too long: that layer and
every later one compute on the placeholder slot, and the engine computes the token again. The
CUDA tests in test_engine_exact.py run the real kernel on the GPU."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import make_sampler

from conftest import TOL, resident_greedy
from workbench.config import AheadConfig, ArenaConfig
from workbench.engine.engine import Engine
from workbench.engine.handshake import Flight, Handshake
from workbench.hooks import run_with_cache

PROMPT = [5, 17, 3, 99, 42, 8, 77, 1, 64, 23, 11, 90, 31, 7, 56, 2, 88, 14, 70, 45]


class HostDevice(Handshake):
    LANES = 1  # its claims are made as a token's graph is built: no token can be built ahead

    def __init__(self, eng, give_up=False):  # no pinned mailbox, no kernel: the host answers in ``slots``
        self.k, self.placeholder, self.give_up = eng.top_k, eng.arena.placeholder, give_up
        self.claim = lambda layer, ids, z: eng.current.answer(layer, ids, z)  # the handshake pass's claim
        self.launch_every, self.token = 0, 0

    def begin(self, through=True):
        self.token += 1
        f = Flight(0, self.token, False)
        f.given = None
        return f

    def slots(self, f, layer, indices, extra=None):
        f.tickets[layer] = f.token
        if f.void:  # given up: later layers send nothing and compute on the placeholder
            return mx.full(indices.shape, self.placeholder, dtype=mx.uint32)
        mx.eval(indices, *([] if extra is None else [extra]))
        z = None if extra is None else np.array(extra.astype(mx.float32)).reshape(-1)
        f.answers[layer] = self.claim(layer, np.array(indices).reshape(-1).tolist(), z)
        if self.give_up:  # claimed, but the device stopped waiting before the answer
            f.given, f.void = layer, True
            return mx.full(indices.shape, self.placeholder, dtype=mx.uint32)
        return mx.array(np.array(f.answers[layer], dtype=np.uint32).reshape(indices.shape))

    def serve(self, f, claim, wait, settle=None):
        return 0.0

    def gave_up(self, f):
        return f.given

    def abort(self, f):
        pass


def test_the_host_answers_as_a_sync_per_layer_would(tiny):
    """Answered through the handshake's host side, per-layer decode makes the same claims in the same
    order as with a sync per layer: tokens, log-probs, counters, read-ahead and residency; the claim's
    hook points fire in the answer with the same values."""
    model_dir, store = tiny("qwen3_moe", 4, layers=4, experts=16, top_k=4)
    ref, ref_lp = resident_greedy(model_dir, PROMPT, 12)
    for ahead in (None, AheadConfig(predictor="layer", lookahead=1)):
        runs, seen = {}, {}
        for host in (True, False):
            with Engine(store, arena=ArenaConfig("0.3"), decode="layer", ahead=ahead, progress=False) as eng:
                eng.handshake = HostDevice(eng) if host else None
                runs[host] = res = eng.generate(PROMPT, max_tokens=12)
                _, cache = run_with_cache(eng, PROMPT, names_filter="layer.*.experts.selected", max_tokens=4)
                seen[host] = [np.asarray(v).tolist() for v in cache["layer.0.experts.selected"]]
            assert res.tokens == ref
            np.testing.assert_allclose(res.logprobs, ref_lp, atol=TOL)
        assert runs[True].stats["handshake_tokens"] == 11 and runs[False].stats["handshake_tokens"] == 0
        np.testing.assert_array_equal(runs[True].logprobs, runs[False].logprobs)
        for key in ("hits", "misses", "evictions", "residency_hash"):
            assert runs[True].stats[key] == runs[False].stats[key], (ahead, key)
        assert runs[True].stats["prefetch"]["issued"] == runs[False].stats["prefetch"]["issued"]
        assert seen[True] == seen[False] and len(seen[True]) == 5


def test_a_token_given_up_is_computed_again_with_its_own_draw(tiny):
    """Every handshake token given up at its first MoE layer: the engine computes it again from there
    with a sync per layer, on the slots it answered: the same tokens, log-probs, counters and residency
    as a sync per layer; a sampled token is drawn again with its first draw's key, so the sampled
    stream is the same too."""
    _, store = tiny("qwen3_moe", 4, layers=4, experts=16, top_k=4)
    runs, sampled = {}, {}
    for give_up in (True, False):
        with Engine(store, arena="0.3", decode="layer", progress=False) as eng:
            eng.handshake = HostDevice(eng, give_up=True) if give_up else None
            runs[give_up] = eng.generate(PROMPT, max_tokens=8)
            mx.random.seed(11)
            sampled[give_up] = eng.generate(PROMPT, max_tokens=8, sampler=make_sampler(temp=3.0))
    assert runs[True].stats["recomputes"] == 7 and sampled[True].stats["recomputes"] == 7
    assert runs[True].tokens == runs[False].tokens
    np.testing.assert_array_equal(runs[True].logprobs, runs[False].logprobs)
    for key in ("hits", "misses", "evictions", "bytes_read", "residency_hash"):
        assert runs[True].stats[key] == runs[False].stats[key], key
    assert sampled[True].tokens == sampled[False].tokens


def test_the_decode_mode_never_depends_on_read_timing(tiny):
    """auto's controller counts a layer as missed from the claims alone (a demand read or a claimed
    speculative read, complete or not), so whether a read-ahead finished in time never changes the
    mode of a later token, and so never the residency: one I/O worker reading slowly against eight,
    at a sync cost near the controller's threshold, give the same modes, counters and residency."""
    from workbench.config import IOConfig

    _, store = tiny("qwen3_moe", 4, layers=4, experts=16, top_k=4)
    seen = []
    for workers, delay in ((1, 2e-3), (8, 0.0), (1, 0.0)):
        with Engine(store, arena=ArenaConfig("0.5"), io=IOConfig(workers=workers, reserved=0), decode="auto",
                    ahead=AheadConfig(predictor="layer", lookahead=1), sync_cost=3.0, progress=False) as eng:
            eng.handshake = HostDevice(eng)
            if delay:  # every read waits a little: read-ahead is late where it would have been on time
                import time

                read = eng.reader.read_probed
                eng.reader.read_probed = lambda *a, **k: (time.sleep(delay), read(*a, **k))[1]
            res = eng.generate(PROMPT, max_tokens=12)
        frame = res.counters.groupby("step")[["optimistic", "handshake", "hits", "sync_misses"]].sum()
        seen.append((res.tokens, res.stats["residency_hash"], frame.to_dict()))
    assert seen[0] == seen[1] == seen[2]


def test_the_staged_grid_follows_each_layers_landings():
    """``Handshake._grid`` (staged slots): 128 blocks at a layer's first two launches and the two
    after one whose answer landed copies (``land``, the host's own bookkeeping), one block otherwise,
    each layer by its own landings; a fixed grid where named, and an unknown name refused."""
    hs = Handshake.__new__(Handshake)  # the host's side only: pinned mailboxes are CUDA's
    hs.k, hs.copies, hs.grid, hs._since, hs.copy_threads, hs.one_threads = 8, 4, "adaptive", {}, 256, 1024
    hs.box, hs.index = {(0, 3): 0}, {(0, 3): 0}
    hs.words, hs.copy_words = np.zeros(64, dtype=np.uint64), np.zeros((1, 4, 3), dtype=np.uint64)
    f = Flight(0, 1, False)
    f.tickets[3], f.copied[3] = 1, (None, [])
    assert [hs._grid(3)[0] for _ in range(3)] == [128, 128, 1]
    hs.land(f, 3, np.zeros((0, 3), dtype=np.uint64), [])  # nothing to land: still one block
    assert hs._grid(3) == (1, 1024)
    hs.land(f, 3, np.ones((2, 3), dtype=np.uint64), [])
    assert [hs._grid(3)[0] for _ in range(4)] == [128, 128, 1, 1]
    assert hs.copy_words[0, :2].tolist() == [[1, 1, 1]] * 2 and hs.words[9] == 2  # the copies and their number
    assert hs._grid(5)[0] == 128
    hs.grid = "one"
    assert hs._grid(5) == (1, 1024)
    hs.grid = "wide"
    assert hs._grid(3) == (128, 256)
    hs.grid = "fast"
    with pytest.raises(ValueError, match="adaptive, wide, one"):
        hs._grid(3)


def test_the_server_serves_only_inside_its_block_and_raises_its_error_after():
    """``Server.during``: the serve function runs over and over on the server's own thread (marked
    host-only: staged rows are made there, never waited for) while the block runs, never once the
    block has returned; a serve error is raised after the block, whose own error comes first."""
    import threading
    import time

    from workbench.arena import staging
    from workbench.engine.server import Server

    server, calls = Server(), []

    def serve():
        calls.append((threading.current_thread().name, getattr(staging._HOST_ONLY, "on", False)))

    try:
        with server.during(serve):
            time.sleep(0.05)  # the decoding thread in MLX's launch: the interpreter is free
        n = len(calls)
        time.sleep(0.01)
        assert n > 1 and len(calls) == n and set(calls) == {("wb-serve", True)}
        assert not getattr(staging._HOST_ONLY, "on", False)

        def fails():
            raise KeyError("answer")

        with pytest.raises(KeyError, match="answer"):
            with server.during(fails):
                time.sleep(0.01)
        with pytest.raises(ValueError, match="launch"):
            with server.during(fails):
                raise ValueError("launch")
        with server.during(serve):  # the error was raised once: the next block starts clean
            time.sleep(0.01)
    finally:
        server.close()
    assert not server._thread.is_alive()
