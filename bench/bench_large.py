"""Larger than RAM, measured: a synthetic store >= 1.25x this machine's memory, streamed by ioreplay.

    python bench/bench_large.py [--tokens 16] [--arenas 2GB,4GB,8GB] [--modes buffered,direct] [--dir DIR]

1. builds a store with GLM-4.5-Air's routed-expert shapes (4-bit, 9.73 MB experts; its depth cut to
   the fewest layers that reach --ram-factor x MemTotal, so the disk is not filled) in a temp dir;
2. records a trace of the reference model (``workbench run data/models/ref-moe --trace``);
3. measures the device's sequential read (one thread, 8 MiB reads, cold) buffered and direct;
4. runs ``workbench ioreplay --map-layers modulo --map-experts modulo`` once per (mode, arena),
   cold, in a child process, sampling its RSS, the store's pages in the page cache (mincore) and
   the system's page cache (/proc/meminfo Cached) every 0.2 s;
5. prints one markdown table and deletes everything it made.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import mmap
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.io.readpath import drop_cache, sequential_gbps  # noqa: E402
from workbench.store.manifest import EXPERTS  # noqa: E402
from workbench.store.reader import _libc  # noqa: E402
from workbench.store.synth import resolve_shape, store_bytes, synth_store  # noqa: E402

PROMPT = "def quicksort(items):\n    \"\"\"Sort a list of integers.\"\"\"\n"


def meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


class FileCache:
    """Bytes of one file resident in the page cache (mincore over a read-only mapping)."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size
        self.libc = _libc()
        self.addr = self.libc.mmap(None, self.size, mmap.PROT_READ, mmap.MAP_SHARED, self.fd, 0)
        self.vec = (ctypes.c_ubyte * (-(-self.size // mmap.PAGESIZE)))()

    def bytes(self) -> int:
        if self.libc.mincore(self.addr, self.size, self.vec) != 0:
            return -1
        return int((np.frombuffer(self.vec, dtype=np.uint8) & 1).sum()) * mmap.PAGESIZE

    def close(self):
        self.libc.munmap(ctypes.c_void_p(self.addr), self.size)
        os.close(self.fd)


def sample(pid, cache, out, stop):
    while not stop.is_set():
        out.append((time.perf_counter(), rss(pid), cache.bytes(), meminfo("Cached")))
        stop.wait(0.2)


def run_cli(args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "workbench.cli", *args], env=env, cwd=ROOT, **kw)


def ioreplay(trace, store, mode, arena, cache, compute_ms):
    args = ["ioreplay", str(trace), str(store), "--arena", arena, "--io-mode", mode, "--map-layers", "modulo",
            "--map-experts", "modulo", "--json"]
    if compute_ms is not None:
        args += ["--compute-ms", str(compute_ms)]
    drop_cache(Path(store) / EXPERTS)
    samples, stop = [], threading.Event()
    cached0 = meminfo("Cached")
    p = run_cli(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t = threading.Thread(target=sample, args=(p.pid, cache, samples, stop), daemon=True)
    t.start()
    out, err = p.communicate()
    stop.set()
    t.join()
    if p.returncode != 0:
        raise SystemExit(f"ioreplay failed ({mode}, {arena}): {err.strip().splitlines()[-1] if err.strip() else p.returncode}")
    st = json.loads(out)
    st["peak_rss"] = max(s[1] for s in samples)
    st["peak_store_cache"] = max(s[2] for s in samples)
    st["end_store_cache"] = samples[-1][2]
    st["peak_cached_growth"] = max(s[3] for s in samples) - cached0
    st["samples"] = len(samples)
    return st


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16, help="decode tokens in the reference trace")
    ap.add_argument("--arenas", default="2GB,4GB,8GB")
    ap.add_argument("--modes", default="buffered,direct")
    ap.add_argument("--like", default="glm-4.5-air")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--ram-factor", type=float, default=1.3, help="store size as a multiple of MemTotal")
    ap.add_argument("--min-factor", type=float, default=1.25, help="refuse a store smaller than this x MemTotal (smoke tests: 0)")
    ap.add_argument("--compute-ms", type=float, default=None, help="per-layer compute (default: the reference run's)")
    ap.add_argument("--dir", default=str(Path.home() / ".cache" / "workbench" / "bench"), help="where the temp store goes")
    a = ap.parse_args()

    ram = meminfo("MemTotal")
    preset = resolve_shape(a.like)
    per_layer = store_bytes(resolve_shape(a.like, layers=1), a.bits)[1]
    layers = min(preset.layers, math.ceil(a.ram_factor * ram / per_layer))
    expert, total = store_bytes(resolve_shape(a.like, layers=layers), a.bits)
    if total < a.min_factor * ram:
        raise SystemExit(f"--like {a.like} at {a.bits} bits is at most {total / 1e9:.1f} GB, under {a.min_factor}x RAM ({ram / 1e9:.1f} GB)")
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(a.dir).free
    print(f"RAM {ram / 2**30:.2f} GiB; store {layers} x {preset.experts} experts of {expert / 1e6:.2f} MB = {total / 1e9:.2f} GB "
          f"({total / ram:.2f}x RAM); {free / 1e9:.1f} GB free in {a.dir}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-large-", dir=a.dir))
    store, trace = work / "store", work / "ref.parquet"
    try:
        t0 = time.perf_counter()
        synth_store(store, like=a.like, bits=a.bits, layers=layers)
        build_s = time.perf_counter() - t0
        p = run_cli(["run", str(ROOT / "data/models/ref-moe"), "--prompt", PROMPT, "--max-tokens", str(a.tokens),
                     "--arena", "1.0", "--trace", str(trace), "--json"], stdout=subprocess.PIPE, text=True)
        ref = json.loads(p.communicate()[0])["stats"]
        if p.returncode:
            raise SystemExit("recording the reference trace failed")
        working_set = touched_bytes(trace, store)
        path = store / EXPERTS
        seq = {m: sequential_gbps(path, m, chunk=8 << 20, cold=True, limit=4 << 30) for m in ("buffered", "direct")}
        print(f"built in {build_s:.0f} s; sequential read (cold, 4 GiB, 8 MiB reads): "
              + ", ".join(f"{m} {g:.3f} GB/s" for m, g in seq.items()), flush=True)
        cache = FileCache(path)
        rows = []
        try:
            for mode in a.modes.split(","):
                for arena in a.arenas.split(","):
                    st = ioreplay(trace, store, mode, arena, cache, a.compute_ms)
                    st["mode_seq_gbps"] = seq.get(mode, seq["buffered"])
                    rows.append(st)
                    print(f"  {mode} {arena}: {st['bytes_per_token'] / 1e9:.3f} GB/token, {st['median_token_ms']:.0f} ms/token, "
                          f"peak RSS {st['peak_rss'] / 1e9:.2f} GB", flush=True)
        finally:
            cache.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(a, ram, layers, preset, expert, total, build_s, seq, ref, rows, working_set)


def touched_bytes(trace, store) -> int:
    """Bytes of the distinct store experts the mapped trace routes to (its working set)."""
    from workbench.sim.ioreplay import expert_map, layer_plan
    from workbench.store.manifest import Manifest
    from workbench.trace.schema import read_trace

    tr, m = read_trace(trace), Manifest.load(store)
    dec = tr.decode()
    to_store = expert_map(int(tr.meta["n_experts"]), m.n_experts, "modulo")
    used = {}
    for layer, sel in zip(dec.layer, dec.selected):
        used.setdefault(int(layer), set()).update(to_store(np.asarray(sel)).tolist())
    keys = {(sl, e) for sl, tl in layer_plan(tr.moe_layers, m.moe_layers, "modulo") for e in used.get(tl, ())}
    return len(keys) * m.expert_bytes


def report(a, ram, layers, preset, expert, total, build_s, seq, ref, rows, working_set):
    print()
    print(f"Machine: {platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, RAM {ram / 2**30:.2f} GiB. "
          f"Date: {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC.")
    print(f"Store: {a.like} expert shapes at {a.bits} bits, {layers} of {preset.layers} MoE layers x {preset.experts} experts, "
          f"{expert / 1e6:.2f} MB per expert, {total / 1e9:.2f} GB ({total / ram:.2f}x RAM), written in {build_s:.0f} s. "
          f"Trace: reference model, {ref['tokens']} decode tokens, 12 layers x 64 experts top-8 mapped modulo onto the store "
          f"({layers} layers per token), touching {working_set / 1e9:.2f} GB of distinct experts. Sequential read (cold, one thread, 8 MiB): buffered {seq['buffered']:.3f} GB/s, "
          f"direct {seq['direct']:.3f} GB/s.")
    print()
    print("| mode | arena | slots | hit rate | GB/token | ms/token (median) | floor ms/token | measured / floor "
          "| GB/s | share of seq | peak RSS GB | RSS - arena GB | store in page cache, peak GB | system Cached growth, peak GB |")
    print("|" + " --- |" * 14)
    for st in rows:
        arena_b = st["arena_slots"] * st["expert_bytes"]
        bpt = st["bytes_per_token"]
        floor = bpt / (st["mode_seq_gbps"] * 1e9) * 1e3 + st["compute_ms_per_token"]
        gbps = bpt / (st["median_token_ms"] / 1e3) / 1e9 if st["median_token_ms"] else 0.0
        print(f"| {st['io_mode']} | {arena_b / 1e9:.2f} GB | {st['arena_slots']} | {st['hit_rate']:.1%} | {bpt / 1e9:.3f} "
              f"| {st['median_token_ms']:.0f} | {floor:.0f} | {st['median_token_ms'] / floor:.2f} | {gbps:.3f} "
              f"| {gbps / st['mode_seq_gbps']:.2f} | {st['peak_rss'] / 1e9:.2f} | {(st['peak_rss'] - arena_b) / 1e9:.2f} "
              f"| {st['peak_store_cache'] / 1e9:.2f} | {st['peak_cached_growth'] / 1e9:.2f} |")
    print()
    print(f"compute per token (slept by ioreplay, the reference run's per-layer compute x {layers} layers): "
          f"{rows[0]['compute_ms_per_token']:.1f} ms; floor = GB/token / sequential GB/s (same mode) + compute.")


if __name__ == "__main__":
    main()
