"""Does every published slot hold exactly its expert's bytes? Where do non-finite values start?
Is the backend deterministic run to run?

    python bench/slot_probe.py [--device gpu]

On a tiny random 4-bit qwen3_moe (4 layers x 16 experts, top-4) and per slot-write mode: prefill
and a few decode tokens per-layer, then compare every published slot's tensors, byte for byte, with
its blob in the store; report whether resident mlx-lm and the engine produce finite logits; check
an isolated scatter into a slot tensor against numpy; and repeat identical runs (resident mlx-lm on
the reference model and tiny models at hidden 64 / group 32 and hidden 256 / group 64, the engine with read-ahead in auto decode): if repeats differ, a
residency difference under injected read delays is the backend's nondeterminism, not I/O timing.
"""

import argparse
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np


def slot_bytes(arena, s) -> bytes:
    out = []
    for t in arena.m.tensors:
        a = arena.tensors[t.name][s]
        if a.dtype == mx.bfloat16:
            a = a.view(mx.uint16)
        out.append(np.array(a).tobytes())
    return b"".join(out)


def mismatched_slots(eng) -> list:
    with open(eng.root / "experts.bin", "rb") as f:
        data = f.read()
    bad = []
    for key, s in sorted(eng.arena.smap.items()):
        if eng.arena.published[s]:
            layer, e = divmod(key, eng.m.n_experts)
            b = eng.m.blob(layer, e)
            if slot_bytes(eng.arena, s) != data[b.offset:b.offset + b.size]:
                bad.append((layer, e, s))
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    a = ap.parse_args()
    from workbench.config import AheadConfig, ArenaConfig, IOConfig
    from workbench.engine.engine import Engine, EngineError, parse_device
    from workbench.randmodel import make_random_model
    from workbench.store.pack import pack

    dev = parse_device(a.device)
    if dev is not None:
        mx.set_default_device(dev)
    print(f"device {mx.default_device()} | mlx {mx.__version__}")
    rng = np.random.default_rng(0)
    for rows, n in ((39, 3), (17, 4), (385, 8)):
        t = mx.zeros((rows, 32, 8), dtype=mx.uint32)
        mx.eval(t)
        ref = np.zeros((rows, 32, 8), dtype=np.uint32)
        for _ in range(5):
            idx = rng.choice(rows - 1, n, replace=False)
            vals = rng.integers(0, 2**32 - 1, (n, 32, 8), dtype=np.uint32)
            t[mx.array(idx.astype(np.uint32))] = mx.array(vals)
            ref[idx] = vals
            mx.eval(mx.sum(t.astype(mx.float32)))
        print(f"scatter into [{rows}, 32, 8]: matches numpy {bool((np.array(t) == ref).all())}")
    for out_dim, in_dim, group in ((16, 64, 32), (8, 64, 32), (128, 64, 32), (16, 128, 64), (64, 256, 64)):
        w = mx.array(rng.normal(0, 0.02, (out_dim, in_dim)).astype(np.float32))
        wq, sc, bi = mx.quantize(w, group_size=group, bits=4)
        worst = 0.0
        for rows in (1, 9):
            x = mx.array(rng.normal(0, 1, (rows, in_dim)).astype(np.float32))
            got = mx.quantized_matmul(x, wq, sc, bi, transpose=True, group_size=group, bits=4)
            ref = mx.quantized_matmul(x, wq, sc, bi, transpose=True, group_size=group, bits=4, stream=mx.cpu)
            g, r = np.array(got), np.array(ref)
            worst = max(worst, float(np.nan_to_num(np.abs(g - r), nan=np.inf).max()))
        print(f"quantized_matmul {in_dim}->{out_dim} group {group}: max |gpu - cpu| {worst:.2e}")
    for n, out_dim, in_dim, group, k, tokens in ((17, 32, 64, 32, 4, 9), (39, 32, 64, 32, 4, 1), (9, 32, 64, 32, 2, 19),
                                                 (65, 64, 256, 64, 8, 1)):
        w = mx.array(rng.normal(0, 0.02, (n, out_dim, in_dim)).astype(np.float32))
        wq, sc, bi = mx.quantize(w, group_size=group, bits=4)
        x = mx.array(rng.normal(0, 1, (1, tokens, 1, 1, in_dim)).astype(np.float32))
        idx = mx.array(rng.integers(0, n, (1, tokens, k)).astype(np.uint32))
        kw = dict(rhs_indices=idx, transpose=True, group_size=group, bits=4)
        g = np.array(mx.gather_qmm(x, wq, sc, bi, **kw))
        r = np.array(mx.gather_qmm(x, wq, sc, bi, **kw, stream=mx.cpu))
        print(f"gather_qmm [{n}, {out_dim}, {in_dim}] k={k} tokens={tokens}: finite {bool(np.isfinite(g).all())}, "
              f"max |gpu - cpu| {float(np.nan_to_num(np.abs(g - r), nan=np.inf).max()):.2e}")
    with tempfile.TemporaryDirectory() as d:
        model = make_random_model(Path(d) / "m", "qwen3_moe", seed=1, quantize_bits=4, moving=True, layers=4,
                                  experts=16, top_k=4, hidden=64, expert_width=32, vocab=128)
        stable = make_random_model(Path(d) / "m256", "qwen3_moe", seed=1, quantize_bits=4, group_size=64, moving=True,
                                   layers=4, experts=16, top_k=4, hidden=256, expert_width=128, vocab=128)
        store = pack(model, Path(d) / "s", progress=False)
        prompt = [9, 4, 27, 31, 2, 88, 5, 60, 13, 101]
        from mlx_lm.generate import generate_step
        from mlx_lm.utils import load_model

        from workbench.data import default_model

        for name, path in (("reference", default_model()), ("tiny h256 g64", stable), ("tiny", model)):
            res_model, _ = load_model(Path(path))
            runs = [np.stack([np.array(lp.astype(mx.float32)) for (_, lp), _ in
                              zip(generate_step(mx.array(prompt), res_model), range(12))]) for _ in range(4)]
            same = [bool(np.array_equal(r, runs[0], equal_nan=True)) for r in runs[1:]]
            nan = [int(np.isnan(r).any(axis=1).sum()) for r in runs]
            spread = max(float(np.nanmax(np.abs(r - runs[0]))) for r in runs[1:])
            print(f"resident {name}: repeats bit-identical {same}, steps with NaN per run {nan}, max |diff| {spread:.2e}")
        lps = list(runs[-1][:6])  # the tiny model's last resident run
        out = []
        for _ in range(4):
            with Engine(store, arena="0.4", io=IOConfig(workers=4), ahead=AheadConfig("layer", 1, gate="confidence"),
                        progress=False) as eng:
                try:
                    r = eng.generate(prompt, max_tokens=12)
                    out.append((tuple(r.tokens), r.stats["residency_hash"]))
                except EngineError as e:
                    out.append(("non-finite", str(e)[:60]))
        print(f"engine auto + read-ahead, 4 runs: distinct (tokens, residency) {len(set(out))}; {[o[1] for o in out]}")
        for writes in ("direct", "staged"):
            for arena in ("0.3", "0.6", "1.0"):
                with Engine(store, arena=ArenaConfig(arena, writes=writes), decode="layer", progress=False) as eng:
                    seen = []

                    def watch(v, name, **ctx):
                        if isinstance(v, mx.array) and not seen and not bool(mx.all(mx.isfinite(v)).item()):
                            seen.append(f"{name} at step {ctx.get('step')}")

                    eng.hooks.add("layer.*", watch)
                    try:
                        r = eng.generate(prompt, max_tokens=6)
                        msg = f"finite, max |dlogprob| vs resident {float(np.abs(r.logprobs - lps[-1]).max()):.2e}"
                    except EngineError as e:
                        msg = f"NON-FINITE: {e}; first non-finite hook value: {seen[:1]}"
                    bad = mismatched_slots(eng)
                    print(f"engine writes={writes} arena={arena}: {msg}; published slots not matching their blob: "
                          f"{len(bad)} of {sum(eng.arena.published)} {bad[:4]}")


if __name__ == "__main__":
    main()
