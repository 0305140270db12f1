"""Command line for the simulator: ``workbench replay``, ``workbench simulate`` and ``workbench export``.

    workbench replay TRACE --policy lru --arena 0.25 [--json]
    workbench simulate TRACE --policy lru --arena 0.25 [--predictor oracle|SRC] [--lookahead D] [--json]
    workbench export TRACE --format oraclegeneral|csv OUT
"""

from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("replay", help="replay a trace through an eviction policy (uniform slots)",
                              description="Replay a recorded routing trace through engine eviction policies with an arena of N slots.")
    p.add_argument("trace", help="trace Parquet file (workbench run --trace)")
    p.add_argument("--policy", default="lru", help="policy name, or several separated by commas (default lru)")
    p.add_argument("--arena", default="0.25", help="a fraction (0.25), percentage (25%%), slot count (64) or size (2GB = 2e9 bytes, 2GiB)")
    p.add_argument("--phase", default="all", choices=["all", "prefill", "decode"], help="which rows to replay (default all)")
    p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="policy option, e.g. -o hotlist=hot.txt or -o protected=0.5 (repeatable)")
    p.add_argument("--no-preload", action="store_true", help="do not load the policy's hotlist before the run")
    p.add_argument("--json", action="store_true", help="print JSON (one object, or a list for several policies)")
    p.set_defaults(func=cmd_replay)

    s = subparsers.add_parser("simulate", help="virtual-time replay with prefetch and I/O",
                              description="Run the virtual-time model over a trace: its prefill as the engine ran it "
                                          "(off the clock), then its decode rows, whose numbers it reports.")
    s.add_argument("trace")
    s.add_argument("--policy", default="lru")
    s.add_argument("--arena", default="0.25")
    from .cli import add_ahead_args

    add_ahead_args(s.add_argument_group("read-ahead (ranking only: fixed routes cannot replay cache-aware routing)"),
                   live=False)
    s.add_argument("--compute-ms", type=float, default=1.0, help="expert compute per layer (ms)")
    s.add_argument("--pre-ms", type=float, default=1.0, help="attention etc. before each MoE block (ms)")
    s.add_argument("--latency-us", type=float, default=100.0, help="read latency (us)")
    s.add_argument("--bandwidth-gbs", type=float, default=2.0, help="device read bandwidth (GB/s)")
    s.add_argument("--io-workers", type=int, default=8)
    s.add_argument("--io-reserved", type=int, default=2, help="virtual workers that serve only urgent reads")
    s.add_argument("--piece-kb", type=int, default=None, help="split reads into pieces of this many KiB")
    s.add_argument("--expert-bytes", type=int, default=None, help="bytes per expert (default: the trace's)")
    s.add_argument("--phase", default="all", choices=["all", "decode"],
                   help="all: replay the prefill first, as the engine ran it (default); decode: the decode rows only")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_simulate)

    e = subparsers.add_parser("export", help="export a trace for libCacheSim (oracleGeneral) or as CSV",
                              description="One request per routed expert in trace order; object id = layer * n_experts + expert.")
    e.add_argument("trace")
    e.add_argument("--format", required=True, choices=["oraclegeneral", "csv"])
    e.add_argument("out", help="output file")
    e.add_argument("--size", type=int, default=None, help="object size in bytes (default: the trace's expert_bytes)")
    e.add_argument("--phase", default="all", choices=["all", "prefill", "decode"])
    e.set_defaults(func=cmd_export)


def _fail(err) -> int:
    print(f"error: {err}", file=sys.stderr)
    return 2


def _options(pairs):
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"policy option {pair!r} must look like KEY=VALUE")
        key, value = pair.split("=", 1)
        for conv in (int, float):
            try:
                value = conv(value)
                break
            except ValueError:
                pass
        out[key.strip()] = value
    return out


def cmd_replay(args) -> int:
    import warnings

    from .sim.replay import replay
    from .trace.schema import TraceError

    try:
        from .arena.policies.static import require_hotlist

        opts = _options(args.option)
        policies = [p.strip() for p in args.policy.split(",") if p.strip()]
        if not policies:
            raise ValueError("--policy needs at least one name")
        for pol in policies:
            require_hotlist(pol, opts, "-o hotlist=FILE")
        results = []
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            for pol in policies:
                r = replay(args.trace, pol, args.arena, phase=args.phase, preload=not args.no_preload, **opts)
                results.append(r.to_dict())
    except (TraceError, ValueError) as err:
        return _fail(err)
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results))
    else:
        for d in results:
            print(f"{d['policy']:>8}  slots={d['capacity']:<6} lookups={d['lookups']:<9} hits={d['hits']:<9} "
                  f"misses={d['misses']:<9} hit_rate={d['hit_rate']:.4f}")
            if d.get("warning"):
                print(f"warning: {d['warning']}", file=sys.stderr)
    return 0


def cmd_simulate(args) -> int:
    from .sim.vtime import simulate
    from .trace.schema import TraceError

    try:
        arena, ahead, timing = simulate_config(args)
        res = simulate(args.trace, arena, ahead, timing=timing, phase=args.phase)
    except (TraceError, ValueError) as err:
        return _fail(err)
    s = res.summary
    if args.json:
        print(json.dumps(s))
    else:
        print(f"{s['policy']} slots={s['capacity']} tokens={s['tokens']} hit_rate={s['hit_rate']:.4f} "
              f"sync_misses={s['sync_misses']} ms/token={s['s_per_token'] * 1e3:.3f} stall_s={s['stall_s']:.4f}")
        print("prefetch: " + " ".join(f"{k}={v}" for k, v in s["prefetch"].items()))
    return 0


def simulate_config(args):
    """(ArenaConfig, AheadConfig, Timing) of ``workbench simulate``'s flags, every value checked."""
    from .arena.policies.static import require_hotlist
    from .checks import real, whole
    from .cli import ahead_config
    from .config import ArenaConfig, IOConfig
    from .sim.vtime import Timing

    real("--compute-ms", args.compute_ms, 0)
    real("--pre-ms", args.pre_ms, 0)
    real("--latency-us", args.latency_us, 0)
    real("--bandwidth-gbs", args.bandwidth_gbs, 0, open_lo=True)
    io = IOConfig(workers=args.io_workers, reserved=args.io_reserved)
    whole("--piece-kb", args.piece_kb, 1, none_ok=True)
    whole("--expert-bytes", args.expert_bytes, 1, none_ok=True)
    require_hotlist(args.policy, {}, "one to `workbench replay TRACE --policy static -o hotlist=FILE` (simulate takes none)")
    timing = Timing(compute_s=args.compute_ms / 1e3, pre_moe_s=args.pre_ms / 1e3, read_latency_s=args.latency_us / 1e6,
                    bandwidth=args.bandwidth_gbs * 1e9, workers=io.workers, urgent_workers=io.reserved,
                    piece_bytes=args.piece_kb * 1024 if args.piece_kb else None, expert_bytes=args.expert_bytes)
    return ArenaConfig(size=args.arena, policy=args.policy), ahead_config(args), timing


def cmd_export(args) -> int:
    from .sim.export import export
    from .trace.schema import TraceError

    try:
        from .checks import output_file, whole

        whole("--size", args.size, 1, none_ok=True)
        output_file("OUT", args.out)
        n = export(args.trace, args.format, args.out, size=args.size, phase=args.phase)
    except (TraceError, ValueError, OSError) as err:
        return _fail(err)
    print(f"wrote {n} requests to {args.out} ({args.format})")
    return 0
