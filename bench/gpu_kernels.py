"""What the GPU runs per decode token: resident mlx-lm, the sync floor and the engine, side by side.

    python bench/gpu_kernels.py [--model DIR | --mid | --wide [H,W,E]] [--tokens 32] [--arenas 1.0,0.25] [--decode auto,layer]
                                [--writes staged,mapped]

CUDA only: kernels and copies are recorded through CUPTI (torch.profiler, which sees every
kernel of the process, MLX's included). Per row: wall ms per token, kernels per token, the GPU's
busy time per token (sum of kernel and copy durations) and the share of the wall time the GPU
was idle (host-bound when high); then the kernels that take the most GPU time per token.
"""

import argparse
import itertools
import time

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model

from bench_engine import mid_model, set_copy_grid, sync_floor_model, wide_model
from workbench.config import ArenaConfig
from workbench.data import default_model
from workbench.engine.engine import Engine


def _profiled(fn):
    """(wall ms, {kernel name: (calls, us)}) of one call of ``fn``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        fn()
        wall = (time.perf_counter() - t) * 1e3
    rows = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0
        if us > 0:
            rows[e.key] = (e.count, us)
    return wall, rows


def kernels(run, n):
    """Decode only: a run of ``n`` tokens less a run of one (prompt and first token), per token:
    (wall ms, [(name, calls, us)] by GPU time)."""
    wall, rows = _profiled(lambda: run(n))
    wall1, rows1 = _profiled(lambda: run(1))
    out = []
    for name, (calls, us) in rows.items():
        c1, u1 = rows1.get(name, (0, 0.0))
        out.append((name, (calls - c1) / (n - 1), (us - u1) / (n - 1)))
    return (wall - wall1) / (n - 1), sorted(out, key=lambda r: -r[2])


def report(label, wall, rows, top):
    busy = sum(r[2] for r in rows) / 1e3
    print(f"{label:<28} wall {wall:7.2f} ms/tok  kernels {sum(r[1] for r in rows):6.0f}/tok  "
          f"gpu busy {busy:6.2f} ms/tok  idle {max(0.0, 1 - busy / wall):5.1%}", flush=True)
    for name, calls, us in rows[:top]:
        print(f"    {us:8.1f} us/tok {calls:6.1f} calls/tok  {name[:110]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--mid", action="store_true")
    ap.add_argument("--wide", nargs="?", const="2048,768,128", default=None, metavar="H,W,E",
                    help="the random qwen3_moe at an expert shape (bench_engine.py --wide)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--arenas", default="1.0,0.25")
    ap.add_argument("--decode", default="auto,layer")
    ap.add_argument("--writes", default=None, help="slot write modes to compare, e.g. staged,mapped (default: the "
                    "backend's)")
    ap.add_argument("--copy-grid", default="engine", help="staged slots under the handshake: its kernel's grid, "
                    "comma-separated values to compare: adaptive, wide, one (Handshake.grid); default: the engine's")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    try:
        import torch.profiler  # noqa: F401
    except ImportError:
        raise SystemExit("gpu_kernels: needs torch (its profiler reads CUPTI)")
    mx.set_default_device(mx.gpu if mx.cuda.is_available() else mx.cpu)
    path = wide_model(a.wide) if a.wide else mid_model() if a.mid else (a.model or default_model())
    prompt = list(range(1, 33))
    n = a.tokens

    def resident(model):
        def run(tokens):
            for _ in zip(generate_step(mx.array(prompt), model), range(tokens)):
                pass
        return run

    model, floor = load_model(path)[0], sync_floor_model(path)
    for label, m in (("resident mlx-lm", model), ("sync floor", floor)):
        resident(m)(n)
        report(label, *kernels(resident(m), n), a.top)
    combos = itertools.product(a.arenas.split(","), a.decode.split(","), a.writes.split(",") if a.writes else [None],
                               a.copy_grid.split(","))
    for arena, decode, writes, grid in combos:
        with Engine.open(path, arena=ArenaConfig(arena, writes=writes), decode=decode, progress=False) as eng:
            set_copy_grid(eng, grid)
            def run(tokens):
                r = eng.generate(prompt, max_tokens=tokens, progress=False)
                if tokens == n:
                    run.stats = r.stats
            run(n)
            wall, rows = kernels(run, n)
            s = run.stats
            report(f"engine {arena} {decode} ({eng.arena.writes}{'' if grid == 'engine' else ', grid ' + grid})",
                   wall, rows, a.top)
            print(f"    hit rate {s['hit_rate']:.1%}, distinct {s['distinct_tokens']}/{s['tokens']}, "
                  f"optimistic {s['optimistic_tokens']}, recomputes {s['recomputes']}", flush=True)


if __name__ == "__main__":
    main()
