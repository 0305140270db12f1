"""Replay speed: our policies' fast replay vs libCacheSim on the same 1M-lookup trace.

    python bench/bench_sim.py [--lookups 1000000] [--arena 0.25] [--no-append]

Builds a synthetic trace (48 layers x 128 experts, top-8, Zipf-like popularity per layer),
replays it through lru/fifo/lfu, exports it as oracleGeneral and replays that with libCacheSim
when it is importable (optional GPL extra: pip install libcachesim). Then times every policy's
hand-written ``replay()`` against the step-by-step protocol it is tested to equal (``Policy.replay``)
on a smaller prefix. Prints lookups/s, checks that miss counts agree, and appends a dated section
to bench/RESULTS.md (unless --no-append).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.analysis.bounds import belady_misses  # noqa: E402
from workbench.arena.policies import make_policy  # noqa: E402
from workbench.arena.policies.base import Policy  # noqa: E402
from workbench.fsutil import atomic_write  # noqa: E402
from workbench.sim.export import export_oraclegeneral  # noqa: E402
from workbench.sim.replay import replay  # noqa: E402
from workbench.sim.requests import parse_arena, requests_from_trace  # noqa: E402
from workbench.trace.synthetic import routes_trace  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def make_trace(path, lookups, n_layers=48, n_experts=128, top_k=8, seed=0, alpha=1.0):
    """A Zipf-popularity routing trace with about ``lookups`` requests (vectorized)."""
    rng = np.random.default_rng(seed)
    n_tokens = max(1, lookups // (n_layers * top_k))
    w = 1.0 / np.arange(1, n_experts + 1) ** alpha
    w /= w.sum()
    perms = np.stack([rng.permutation(n_experts) for _ in range(n_layers)])
    # top_k distinct experts per (token, layer): Gumbel top-k over log weights
    g = np.log(w)[None, None, :] + rng.gumbel(size=(n_tokens, n_layers, n_experts))
    ranks = np.argsort(-g, axis=-1)[..., :top_k]
    sel = np.take_along_axis(np.broadcast_to(perms[None], (n_tokens, n_layers, n_experts)), ranks, axis=-1)
    routes_trace(path, sel, n_experts, weights=np.full(sel.shape, 1.0 / top_k),
                 meta={"model_type": "synthetic-bench", "expert_bytes": 1_179_648})


def timed(fn, repeat=5, setup=None):
    """Best CPU time (process_time: this core's seconds, robust to other load) over ``repeat`` runs."""
    best, out = float("inf"), None
    for _ in range(repeat):
        arg = setup() if setup else None
        t = time.process_time()
        out = fn(arg) if setup else fn()
        best = min(best, time.process_time() - t)
    return best, out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lookups", type=int, default=1_000_000)
    ap.add_argument("--arena", default="0.25")
    ap.add_argument("--repeat", type=int, default=7, help="interleaved runs per policy (medians reported)")
    ap.add_argument("--loop-lookups", type=int, default=20_000,
                    help="lookups for each policy's replay() vs its step-by-step protocol")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="bench_sim."))
    trace = tmp / "bench.parquet"
    t0 = time.perf_counter()
    make_trace(trace, args.lookups)
    req = requests_from_trace(trace)
    keys = req.keys
    cap = parse_arena(args.arena, req.n_routed)
    print(f"trace: {len(keys)} lookups, {req.n_routed} routed experts, arena {args.arena} = {cap} slots "
          f"(built in {time.perf_counter() - t0:.1f}s)")

    rows = []
    ours, theirs = {}, {}
    lcs_version = None
    try:
        import libcachesim as lcs

        lcs_version = getattr(lcs, "__version__", "?")
        og = tmp / "bench.oracleGeneral.bin"
        export_oraclegeneral(trace, og)
        eb = 1_179_648
        lcs_classes = {"lru": lcs.LRU, "fifo": lcs.FIFO, "lfu": lcs.LFU, "belady": lcs.Belady}
    except ImportError:
        lcs_classes = {}

    def run_ours(name):
        if name == "belady":
            return belady_misses(keys, cap)
        return len(keys) - int(make_policy(name, cap).replay(keys).sum())

    # interleave ours and libCacheSim run by run so that load on a shared machine hits both alike
    for name in ("lru", "fifo", "lfu", "belady"):
        o_t, t_t = [], []
        for _ in range(args.repeat):
            sec, misses = timed(lambda: run_ours(name), repeat=1)
            o_t.append(sec)
            ours[name] = misses
            if name in lcs_classes:
                cls = lcs_classes[name]

                def setup(cls=cls):  # reader and cache built outside the timer, like our flattened keys
                    return lcs.TraceReader(str(og), lcs.TraceType.ORACLE_GENERAL_TRACE), cls(cap * eb)

                def run(arg):
                    reader, cache = arg
                    mr, _ = cache.process_trace(reader)
                    return int(round(mr * len(keys)))
                sec, lmiss = timed(run, repeat=1, setup=setup)
                t_t.append(sec)
                theirs[name] = lmiss
        o_rate = len(keys) / float(np.median(o_t)) / 1e6
        if t_t:
            t_rate = len(keys) / float(np.median(t_t)) / 1e6
            ratio = float(np.median(np.array(t_t) / np.array(o_t)))
            rows.append((name, o_rate, t_rate, ratio, ours[name], theirs[name]))
        else:
            rows.append((name, o_rate, None, None, ours[name], None))
    sec, res = timed(lambda: replay(trace, "lru", cap, preload=False), repeat=2)
    end_to_end = sec

    print(f"{'policy':>8} {'ours Mlookups/s':>16} {'libCacheSim Mlookups/s':>23} {'ours/lcs':>9} {'misses ours':>12} {'misses lcs':>11}")
    for name, rate, lrate, ratio, misses, lmiss in rows:
        if lrate is not None:
            agree = "" if lmiss == misses else "  MISMATCH"
            print(f"{name:>8} {rate:16.2f} {lrate:23.2f} {ratio:9.2f} {misses:12d} {lmiss:11d}{agree}")
        else:
            print(f"{name:>8} {rate:16.2f} {'n/a':>23} {'':>9} {misses:12d}")
    e2e = len(keys) / end_to_end / 1e6
    print(f"end to end (read Parquet + flatten + LRU replay): {e2e:.2f} M lookups/s, hit rate {res.hit_rate:.4f}")
    # each policy's hand-written replay() against the step-by-step protocol it must equal (Policy.replay,
    # the SimCache protocol): a fast loop stays only where this shows it pays
    small, loops = keys[:args.loop_lookups], []
    for name in ("lru", "fifo", "lfu", "slru", "twohit", "ds4", "static", "s3fifo"):
        f_t, s_t = [], []
        for _ in range(3):
            f_t.append(timed(lambda: make_policy(name, cap).replay(small), repeat=1)[0])
            s_t.append(timed(lambda: Policy.replay(make_policy(name, cap), small), repeat=1)[0])
        loops.append((name, len(small) / float(np.median(f_t)) / 1e6, len(small) / float(np.median(s_t)) / 1e6,
                      float(np.median(np.array(s_t) / np.array(f_t)))))
    print(f"{'policy':>8} {'replay() M/s':>13} {'step-by-step M/s':>17} {'speed-up':>9}   ({len(small)} lookups)")
    for name, fast, slow, ratio in loops:
        print(f"{name:>8} {fast:13.2f} {slow:17.3f} {ratio:8.1f}x")

    if not args.no_append:
        lines = [
            "",
            f"## Replay simulator speed, {dt.datetime.now().strftime('%Y-%m-%d %H:%M')}",
            "",
            f"Machine: {machine()}. libCacheSim: {lcs_version or 'not installed'}.",
            f"Command: `python bench/bench_sim.py --lookups {args.lookups} --arena {args.arena}`; "
            f"trace: {len(keys)} lookups (48 layers x 128 experts, top-8, Zipf per layer), {cap} slots. "
            f"One core, CPU time (time.process_time), medians of {args.repeat} runs interleaved ours/libCacheSim "
            "(the ratio is the median of per-pair ratios), replay loop only (ours: the trace already flattened "
            "to keys; libCacheSim: process_trace over a TraceReader of the exported oracleGeneral file, reader "
            "and cache built outside the timer). The machine is shared, so single runs vary by up to 2x.",
            "",
            "| policy | ours M lookups/s | libCacheSim M lookups/s | ours / libCacheSim | misses ours | misses libCacheSim |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for name, rate, lrate, ratio, m, lm in rows:
            lines.append(f"| {name} | {rate:.2f} | {'' if lrate is None else f'{lrate:.2f}'} | "
                         f"{'' if ratio is None else f'{ratio:.2f}'} | {m} | {'' if lm is None else lm} |")
        lines += ["", f"End to end (read Parquet, flatten, LRU replay): {e2e:.2f} M lookups/s.", "",
                  f"Each policy's hand-written `replay()` loop against the step-by-step protocol it is tested to equal "
                  f"(`Policy.replay`), first {len(small)} lookups, medians of 3 interleaved runs:", "",
                  "| policy | replay() M lookups/s | step-by-step M lookups/s | speed-up |", "| --- | --- | --- | --- |"]
        lines += [f"| {name} | {fast:.2f} | {slow:.3f} | {ratio:.1f}x |" for name, fast, slow, ratio in loops] + [""]
        text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
        atomic_write(RESULTS, lambda tmp: Path(tmp).write_text(text.rstrip("\n") + "\n" + "\n".join(lines)))
        print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()
