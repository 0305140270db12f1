"""Sweep throughput: cells per second against the number of Dask workers.

    python bench/bench_sweep.py [--workers 1,2] [--reps 3] [--tokens 64]

One grid of simulate cells (synthetic Zipf and sticky traces, 16 layers x 64 experts, top-8;
policies x arenas x predictors), run on a LocalCluster of N worker processes (one thread each)
on 127.0.0.1. Every cluster is started first (its start time reported apart); the reps then
interleave the worker counts, each running the whole grid into a fresh directory. Medians of --reps.
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
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    traces = []
    for kind in ("zipf", "sticky"):
        p = work / f"{kind}.parquet"
        synthetic_trace(p, n_tokens=a.tokens, n_layers=16, n_experts=64, top_k=8, kind=kind, predictors=(1, 2))
        traces.append(p)
    grid = Grid(traces=traces, policies=["lru", "fifo", "slru", "s3fifo"], arenas=["0.1", "0.25", "0.5"],
                predictors=["none", "d1", "oracle"])
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
    print(f"Grid: {n_cells} simulate cells (2 traces x {a.tokens} tokens, 16 layers x 64 experts top-8; 4 policies x "
          f"3 arenas x 3 predictors), medians of {a.reps} reps.")
    print()
    print("| workers | cluster start s | grid s (median) | cells/s | vs 1 worker |")
    print("| --- | --- | --- | --- | --- |")
    for n, start_s, med, cps in rows:
        print(f"| {n} | {start_s:.1f} | {med:.2f} | {cps:.2f} | {cps / base:.2f}x |")


if __name__ == "__main__":
    main()
