"""Engine overhead, side by side in one run: streamed vs resident mlx-lm on the same model.

    python bench/bench_engine.py [--model DIR] [--tokens 64] [--reps 5]

Prints the ratio of median decode times per token (streamed / resident) for a 100% arena
(all hits: pure engine overhead) and a 25% arena (page cache warm, so the engine's own cost
shows), hit rate and distinct tokens beside them, and the hook cost (no subscriber vs a full
trace recorder with MoE inputs).
"""

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model

from workbench.data import default_model, workload
from workbench.engine.engine import Engine
from workbench.trace.recorder import TraceRecorder


def resident_ms(model, prompt, n):
    times, t = [], time.perf_counter()
    for (tok, _), _ in zip(generate_step(mx.array(prompt), model, max_tokens=n), range(n)):
        now = time.perf_counter()
        times.append(now - t)
        t = now
    return statistics.median(times[1:]) * 1e3


def streamed_ms(eng, prompt, n, trace=None):
    res = eng.generate(prompt, max_tokens=n, trace=trace, progress=False)
    return statistics.median(res.step_times[1:]) * 1e3, res.stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    path = Path(a.model or default_model())
    try:
        prompt = Engine.open(path, arena="1.0", progress=False).encode(workload("code_heldout")[0]["text"])[:64]
    except Exception:
        prompt = list(range(1, 17))
    model, _ = load_model(path)
    print(f"model {path} | {platform.machine()} {platform.system()} | mlx {mx.__version__} | device {mx.default_device()}")
    for arena in ("1.0", "0.25"):
        eng = Engine.open(path, arena=arena, progress=False)
        streamed_ms(eng, prompt, 8)  # warm: page cache and compiled kernels
        r, s, stats = [], [], None
        for _ in range(a.reps):  # interleaved, so drifting machine load hits both sides
            r.append(resident_ms(model, prompt, a.tokens))
            ms, stats = streamed_ms(eng, prompt, a.tokens)
            s.append(ms)
        rm, sm = statistics.median(r), statistics.median(s)
        print(f"arena {arena:>4} ({eng.n_slots} slots): resident {rm:.2f} ms/tok, streamed {sm:.2f} ms/tok, "
              f"ratio streamed/resident {sm / rm:.3f} (throughput {rm / sm:.2f}x of resident), "
              f"hit rate {stats['hit_rate']:.1%}, distinct tokens {stats['distinct_tokens']}/{stats['tokens']}")
        if arena == "1.0":
            with tempfile.TemporaryDirectory() as d:
                plain, traced = [], []
                for i in range(a.reps):
                    plain.append(streamed_ms(eng, prompt, a.tokens)[0])
                    traced.append(streamed_ms(eng, prompt, a.tokens, TraceRecorder(f"{d}/t{i}.parquet", moe_input=True))[0])
                print(f"hooks: no subscriber {statistics.median(plain):.2f} ms/tok, full trace recorder "
                      f"{statistics.median(traced):.2f} ms/tok, ratio {statistics.median(traced) / statistics.median(plain):.3f}")
        eng.close()


if __name__ == "__main__":
    main()
