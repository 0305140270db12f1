"""When do non-finite logits appear? Resident mlx-lm and the engine, repeated, on one backend.

    python bench/nan_probe.py [--model DIR] [--runs 8] [--processes 4] [--device gpu]

Counts runs whose logits hold a NaN or inf at any decode step:
  resident-fresh   mlx-lm generate_step, each run in a fresh process (first run after start-up)
  resident-warm    the same, repeated in one process
  engine-<writes>  the engine at a 50% arena with layer read-ahead (the configuration that once gave
                   token 0 at every step on CUDA), per slot-write mode, repeated in one process
"""

import argparse
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np


def resident_nonfinite(path, prompt, n) -> int:
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(path))
    bad = 0
    for (tok, logprobs), _ in zip(generate_step(mx.array(prompt), model, max_tokens=n), range(n)):
        bad += int(not np.isfinite(np.array(logprobs.astype(mx.float32))).all())
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--device", default=None)
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    from workbench.data import default_model
    from workbench.config import AheadConfig, ArenaConfig
    from workbench.engine.engine import Engine, EngineError, parse_device

    dev = parse_device(a.device)
    if dev is not None:
        mx.set_default_device(dev)
    path = a.model or str(default_model())
    prompt = list(range(5, 37))
    if a.child:
        print(resident_nonfinite(path, prompt, a.tokens))
        return
    fresh = []
    for _ in range(a.processes):
        cmd = [sys.executable, __file__, "--child", "--model", path, "--tokens", str(a.tokens)]
        if a.device:
            cmd += ["--device", a.device]
        out = subprocess.run(cmd, capture_output=True, text=True)
        fresh.append(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else f"error: {out.stderr[-200:]}")
    print(f"device {mx.default_device()} | mlx {mx.__version__} | {a.tokens} tokens per run")
    print(f"resident-fresh: non-finite steps per process {fresh}")
    warm = [resident_nonfinite(path, prompt, a.tokens) for _ in range(a.runs)]
    print(f"resident-warm:  non-finite steps per run {warm}")
    for writes in ("direct", "staged"):
        errors, tokens = [], set()
        with Engine.open(path, arena=ArenaConfig("0.5", writes=writes), ahead=AheadConfig("layer", 1), progress=False) as eng:
            for _ in range(a.runs):
                try:
                    tokens.add(tuple(eng.generate(prompt, max_tokens=a.tokens).tokens))
                    errors.append(0)
                except EngineError as e:
                    errors.append(1)
                    print(f"  engine-{writes}: {e}")
        print(f"engine-{writes}: runs with non-finite logits {sum(errors)}/{len(errors)}, distinct outputs {len(tokens)}")


if __name__ == "__main__":
    main()
