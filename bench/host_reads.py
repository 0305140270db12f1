"""What bringing one small device array to the host costs, per way of reading it (the engine does
it once per token, or once per MoE layer in per-layer decode): microseconds from launching the
kernel that makes it to having its values, medians.

    python bench/host_reads.py [--device gpu] [--n 300]
"""

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

READS = {
    "item": lambda y: y[0].item(),
    "np.array": np.array,
    "tolist": lambda y: y.tolist(),
    "eval, then np.array": lambda y: (mx.eval(y), np.array(y)),
}


def cost(read, size, n):
    x = mx.ones((size,), dtype=mx.uint32)
    mx.eval(x)
    ts = []
    for i in range(n):
        y = x + i  # a fresh device array, made by a kernel
        t = time.perf_counter()
        read(y)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts[n // 10:]) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--n", type=int, default=300)
    a = ap.parse_args()
    mx.set_default_device(mx.gpu if a.device == "gpu" else mx.cpu)
    print(f"mlx {mx.__version__} {mx.default_device()}: us per read of a fresh device array (median of {a.n})")
    for size in (1, 16, 1024):
        print(f"  {size:5d} uint32: " + "  ".join(f"{k} {cost(f, size, a.n):7.1f}" for k, f in READS.items()))


if __name__ == "__main__":
    main()
