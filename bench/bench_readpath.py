"""Read path: cold GB/s of the store's blob reads (1/2/4/8 threads) vs a plain sequential read
of the same file in the same mode, on a store with blobs of 1 MiB or more.

    python bench/bench_readpath.py [--store DIR]   (builds a 1.5 MiB-per-expert random store if none)
"""

import argparse
import platform
from pathlib import Path

from workbench.engine.engine import cache_dir
from workbench.io.readpath import read_path_table


def big_store() -> Path:
    from workbench.randmodel import make_random_model
    from workbench.store.pack import pack

    root = cache_dir() / "bench"
    store = root / "big-store"
    if not (store / "manifest.json").exists():
        model = make_random_model(root / "big-model", "qwen3_moe", layers=4, experts=48, top_k=8, hidden=512,
                                  expert_width=256, vocab=256)  # float32: 1.5 MiB per expert
        pack(model, store)
    return store


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    store = Path(a.store) if a.store else big_store()
    df = read_path_table(store, reps=a.reps)
    print(f"store {store} | {platform.machine()} {platform.system()} | medians of {a.reps}")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    best = df[df.method.str.startswith("store")].groupby(["method", "mode", "cold"]).share_of_sequential.max()
    print("\nbest store-read share of sequential, by mode:")
    print(best.to_string(float_format=lambda v: f"{v:.1%}"))


if __name__ == "__main__":
    main()
