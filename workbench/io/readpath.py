"""Read-path measurements: is the store's read path at the device's limit?

``read_path_table`` compares, cold and warm, (a) a plain sequential read of the experts
file, (b) buffered ``pread`` into a heap buffer, (c) ``pread`` into a fresh array, and
(d) ``preadv`` straight into preallocated arena slots through the real I/O scheduler at
1..N threads, in each read mode the OS offers.
"""

from __future__ import annotations

import mmap
import os
import random
import time

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ..store.manifest import EXPERTS, Manifest
from ..store.reader import PIECE_BYTES, BlobReader, available_modes
from .scheduler import IOScheduler, ReadRequest


def drop_cache(path) -> None:
    """Evict a file from the page cache (Linux; a no-op elsewhere)."""
    if hasattr(os, "posix_fadvise"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def sequential_gbps(path, mode="buffered", chunk=1 << 20, cold=True, limit=None) -> float:
    """GB/s of one thread reading the file (its first ``limit`` bytes) front to back in ``chunk`` pieces."""
    if cold:
        drop_cache(path)
    flags = os.O_RDONLY | (os.O_DIRECT if mode == "direct" else 0)
    fd = os.open(path, flags)
    buf = mmap.mmap(-1, chunk)
    size = os.fstat(fd).st_size if limit is None else min(limit, os.fstat(fd).st_size)
    t0 = time.perf_counter()
    off = 0
    try:
        while off < size:
            n = os.preadv(fd, [buf], off)
            if n <= 0:
                break
            off += n
            if mode == "dontneed":
                os.posix_fadvise(fd, off - n, n, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return off / (time.perf_counter() - t0) / 1e9


def demand_read_us(store, split=True, cold=False, mode="buffered", workers=8, n=48, seed=0,
                   piece_bytes=PIECE_BYTES) -> float:
    """Median microseconds of one demand miss at a time (what a decode claim waits for), each blob
    read into its own slot-sized buffer through the real scheduler and reader: ``split`` its pieces
    over the idle workers (``IOScheduler.split``) or read by the waiting thread alone; pieces of
    ``piece_bytes``."""
    m = Manifest.load(store)
    path = os.path.join(store, EXPERTS)
    blobs = random.Random(seed).sample(list(m.blobs.values()), min(n, len(m.blobs)))
    buf = mmap.mmap(-1, m.expert_bytes)
    reader = BlobReader(store, m, mode=mode, verify="never", piece_bytes=piece_bytes)
    io = IOScheduler(reader, workers=workers, reserved=min(2, workers), inline_below=0)
    io.split = split
    times = []
    try:
        if cold:
            drop_cache(path)
        else:
            for b in blobs:
                io.wait(io.submit(ReadRequest(b, [memoryview(buf)[:b.size]], 0)))
        for b in blobs:
            t0 = time.perf_counter()
            io.wait(io.submit(ReadRequest(b, [memoryview(buf)[:b.size]], 0)))
            times.append(time.perf_counter() - t0)
    finally:
        io.close()
        reader.close()
    return float(np.median(times)) * 1e6


def blobs_gbps(store, mode="buffered", threads=4, cold=True, n_slots=64, seed=0, order="random") -> float:
    """GB/s of reading every blob once (``order``: "random", as decode does, or "file") into
    arena-like slots through the real scheduler and reader."""
    import mlx.core as mx

    m = Manifest.load(store)
    path = os.path.join(store, EXPERTS)
    if cold:
        drop_cache(path)
    slots = mx.zeros((n_slots, m.expert_bytes), dtype=mx.uint8)
    mx.eval(slots)
    raw = memoryview(slots).cast("B")
    reader = BlobReader(store, m, mode=mode, verify="never")
    io = IOScheduler(reader, workers=threads, reserved=0)
    blobs = list(m.blobs.values())
    if order == "random":
        random.Random(seed).shuffle(blobs)
    t0 = time.perf_counter()
    inflight = []
    try:
        for i, b in enumerate(blobs):
            s = i % n_slots
            if len(inflight) >= n_slots:
                io.wait(inflight.pop(0))
            inflight.append(io.submit(ReadRequest(b, [raw[s * m.expert_bytes:(s + 1) * m.expert_bytes]], s)))
        for r in inflight:
            io.wait(r)
    finally:
        io.close()
        reader.close()
    return sum(b.size for b in blobs) / (time.perf_counter() - t0) / 1e9


COPY_VARIANTS = ("pread_heap", "pread_fresh_array", "preadv_slot")


def _copy_variants(path, blocks, slot_bytes, cold, order=COPY_VARIANTS) -> dict:
    """Single-thread GB/s of each variant reading ``blocks`` [(offset, size)] of ``path`` in the given order."""
    import mlx.core as mx

    total = sum(size for _, size in blocks)
    slot = mx.zeros((slot_bytes,), dtype=mx.uint8)
    mx.eval(slot)
    view = memoryview(slot).cast("B")
    out = {}
    fd = os.open(path, os.O_RDONLY)
    try:
        for name in order:
            if cold:
                drop_cache(path)
            t0 = time.perf_counter()
            for off, size in blocks:
                if name == "pread_heap":
                    os.pread(fd, size, off)
                elif name == "pread_fresh_array":
                    a = mx.array(np.frombuffer(os.pread(fd, size, off), dtype=np.uint8))
                    mx.eval(a)
                else:
                    os.preadv(fd, [view[:size]], off)
            out[name] = total / (time.perf_counter() - t0) / 1e9
    finally:
        os.close(fd)
    return out


def copy_variants_gbps(store, cold=True, limit=64) -> dict:
    """Single-thread GB/s: pread into a heap buffer, pread into a fresh array, preadv into a slot."""
    m = Manifest.load(store)
    blobs = list(m.blobs.values())[:limit]
    return _copy_variants(os.path.join(store, EXPERTS), [(b.offset, b.size) for b in blobs], m.expert_bytes, cold)


def copy_variants_file_gbps(block_bytes: int, n_blocks: int, repeats: int, seed: int = 0, directory=None) -> list:
    """The three copy variants at a chosen block size: a scratch file of ``n_blocks`` blocks of
    ``block_bytes`` (random bytes, removed after), each repeat cold (dontneed), blocks in a fresh
    shuffled order and the variants in a shuffled order. One {variant: GB/s} per repeat."""
    import tempfile

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(dir=directory, prefix="readpath-") as tmp:
        path = os.path.join(tmp, "blocks.bin")
        chunk = np.random.default_rng(seed).integers(0, 256, block_bytes, dtype=np.uint8).tobytes()
        with open(path, "wb") as f:
            for _ in range(n_blocks):
                f.write(chunk)
        blocks = [(i * block_bytes, block_bytes) for i in range(n_blocks)]
        reps = []
        for _ in range(repeats):
            rng.shuffle(blocks)
            order = list(COPY_VARIANTS)
            rng.shuffle(order)
            reps.append(_copy_variants(path, blocks, block_bytes, cold=True, order=order))
        return reps


def read_path_table(store, threads=(1, 2, 4, 8), modes=None, reps=1, progress=True) -> pd.DataFrame:
    """Tidy table: method, mode, threads, cold, gbps (median of ``reps``), gbps_min and gbps_max
    (the spread of the repeats), and share of the sequential read in the same mode and temperature."""
    import statistics

    path = os.path.join(store, EXPERTS)
    modes = [m for m in (modes or ("buffered", "dontneed", "direct")) if m in available_modes()]
    rows = []
    jobs = [(mode, cold) for mode in modes for cold in ((True, False) if mode == "buffered" else (True,))]
    def spread(values):
        values = list(values)
        return dict(gbps=statistics.median(values), gbps_min=min(values), gbps_max=max(values))

    for mode, cold in tqdm(jobs, desc="read path", disable=not progress):
        rows.append(dict(method="sequential", mode=mode, threads=1, cold=cold,
                         **spread(sequential_gbps(path, mode, cold=cold) for _ in range(reps))))
        for order in ("random", "file"):
            for t in threads:
                rows.append(dict(method=f"store blobs, {order} order", mode=mode, threads=t, cold=cold,
                                 **spread(blobs_gbps(store, mode, t, cold=cold, order=order) for _ in range(reps))))
        if mode == "buffered":
            variants = [copy_variants_gbps(store, cold=cold) for _ in range(reps)]
            for name in variants[0]:
                rows.append(dict(method=name, mode=mode, threads=1, cold=cold, **spread(v[name] for v in variants)))
    df = pd.DataFrame(rows)
    seq = df[df.method == "sequential"].set_index(["mode", "cold"]).gbps
    df["share_of_sequential"] = [g / seq[(m, c)] for m, c, g in zip(df["mode"], df["cold"], df["gbps"])]
    return df
