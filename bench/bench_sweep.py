"""Sweep throughput: cells per second against the number of Dask workers.

    python bench/bench_sweep.py [--workers 1,2] [--reps 3] [--tokens 64] [--kind simulate|replay] [--load-cells 100000]

One grid of cells on synthetic Zipf and sticky traces, run on a LocalCluster of N worker processes (one
thread each) on 127.0.0.1: simulate (16 layers x 64 experts, top-8; 4 policies x 3 arenas x 3
predictors = 72 cells) or replay (48 layers x 128 experts, top-8; 7 policies x 3 arenas = 42 cells).
Every cluster is started first (its start time reported apart); the reps then interleave the worker
counts, each running the whole grid into a fresh directory. Medians of --reps. ``--load-cells N``
also times ``load_sweep`` of a dataset of N verified rows (written as a sweep writes them, 500 a part).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.sim.sweep import Grid, open_client, sweep  # noqa: E402
from workbench.trace.synthetic import synthetic_trace  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--kind", choices=["simulate", "replay"], default="simulate")
    ap.add_argument("--load-cells", type=int, default=0)
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    traces = []
    shape = dict(n_layers=16, n_experts=64) if a.kind == "simulate" else dict(n_layers=48, n_experts=128)
    for kind in ("zipf", "sticky"):
        p = work / f"{kind}.parquet"
        synthetic_trace(p, n_tokens=a.tokens, top_k=8, kind=kind, predictors=(1, 2), **shape)
        traces.append(p)
    if a.kind == "simulate":
        grid = Grid(traces=traces, policies=["lru", "fifo", "slru", "s3fifo"], arenas=["0.1", "0.25", "0.5"],
                    predictors=["none", "d1", "oracle"])
    else:
        grid = Grid(traces=traces, kind="replay", policies=["lru", "fifo", "lfu", "slru", "s3fifo", "twohit", "ds4"],
                    arenas=["0.1", "0.25", "0.5"])
    n_cells = len(grid.cells())
    counts = [int(x) for x in a.workers.split(",")]
    clients, starts, times = {}, {}, {n: [] for n in counts}
    try:
        for n in counts:  # every cluster up first; reps then interleave, so load drifts hit all alike
            t0 = time.perf_counter()
            clients[n] = open_client(workers=n)
            clients[n][0].submit(sum, [1]).result()  # workers up and answering
            starts[n] = time.perf_counter() - t0
        for rep in range(a.reps):
            for n in counts:
                res = sweep(grid, work / f"out-{n}-{rep}", client=clients[n][0], progress=False)
                assert res.ran == n_cells
                times[n].append(res.seconds)
    finally:
        for client, cluster in clients.values():
            client.close()
            cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    rows = [(n, starts[n], statistics.median(times[n]), n_cells / statistics.median(times[n])) for n in counts]
    base = rows[0][3]
    print(f"Machine: {platform.machine()} {platform.system()}, {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; load average {load0:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end (other sessions share the cores)")
    print(f"Grid: {n_cells} {a.kind} cells (2 traces x {a.tokens} tokens, {shape['n_layers']} layers x "
          f"{shape['n_experts']} experts top-8), medians of {a.reps} reps.")
    print()
    print("| workers | cluster start s | grid s (median) | cells/s | vs 1 worker |")
    print("| --- | --- | --- | --- | --- |")
    for n, start_s, med, cps in rows:
        print(f"| {n} | {start_s:.1f} | {med:.2f} | {cps:.2f} | {cps / base:.2f}x |")
    if a.load_cells:
        print(f"load_sweep of {a.load_cells} cells: {load_time(a.load_cells):.2f} s")


def load_time(n_cells, per_part=500):
    """Seconds to load (and verify) a dataset of ``n_cells`` rows written in parts of ``per_part``."""
    from workbench.sim.sweep import load_sweep
    from workbench.sim.sweep_data import config_hash, encode_part, write_part

    out = Path(tempfile.mkdtemp(prefix="bench-load-"))
    try:
        for start in range(0, n_cells, per_part):
            rows = []
            for i in range(start, min(n_cells, start + per_part)):
                config = dict(kind="replay", workload="w", trace_sha256="0" * 64, policy="lru", arena=str(i), predictor="none",
                              distance=None, gate="none", phase="all", workbench="bench")
                cid, text = config_hash(config)
                rows.append(dict(config, cell_id=cid, config_json=text, status="ok", hits=i, misses=i, lookups=2 * i,
                                 hit_rate=0.5, slots=i, cell_s=0.01, worker="w", error=None))
            write_part(out, encode_part(rows))
        t0 = time.perf_counter()
        df = load_sweep(out)
        assert len(df) == n_cells
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
