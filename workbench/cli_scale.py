"""``workbench synth-store`` (an expert store at a public model's real shapes) and ``workbench sweep``
(a policy grid over traces on Dask)."""

from __future__ import annotations

import sys


def cmd_synth_store(args) -> int:
    from .store.synth import store_bytes, resolve_shape, synth_store

    overrides = dict(layers=args.layers, experts=args.experts, hidden=args.hidden, width=args.expert_width, top_k=args.top_k)
    shape = resolve_shape(args.like, **overrides)
    expert, total = store_bytes(shape, args.bits)
    print(f"synth-store: {shape.layers} layers x {shape.experts} experts, {expert / 1e6:.2f} MB each at {args.bits} bits, "
          f"{total / 1e9:.2f} GB -> {args.out}", file=sys.stderr)
    synth_store(args.out, like=args.like, bits=args.bits, seed=args.seed, progress=True, **overrides)
    print(f"wrote {args.out}")
    return 0


def register(sub) -> None:
    from .store.synth import PRESETS

    p = sub.add_parser("synth-store", help="write a random expert store with a public MoE model's real shapes",
                       description="Random expert contents at real shapes, written layer by layer, for `workbench ioreplay`. "
                                   "Explicit shape flags override the preset's fields.")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--like", choices=sorted(PRESETS), help="take the shapes of this model")
    p.add_argument("--bits", type=int, default=4, help="quantization bits (2 3 4 5 6 8; 16 for bfloat16), default 4")
    p.add_argument("--layers", type=int, help="MoE layers")
    p.add_argument("--experts", type=int, help="routed experts per layer")
    p.add_argument("--hidden", type=int, help="hidden size")
    p.add_argument("--expert-width", type=int, help="expert FFN width (moe_intermediate_size)")
    p.add_argument("--top-k", type=int, help="experts per token")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_synth_store)
