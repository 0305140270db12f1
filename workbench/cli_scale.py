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
    from .checks import parse_whole, real
    from .sim.sweep import Grid

    ms = {flag: real(flag, v, 0, none_ok=True) for flag, v in (("--compute-ms", args.compute_ms), ("--pre-ms", args.pre_ms),
                                                              ("--bandwidth-gbs", args.bandwidth_gbs), ("--latency-us", args.latency_us))}
    if ms["--bandwidth-gbs"] == 0:
        raise ValueError("--bandwidth-gbs 0 is out of range: give a value > 0")
    timing = {k: v for k, v in dict(compute_s=ms["--compute-ms"] and ms["--compute-ms"] / 1e3,
                                     pre_moe_s=ms["--pre-ms"] and ms["--pre-ms"] / 1e3,
                                     bandwidth=ms["--bandwidth-gbs"] and ms["--bandwidth-gbs"] * 1e9,
                                     read_latency_s=ms["--latency-us"] and ms["--latency-us"] / 1e6).items() if v is not None}
    distances = [parse_whole("--lookahead", d, 1) for d in _list(args.lookahead)] if args.lookahead else None
    axes = dict(policies=_list(args.policy), arenas=_list(args.arena), predictors=_list(args.predictor),
                distances=distances, gates=_list(args.gate), kind=args.kind, phase=args.phase, hotlist=args.hotlist,
                store=args.store, io_mode=args.io_mode, cache=args.cache, map_layers=args.map_layers, map_experts=args.map_experts)
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
    from .checks import real
    from .sim.sweep import SweepError, sweep
    from .trace.schema import TraceError

    def say(text):
        print(f"sweep: {text}", file=sys.stderr)

    try:
        real("--connect-timeout", args.connect_timeout, 0, open_lo=True)
        grid = sweep_grid(args)
        res = sweep(grid, args.out, workers=args.workers, scheduler=args.scheduler, progress=True,
                    timeout=args.connect_timeout, log=say)
    except (SweepError, TraceError, ValueError) as e:
        print(f"workbench sweep: error: {e}", file=sys.stderr)
        return 2
    print(f"sweep {res.out}: {res.ran} cells run, {res.skipped} already done and skipped, {res.total} in the grid "
          f"({res.seconds:.1f} s)" + (f"; {res.failed} failed" if res.failed else ""))
    if res.failed:
        label, error = res.errors[0]
        print(f"workbench sweep: {res.failed} cells failed and are recorded (load_sweep(out, failed=True)); they rerun "
              f"on the next sweep. First: {label}: {error}", file=sys.stderr)
        return 1
    return 0


def register_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="run a policy grid over traces on Dask; one Parquet dataset of rows",
                       description="Every combination of the comma lists (or a --grid YAML file) is one cell, run by the "
                                   "same library call as `workbench simulate` / `replay` / `ioreplay`, with their defaults "
                                   "(--phase all) except --cache: ioreplay cells run cold (--cache cold), while "
                                   "`workbench ioreplay` leaves the page cache as found by default. Rows go to "
                                   "OUT/part-*.parquet as batches finish; a cell is keyed by the trace's content, the "
                                   "workbench version and every setting, and a rerun skips finished cells. A failing cell is "
                                   "recorded and the sweep goes on (exit 1).")
    p.add_argument("trace", nargs="*", metavar="TRACE", help="trace files or fsspec URLs (file://, s3://, gs://)")
    p.add_argument("--grid", help="YAML file with axes: traces (or workloads: name: path), policies, arenas, predictors, "
                                  "distances, gates, kind, phase, timing, hotlist, store, cache")
    p.add_argument("--kind", choices=["simulate", "replay", "ioreplay"], default=None, help="cell type (default simulate)")
    p.add_argument("--phase", choices=["all", "decode"], default=None,
                   help="all: prefill then decode, as the engine ran them (default, as in replay, simulate and ioreplay); "
                        "decode: decode rows only")
    p.add_argument("--policy", help="comma list, e.g. lru,fifo")
    p.add_argument("--hotlist", help="the hotlist of --policy static (KEY or LAYER EXPERT per line, hottest first)")
    p.add_argument("--arena", help="comma list in any --arena form: 0.25, 25%%, 64, 2GB")
    p.add_argument("--predictor", help="comma list: none, oracle, or recorded sources (pred_SRC columns)")
    p.add_argument("--lookahead", help="comma list of prediction distances in rows (default: from the predictor); "
                                       "without --predictor it implies --predictor layer")
    p.add_argument("--gate", help="comma list: none, confidence, cost (simulate)")
    p.add_argument("--compute-ms", type=float, help="simulate: expert compute per layer (ms); ioreplay: slept per layer")
    p.add_argument("--pre-ms", type=float, help="simulate: attention etc. before each MoE block (ms)")
    p.add_argument("--bandwidth-gbs", type=float, help="simulate: device read bandwidth (GB/s)")
    p.add_argument("--latency-us", type=float, help="simulate: read latency (us)")
    p.add_argument("--store", help="ioreplay: the store to read (a local path on every worker)")
    p.add_argument("--io-mode", default=None, help="ioreplay: buffered | dontneed | direct (default buffered)")
    p.add_argument("--cache", choices=["cold", "warm"], default=None,
                   help="ioreplay: cold drops the store's pages and turns read-ahead off before each cell (default); "
                        "warm leaves the page cache as it is")
    p.add_argument("--map-layers", choices=["modulo", "spread"], help="ioreplay: map the trace's layers onto the store's")
    p.add_argument("--map-experts", choices=["modulo"], help="ioreplay: map the trace's expert ids onto the store's")
    p.add_argument("--out", required=True, help="sweep folder or URL (a Parquet dataset of part files)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--workers", type=int, default=None, help="local worker processes (default: this machine's usable cores)")
    g.add_argument("--scheduler", help="address of an existing Dask scheduler, e.g. tcp://10.0.0.5:8786")
    p.add_argument("--connect-timeout", type=float, default=10.0,
                   help="seconds to wait for the scheduler to answer and for a worker to join (default 10)")
    p.set_defaults(func=cmd_sweep)
