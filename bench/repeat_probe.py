"""Is the GPU run-to-run deterministic? The same runs repeated, no delays injected.

    python bench/repeat_probe.py [--device gpu]

Resident mlx-lm (reference model and a tiny random 4-bit qwen3_moe): are repeated runs' log-probs
bit-identical? The engine with read-ahead in auto decode: are repeated runs' tokens and residency
hashes identical? If they differ here, a residency difference under injected read delays is the
backend's nondeterminism, not the I/O timing.
"""

import argparse
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    a = ap.parse_args()
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    from workbench.data import default_model
    from workbench.engine.engine import Engine, EngineError, parse_device
    from workbench.randmodel import make_random_model
    from workbench.routing.setup import configure
    from workbench.store.pack import pack

    dev = parse_device(a.device)
    if dev is not None:
        mx.set_default_device(dev)
    prompt = [9, 4, 27, 31, 2, 88, 5, 60, 13, 101]
    with tempfile.TemporaryDirectory() as d:
        tiny = make_random_model(Path(d) / "m", "qwen3_moe", seed=1, quantize_bits=4, moving=True, layers=4,
                                 experts=16, top_k=4, hidden=64, expert_width=32, vocab=128)
        store = pack(tiny, Path(d) / "s", progress=False)
        for name, path in (("reference", default_model()), ("tiny", tiny)):
            model, _ = load_model(Path(path))
            runs = [np.stack([np.array(lp.astype(mx.float32)) for (_, lp), _ in
                              zip(generate_step(mx.array(prompt), model), range(12))]) for _ in range(4)]
            same = [bool(np.array_equal(r, runs[0], equal_nan=True)) for r in runs[1:]]
            nan = [int(np.isnan(r).any(axis=1).sum()) for r in runs]
            spread = max(float(np.nanmax(np.abs(r - runs[0]))) for r in runs[1:])
            print(f"resident {name}: repeats bit-identical {same}, steps with NaN per run {nan}, max |diff| {spread:.2e}")
        out = []
        for _ in range(4):
            with Engine(store, arena="0.4", io_workers=4, progress=False) as eng:
                configure(eng, predictor="layer", lookahead=1, gate="confidence")
                try:
                    r = eng.generate(prompt, max_tokens=12)
                    out.append((tuple(r.tokens), r.stats["residency_hash"], r.stats["recomputes"]))
                except EngineError as e:
                    out.append(("non-finite", str(e)[:60], None))
        print(f"engine auto + read-ahead, 4 runs: distinct (tokens, residency) {len({o[:2] for o in out})}; "
              f"hashes {[o[1] for o in out]}, recomputes {[o[2] for o in out]}")


if __name__ == "__main__":
    main()
