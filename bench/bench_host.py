"""Where the host time of a per-layer token goes, function by function.

    python bench/bench_host.py [--mid | --wide [H,W,E]] [--device cpu|gpu] [--arena 0.25] [--tokens 32] [--reps 3] [--pipeline on|off]
                               [--handshake on|off]
                               [--io-workers 8] [--verify first] [--inline-below BYTES] [--prefill N]

Per-layer decode on the reference model (``--mid``: the mid-size random model) from a one-token prompt (no prefill), with the engine's
per-layer functions and MLX's eval calls wrapped in timers (about a microsecond each): microseconds
per MoE layer and calls per layer, nested (``at_layer`` runs inside ``SyncPass._compute``, the reads inside
``at_layer``; ``mx.eval`` holds the router sync's wait for the device; with the handshake on CUDA the
claims run in ``HandshakePass.answer`` inside ``HandshakePass.serve``, which also holds the wait for the device). The sync floor (resident
mlx-lm with one forced host sync per MoE layer) is timed beside it. cProfile (``bench_engine.py
--profile``) sees more functions but slows each call several times over.

``--prefill N``: the same for an N-token prompt's prefill (each rep from a fresh arena, as
``bench_engine.py --prefill`` times it), per MoE layer of the prefill, beside resident mlx-lm's time
to first token.
"""

import argparse
import collections
import datetime
import platform
import statistics
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import mlx_lm.models.switch_layers as switch_layers
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model

import workbench.arena.staging as staging_module
import workbench.engine.passes as passes_module
from bench_engine import mid_model, sync_floor_model, token_ms, ttft_resident, ttft_streamed, wide_model
from workbench.arena.claims import Claims
from workbench.config import ArenaConfig, IOConfig
from workbench.data import default_model, workload
from workbench.engine.engine import Engine, parse_device
from workbench.engine.frozen import DeviceCopies
from workbench.engine.run import Run

SPENT, CALLS = collections.defaultdict(int), collections.defaultdict(int)
READS = []  # (ns submitted -> started, ns started -> done, bytes) per demand read waited for


PAUSED = [False]  # True while resident mlx-lm runs (it calls the same switch layers and MLX evals)


def timed(name, fn):
    def run(*a, **k):
        if PAUSED[0]:
            return fn(*a, **k)
        t = time.perf_counter_ns()
        try:
            return fn(*a, **k)
        finally:
            SPENT[name] += time.perf_counter_ns() - t
            CALLS[name] += 1
    return run


class TimedMX:
    """``mlx.core`` for the engine's modules, with ``eval`` and ``async_eval`` timed."""

    eval = staticmethod(timed("mx.eval", mx.eval))
    async_eval = staticmethod(timed("mx.async_eval", mx.async_eval))

    def __getattr__(self, name):
        return getattr(mx, name)


def instrument(eng):
    arena = eng.arena
    for name in ("at_layer", "release", "after_layer", "_victim", "_read", "_wait_all", "prefetch"):
        setattr(arena, name, timed("arena." + name, getattr(arena, name)))
    for obj, names in ((arena.slots, ("landed",)), (arena.map, ("publish",))):
        for name in names:
            setattr(obj, name, timed(f"{type(obj).__name__}.{name}", getattr(obj, name)))
    arena.io.submit_many = timed("io.submit_many (inline reads)", arena.io.submit_many)
    reader = arena.io.reader
    for name in ("read_probed", "_check"):  # on the I/O workers too: summed over threads
        setattr(reader, name, timed("reader." + name + " (any thread)", getattr(reader, name)))
    wait_all = arena._wait_all

    def waited(reqs):  # each demand read's hand-off (submitted -> started) and read (started -> done)
        wait_all(reqs)
        for r in reqs:
            if r.t_start and r.t_done:
                READS.append((r.t_start - r.t_submit, r.t_done - r.t_start, r.bytes_read))
    arena._wait_all = waited
    staging = getattr(arena.slots, "staging", None)
    if staging is not None:
        for name in ("take", "_launch", "_grow"):
            setattr(staging, name, timed("staging." + name, getattr(staging, name)))
    eng.run_experts = timed("engine.run_experts", eng.run_experts)
    hs = eng.handshake
    if hs is not None:  # the handshake's graph building: its Python and its kernels' calls
        for name in ("slots", "serve", "_settle", "_wait"):
            setattr(hs, name, timed("handshake." + name, getattr(hs, name)))
        hs.kernel = timed("handshake.kernel (call)", hs.kernel)


