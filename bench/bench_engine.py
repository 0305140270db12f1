"""Engine speed, side by side in one process: streamed vs resident mlx-lm vs the sync floor.

    python bench/bench_engine.py [--model DIR | --mid | --wide] [--device cpu|gpu] [--tokens 64] [--reps 5]
                                 [--arenas 1.0,0.5,0.25] [--decode auto,layer] [--temp 0,1.0] [--prefill 2048]

Models: the reference model (experts of 31 KB), ``--mid`` (0.5 MB) or ``--wide [H,W,E]`` (by default
Qwen3-30B-A3B's expert shape, 2.6 MB, 16 layers, routers skewed to 16 experts per layer:
``randmodel.make_wide_model``).
``--temp``: decoding temperatures (0: greedy), each row's tokens drawn with one seed on every side.
``--prefill N``: also time to first token on an N-token prompt, streamed vs resident, per arena; at
the ``--trace-at`` arenas, traced / untraced too (to the first ``on_token`` call, fresh arenas, ABBA pairs).

Rows per arena and decode mode, medians of per-token decode times over ``--reps`` interleaved
runs (so drifting load hits every side alike):
  resident    mlx-lm's own generate_step on the resident model (pipelined with async_eval)
  sync floor  the same, with one forced host sync per MoE layer (mx.eval of the expert ids and a
              copy to numpy): the reference any engine that syncs per layer is measured against
  streamed    the engine; hit rate, distinct tokens, optimistic tokens and recomputes beside it
"no-read tokens" is the median over decode tokens that read nothing (every expert was resident).
"host us/layer" is the engine's own cost per MoE layer above the sync floor: (streamed - floor) / layers;
"engine/floor per rep" the streamed / floor ratio of each rep, median [lowest, highest].
"MB/tok" is what the engine read per decode token (demand and read-ahead); "read-floor" the sync floor
plus those bytes at the read path's rate here, page cache warm (``read_gbps``): a claim cannot beat it
without hiding reads.
The trace row: a full trace recorder (MoE inputs included) against the untraced run (``--trace-at``), over
``--trace-reps`` interleaved pairs (ABBA order): the median ms/token of each side and the traced / untraced
ratio of each pair, median [lowest, highest]; the same for whole calls (prefill, decode, the trace's write).
"""

import argparse
import cProfile
import pstats
import datetime
import itertools
import platform
import statistics
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP
from mlx_lm.utils import load_model

from workbench.config import AheadConfig, ArenaConfig
from workbench.data import default_model, workload
from workbench.engine.engine import Engine, parse_device
from workbench.engine.handshake import GRIDS
from workbench.fsutil import cache_dir
from workbench.io.readpath import blobs_gbps, copy_variants_gbps
from workbench.trace.recorder import TraceRecorder


def mid_model() -> Path:
    """A random 4-bit qwen3_moe of 16 layers x 64 experts, hidden 1024, that keeps its tokens moving."""
    from workbench.randmodel import make_random_model

    path = cache_dir() / "bench" / "mid-16x64-h1024-4bit"
    if not (path / "config.json").exists():
        make_random_model(path, "qwen3_moe", seed=3, quantize_bits=4, group_size=64, moving=True, layers=16,
                          experts=64, top_k=8, hidden=1024, expert_width=256, vocab=2048)
    return path


def wide_model(shape="2048,768,128") -> Path:
    """A random qwen3_moe of 16 layers with skewed routers at expert shape HIDDEN,WIDTH,EXPERTS
    (default Qwen3-30B-A3B's: 2.6 MB experts; 1024,256,64 makes 0.44 MB ones)."""
    from workbench.randmodel import make_wide_model

    hidden, width, experts = (int(v) for v in shape.split(","))
    path = cache_dir() / "bench" / f"wide-16x{experts}-h{hidden}-w{width}-4bit"
    if not (path / "config.json").exists():
        make_wide_model(path, hidden=hidden, expert_width=width, experts=experts)
    return path


