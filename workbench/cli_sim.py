"""Command line for the simulator: ``workbench replay``, ``workbench simulate`` and ``workbench export``.

    workbench replay TRACE --policy lru --arena 0.25 [--json]
    workbench simulate TRACE --policy lru --arena 0.25 [--predictor oracle|SRC] [--json]
    workbench export TRACE --format oraclegeneral|csv OUT
"""

from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    from .routing.rank import AHEAD_MODES, SEED_MODE_NAMES

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
                              description="Run the virtual-time model over a trace's decode rows.")
    s.add_argument("trace")
    s.add_argument("--policy", default="lru")
    s.add_argument("--arena", default="0.25")
    s.add_argument("--predictor", default=None, help="'oracle' or a pred_<SRC> column's SRC (default: no read-ahead)")
    s.add_argument("--distance", type=int, default=None, help="rows ahead a prediction is available (default from the name)")
    s.add_argument("--mode", default="raw", choices=AHEAD_MODES + tuple(SEED_MODE_NAMES),
                   help="ahead() ranking: raw | resident_bonus | cache_aware (the seed's unpert1 | unpert0 | route)")
    s.add_argument("--moce-bonus", type=float, default=0.85, help="resident bonus b for resident_bonus/cache_aware ranking")
    s.add_argument("--moce-protect", type=int, default=3, help="protected width p for cache_aware ranking")
    s.add_argument("--moce-r1", type=float, default=0.0, help="rank-1 resident bonus for cache_aware ranking")
    s.add_argument("--gate", default="none", help="admission gate: none, confidence, cost")
    s.add_argument("--compute-ms", type=float, default=1.0, help="expert compute per layer (ms)")
    s.add_argument("--pre-ms", type=float, default=1.0, help="attention etc. before each MoE block (ms)")
    s.add_argument("--latency-us", type=float, default=100.0, help="read latency (us)")
    s.add_argument("--bandwidth-gbs", type=float, default=2.0, help="device read bandwidth (GB/s)")
    s.add_argument("--io-workers", type=int, default=8)
    s.add_argument("--urgent-workers", type=int, default=2)
    s.add_argument("--piece-kb", type=int, default=None, help="split reads into pieces of this many KiB")
    s.add_argument("--expert-bytes", type=int, default=None, help="bytes per expert (default: the trace's)")
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
    from .sim.vtime import Timing, simulate
    from .trace.schema import TraceError

    try:
        check_simulate_args(args)
        timing = Timing(compute_s=args.compute_ms / 1e3, pre_moe_s=args.pre_ms / 1e3, read_latency_s=args.latency_us / 1e6,
                        bandwidth=args.bandwidth_gbs * 1e9, workers=args.io_workers, urgent_workers=args.urgent_workers,
                        piece_bytes=args.piece_kb * 1024 if args.piece_kb else None, expert_bytes=args.expert_bytes)
        res = simulate(args.trace, args.policy, args.arena, timing=timing, predictor=args.predictor, distance=args.distance,
                       mode=args.mode, p=args.moce_protect, b=args.moce_bonus, r1=args.moce_r1, gate=args.gate)
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


def check_simulate_args(args) -> None:
    from .arena.policies.static import require_hotlist
    from .checks import io_workers, real, whole

    real("--compute-ms", args.compute_ms, 0)
    real("--pre-ms", args.pre_ms, 0)
    real("--latency-us", args.latency_us, 0)
    real("--bandwidth-gbs", args.bandwidth_gbs, 0, open_lo=True)
    io_workers("--io-workers", args.io_workers, args.urgent_workers, "--urgent-workers")
    whole("--piece-kb", args.piece_kb, 1, none_ok=True)
    whole("--expert-bytes", args.expert_bytes, 1, none_ok=True)
    whole("--distance", args.distance, 1, none_ok=True)
    real("--moce-bonus", args.moce_bonus, 0)
    whole("--moce-protect", args.moce_protect, 0)
    real("--moce-r1", args.moce_r1, 0)
    require_hotlist(args.policy, {}, "one to `workbench replay TRACE --policy static -o hotlist=FILE` (simulate takes none)")


def cmd_export(args) -> int:
    from .sim.export import export
    from .trace.schema import TraceError

    try:
        from .checks import whole

        whole("--size", args.size, 1, none_ok=True)
        n = export(args.trace, args.format, args.out, size=args.size, phase=args.phase)
    except (TraceError, ValueError, OSError) as err:
        return _fail(err)
    print(f"wrote {n} requests to {args.out} ({args.format})")
    return 0