def instrument_classes():
    """The passes' and the run's methods (passes are made per token: their class's methods are
    timed), mlx-lm's switch layers' graph building, and MLX's eval calls in the engine's modules."""
    for cls, names in ((passes_module.SyncPass, ("experts", "_compute")), (passes_module.HandshakePass, ("serve", "answer", "start", "finish")),
                       (passes_module.BatchPass, ("_unsynced",)), (Claims, ("claim", "end")),
                       (DeviceCopies, ("__call__",)), (Run, ("selected", "prefill", "forward", "launch_ahead"))):
        for name in names:  # passes are made per token: time their class's methods
            setattr(cls, name, timed(f"{cls.__name__}.{name}", cls.__dict__[name]))
    for cls in (switch_layers.SwitchGLU, switch_layers.SwitchMLP):
        cls.__call__ = timed(f"{cls.__name__} (graph)", cls.__call__)
    passes_module.mx = staging_module.mx = TimedMX()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--mid", action="store_true", help="the random 16 x 64, hidden 1024, 4-bit model")
    ap.add_argument("--wide", nargs="?", const="2048,768,128", default=None, metavar="H,W,E",
                    help="the random qwen3_moe at an expert shape (bench_engine.py --wide)")
    ap.add_argument("--arena", default="0.25")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pipeline", default="on", choices=["on", "off"])
    ap.add_argument("--handshake", default="on", choices=["on", "off"], help="CUDA: ids through the handshake (on, "
                    "where it works) or a sync per layer (off)")
    ap.add_argument("--writes", default=None, help="slot writes: direct, mapped or staged (default: the backend's)")
    ap.add_argument("--prefill", type=int, default=0, help="time an N-token prompt's prefill instead of decode")
    ap.add_argument("--io-workers", type=int, default=IOConfig.workers)
    ap.add_argument("--verify", default=IOConfig.verify, help="checksums: first (default), changed, always or never")
    ap.add_argument("--inline-below", type=int, default=None, help="bytes: smaller demand reads are read by the "
                    "claiming thread itself, larger ones by the I/O workers (default: the scheduler's)")
    a = ap.parse_args()
    dev = parse_device(a.device)
    if dev is not None:
        mx.set_default_device(dev)
    path = wide_model(a.wide) if a.wide else mid_model() if a.mid else Path(default_model())
    config = dict(arena=ArenaConfig(a.arena, writes=a.writes), decode="layer", progress=False,
                  io=IOConfig(workers=a.io_workers, reserved=min(IOConfig.reserved, a.io_workers - 1), verify=a.verify))
    (prefill_main if a.prefill else decode_main)(path, config, a)


def open_engine(path, config, a):
    eng = Engine.open(path, **config)
    if a.inline_below is not None:
        eng.io.inline_below = a.inline_below
    eng.pipeline = a.pipeline == "on"
    if a.handshake == "off":
        eng.handshake = None
    return eng


def header(eng, a, what):
    print(f"{datetime.datetime.now():%Y-%m-%d %H:%M} | {platform.machine()} {platform.system()} | mlx {mx.__version__} | "
          f"device {mx.default_device()} | arena {a.arena}, {eng.arena.writes} writes, pipeline {a.pipeline}, "
          f"handshake {'on' if eng.handshake is not None else 'off'}, {a.io_workers} I/O workers, verify {a.verify}, "
          f"inline below {eng.io.inline_below} bytes, {what}")


