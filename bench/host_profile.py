"""Where the host's time goes in decode, sampled by py-spy: resident mlx-lm or the engine, decode only.

    python bench/host_profile.py [--mid | --wide [H,W,E]] [--device gpu] --who engine|resident
                                 [--arena 0.25] [--writes staged] [--temp 0] [--seconds 15] [--rate 100]
                                 [--native] [--out DIR] [--top 30]

Builds the model (``bench_engine``'s), warms up, then starts ``py-spy record`` on this process for
``--seconds`` while it decodes long generations (a seeded 64-token prompt, then ``--tokens`` tokens each),
and prints the functions with the most samples: inclusive (the function and what it calls) and self,
as a share of all samples of the decoding thread. ``--native`` adds C/C++ frames (MLX's eval, CUDA's
graph calls); py-spy then stops the process for each sample (it cannot unwind native stacks without),
so the handshake's device waits up to 5 s for an answer instead of giving the token up.
Needs py-spy (``pip install py-spy``) and ptrace rights (root, or
``kernel.yama.ptrace_scope=0``). The raw collapsed stacks are written to ``DIR/WHO.txt``: read them with
any flame graph tool. ``bench_host.py`` times the engine's own functions without sampling.
"""

import argparse
import collections
import os
import shutil
import subprocess
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model

from bench_engine import mid_model, sampler_for, wide_model
from workbench.config import ArenaConfig
from workbench.data import default_model
from workbench.engine.engine import Engine, parse_device


def decode_for(seconds, step):
    """Call ``step()`` until ``seconds`` have passed; how many calls."""
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        step()
        n += 1
    return n


def shares(path, top):
    """(inclusive, self) sample counts per frame name, and the total, from py-spy's raw output."""
    incl, own, total = collections.Counter(), collections.Counter(), 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f.split(" (")[0] for f in stack.split(";")]
        if not any("decode_for" in f for f in frames):  # another thread (I/O workers, MLX's own)
            continue
        total += n
        for f in set(frames):
            incl[f] += n
        own[frames[-1]] += n
    return incl.most_common(top), own.most_common(top), total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mid", action="store_true")
    ap.add_argument("--wide", nargs="?", const="2048,768,128", default=None, metavar="H,W,E")
    ap.add_argument("--device", default=None)
    ap.add_argument("--who", choices=["engine", "resident"], default="engine")
    ap.add_argument("--arena", default="0.25")
    ap.add_argument("--writes", default=None)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--tokens", type=int, default=200, help="tokens per generation")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rate", type=int, default=100)
    ap.add_argument("--native", action="store_true")
    ap.add_argument("--out", default=".")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    dev = parse_device(a.device)
    if dev is not None:
        mx.set_default_device(dev)
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("host_profile: py-spy is not installed (pip install py-spy)")
    path = mid_model() if a.mid else wide_model(a.wide) if a.wide else Path(default_model())
    vocab = load_model(path, lazy=True)[0].args.vocab_size
    prompt = np.random.default_rng(0).integers(1, vocab, 64).tolist()  # as bench_engine's random models
    eng, stats = None, None
    if a.who == "engine":
        eng = Engine.open(path, arena=ArenaConfig(a.arena, writes=a.writes), progress=False)
        if a.native and eng.handshake is not None:  # py-spy stops the process for each sample: the device must
            eng.handshake.set_timeout(5.0)  # not give a token up meanwhile (a recompute would skew the samples)
        stats = {}

        def step():
            mx.random.seed(7)
            res = eng.generate(prompt, max_tokens=a.tokens, progress=False, sampler=sampler_for(a.temp))
            stats.update(res.stats)
    else:
        model = load_model(path)[0]

        def step():
            mx.random.seed(7)
            for (tok, _), _ in zip(generate_step(mx.array(prompt), model, sampler=sampler_for(a.temp)), range(a.tokens)):
                pass
    try:
        profile(a, spy, path, step, stats)
    finally:
        if eng is not None:
            eng.close()


def profile(a, spy, path, step, stats):
    """Warm up, then decode under ``py-spy record`` and print the shares (``stats``: the engine's last run's)."""
    decode_for(3.0, step)  # warm: kernels loaded, page cache, the arena's decode set
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / f"{a.who}.txt"
    cmd = [spy, "record", "--pid", str(os.getpid()), "--rate", str(a.rate), "--duration", str(int(a.seconds)),
           "--format", "raw", "-o", str(raw)] + (["--native"] if a.native else ["--nonblocking"])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # py-spy attaches
    t0 = time.perf_counter()
    calls = decode_for(a.seconds + 1.0, step)
    ms = (time.perf_counter() - t0) * 1e3 / (calls * a.tokens)
    err = proc.communicate(timeout=120)[1]
    if proc.returncode != 0 or not raw.exists():
        raise SystemExit(f"host_profile: py-spy failed ({proc.returncode}): {err.strip()[-400:]}")
    incl, own, total = shares(raw, a.top)
    extra = ""
    if stats is not None:
        extra = (f" | hit rate {stats['hit_rate']:.1%}, distinct {stats['distinct_tokens']}/{stats['tokens']}, "
                 f"handshake tokens {stats['handshake_tokens']}, optimistic {stats['optimistic_tokens']}")
    print(f"{a.who} | {path.name} | arena {a.arena} | temp {a.temp} | {ms:.2f} ms/token over {calls} x {a.tokens} tokens"
          f"{extra} | {total} samples of the decoding thread")
    for title, rows in (("inclusive", incl), ("self", own)):
        print(f"-- {title}")
        for name, n in rows:
            print(f"{n / max(1, total):6.1%}  {name[:160]}")


if __name__ == "__main__":
    main()
