"""Read path: cold GB/s of the store's blob reads (1/2/4/8 threads) vs a plain sequential read
of the same file in the same mode, on a store with blobs of 1 MiB or more; and the cost of landing
a read in a slot that the device then computes on, per slot-write mode (direct: preadv into the
slot's memory; mapped: the same into slot memory kept on the host and read by the GPU over the bus,
CUDA; staged: preadv into a pinned bounce row, then a copy into the slot), one expert and a layer's
worth of experts per claim, on that store and on the reference model's; and one demand miss at a
time, warm and cold, its pieces split over the idle I/O workers against read by the waiting thread.

    python bench/bench_readpath.py [--store DIR] [--device gpu] [--slot-writes-only]
"""

import argparse
import platform

import numpy as np
from pathlib import Path

from workbench.data import default_model
from workbench.fsutil import cache_dir
from workbench.io.readpath import demand_read_us, read_path_table
from workbench.store.cache import resolve_store
from workbench.store.manifest import Manifest


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


def slot_writes(store, n=64, reps=3, per_claim=1):
    """Median microseconds per expert: claim ``per_claim`` experts that all miss (page cache warm;
    the claiming thread reads small blobs itself), then compute on them. Staged writes on CUDA run
    three ways: the decode thread's reads through the landing kernel, and every read by DMA, one
    batch or one copy per tensor per expert."""
    import statistics
    import time

    import mlx.core as mx

    from workbench.arena.arena import Arena
    from workbench.arena.counters import Counters
    from workbench.hooks import Hooks
    from workbench.io.scheduler import IOScheduler
    from workbench.store.manifest import Manifest
    from workbench.store.reader import BlobReader

    m = Manifest.load(store)
    layer, k = m.moe_layers[0], per_claim
    rows = []
    variants = (("direct", None), ("mapped", None), ("staged", "kernel"), ("staged", "batch"), ("staged", "per tensor"))
    for writes, how in variants:
        reader = BlobReader(store, m, verify="never")
        io = IOScheduler(reader, workers=2, reserved=1)
        arena = Arena(m, max(k, m.top_k), io, Counters(), Hooks(), "lru", writes=writes)
        staging = getattr(arena.slots, "staging", None)
        able = {"kernel": getattr(staging, "kernel", False), "batch": getattr(staging, "batched", False),
                "per tensor": getattr(staging, "device_copy", False)}
        if how is not None and how != "kernel" and not able[how]:  # not here: the first staged row covers it
            io.close()
            reader.close()
            continue
        if how in ("batch", "per tensor"):
            staging.kernel = False
            staging.batched = how == "batch"
        name = m.tensors[0].name
        per = []
        try:
            for rep in range(reps + 1):
                t0 = time.perf_counter()
                for i in range(n):
                    wanted = sorted({(i * k + j) % m.n_experts for j in range(k)})
                    table = arena.at_layer(layer, wanted)
                    idx = arena.slots.landed(table[wanted])
                    mx.eval(mx.sum(mx.take(arena.tensors[name], idx, axis=0).astype(mx.float32)))
                    arena.release()
                if rep:  # the first pass warms the page cache and the kernels
                    per.append((time.perf_counter() - t0) / (n * k) * 1e6)
        finally:
            arena.close()
            io.close()
            reader.close()
        if staging is None:
            label = arena.writes if arena.writes == writes else f"{writes} (is {arena.writes} here)"
        elif not staging.device_copy:
            label = f"{writes} (host copy)"
        else:
            label = {True: "staged (landing kernel)"}.get(staging.kernel) or \
                f"staged (DMA, {'one batch per expert' if staging.batched else 'one copy per tensor'})"
        rows.append((label, statistics.median(per)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default=None)
    ap.add_argument("--slot-writes-only", action="store_true")
    a = ap.parse_args()
    if a.device:
        import mlx.core as mx

        from workbench.engine.engine import parse_device

        mx.set_default_device(parse_device(a.device))
    store = Path(a.store) if a.store else big_store()
    stores = [store] if a.store else [store, resolve_store(default_model(), progress=False)]
    print("slot writes, page cache warm: microseconds per expert (read, land in a slot, compute on it)")
    for s in stores:
        m = Manifest.load(s)
        for k in dict.fromkeys((1, m.top_k)):
            print(f"  {s.name}: {m.expert_bytes} bytes in {len(m.tensors)} tensors per expert, {k} per claim")
            for writes, us in slot_writes(s, reps=a.reps, per_claim=k):
                print(f"    {writes:<48} {us:9.1f} us")
    if a.slot_writes_only:
        return
    m = Manifest.load(store)
    print(f"one demand miss at a time ({m.expert_bytes / 1e6:.2f} MB blobs, {a.reps} runs): median microseconds, "
          "its pieces split over idle workers against read by the waiting thread alone")
    for cold in (False, True):
        split, whole = ([demand_read_us(store, split=sp, cold=cold) for _ in range(a.reps)] for sp in (True, False))
        print(f"  {'cold' if cold else 'warm'}: split {np.median(split):8.1f} us, whole {np.median(whole):8.1f} us "
              f"({np.median(whole) / np.median(split):.2f}x)")
    df = read_path_table(store, reps=a.reps)
    print(f"store {store} | {platform.machine()} {platform.system()} | medians of {a.reps}")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    best = df[df.method.str.startswith("store")].groupby(["method", "mode", "cold"]).share_of_sequential.max()
    print("\nbest store-read share of sequential, by mode:")
    print(best.to_string(float_format=lambda v: f"{v:.1%}"))


if __name__ == "__main__":
    main()