def table(layers):
    print(f"{'function':<32} {'us/layer':>9} {'calls/layer':>12}")
    for name, ns in sorted(SPENT.items(), key=lambda kv: -kv[1]):
        print(f"{name:<32} {ns / layers / 1e3:9.1f} {CALLS[name] / layers:12.2f}")
    if READS:
        q, r, b = (sorted(x) for x in zip(*READS))
        mid = len(READS) // 2
        print(f"demand reads: {len(READS) / layers:.2f}/layer of {b[mid] / 1e3:.0f} KB (median): submitted -> started "
              f"{q[mid] / 1e3:.1f} us (p90 {q[len(q) * 9 // 10] / 1e3:.1f}), started -> done {r[mid] / 1e3:.1f} us "
              f"(p90 {r[len(r) * 9 // 10] / 1e3:.1f}), {b[mid] / max(r[mid], 1):.2f} GB/s per read")


def decode_main(path, config, a):
    with open_engine(path, config, a) as eng:
        prompt = [1] if a.mid or a.wide else eng.encode(workload("code_heldout")[0]["text"])[:1]
        eng.generate(prompt, max_tokens=8, progress=False)  # warm: compiled kernels, page cache
        floor = sync_floor_model(path)
        floor_ms = statistics.median(token_ms(generate_step(mx.array(prompt), floor), a.tokens) for _ in range(a.reps))
        instrument_classes()
        instrument(eng)
        ms = []
        for _ in range(a.reps):
            res = eng.generate(prompt, max_tokens=a.tokens, progress=False)
            ms.append(statistics.median(res.step_times[1:]) * 1e3)
    header(eng, a, f"{a.tokens} tokens x {a.reps} reps")
    print(f"engine {statistics.median(ms):.2f} ms/token, sync floor {floor_ms:.2f} ms/token, engine/floor "
          f"{statistics.median(ms) / floor_ms:.2f}; hit rate {res.stats['hit_rate']:.1%}, "
          f"{res.stats['distinct_tokens']}/{res.stats['tokens']} distinct tokens")
    table(len(eng.m.moe_layers) * a.tokens * a.reps)


def prefill_main(path, config, a):
    """Time to first token on an ``a.prefill``-token prompt, each rep from a fresh engine (timed
    around ``generate``), with resident mlx-lm's beside it; the host time per MoE layer of the prefill."""
    model = load_model(path)[0]
    prompt = np.random.default_rng(1).integers(1, model.args.vocab_size, a.prefill).tolist()
    with open_engine(path, config, a) as eng:  # warm: compiled kernels, page cache
        eng.generate(prompt, max_tokens=1, progress=False)
    instrument_classes()
    resident, streamed = [], []
    for _ in range(a.reps):
        PAUSED[0] = True
        resident.append(ttft_resident(prompt, model)[0])
        PAUSED[0] = False
        with open_engine(path, config, a) as eng:
            instrument(eng)
            t, pre, _ = ttft_streamed(eng, prompt)
            streamed.append(t)
    header(eng, a, f"{a.prefill}-token prefill x {a.reps} reps, fresh arena each")
    rm, sm = statistics.median(resident), statistics.median(streamed)
    print(f"time to first token: streamed {sm * 1e3:.1f} ms [{min(streamed) * 1e3:.1f}, {max(streamed) * 1e3:.1f}], "
          f"resident {rm * 1e3:.1f} ms: {rm / sm:.2f}x resident; prefill hit rate {pre['hit_rate']:.1%}, "
          f"{pre['bytes_read'] / 1e6:.0f} MB read, {pre['misses']} misses, {pre['prefetch']['issued']} read ahead")
    table(len(eng.m.moe_layers) * a.reps)


if __name__ == "__main__":
    main()
