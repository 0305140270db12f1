"""The arena's host cost per claim, apart from routing and compute: a seeded sequence of top-k
claims, every MoE layer in turn as decode tokens claim them, at a partial arena, page cache warm.

    python bench/bench_claims.py [--model DIR | --mid] [--device cpu|gpu] [--arenas 0.25,0.5] [--reps 7]
                                 [--writes direct,staged]

Per arena and slot-write mode, medians over ``--reps`` passes of the sequence:
  claim      microseconds per claim: ``at_layer`` (hits, victims, reads, publishing), ``release``
             (staged writes land there: a host wait per claim) and ``after_layer``
  reads      the misses' share of the same blobs read alone, in the same order, where the arena reads
             them (os.preadv into slots in turn, or into bounce rows)
  own        claim - reads: the arena's and the scheduler's own cost, per claim and per miss
"""

import argparse
import datetime
import os
import platform
import statistics
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from bench_engine import mid_model
from workbench.config import ArenaConfig
from workbench.data import default_model
from workbench.engine.engine import Engine, parse_device


def claims(m, tokens, seed=0):
    """(layer, sorted top-k expert ids) per MoE layer of ``tokens`` tokens, uniformly random."""
    rng = np.random.default_rng(seed)
    return [(layer, np.sort(rng.choice(m.n_experts, m.top_k, replace=False)))
            for _ in range(tokens) for layer in m.moe_layers]


def claim_us(arena, seq):
    t = time.perf_counter()
    for layer, experts in seq:
        arena.at_layer(layer, experts)
        arena.release()
        arena.after_layer()
    return (time.perf_counter() - t) / len(seq) * 1e6


def read_us(arena, fd, blobs, n_claims):
    """The blobs read where the arena reads them: into slots in turn (direct), or into bounce rows."""
    slots = arena.slots
    if slots.in_place:
        targets = slots.views
    else:
        rows = [slots.staging.take() for _ in range(8)]
        targets = [row.views for row in rows]
    t = time.perf_counter()
    for i, b in enumerate(blobs):
        os.preadv(fd, targets[i % len(targets)], b.offset)
    dt = time.perf_counter() - t
    if not slots.in_place:
        for row in rows:
            slots.staging.give(row)
    return dt / n_claims * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--mid", action="store_true", help="the random 16 x 64, hidden 1024, 4-bit model")
    ap.add_argument("--device", default=None)
    ap.add_argument("--arenas", default="0.25,0.5")
    ap.add_argument("--tokens", type=int, default=60, help="decode tokens per pass of the sequence")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--writes", default=None, help="slot write modes, e.g. direct,staged (default: the backend's)")
    a = ap.parse_args()
    dev = parse_device(a.device)
    if dev is not None:
        mx.set_default_device(dev)
    path = mid_model() if a.mid else Path(a.model or default_model())
    print(f"{datetime.datetime.now():%Y-%m-%d %H:%M} | model {path.name} | {platform.machine()} {platform.system()} | "
          f"mlx {mx.__version__} | device {mx.default_device()} | {a.tokens} tokens x {a.reps} reps")
    print("arena  writes  slots  hit-rate  misses/claim  claim-us  reads-us  own-us/claim  own-us/miss")
    for arena in a.arenas.split(","):
        for writes in a.writes.split(",") if a.writes else [None]:
            with Engine.open(path, arena=ArenaConfig(arena, writes=writes), progress=False) as eng:
                ar, m = eng.arena, eng.m
                seq = claims(m, a.tokens)
                claim_us(ar, seq)  # warm: page cache, verified blobs, bounce rows
                before = eng.counters.totals("decode")
                runs = [claim_us(ar, seq) for _ in range(a.reps)]
                tot = eng.counters.totals("decode")
                misses = (tot["misses"] - before["misses"]) / a.reps
                hits = (tot["hits"] - before["hits"]) / a.reps
                blobs = [m.blob(layer, int(e)) for layer, experts in seq for e in experts]
                reads = statistics.median(read_us(ar, eng.reader.fd, blobs, len(seq)) for _ in range(a.reps))
                claim = statistics.median(runs)
                per_miss = misses / len(seq)
                own = claim - reads * per_miss / m.top_k  # only the misses read
                own_miss = f"{own / per_miss:11.1f}" if per_miss else f"{'-':>11}"  # an arena that holds them all
                print(f"{arena:>5}  {ar.writes:<6} {ar.n_slots:5d}  {hits / (hits + misses):7.1%}  {per_miss:12.2f}  "
                      f"{claim:8.1f}  {reads * per_miss / m.top_k:8.1f}  {own:12.1f}  {own_miss}",
                      flush=True)


if __name__ == "__main__":
    main()
