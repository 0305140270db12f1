"""Live speculative decoding against plain streaming, side by side in one run.

    python bench/bench_speculative.py [--model DIR] [--draft DIR] [--tokens 48] [--reps 3]

For each arena and number of drafted tokens: median tokens/s of plain streamed greedy decoding
and of speculative decoding (resident draft, verify passes through the streamed target), their
ratio, acceptance, experts claimed (union) and read per verify pass, bytes per token, and whether
the two produced the same tokens (they must, at temperature 0).
"""

import argparse
import platform
import statistics
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model

from workbench.data import default_model, workload
from workbench.engine.engine import Engine
from workbench.engine.speculative import speculative_generate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--arenas", default="0.1,0.25,0.5,1.0")
    ap.add_argument("--drafts", default="1,2,3,4")
    a = ap.parse_args()
    path = Path(a.model or default_model())
    draft_path = Path(a.draft or path.parent / "ref-draft")
    draft, _ = load_model(draft_path)
    with Engine.open(path, arena="1.0", progress=False) as eng:
        prompt = eng.encode(workload("code_heldout")[0]["text"])[:64]
    print(f"model {path} | draft {draft_path} | {platform.machine()} {platform.system()} | "
          f"mlx {mx.__version__} | device {mx.default_device()} | {a.tokens} tokens, median of {a.reps}")
    cols = ("arena", "draft", "plain tok/s", "spec tok/s", "ratio", "accept", "tok/pass", "union/pass",
            "read/pass", "MB/tok plain", "MB/tok spec", "same")
    print(" | ".join(cols))
    for arena in a.arenas.split(","):
        for n in (int(x) for x in a.drafts.split(",")):
            plain_tps, spec_tps = [], []
            with Engine.open(path, arena=arena, progress=False) as eng:
                eng.generate(prompt, max_tokens=4)  # warm page cache and kernels
                for _ in range(a.reps):  # interleaved, so drifting machine load hits both sides
                    p = eng.generate(prompt, max_tokens=a.tokens, progress=False)
                    s = speculative_generate(eng, draft, prompt, max_tokens=a.tokens, num_draft_tokens=n,
                                             progress=False)
                    plain_tps.append(p.stats["tokens_per_s"])
                    spec_tps.append(s.stats["tokens_per_s"])
            sp = s.stats["speculative"]
            pt, st = statistics.median(plain_tps), statistics.median(spec_tps)
            row = (arena, n, f"{pt:.2f}", f"{st:.2f}", f"{st / pt:.2f}x", f"{sp['acceptance']:.1%}",
                   f"{sp['tokens_per_pass']:.2f}", f"{sp['union_experts_per_pass']:.1f}",
                   f"{sp['experts_read_per_pass']:.1f}", f"{p.stats['bytes_per_token'] / 1e6:.3f}",
                   f"{s.stats['bytes_per_token'] / 1e6:.3f}", p.tokens == s.tokens)
            print(" | ".join(str(x) for x in row), flush=True)


if __name__ == "__main__":
    main()
