"""Host time of a decode token's expert matmuls on per-layer tensors (resident mlx-lm) against one arena
tensor shared by all layers (the engine), under MLX's graph size limit.

    python bench/gpu_graphs.py [--device gpu] [--layers 16] [--experts 128] [--slots 512] [--hidden 2048]
                               [--width 768] [--tokens 64] [--reps 5] [--layout both|per-layer|arena]

MLX's GPU backends end a command buffer (on CUDA: a graph, launched then) once its ops number more than
``MLX_MAX_OPS_PER_BUFFER`` or their inputs add up to ``MLX_MAX_MB_PER_BUFFER`` (CUDA on an H100/H200:
100 ops, 1000 MB), counting each input's whole buffer. A gather from one tensor of all the arena's slots
counts the whole arena, so the engine's expert matmuls could end graphs more often than resident
mlx-lm's, and each graph costs the host a launch. This builds Qwen3-30B-A3B's expert shape (4-bit,
group 64, top-8) both ways, with random weights, and times tokens of ``--layers`` layers, each a few
elementwise ops and the three expert matmuls (gather_qmm) with SwiGLU, built whole, then evaluated
(``mx.async_eval`` and a wait, as generate_step does): per token the host's time building and
launching, and the wall time, medians of ``--reps``, both layouts interleaved in one process. Run it
with and without ``MLX_MAX_MB_PER_BUFFER=1000000`` (no byte limit; MLX reads it once, at its first GPU
stream); with ``MLX_SAVE_CUDA_GRAPHS_DOT_FILE=DIR/g`` MLX writes one file per graph, so ``--layout``
alone gives each layout's graphs per token. The answer on the H200 (bench/RESULTS.md, gpu_graphs): the
arena ends about two more graphs per 16-layer token, which cost no host time that shows.
"""

import argparse
import os
import statistics
import time

import mlx.core as mx

from workbench.engine.engine import parse_device


LABELS = {"per-layer": "per-layer tensors", "arena": "one arena tensor"}


def quantized(n, rows, cols, bits=4, group=64):
    """``n`` random 4-bit matrices [rows, cols]: codes, scales, biases (as ``mx.quantize`` lays them out)."""
    codes = mx.random.randint(0, 2**32 - 1, (n, rows, cols * bits // 32)).astype(mx.uint32)
    scales = (mx.random.uniform(shape=(n, rows, cols // group)) * 0.01).astype(mx.float16)
    biases = (mx.random.uniform(shape=(n, rows, cols // group)) * -0.005).astype(mx.float16)
    return codes, scales, biases


def layer_weights(n, hidden, width):
    return {"gate": quantized(n, width, hidden), "up": quantized(n, width, hidden), "down": quantized(n, hidden, width)}


def experts(x, w, ids):
    """SwitchGLU's math for one token: gate/up/down through gather_qmm on the rows ``ids``."""
    x = mx.expand_dims(x, (-2, -3))
    g = mx.gather_qmm(x, *w["gate"], rhs_indices=ids, transpose=True, group_size=64, bits=4)
    u = mx.gather_qmm(x, *w["up"], rhs_indices=ids, transpose=True, group_size=64, bits=4)
    h = (g * mx.sigmoid(g)) * u
    return mx.gather_qmm(h, *w["down"], rhs_indices=ids, transpose=True, group_size=64, bits=4).squeeze(-2).sum(axis=-2)


def token(x, weights_of, ids_of, layers):
    for layer in range(layers):
        h = x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + 1e-6)  # a few of the layer's other nodes
        x = x + experts(h, weights_of(layer), ids_of(layer)).astype(x.dtype) * 0.01
    return x


def timed(x, weights_of, ids, layers, tokens):
    """Per-token (host ms building and launching, wall ms), medians over ``tokens``."""
    host, wall = [], []
    for t in range(tokens):
        t0 = time.perf_counter()
        y = token(x, weights_of, lambda layer: ids[t % len(ids)][layer], layers)
        mx.async_eval(y)
        t1 = time.perf_counter()
        mx.eval(y)
        host.append((t1 - t0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(host), statistics.median(wall)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--slots", type=int, default=512, help="the arena's slots, shared by every layer (25%% of 16 x 128)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layout", choices=["both", "per-layer", "arena"], default="both",
                    help="time one layout alone (to count its graphs)")
    a = ap.parse_args()
    dev = parse_device(a.device)
    if dev is not None:
        mx.set_default_device(dev)
    mx.random.seed(0)
    per_layer = [layer_weights(a.experts, a.hidden, a.width) for _ in range(a.layers)]
    arena = layer_weights(a.slots + 1, a.hidden, a.width)
    mx.eval(per_layer, arena)
    mb = lambda ws: sum(v.nbytes for w in ws for t in w.values() for v in t) / 1e6  # noqa: E731
    ids = [[mx.random.randint(0, a.experts, (1, 1, a.top_k)).astype(mx.uint32) for _ in range(a.layers)]
           for _ in range(8)]
    slot_ids = [[mx.random.randint(0, a.slots, (1, 1, a.top_k)).astype(mx.uint32) for _ in range(a.layers)]
                for _ in range(8)]
    x = mx.random.normal((1, a.hidden)).astype(mx.float16)
    mx.eval(ids, slot_ids, x)
    sides = {"per-layer": (lambda layer: per_layer[layer], ids), "arena": (lambda layer: arena, slot_ids)}
    sides = {k: v for k, v in sides.items() if a.layout in ("both", k)}
    for name, (weights_of, which) in sides.items():  # warm: kernels compiled, graphs cached
        timed(x, weights_of, which, a.layers, 8)
    got = {name: [] for name in sides}
    for _ in range(a.reps):
        for name, (weights_of, which) in sides.items():
            got[name].append(timed(x, weights_of, which, a.layers, a.tokens))
    print(f"device {mx.default_device()} | mlx {mx.__version__} | MLX_MAX_MB_PER_BUFFER="
          f"{os.environ.get('MLX_MAX_MB_PER_BUFFER', '(MLX default)')} | {a.layers} layers, top-{a.top_k}, "
          f"per-layer tensors {mb(per_layer):.0f} MB, arena {mb([arena]):.0f} MB | {a.tokens} tokens x {a.reps} reps")
    print("layout              host ms/token (build + async_eval)  wall ms/token   [every rep's host ms]")
    for name, rows in got.items():
        host = [h for h, _ in rows]
        print(f"{LABELS[name]:<20} {statistics.median(host):10.3f}                    {statistics.median(w for _, w in rows):10.3f}"
              f"      {' '.join(f'{h:.3f}' for h in host)}")


if __name__ == "__main__":
    main()
