"""Streaming decode with a 25% arena and cold reads, against its floor.

    python bench/bench_cold.py [--tokens 32] [--mode dontneed|direct] [--writes direct|staged] [--device cpu|gpu]
                               [--ahead none,layer:1]

floor per token = bytes read per token / cold sequential bandwidth (measured in this run, same
read mode) + compute per token (the same engine with every expert resident, measured in this
run). Prints the ratio measured / floor (target: within 1.2x), with hit rate and distinct tokens;
``--ahead`` compares read-ahead settings (PREDICTOR:LOOKAHEAD or none), each against its own floor.
"""

import argparse
import os
import platform
import statistics

from bench_engine import ahead_config
from workbench.config import ArenaConfig, IOConfig
from workbench.engine.engine import Engine
from workbench.fsutil import cache_dir
from workbench.io.readpath import drop_cache, sequential_gbps
from workbench.store.manifest import EXPERTS


def moving_store():
    from workbench.randmodel import make_random_model
    from workbench.store.pack import pack

    root = cache_dir() / "bench"
    store = root / "big-moving-store"
    if not (store / "manifest.json").exists():
        model = make_random_model(root / "big-moving-model", "qwen3_moe", moving=True, layers=4, experts=48,
                                  top_k=8, hidden=512, expert_width=256, vocab=256)
        pack(model, store)
    return store


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--mode", default="dontneed")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default=None)
    ap.add_argument("--writes", default=None, help="slot writes: direct or staged (default: the backend's)")
    ap.add_argument("--ahead", default="none", help="read-ahead to compare, comma-separated PREDICTOR:LOOKAHEAD or none")
    a = ap.parse_args()
    if a.device:
        import mlx.core as mx

        from workbench.engine.engine import parse_device

        mx.set_default_device(parse_device(a.device))
    store = moving_store()
    prompt = list(range(3, 19))
    path = os.path.join(store, EXPERTS)
    with Engine(store, arena="1.0", progress=False) as eng:
        eng.generate(prompt, max_tokens=4)
        compute = statistics.median(statistics.median(eng.generate(prompt, max_tokens=a.tokens).step_times[1:])
                                    for _ in range(a.reps))
    print(f"store {store} | {platform.machine()} {platform.system()} | mode {a.mode} | compute {compute * 1e3:.2f} ms/token")
    for ahead in a.ahead.split(","):
        cold(store, path, prompt, compute, a, ahead)


def cold(store, path, prompt, compute, a, ahead):
    rows = []
    for rep in range(a.reps):
        seq = sequential_gbps(path, a.mode, cold=True)
        with Engine(store, arena=ArenaConfig("0.25", writes=a.writes), io=IOConfig(workers=8, mode=a.mode, verify="never"),
                    ahead=ahead_config(ahead), progress=False) as eng:
            drop_cache(path)
            res = eng.generate(prompt, max_tokens=a.tokens)
        per_tok = statistics.median(res.step_times[1:])
        bpt = res.stats["bytes_per_token"]
        floor = bpt / (seq * 1e9) + compute
        rows.append((per_tok, floor, seq, bpt, res.stats))
    per_tok, floor, seq, bpt, st = sorted(rows, key=lambda r: r[0] / r[1])[len(rows) // 2]
    print(f"read-ahead {ahead} | slot writes {st['slot_writes']} | cold sequential {seq:.3f} GB/s | "
          f"{bpt / 1e6:.2f} MB read per token")
    print(f"measured {per_tok * 1e3:.2f} ms/token vs floor {floor * 1e3:.2f} ms/token: ratio {per_tok / floor:.3f} "
          f"(hit rate {st['hit_rate']:.1%}, distinct tokens {st['distinct_tokens']}/{st['tokens']})")
    wait = st["io_wait_s"] / st["tokens"]  # the decode thread's wait for its claims' reads
    print(f"waiting for reads {wait * 1e3:.2f} ms/token, {wait / per_tok:.0%} of the token "
          f"({bpt / wait / 1e9 if wait else float('nan'):.3f} GB/s: bytes read per token over that wait)")


if __name__ == "__main__":
    main()
