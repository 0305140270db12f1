"""What one MoE layer's host round-trip costs on this backend, primitive by primitive.

    python bench/bench_sync.py [--device cpu|gpu] [--layers 12] [--tokens 64] [--reps 5] [--hidden 256]

A stand-in decode (per layer: a dense matmul, a router, top-k, the experts as a gather and a
matmul) is run with each per-layer variant below; medians over tokens and ``--reps`` interleaved
runs, printed as microseconds per layer above the lazy run and above the forced sync:
  lazy          the whole token is one graph (what resident mlx-lm does)
  sync          + mx.eval of the expert ids and a copy to numpy (the sync floor)
  +async        + mx.async_eval of the layer's output (its experts start at once)
  +upload       + the slot ids uploaded from numpy (mx.array) and used by the experts
  +upload+async both
  +lookup       + the slot ids gathered on the device from a device table (nothing uploaded)
  +kernel       + a custom kernel whose input table is uploaded and whose output is the ids (CUDA only)
  +pinned       the same kernel reading its table from pinned host memory, through an uploaded
                8-byte address (CUDA only)
  handshake     no sync: the engine's handshake kernel sends the ids to the host through pinned
                memory and waits in the device's stream for the slot ids the host writes back, while
                the host launches the layers after it (workbench/engine/handshake.py; CUDA only)
"""

import argparse
import datetime
import platform
import statistics
import time

import mlx.core as mx
import numpy as np

from workbench import cuda
from workbench.engine.engine import parse_device

_IDS_SOURCE = """
    const unsigned long long* t = (const unsigned long long*)table;
    for (unsigned long long i = threadIdx.x; i < t[0]; i += blockDim.x) out[i] = (unsigned int)t[1 + i];
"""
_PINNED_SOURCE = """
    const unsigned long long* t = (const unsigned long long*)(*(const unsigned long long*)where);
    for (unsigned long long i = threadIdx.x; i < t[0]; i += blockDim.x) out[i] = (unsigned int)t[1 + i];
"""


def variants(kernel):
    names = ["lazy", "sync", "+async", "+upload", "+upload+async", "+lookup"]
    return names + (["+kernel", "+pinned", "handshake"] if kernel is not None else [])


def token(x, w, lut, variant, kernel, top_k):
    """One stand-in decode token through ``len(w)`` layers with ``variant`` per layer; evaluated."""
    if variant == "handshake":
        hs, perm = kernel[3], kernel[4]
        f = hs.begin(through=False)  # every layer waits for the host's answer

        def claim(layer, ids, extra):  # the host's answer: a fixed expert -> slot permutation
            return [perm[e] for e in ids]
    for i, (dense, router, experts) in enumerate(w):
        h = mx.tanh(x @ dense)
        idx = mx.argpartition(-(h @ router), kth=top_k - 1, axis=-1)[..., :top_k].reshape(-1)
        slots = idx
        if variant == "handshake":
            slots = hs.slots(f, i, idx)
        elif variant != "lazy":
            mx.eval(idx)
            ids = np.array(idx)
            if "upload" in variant:
                slots = mx.array(ids.astype(np.uint32))
            elif variant == "+lookup":
                slots = lut[idx]
            elif variant == "+kernel":
                table = np.concatenate([[ids.size], ids]).astype(np.uint64)
                slots = kernel[0](inputs=[mx.array(table)], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                                  output_shapes=[ids.shape], output_dtypes=[mx.uint32])[0]
            elif variant == "+pinned":  # layer i's table: the previous token's kernels have run (its eval)
                host, where = kernel[2][0][i]
                host[0], host[1:1 + ids.size] = ids.size, ids
                slots = kernel[1](inputs=[mx.array(np.uint64(where))], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                                  output_shapes=[ids.shape], output_dtypes=[mx.uint32])[0]
        y = (mx.take(experts, slots, axis=0) @ h.reshape(-1, 1)).sum(axis=0).reshape(1, -1)
        if variant.endswith("async"):
            mx.async_eval(y)
        if variant == "handshake":
            mx.async_eval(y)
            f.last = y
            hs.serve(f, claim, wait=False)
        x = x + y * 0.01
    if variant == "handshake":
        mx.async_eval(x)
        f.last = x
        hs.serve(f, claim, wait=True)
    mx.eval(x)
    return x


def pinned_tables(n, top_k):
    """``n`` tables of 1 + top_k uint64 in pinned host memory, as (numpy view, the GPU's address), and
    the memory itself (freed once that is gone: keep it)."""
    chunk = cuda.Pinned(cuda.runtime(), n * 64 * 8)
    flat = np.frombuffer(chunk.buffer, dtype=np.uint64)
    return [(flat[i * 64:i * 64 + 1 + top_k], chunk.device + i * 64 * 8) for i in range(n)], chunk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    a = ap.parse_args()
    dev = parse_device(a.device)
    if dev is not None:
        mx.set_default_device(dev)
    gpu = mx.default_device() != mx.cpu
    kernel = None
    if gpu and cuda.available():
        kernel = (mx.fast.cuda_kernel(name="bench_sync_ids", input_names=["table"], output_names=["out"],
                                      source=_IDS_SOURCE),
                  mx.fast.cuda_kernel(name="bench_sync_pinned", input_names=["where"], output_names=["out"],
                                      source=_PINNED_SOURCE),
                  pinned_tables(a.layers, a.top_k))
        from workbench.engine.handshake import Handshake

        hs = Handshake(range(a.layers), a.top_k, placeholder=0)
        if not hs._self_test():
            raise SystemExit("the handshake's self-test failed on this device")
        kernel += (hs, np.random.default_rng(0).permutation(a.experts).tolist())
    mx.random.seed(0)
    d, e = a.hidden, a.experts
    w = [(mx.random.normal((d, d)) / d ** 0.5, mx.random.normal((d, e)), mx.random.normal((e, d, d)) / d ** 0.5)
         for _ in range(a.layers)]
    lut = mx.array(np.random.default_rng(0).permutation(e).astype(np.uint32))
    mx.eval(w, lut)
    names = variants(kernel)
    times = {n: [] for n in names}
    x0 = mx.random.normal((1, d))
    for rep in range(a.reps + 1):  # the first round warms up (kernels compiled, graphs cached)
        for n in (names if rep % 2 == 0 else names[::-1]):
            x, per = x0, []
            for _ in range(a.tokens):
                t = time.perf_counter()
                x = token(x, w, lut, n, kernel, a.top_k)
                per.append(time.perf_counter() - t)
            if rep:
                times[n].append(statistics.median(per) * 1e6 / a.layers)
    print(f"{datetime.datetime.now():%Y-%m-%d %H:%M} | {platform.machine()} {platform.system()} | mlx {mx.__version__} | "
          f"device {mx.default_device()} | {a.layers} layers, hidden {d}, {e} experts, top-{a.top_k}, "
          f"{a.tokens} tokens x {a.reps} reps")
    med = {n: statistics.median(v) for n, v in times.items()}
    print(f"{'variant':<14} {'us/layer':>9} {'over lazy':>10} {'over sync':>10}   runs")
    for n in names:
        print(f"{n:<14} {med[n]:9.1f} {med[n] - med['lazy']:10.1f} {med[n] - med['sync']:10.1f}   "
              + " ".join(f"{v:.1f}" for v in times[n]))


if __name__ == "__main__":
    main()
