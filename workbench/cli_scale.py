"""``workbench synth-store`` (an expert store at a public model's real shapes) and ``workbench sweep``
(a policy grid over traces on Dask)."""

from __future__ import annotations

import sys


def cmd_synth_store(args) -> int:
    from .store.synth import store_bytes, resolve_shape, synth_store

    overrides = dict(layers=args.layers, experts=args.experts, hidden=args.hidden, width=args.expert_width, top_k=args.top_k)
    shape = resolve_shape(args.like, **overrides)
    expert, total = store_bytes(shape, args.bits, args.dtype)
    print(f"synth-store: {shape.layers} layers x {shape.experts} experts, {expert / 1e6:.2f} MB each at {args.bits} bits, "
          f"{total / 1e9:.2f} GB -> {args.out}", file=sys.stderr)
    synth_store(args.out, like=args.like, bits=args.bits, seed=args.seed, progress=True, dtype=args.dtype, **overrides)
    print(f"wrote {args.out}")
    return 0


def register(sub) -> None:
    from .store.synth import PRESETS

    p = sub.add_parser("synth-store", help="write a random expert store with a public MoE model's real shapes",
                       description="Random expert contents at real shapes, written layer by layer, for `workbench ioreplay`. "
                                   "Explicit shape flags override the preset's fields.")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--like", choices=sorted(PRESETS), help="take the shapes of this model")
    p.add_argument("--bits", type=int, default=4, help="quantization bits (2 3 4 5 6 8; 16: unquantized), default 4")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="dtype of scales and biases (of the weights at 16 bits); published MLX checkpoints: bfloat16")
    p.add_argument("--layers", type=int, help="MoE layers")
    p.add_argument("--experts", type=int, help="routed experts per layer")
    p.add_argument("--hidden", type=int, help="hidden size")
    p.add_argument("--expert-width", type=int, help="expert FFN width (moe_intermediate_size)")
    p.add_argument("--top-k", type=int, help="experts per token")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_synth_store)
    register_sweep(sub)


def _list(text):
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def sweep_grid(args):
    """The Grid of ``workbench sweep``'s flags (and --grid file)."""
    from .sim.sweep import Grid

    timing = {k: v for k, v in dict(compute_s=args.compute_ms and args.compute_ms / 1e3, pre_moe_s=args.pre_ms and args.pre_ms / 1e3,
                                     bandwidth=args.bandwidth_gbs and args.bandwidth_gbs * 1e9,
                                     read_latency_s=args.latency_us and args.latency_us / 1e6).items() if v is not None}
    axes = dict(policies=_list(args.policy), arenas=_list(args.arena), predictors=_list(args.predictor),
                distances=[int(d) for d in _list(args.lookahead)] if args.lookahead else None, gates=_list(args.gate),
                kind=args.kind, store=args.store, io_mode=args.io_mode, map_layers=args.map_layers, map_experts=args.map_experts)
    if args.trace:
        axes["traces"] = args.trace
    if args.grid:
        grid = Grid.from_yaml(args.grid, **axes)
        if timing:
            grid.timing = {**grid.timing, **timing}
    else:
        if not args.trace:
            raise ValueError("give one or more TRACE files or a --grid YAML file")
        grid = Grid(**{k: v for k, v in axes.items() if v is not None}, timing=timing)
    if args.lookahead and args.predictor is None and grid.predictors == ["none"]:
        grid.predictors = ["layer"]  # a lookahead alone reads ahead with the layer predictor, as in run and simulate
    return grid


def cmd_sweep(args) -> int:
    from .sim.sweep import SweepError, sweep

    grid = sweep_grid(args)
    try:
        res = sweep(grid, args.out, workers=args.workers, scheduler=args.scheduler, progress=True)
    except SweepError as e:
        print(f"workbench sweep: error: {e}", file=sys.stderr)
        return 2
    print(f"sweep {res.out}: {res.ran} cells run, {res.skipped} already done and skipped, {res.total} in the grid "
          f"({res.seconds:.1f} s)")
    return 0


def register_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="run a policy grid over traces on Dask; one Parquet row per cell",
                       description="Every combination of the comma lists (or a --grid YAML file) is one cell, run by the "
                                   "same library call as `workbench simulate` / `replay` / `ioreplay`. Rows go to "
                                   "OUT/cell-<id>.parquet as cells finish; a rerun skips finished cells.")
    p.add_argument("trace", nargs="*", metavar="TRACE")
    p.add_argument("--grid", help="YAML file with axes: traces (or workloads: name: path), policies, arenas, predictors, "
                                  "distances, gates, kind, timing, store")
    p.add_argument("--kind", choices=["simulate", "replay", "ioreplay"], default=None, help="cell type (default simulate)")
    p.add_argument("--policy", help="comma list, e.g. lru,fifo")
    p.add_argument("--arena", help="comma list in any --arena form: 0.25, 25%%, 64, 2GB")
    p.add_argument("--predictor", help="comma list: none, oracle, or recorded sources (pred_SRC columns)")
    p.add_argument("--lookahead", help="comma list of prediction distances in rows (default: from the predictor); "
                                       "without --predictor it implies --predictor layer")
    p.add_argument("--gate", help="comma list: none, confidence, cost (simulate)")
    p.add_argument("--compute-ms", type=float, help="simulate: expert compute per layer (ms); ioreplay: slept per layer")
    p.add_argument("--pre-ms", type=float, help="simulate: attention etc. before each MoE block (ms)")
    p.add_argument("--bandwidth-gbs", type=float, help="simulate: device read bandwidth (GB/s)")
    p.add_argument("--latency-us", type=float, help="simulate: read latency (us)")
    p.add_argument("--store", help="ioreplay: the store to read")
    p.add_argument("--io-mode", default=None, help="ioreplay: buffered | dontneed | direct (default buffered)")
    p.add_argument("--map-layers", choices=["modulo", "spread"], help="ioreplay: map the trace's layers onto the store's")
    p.add_argument("--map-experts", choices=["modulo"], help="ioreplay: map the trace's expert ids onto the store's")
    p.add_argument("--out", required=True, help="sweep directory (a Parquet dataset, one file per cell)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--workers", type=int, default=None, help="local worker processes (default 2)")
    g.add_argument("--scheduler", help="address of an existing Dask scheduler, e.g. tcp://10.0.0.5:8786")
    p.set_defaults(func=cmd_sweep)
