"""``workbench compare`` (configurations side by side) and ``workbench ioreplay`` (real I/O, traced routing)."""

from __future__ import annotations

import argparse
import json
import shlex

DEFAULT_VARIANTS = (
    "unpert1=--predictor layer --mode raw",
    "unpert0=--predictor layer --mode resident_bonus",
    "route=--predictor layer --mode cache_aware",
    "twohit=--predictor layer --mode raw --policy twohit",
)
ROWS = ("tokens_per_s", "hit_rate", "hits", "misses", "sync_misses", "evictions", "bytes_per_token",
        "prefetch.issued", "prefetch.cancelled_before_read", "prefetch.partially_read", "prefetch.completed_unused",
        "prefetch.useful_late", "prefetch.useful_timely", "same_tokens", "mean_kl", "ppl_exact", "ppl_approx",
        "residency_hash")


def variant_configs(model, specs, common) -> dict:
    """``NAME=FLAGS`` specs (``workbench run`` flags, after the ``common`` ones) as compare() variants."""
    from .cli import build_parser, engine_config

    parser = build_parser()
    out = {}
    for spec in specs:
        name, _, flags = spec.partition("=")
        if name in out:
            raise ValueError(f"--variant {name} is given twice; give each variant its own NAME")
        out[name] = engine_config(parser.parse_args(["run", str(model), "--prompt-ids", "0"] + common + shlex.split(flags)))
    return out


# rows shown in another unit than the stats': label -> (scale, format)
SHOWN = {"bytes_per_token": ("MB read per token", 1e-6, ".3f"), "hit_rate": ("hit rate (%)", 100, ".1f")}


def table(results) -> str:
    def get(s, key):
        a, _, b = key.partition(".")
        v = s[a][b] if b else s.get(a)
        if key in SHOWN and isinstance(v, (int, float)):
            return f"{v * SHOWN[key][1]:{SHOWN[key][2]}}"
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    names = [r["name"] for r in results]
    labels = [SHOWN[k][0] if k in SHOWN else k for k in ROWS]
    w0 = max(len(r) for r in labels)
    ws = [max(12, len(n)) for n in names]
    lines = [f"{'':<{w0}}  " + "  ".join(f"{n:>{w}}" for n, w in zip(names, ws))]
    for key, label in zip(ROWS, labels):
        lines.append(f"{label:<{w0}}  " + "  ".join(f"{get(r, key):>{w}}" for r, w in zip(results, ws)))
    return "\n".join(lines)


def cmd_compare(args) -> int:
    from .analysis.compare import compare
    from .cli import parse_ids
    from .data import default_model

    model = args.model or str(default_model())
    prompt = parse_ids(args.prompt_ids) if args.prompt_ids else (args.prompt or [1, 2, 3, 4, 5, 6, 7, 8])
    base = shlex.split(args.common) if args.common else []
    specs = args.variant or list(DEFAULT_VARIANTS)
    results = compare(model, prompt, args.max_tokens, variant_configs(model, specs, base), progress=not args.json)
    for r, spec in zip(results, specs):
        r["flags"] = spec.partition("=")[2]
    print(json.dumps(results) if args.json else table(results))
    return 0


def cmd_ioreplay(args) -> int:
    from .cli import arena_config, io_config
    from .config import AheadConfig
    from .sim.ioreplay import replay_io

    stats = replay_io(args.trace, args.store, arena=arena_config(args), io=io_config(args, "never"),
                      ahead=AheadConfig(predictor=args.predictor, lookahead=args.lookahead), compute_ms=args.compute_ms,
                      max_steps=args.max_steps, progress=not args.json, map_layers=args.map_layers,
                      map_experts=args.map_experts, phase=args.phase, cache=args.cache)
    if args.json:
        print(json.dumps(stats))
    else:
        for k, v in stats.items():
            print(f"{k:<22} {v}")
    return 0


def register(sub) -> None:
    from .cli import add_arena_args, add_io_args

    p = sub.add_parser("compare", help="run configurations on the same prompt, counters side by side",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="default variants:\n  " + "\n  ".join(DEFAULT_VARIANTS))
    p.add_argument("model", nargs="?", metavar="MODEL_OR_STORE", help="default: the shipped reference model")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt")
    g.add_argument("--prompt-ids")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--variant", action="append", help="NAME=FLAGS, e.g. 'bonus=--predictor layer --mode resident_bonus' (repeat)")
    p.add_argument("--common", default="--arena 0.25", help="flags every variant shares (default: --arena 0.25)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("ioreplay", help="replay a trace's routing through the real arena and I/O against any store")
    p.add_argument("trace")
    p.add_argument("store", help="a packed store whose expert size you want to study")
    add_arena_args(p)
    add_io_args(p)
    p.add_argument("--compute-ms", type=float, default=None, help="per-layer compute (default: from the trace's run)")
    p.add_argument("--predictor", default=None, help="read ahead: oracle, or a recorded predictor source (trace column "
                                                     "pred_SRC, e.g. layer); default: layer when --lookahead is given")
    p.add_argument("--lookahead", type=int, default=None, help="layers ahead a read is issued (default 1); without "
                                                               "--predictor it implies --predictor layer")
    p.add_argument("--max-steps", type=int, default=None, help="decode steps to replay (default all)")
    p.add_argument("--phase", default="all", choices=["all", "decode"],
                   help="all: replay the prefill first, as the engine ran it, untimed (default); decode: decode rows only")
    p.add_argument("--map-layers", choices=["modulo", "spread"], default=None,
                   help="replay a trace of another model: store layer j takes trace layer j mod n (modulo) "
                        "or j*n/N (spread); without it the layers must match")
    p.add_argument("--map-experts", choices=["modulo"], default=None,
                   help="map trace expert e to store expert e mod E; without it the expert counts must match")
    p.add_argument("--cache", choices=["cold", "warm"], default=None,
                   help="cold: drop the store's pages and turn read-ahead off first (as a sweep's cells); warm: leave "
                        "the page cache as it is; default: as found (stated in the result). disk_bytes / cache_bytes "
                        "split the bytes read either way")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ioreplay)
