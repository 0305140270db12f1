"""Sweep throughput: cells per second against the number of Dask workers; ioreplay cells alone vs in a sweep.

    python bench/bench_sweep.py [--workers 1,2] [--reps 3] [--warmup 1] [--tokens 64] [--kind simulate|replay]
                                [--load-cells 100000]
    python bench/bench_sweep.py --kind ioreplay [--workers 2] [--reps 3] [--tokens 64] [--io-mode buffered]

Needs only the repository: the traces are synthetic (Zipf and sticky routing), nothing is installed.

simulate / replay: one grid of cells run on a LocalCluster of N worker processes (one thread each) on
127.0.0.1: simulate (16 layers x 64 experts, top-8; 4 policies x 3 arenas x 3 predictors = 72 cells) or
replay (48 layers x 128 experts, top-8; 7 policies x 3 arenas = 42 cells). Every cluster is started
first (its start time reported apart); --warmup rounds then let each worker load the traces and the
compiled replay loops (the first round's time is reported as "first grid s"); the timed reps interleave
the worker counts, each running the whole grid into a fresh directory. "cells' own s": the sum of the
cells' times on their workers (grown with N workers: the cells themselves ran slower, the machine's
cores or memory shared); "busy": that over N x the grid's time (what is left: waiting, scheduling,
writing). Medians of --reps, every rep's
time listed, and what else took the cores meanwhile (other processes' busy cores and the cores the
hypervisor stole, from /proc/stat via psutil) next to the load average. The 16-core GPU host's
measurement: ``--kind replay --tokens 256 --reps 7 --warmup 2 --workers 1,8``.

``--plain`` also runs the grid on N plain processes (no scheduler, no transfers, no writes), started
together: what the machine itself gives N workers, against which the sweep's scaling reads.

``--load-cells N`` also times ``load_sweep`` of a dataset of N verified rows (written as a sweep writes
them, 500 a part).

ioreplay: a synthetic store at Qwen3-30B-A3B's expert shape (``--io-layers`` MoE layers, 128 experts,
4-bit) and a Zipf trace for it; each cell (``--policies`` x ``--arenas``, no compute, cold cache) runs
alone through ``workbench ioreplay --cache cold --json`` (its own process) and inside a sweep of
``--workers`` workers, rep by rep (the order alternating), and the rows are printed side by side: the
median token time and GB/s alone and in the sweep, the ratio (median over reps) and its spread, and
whether both replays left the same residency (the same reads, so only their speed may differ).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.sim.sweep import Grid, load_sweep, open_client, sweep  # noqa: E402
from workbench.trace.synthetic import synthetic_trace  # noqa: E402


class OtherCPU:
    """What else took the machine's cores while the block ran, in cores: ``cores``, the rest of the machine
    (all busy CPU time from /proc/stat minus this process's and its children's: the cluster's workers,
    running or ended) and ``steal``, the time the hypervisor gave this VM's CPUs to someone else."""

    def _now(self):
        import psutil

        t = psutil.cpu_times()
        busy = sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
        me = psutil.Process()
        done = os.times()
        own = done.children_user + done.children_system  # children that ended (the `workbench ioreplay` runs)
        for p in [me] + me.children(recursive=True):
            try:
                c = p.cpu_times()
                own += c.user + c.system
            except psutil.Error:
                pass
        return time.perf_counter(), busy, own, getattr(t, "steal", 0.0)

    def __enter__(self):
        self.start = self._now()
        self.load = [os.getloadavg()[0]]
        return self

    def __exit__(self, *exc):
        (t0, b0, o0, s0), (t1, b1, o1, s1) = self.start, self._now()
        self.load.append(os.getloadavg()[0])
        self.cores = max(0.0, ((b1 - b0) - (o1 - o0)) / max(1e-9, t1 - t0))
        self.steal = (s1 - s0) / max(1e-9, t1 - t0)


def _plain(cells, barrier, done):
    """One plain process (no Dask) of ``independent``: warm (trace, compiled loops), wait for the
    others, run its cells, report when it ended (or what failed)."""
    from workbench.sim.sweep import run_batch

    try:
        run_batch(cells)
        barrier.wait(timeout=600)
        failed = [r["error"] for r in run_batch(cells) if r["status"] != "ok"]
        done.put(f"{len(failed)} cells failed: {failed[0]}" if failed else time.time())
    except Exception as e:
        done.put(f"{type(e).__name__}: {e}")