def sampler_for(temp):
    from mlx_lm.sample_utils import make_sampler

    return None if temp == 0 else make_sampler(temp=temp)


def resident_ms(prompt, model, n, temp, seed=7):
    """Median per-token ms of mlx-lm's generate_step, and its tokens (seeded as the engine is)."""
    mx.random.seed(seed)
    toks, times, t = [], [], time.perf_counter()
    for (tok, _), _ in zip(generate_step(mx.array(prompt), model, sampler=sampler_for(temp)), range(n)):
        now = time.perf_counter()
        times.append(now - t)
        toks.append(int(tok))
        t = now
    return statistics.median(times[1:]) * 1e3, toks


def ttft_resident(prompt, model) -> tuple[float, int]:
    """Seconds to resident mlx-lm's first token, and that token."""
    t = time.perf_counter()
    token, _ = next(generate_step(mx.array(prompt), model))
    return time.perf_counter() - t, int(token)


def ttft_streamed(eng, prompt) -> tuple[float, dict, int]:
    """Seconds to the engine's first token, its prefill counters, and that token."""
    t = time.perf_counter()
    res = eng.generate(prompt, max_tokens=1, progress=False)
    return time.perf_counter() - t, res.stats["prefill"], res.tokens[0]


def ttft_trace_pairs(path, arena, writes, prompt, pairs, folder) -> list:
    """Time to first token traced (a full trace recorder, MoE inputs included) / untraced, each from a
    fresh arena, ``pairs`` pairs in ABBA order; both sides timed to ``on_token``'s first call."""
    ratios = []
    for i in range(pairs):
        seconds = {}
        for with_trace in ((False, True) if i % 2 == 0 else (True, False)):
            with Engine.open(path, arena=ArenaConfig(arena, writes=writes), progress=False) as eng:
                t, out = time.perf_counter(), []
                rec = TraceRecorder(f"{folder}/p{i}.parquet", moe_input=True) if with_trace else None
                eng.generate(prompt, max_tokens=1, progress=False, trace=rec, on_token=lambda _: out.append(time.perf_counter()))
                seconds[with_trace] = out[0] - t
        ratios.append(seconds[True] / seconds[False])
    return ratios


def token_ms(gen, n):
    times, t = [], time.perf_counter()
    for _, _ in zip(gen, range(n)):
        now = time.perf_counter()
        times.append(now - t)
        t = now
    return statistics.median(times[1:]) * 1e3


