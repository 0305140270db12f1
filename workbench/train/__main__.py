"""``python -m workbench.train``: build, train, export (GPU machine); convert, measure (here).

GPU machine (needs the ``train`` extra: torch, transformers 5, tokenizers, safetensors)::

    python -m workbench.train device-run --out $OUT --bench 64,128,256 --train-seconds 75
    python -m workbench.train device-run --out $OUT --steps 2965 --tokenizer data/models/ref-moe/tokenizer.json
    python -m workbench.train device-run --out $OUT --steps 5307 --resume   # same machine, still warm

Here (mlx, mlx-lm)::

    python -m workbench.train convert --export DIR      # -> data/models/ref-{moe,draft}, data/workloads
    python -m workbench.train measure --export DIR --json data/models/metrics_mlx.json

data/models/MODEL_CARD.md records the runs behind the shipped model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _device_run(args) -> int:
    from .pipeline import device_run

    return device_run(args)


def _convert(args) -> int:
    from .convert import convert

    out = convert(args.export, args.models, args.workloads, args.expert_bits, args.other_bits, args.draft_bits, args.dtype)
    print(json.dumps(out, indent=1))
    return 0


def _measure(args) -> int:
    from .evaluate import measure

    res = measure(args.models, args.workloads, n_eval=args.n_eval, n_prompts=args.n_prompts, n_new=args.n_new,
                  export_dir=args.export)
    text = json.dumps(res, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbench.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("device-run", help="corpus, tokenizer, train, bf16 eval, compact export (GPU machine)")
    d.add_argument("--out", required=True, help="folder for the files to bring back ($OUT)")
    d.add_argument("--cache", default=".cache/train", help="tokenized corpus and checkpoints on the machine")
    d.add_argument("--tokenizer", default=None, help="reuse this tokenizer.json instead of training one")
    d.add_argument("--site-packages", default=None, help="corpus source (default: this python's site-packages)")
    d.add_argument("--heldout", default=None, help="comma-separated held-out packages")
    d.add_argument("--bench", default=None, help="comma-separated batch sizes to time first, e.g. 64,128")
    d.add_argument("--batch", type=int, default=128)
    d.add_argument("--seq", type=int, default=512)
    d.add_argument("--steps", type=int, default=0, help="total steps (0: fit --train-seconds)")
    d.add_argument("--train-seconds", type=float, default=480.0)
    d.add_argument("--max-seconds", type=float, default=0.0, help="hard stop for training, from command start")
    d.add_argument("--lr", type=float, default=2e-3)
    d.add_argument("--aux-coef", type=float, default=0.01)
    d.add_argument("--draft-every", type=int, default=4)
    d.add_argument("--resume", action="store_true", help="continue from <cache>/ckpt_stable.pt")
    d.set_defaults(func=_device_run)

    c = sub.add_parser("convert", help="compact export -> quantized mlx-lm dirs + workloads (here)")
    c.add_argument("--export", required=True, help="folder holding what device-run wrote to $OUT")
    c.add_argument("--models", default=str(REPO / "data" / "models"))
    c.add_argument("--workloads", default=str(REPO / "data" / "workloads"))
    c.add_argument("--expert-bits", type=int, default=4)
    c.add_argument("--other-bits", type=int, default=8, help="embedding/attention bits (16: keep float)")
    c.add_argument("--draft-bits", type=int, default=8)
    c.add_argument("--dtype", default="float32", choices=["bfloat16", "float16", "float32"],
                   help="dtype of scales/biases and float weights (float32: 6-10x faster on CPU than bf16)")
    c.set_defaults(func=_convert)

    m = sub.add_parser("measure", help="held-out ppl, routing stats, draft acceptance with mlx (here)")
    m.add_argument("--models", default=str(REPO / "data" / "models"))
    m.add_argument("--workloads", default=str(REPO / "data" / "workloads"))
    m.add_argument("--export", default=None, help="also measure the unquantized export")
    m.add_argument("--n-eval", type=int, default=None)
    m.add_argument("--n-prompts", type=int, default=12)
    m.add_argument("--n-new", type=int, default=32)
    m.add_argument("--json", default=None)
    m.set_defaults(func=_measure)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