def independent(cells, n, reps=3) -> float:
    """Median seconds for ``n`` plain processes, started together, to run the grid's cells, shared out
    by estimated cost (costliest first, each to the least loaded process): what the machine itself
    gives n workers with no scheduler, no transfers and no writes."""
    import multiprocessing as mp

    from workbench.sim.sweep import cell_cost

    shares, load = [[] for _ in range(n)], [0.0] * n
    for c in sorted(cells, key=cell_cost, reverse=True):
        i = load.index(min(load))
        shares[i].append(c)
        load[i] += cell_cost(c)
    ctx = mp.get_context("spawn")
    times = []
    for _ in range(reps):
        barrier, done = ctx.Barrier(n + 1), ctx.Queue()
        procs = [ctx.Process(target=_plain, args=(share, barrier, done)) for share in shares]
        for p in procs:
            p.start()
        barrier.wait(timeout=600)
        t0 = time.time()
        ends = [done.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        bad = [e for e in ends if isinstance(e, str)]
        if bad:
            raise RuntimeError(f"a plain process failed: {bad[0]}")
        times.append(max(ends) - t0)
    return statistics.median(times)


def spread(values) -> str:
    """median (min-max) of a few numbers, two decimals."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def machine_line() -> str:
    return (f"Machine: {platform.machine()} {platform.system()}, {os.cpu_count()} CPUs; "
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default=None, help="worker counts to compare (default 1,2; ioreplay: 2)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds per worker count before the reps")
    ap.add_argument("--tokens", type=int, default=None, help="decode tokens per trace (default 64)")
    ap.add_argument("--kind", choices=["simulate", "replay", "ioreplay"], default="simulate")
    ap.add_argument("--load-cells", type=int, default=0)
    ap.add_argument("--plain", action="store_true", help="also time the grid on plain processes with no Dask (the "
                    "machine's own scaling)")
    ap.add_argument("--policies", default="lru,lfu", help="ioreplay: policies of the cells")
    ap.add_argument("--arenas", default="0.1,0.25", help="ioreplay: arenas of the cells")
    ap.add_argument("--io-layers", type=int, default=4, help="ioreplay: MoE layers of the synthetic store")
    ap.add_argument("--io-mode", default="buffered", help="ioreplay: buffered | dontneed | direct")
    a = ap.parse_args()
    if a.kind == "ioreplay":
        return ioreplay_check(a)
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    traces = []
    tokens = a.tokens or 64
    shape = dict(n_layers=16, n_experts=64) if a.kind == "simulate" else dict(n_layers=48, n_experts=128)
    for kind in ("zipf", "sticky"):
        p = work / f"{kind}.parquet"
        synthetic_trace(p, n_tokens=tokens, top_k=8, kind=kind, predictors=(1, 2), **shape)
        traces.append(p)
    if a.kind == "simulate":
        grid = Grid(traces=traces, policies=["lru", "fifo", "slru", "s3fifo"], arenas=["0.1", "0.25", "0.5"],
                    predictors=["none", "d1", "oracle"])
    else:
        grid = Grid(traces=traces, kind="replay", policies=["lru", "fifo", "lfu", "slru", "s3fifo", "twohit", "ds4"],
                    arenas=["0.1", "0.25", "0.5"])
    n_cells = len(grid.cells())
    counts = [int(x) for x in (a.workers or "1,2").split(",")]
    clients, starts, first, times = {}, {}, {}, {n: [] for n in counts}
    others, own_s = {n: [] for n in counts}, {n: [] for n in counts}
    t_all = time.perf_counter()
    try:
        for n in counts:  # every cluster up first; reps then interleave, so load drifts hit all alike
            t0 = time.perf_counter()
            clients[n] = open_client(workers=n)
            clients[n][0].submit(sum, [1]).result()  # workers up and answering
            starts[n] = time.perf_counter() - t0
        run = lambda n, tag: sweep(grid, work / f"out-{n}-{tag}", client=clients[n][0], progress=False)  # noqa: E731
        for w in range(a.warmup):
            for n in counts:
                res = run(n, f"warmup{w}")
                assert res.ran == n_cells, res
                first.setdefault(n, res.seconds)
        for rep in range(a.reps):
            for n in counts:
                with OtherCPU() as cpu:
                    res = run(n, rep)
                assert res.ran == n_cells, res
                times[n].append(res.seconds)
                others[n].append(cpu)
                own_s[n].append(load_sweep(res.out).cell_s.sum())  # the cells' own seconds, on their workers
        for n in list(clients):  # the clusters go before any plain process runs
            client, cluster = clients.pop(n)
            client.close()
            cluster.close()
        alone = {n: independent(grid.cells(), n) for n in counts} if a.plain else {}
    finally:
        for client, cluster in clients.values():
            client.close()
            cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    base = n_cells / statistics.median(times[counts[0]])
    print(machine_line() + f"; whole run {time.perf_counter() - t_all:.0f} s")
    print(f"Grid: {n_cells} {a.kind} cells (2 traces x {tokens} tokens, {shape['n_layers']} layers x "
          f"{shape['n_experts']} experts top-8); {a.warmup} warm-up round(s), then medians of {a.reps} reps.")
    print()
    print(f"| workers | cluster start s | first grid s | grid s (median) | cells/s | vs {counts[0]} worker(s) | "
          "cells' own s (sum) | busy | every rep s | other processes' cores | cores stolen by the hypervisor | load average |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in counts:
        med, own = statistics.median(times[n]), statistics.median(own_s[n])
        loads = [x for c in others[n] for x in c.load]
        print(f"| {n} | {starts[n]:.1f} | {first.get(n, float('nan')):.2f} | {med:.2f} | {n_cells / med:.2f} | "
              f"{n_cells / med / base:.2f}x | {own:.2f} | {own / (n * med):.0%} | {' '.join(f'{t:.2f}' for t in times[n])} | "
              f"{spread([c.cores for c in others[n]])} | {spread([c.steal for c in others[n]])} | "
              f"{min(loads):.1f}-{max(loads):.1f} |")
    if alone:
        print()
        print("Without Dask (plain processes started together, the cells shared out by estimated cost; medians of 3):")
        print(" ".join(f"{n}: {alone[n]:.2f} s, {alone[counts[0]] / alone[n]:.2f}x;" for n in counts))
    if a.load_cells:
        print(f"load_sweep of {a.load_cells} cells: {load_time(a.load_cells):.2f} s")


def load_time(n_cells, per_part=500):
    """Seconds to load (and verify) a dataset of ``n_cells`` rows written in parts of ``per_part``."""
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


# --- ioreplay: alone vs inside a sweep -------------------------------------------------------

IO_KEYS = ("median_token_ms", "wall_s", "bytes_read", "disk_bytes", "cache_bytes", "residency_hash", "tokens")


def ioreplay_alone(trace, store, policy, arena, io_mode) -> dict:
    """One cell through the command line, in its own process (as a user runs it)."""
    cmd = [sys.executable, "-m", "workbench.cli", "ioreplay", str(trace), str(store), "--policy", policy, "--arena", arena,
           "--cache", "cold", "--compute-ms", "0", "--io-mode", io_mode, "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode:
        raise SystemExit(f"bench_sweep: `{' '.join(cmd)}` failed (exit {p.returncode}): {p.stderr.strip()[-400:]}")
    stats = json.loads(p.stdout.strip().splitlines()[-1])
    return {k: stats[k] for k in IO_KEYS}


def ioreplay_check(a):
    from workbench.store.manifest import Manifest
    from workbench.store.synth import synth_store

    policies, arenas = a.policies.split(","), a.arenas.split(",")
    workers = int(a.workers or 2)
    tokens = a.tokens or 64
    work = Path(tempfile.mkdtemp(prefix="bench-ioreplay-"))
    t_all = time.perf_counter()
    try:
        store = synth_store(work / "store", like="qwen3-30b-a3b", layers=a.io_layers, progress=False)
        m = Manifest.load(store)
        trace = work / "zipf.parquet"
        synthetic_trace(trace, n_tokens=tokens, n_layers=a.io_layers, n_experts=m.n_experts, top_k=m.top_k, kind="zipf",
                        expert_bytes=m.expert_bytes)
        grid = Grid(traces=[trace], kind="ioreplay", store=str(store), policies=policies, arenas=arenas,
                    timing={"compute_s": 0.0}, cache="cold", io_mode=a.io_mode)
        client, cluster = open_client(workers=workers)
        alone, inside, cpu = {}, {}, []
        try:
            client.submit(sum, [1]).result()
            def run_alone(rep):
                for p in policies:
                    for ar in arenas:
                        alone.setdefault((p, ar), []).append(ioreplay_alone(trace, store, p, ar, a.io_mode))

            def run_sweep(rep):
                res = sweep(grid, work / f"out-{rep}", client=client, progress=False)
                assert res.ran == len(policies) * len(arenas), res
                for r in load_sweep(work / f"out-{rep}").to_dict("records"):
                    inside.setdefault((r["policy"], r["arena"]), []).append({k: r[k] for k in IO_KEYS})

            for rep in range(a.reps):
                with OtherCPU() as c:
                    for step in ((run_alone, run_sweep) if rep % 2 == 0 else (run_sweep, run_alone)):
                        step(rep)
                cpu.append(c)
        finally:
            client.close()
            cluster.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(machine_line() + f"; whole run {time.perf_counter() - t_all:.0f} s")
    print(f"Store: synthetic, Qwen3-30B-A3B expert shape ({m.expert_bytes / 2**20:.2f} MiB experts, 4-bit), "
          f"{a.io_layers} layers x {m.n_experts} experts; trace: Zipf, {tokens} decode tokens, top-{m.top_k}. "
          f"Cells cold, no compute, {a.io_mode} reads; the sweep on {workers} workers (one cell per disk at a time). "
          f"{a.reps} reps, alone and sweep in alternating order.")
    loads = [x for c in cpu for x in c.load]
    print(f"Other processes kept {spread([c.cores for c in cpu])} cores busy, the hypervisor took "
          f"{spread([c.steal for c in cpu])} cores (median over reps, min-max); load average "
          f"{min(loads):.1f}-{max(loads):.1f}.")
    print()
    print("Token ms: the median token time of each replay, then the median over reps; each side's own spread is "
          "max / min over its reps (how far one run of the same cell strays from another).")
    print()
    print("| policy | arena | token ms alone | token ms sweep | sweep / alone (median) | ratio over reps | "
          "alone max/min | sweep max/min | GB/s alone | GB/s sweep | disk MB alone / sweep | same residency | within 10% |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key in alone:
        al, sw = alone[key], inside[key]
        ratios = [s["median_token_ms"] / x["median_token_ms"] for x, s in zip(al, sw)]
        same = all(x["residency_hash"] == s["residency_hash"] for x, s in zip(al, sw))
        ratio = statistics.median(ratios)
        print(f"| {key[0]} | {key[1]} | {_med(al, 'median_token_ms'):.2f} | {_med(sw, 'median_token_ms'):.2f} | "
              f"{ratio:.3f} | {min(ratios):.3f}-{max(ratios):.3f} | {_strays(al):.2f} | {_strays(sw):.2f} | "
              f"{_gbs(al):.2f} | {_gbs(sw):.2f} | {_disk_mb(al):.0f} / {_disk_mb(sw):.0f} | "
              f"{'yes' if same else 'NO'} | {'yes' if abs(ratio - 1) <= 0.10 else 'no'} |")


def _med(rows, key):
    return statistics.median(r[key] for r in rows)


def _gbs(rows):
    return statistics.median(r["bytes_read"] / r["wall_s"] / 1e9 for r in rows)


def _disk_mb(rows):
    return statistics.median((r["disk_bytes"] or 0) / 1e6 for r in rows)


def _strays(rows):
    """How far one run of the same cell strays from another: max / min token time over reps."""
    return max(r["median_token_ms"] for r in rows) / min(r["median_token_ms"] for r in rows)


if __name__ == "__main__":
    main()