class SyncedExperts:
    """Resident experts with one forced host sync per MoE layer (the sync floor)."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, x, indices):
        mx.eval(indices)
        np.array(indices)
        return self.inner(x, indices)


def sync_floor_model(path):
    model, _ = load_model(path)
    for _, module in model.named_modules():
        for name, child in list(module.children().items()):
            if isinstance(child, (SwitchGLU, SwitchMLP)):
                module[name] = SyncedExperts(child)
    return model


def spread(streamed_ms, floor_ms, digits=2) -> str:
    """Streamed / floor (or traced / untraced) of each interleaved rep: median [lowest, highest] (the
    floor is the run beside it)."""
    ratios = sorted(s / f for s, f in zip(streamed_ms, floor_ms))
    return f"{statistics.median(ratios):.{digits}f} [{ratios[0]:.{digits}f}, {ratios[-1]:.{digits}f}]"


def streamed(eng, prompt, n, trace=None, temp=0, seed=7):
    mx.random.seed(seed)
    res = eng.generate(prompt, max_tokens=n, trace=trace, progress=False, sampler=sampler_for(temp))
    c = res.counters
    dec = c[c.phase == "decode"].groupby("step")[["bytes_read", "misses", "prefetch_useful_late"]].sum()
    quiet = [t for t, (_, row) in zip(res.step_times, dec.iterrows()) if not row.any()]
    res.stats["bytes_per_token"] = dec.bytes_read.iloc[1:].mean() if len(dec) > 1 else 0.0
    res.stats["token_ids"] = res.tokens
    return statistics.median(res.step_times[1:]) * 1e3, res.stats, (statistics.median(quiet) * 1e3 if quiet else None)


def trace_pairs(eng, prompt, n, pairs, temp, folder) -> dict:
    """``pairs`` untraced and traced runs (a full trace recorder, MoE inputs included), interleaved
    in ABBA order so that neither side always runs first after the other's trace write: each run's
    median ms/token and its whole call in ms (prefill, decode and the trace's write), per side."""
    out = {k: [] for k in ("plain", "traced", "plain_call", "traced_call")}
    for i in range(pairs):
        for with_trace in ((False, True) if i % 2 == 0 else (True, False)):
            rec = TraceRecorder(f"{folder}/t{i}.parquet", moe_input=True) if with_trace else None
            side = "traced" if with_trace else "plain"
            t = time.perf_counter()
            out[side].append(streamed(eng, prompt, n, rec, temp=temp)[0])
            out[side + "_call"].append((time.perf_counter() - t) * 1e3)
    return out


def read_gbps(eng) -> tuple[float, str]:
    """What the read path can do here, page cache warm (median of three): blobs the claiming thread
    reads itself (below ``inline_below``) at one thread's ``preadv`` straight into a slot; larger ones
    through the real scheduler and reader into slots with the engine's worker threads."""
    if eng.m.expert_bytes < eng.io.inline_below:
        return statistics.median(copy_variants_gbps(eng.root, cold=False)["preadv_slot"] for _ in range(3)), "1 thread"
    gbps = statistics.median(blobs_gbps(eng.root, "buffered", eng.io.workers, cold=False) for _ in range(3))
    return gbps, f"{eng.io.workers} threads"


def host_profile(eng, prompt, n, top, trace=None):
    """Where the host time of one streamed run goes: functions by own time, in us per token."""
    prof = cProfile.Profile()
    prof.enable()
    eng.generate(prompt, max_tokens=n, trace=trace, progress=False)
    prof.disable()
    rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (file, line, fn), (_, calls, own, cum, _) in rows:
        print(f"    {own / n * 1e6:8.0f} us/tok own {cum / n * 1e6:8.0f} cum {calls / n:7.1f} calls/tok  "
              f"{Path(file).name}:{line} {fn}")


def set_copy_grid(eng, grid) -> None:
    """``--copy-grid``: the handshake kernel's grid with staged slots (``Handshake.grid``)."""
    if grid != "engine" and grid not in GRIDS:
        raise SystemExit(f"--copy-grid {grid}: use one of {', '.join(GRIDS)}")
    if grid != "engine" and eng.handshake is not None:
        eng.handshake.grid = grid


def ahead_config(spec):
    """'none' or PREDICTOR:LOOKAHEAD -> an AheadConfig (None: no read-ahead)."""
    if spec == "none":
        return None
    predictor, _, lookahead = spec.partition(":")
    return AheadConfig(predictor=predictor, lookahead=int(lookahead or 1))


def ttft_rows(path, model, a, gbps) -> None:
    """Time to first token on an ``--prefill``-token prompt, streamed vs resident, per arena (medians
    of ``--reps``, each streamed run from a fresh arena). The prefill floor: resident plus the
    prefill's bytes read once at the read path's rate."""
    prompt = np.random.default_rng(1).integers(1, model.args.vocab_size, a.prefill).tolist()
    print(f"time to first token, {a.prefill}-token prompt:")
    print("arena  writes  resident-s  streamed-s  vs-resident  prefill-MB  floor-s  hit-rate  streamed/floor  equal")
    ttft_resident(prompt, model)
    for arena in (a.prefill_arenas or a.arenas).split(","):
        for writes in a.writes.split(",") if a.writes else [None]:
            res, st, equal = [], [], True
            eng = Engine.open(path, arena=ArenaConfig(arena, writes=writes), progress=False)
            ttft_streamed(eng, prompt)  # warm: compiled kernels (of this prompt's path), page cache
            full, name = eng.n_slots >= eng.m.n_routed, eng.arena.writes
            if not full:  # a partial arena starts each prefill empty: a fresh engine each rep
                eng.close()
            for _ in range(a.reps):
                t, first = ttft_resident(prompt, model)
                res.append(t)
                if full:  # never misses: the same arena serves every rep
                    t, pre, token = ttft_streamed(eng, prompt)
                else:
                    with Engine.open(path, arena=ArenaConfig(arena, writes=writes), progress=False) as fresh:
                        t, pre, token = ttft_streamed(fresh, prompt)
                st.append(t)
                equal &= token == first
            if full:
                eng.close()
            rm, sm = statistics.median(res), statistics.median(st)
            floor = rm + pre["bytes_read"] / gbps / 1e9
            print(f"{arena:>5}  {name:<6}  {rm:10.3f}  {sm:10.3f}  {rm / sm:10.2f}x  {pre['bytes_read'] / 1e6:10.0f}  "
                  f"{floor:7.3f}  {pre['hit_rate']:7.1%}  {sm / floor:8.2f}  {'yes' if equal else 'NO':>5}", flush=True)
            if arena in a.trace_at.split(","):
                with tempfile.TemporaryDirectory() as d:
                    r = ttft_trace_pairs(path, arena, writes, prompt, a.trace_reps or 2 * a.reps, d)
                print(f"  traced / untraced time to first token: {statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}] "
                      f"({len(r)} interleaved pairs, a full trace recorder)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--mid", action="store_true", help="the random 16 x 64, hidden 1024, 4-bit model")
    ap.add_argument("--wide", nargs="?", const="2048,768,128", default=None, metavar="H,W,E",
                    help="a random model with skewed routers at expert shape HIDDEN,WIDTH,EXPERTS (default: "
                    "Qwen3-30B-A3B's, 2.6 MB experts)")
    ap.add_argument("--temp", default="0", help="decoding temperatures, comma-separated (0: greedy)")
    ap.add_argument("--prefill", type=int, default=0, help="also time to first token on a prompt of this many tokens")
    ap.add_argument("--prefill-arenas", default=None, help="arenas of the time-to-first-token rows (default: --arenas)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--arenas", default="1.0,0.5,0.25")
    ap.add_argument("--decode", default="auto,layer")
    ap.add_argument("--writes", default=None, help="slot write modes to compare, e.g. direct,staged (default: the backend's)")
    ap.add_argument("--inline-below", default="engine", help="blob size (bytes) below which the waiting thread reads "
                    "a demand miss itself rather than waking a worker, comma-separated values to compare (default: "
                    "the engine's)")
    ap.add_argument("--landing", default="engine", help="staged writes on CUDA: how the decode thread's own reads "
                    "land, comma-separated values to compare: kernel (one landing kernel per claim) or dma (a copy "
                    "per read); default: the engine's")
    ap.add_argument("--pipeline", default="engine", help="per-layer decode: start each layer's experts at once "
                    "(on: async_eval) or with the next router sync (off), comma-separated values to compare; default: "
                    "the engine's")
    ap.add_argument("--handshake", default="engine", help="per-layer decode on CUDA: each layer's ids to the host "
                    "and slot ids back in the device's stream (token: the whole token launched at once, then answered, "
                    "the engine's default; layer: each layer launched as it is built; N: every N layers) or through a "
                    "host sync (off), "
                    "comma-separated values to compare; default: the engine's")
    ap.add_argument("--serve-thread", default="engine", help="handshake on CUDA: answer from a second thread while a "
                    "launch runs (on) or from the decoding thread only (off), comma-separated; default: the engine's")
    ap.add_argument("--split-reads", default="engine", help="demand reads of several pieces split over idle I/O "
                    "workers (on) or read by one thread (off), comma-separated; default: the engine's")
    ap.add_argument("--copy-grid", default="engine", help="staged slots under the handshake on CUDA: its kernel's "
                    "grid, comma-separated values to compare: adaptive, wide (128 blocks), one (one block); default: "
                    "the engine's")
    ap.add_argument("--ahead", default="none", help="read-ahead to compare, comma-separated PREDICTOR:LOOKAHEAD or "
                    "none, e.g. none,layer:1 (exact either way)")
    ap.add_argument("--trace-at", default="1.0", help="arenas where the first combination also times a full trace "
                    "recorder against the untraced run, e.g. 1.0,0.25")
    ap.add_argument("--trace-reps", type=int, default=0, help="interleaved untraced/traced pairs of the trace row "
                    "(default: twice --reps)")
    ap.add_argument("--profile", type=int, default=0, help="also print the N functions with the most host time per "
                    "streamed token (cProfile, one run per combination)")
    a = ap.parse_args()
    dev = parse_device(a.device)
    if dev is not None:
        mx.set_default_device(dev)
    path = mid_model() if a.mid else wide_model(a.wide) if a.wide else Path(a.model or default_model())
    with Engine.open(path, arena="1.0", progress=False) as eng:
        try:
            prompt = eng.encode(workload("code_heldout")[0]["text"])[:64]
        except Exception:  # no tokenizer (the random models): a seeded random prompt
            prompt = np.random.default_rng(0).integers(1, eng.model.args.vocab_size, 64).tolist()
        gbps, threads = read_gbps(eng)
    model = load_model(path)[0]
    floor_model = sync_floor_model(path)
    print(f"{datetime.datetime.now():%Y-%m-%d %H:%M} | model {path.name} | {platform.machine()} {platform.system()} | "
          f"mlx {mx.__version__} | device {mx.default_device()} | {a.tokens} tokens x {a.reps} reps")
    print(f"read path: {gbps:.2f} GB/s (the store's blobs, page cache warm, {threads}); read floor: the "
          "sync floor plus the bytes read per decode token at that rate")
    if a.prefill:
        ttft_rows(path, model, a, gbps)
    print("arena  decode     writes  temp  resident  floor  streamed  no-read  vs-resident  vs-floor  hit-rate  distinct  "
          "opt-tok  recomp  hs-tok  hs-pass  host-us/layer  MB/tok  read-floor  equal  engine/floor per rep")
    temps = [float(t) for t in a.temp.split(",")]
    combos = list(itertools.product(a.arenas.split(","), a.decode.split(","), a.writes.split(",") if a.writes else [None],
                                    a.ahead.split(","), a.inline_below.split(","), a.landing.split(","),
                                    a.pipeline.split(","), a.handshake.split(","), a.copy_grid.split(","),
                                    a.serve_thread.split(","), a.split_reads.split(",")))
    for arena, decode, writes, ahead, inline, landing, pipe, hs, grid, aside, split in combos:
            with Engine.open(path, arena=ArenaConfig(arena, writes=writes), decode=decode, ahead=ahead_config(ahead),
                             progress=False) as eng:
                if inline != "engine":
                    eng.io.inline_below = int(inline)
                staging = getattr(eng.arena.slots, "staging", None)
                if landing == "dma" and staging is not None:
                    staging.kernel = False
                elif landing not in ("engine", "dma", "kernel"):
                    raise SystemExit(f"--landing {landing}: use kernel or dma")
                if pipe != "engine":
                    if pipe not in ("on", "off"):
                        raise SystemExit(f"--pipeline {pipe}: use on or off")
                    eng.pipeline = pipe == "on"
                if hs not in ("engine", "token", "layer", "off") and not hs.isdigit():
                    raise SystemExit(f"--handshake {hs}: use token, layer, a number of layers or off")
                if hs == "off":
                    eng.handshake = None
                elif hs != "engine" and eng.handshake is not None:
                    eng.handshake.launch_every = 0 if hs == "token" else 1 if hs == "layer" else int(hs)
                set_copy_grid(eng, grid)
                for name, value in (("--serve-thread", aside), ("--split-reads", split)):
                    if value not in ("engine", "on", "off"):
                        raise SystemExit(f"{name} {value}: use on or off")
                if aside != "engine" and eng.handshake is not None:
                    eng.handshake.serve_thread = aside == "on"
                if split != "engine":
                    eng.io.split = split == "on"
                for temp in temps:
                    streamed(eng, prompt, 8, temp=temp)  # warm: page cache and compiled kernels
                    r, f, s, q, stats, equal = [], [], [], [], None, True
                    for _ in range(a.reps):
                        ms, want = resident_ms(prompt, model, a.tokens, temp)
                        r.append(ms)
                        f.append(resident_ms(prompt, floor_model, a.tokens, temp)[0])
                        ms, stats, quiet = streamed(eng, prompt, a.tokens, temp=temp)
                        equal = equal and stats["token_ids"] == want
                        s.append(ms)
                        if quiet is not None:
                            q.append(quiet)
                    rm, fm, sm = statistics.median(r), statistics.median(f), statistics.median(s)
                    qm = f"{statistics.median(q):7.2f}" if q else "    n/a"
                    label = decode + ("" if ahead == "none" else f"+{ahead}") + ("" if inline == "engine" else f" inline<{inline}")
                    label += "" if pipe == "engine" else f" pipe-{pipe}"
                    label += "" if hs == "engine" else f" hs-{hs}"
                    label += "" if grid == "engine" else f" grid-{grid}"
                    label += "" if aside == "engine" else f" aside-{aside}"
                    label += "" if split == "engine" else f" split-{split}"
                    if landing != "engine" and staging is not None and staging.device_copy:
                        label += " kernel" if staging.kernel else " dma"
                    print(f"{arena:>5}  {label:<10} {eng.arena.writes:<6} {temp:4.1f} {rm:8.2f} {fm:6.2f} {sm:9.2f}  {qm}  {rm / sm:10.2f}x "
                          f"{fm / sm:8.2f}x  {stats['hit_rate']:7.1%}  {stats['distinct_tokens']:3d}/{stats['tokens']:<3d}  "
                          f"{stats['optimistic_tokens']:6d}  {stats['recomputes']:6d}  {stats['handshake_tokens']:5d}  "
                          f"{stats['handshake_layers_passed'] / max(1, stats['handshake_tokens'] * len(eng.m.moe_layers)):6.0%}  "
                          f"{(sm - fm) * 1e3 / len(eng.m.moe_layers):13.0f}  {stats['bytes_per_token'] / 1e6:6.2f}  "
                          f"{fm + stats['bytes_per_token'] / gbps / 1e6:10.2f}  {'yes' if equal else 'NO':>5}  {spread(s, f)}", flush=True)
                    if a.profile:
                        host_profile(eng, prompt, a.tokens, a.profile)
                    first = next(c for c in combos if c[0] == arena)
                    if arena in a.trace_at.split(",") and (arena, decode, writes, ahead, inline, landing, pipe, hs, grid,
                                                           aside, split) == first:
                        with tempfile.TemporaryDirectory() as d:
                            t = trace_pairs(eng, prompt, a.tokens, a.trace_reps or 2 * a.reps, temp, d)
                            print(f"trace (temp {temp}): untraced {statistics.median(t['plain']):.2f} ms/tok, full trace "
                                  f"recorder {statistics.median(t['traced']):.2f} ms/tok, ratio {spread(t['traced'], t['plain'], 3)}; "
                                  f"whole calls {statistics.median(t['plain_call']):.0f} / {statistics.median(t['traced_call']):.0f} "
                                  f"ms, ratio {spread(t['traced_call'], t['plain_call'], 3)} ({len(t['plain'])} interleaved pairs)",
                                  flush=True)
                            if a.profile:
                                print("  the traced run's host profile:")
                                host_profile(eng, prompt, a.tokens, a.profile, TraceRecorder(f"{d}/p.parquet", moe_input=True))


if __name__ == "__main__":
    main()
