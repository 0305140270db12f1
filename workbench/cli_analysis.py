"""`workbench analyze` and `workbench bound`: analyses from the command line.

    workbench analyze TRACE --what lookahead|cosine|gates|union|calibration|bounds [--model DIR] [--out DIR]
    workbench bound --union "1:8,2:13.42,3:17.99,8:35.01" --k 8 [--json]

``analyze`` prints the table, writes it as CSV and the chart as PNG + SVG (offline, vl-convert)
into --out (default: TRACE_STEM.analysis/ beside the trace).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

WHATS = ("lookahead", "cosine", "gates", "union", "calibration", "bounds")


def register(subparsers) -> None:
    a = subparsers.add_parser("analyze", help="turn a trace (and model weights) into a table and a chart",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("trace", nargs="?", help="trace Parquet file (not needed for --what cosine)")
    a.add_argument("--what", required=True, choices=WHATS)
    a.add_argument("--model", help="mlx-lm model directory (lookahead, cosine, gates drop-weakest)")
    a.add_argument("--out", help="output directory for table CSV and chart PNG/SVG")
    a.add_argument("--phase", default="decode", choices=("decode", "prefill", "all"))
    a.add_argument("--distances", type=int, default=3, help="lookahead: distances 1..D (default 3)")
    a.add_argument("--k-extra", default="", help="lookahead: extra candidate counts, e.g. 12,16")
    a.add_argument("--g-max", type=int, default=8, help="union: windows 1..G (default 8)")
    a.add_argument("--share", type=float, default=0.9, help="cosine: energy share for the rank (default 0.9)")
    a.add_argument("--max-rows", type=int, default=512, help="gates: recorded inputs per layer to re-run (default 512)")
    a.add_argument("--eval-trace", help="calibration: held-out trace for the reliability diagram")
    a.add_argument("--budget", help="bounds: byte budget(s) for the knapsack bound, e.g. 9GB or 4GB,9GB")
    a.add_argument("--policies", default="lru,belady", help="bounds: hit-curve policies (default lru,belady)")
    a.add_argument("--max-slots", type=int, default=64, help="bounds: hit curves up to this many slots per layer")
    a.add_argument("--no-chart", action="store_true", help="print and write the table only")
    a.set_defaults(func=cmd_analyze)

    b = subparsers.add_parser("bound", help="MTP speedup bound from a union table",
                              description="Speedup bound for streaming-bound decode: max over g of "
                              "E[tokens](g)/(union(g)/k) with E = (1-a^g)/(1-a).")
    b.add_argument("--union", required=True, help='union table "G:UNION,...", e.g. "1:8,2:13.42,3:17.99,8:35.01"')
    b.add_argument("--k", type=int, required=True, help="experts per token (top-k)")
    b.add_argument("--acceptance", default="0.5,0.6,0.7,0.72,0.75,0.8,0.85,0.9,0.95,0.99",
                   help="comma-separated acceptances (default 0.5..0.99)")
    b.add_argument("--mode", default="table", choices=("table", "interp", "fit"),
                   help="g to optimise over: measured g only (table), every g by linear interpolation, or linear fit")
    b.add_argument("--g", default="", help="only these windows, e.g. 3 or 1,3,8 (a fixed window can lose: speedup < 1)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_bound)


def _err(msg: str) -> int:
    print(f"workbench: error: {msg}", file=sys.stderr)
    return 2


def _parse_size(text: str) -> int:
    from workbench.sizes import parse_bytes  # GB = 1e9, GiB = 2^30, as everywhere

    return parse_bytes(text)


def _print_table(df, title: str) -> None:
    import pandas as pd

    with pd.option_context("display.width", 160, "display.max_rows", 200, "display.max_columns", 30,
                           "display.float_format", "{:.4f}".format):
        print(f"# {title}")
        print(df.to_string(index=False))


def _write(out: Path, name: str, table, chart, no_chart: bool) -> list[Path]:
    from workbench.fsutil import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    csv = out / f"{name}.csv"
    atomic_write(csv, lambda tmp: table.to_csv(tmp, index=False))
    paths = [csv]
    if chart is not None and not no_chart:
        from workbench.viz.render import save_chart

        paths += save_chart(chart, out / name)
    return paths


def cmd_analyze(args) -> int:
    from workbench.trace.schema import TraceError, read_trace
    from workbench.viz import charts

    if args.what != "cosine" and not args.trace:
        return _err(f"--what {args.what} needs a TRACE file")
    if args.what == "cosine" and not args.model:
        return _err("--what cosine needs --model DIR (expert weights)")
    out = Path(args.out) if args.out else (
        Path(args.trace).with_name(Path(args.trace).stem + ".analysis") if args.trace else Path("analysis"))
    phase = None if args.phase == "all" else args.phase
    try:
        trace = read_trace(args.trace) if args.trace else None
        model = None
        if args.model:
            from workbench.analysis._common import load_mlx_model

            model = load_mlx_model(args.model)
        written: list[Path] = []
        if args.what == "lookahead":
            from workbench.analysis.lookahead import lookahead_recovery, lookahead_summary, routers_from_model

            if model is None:
                return _err("--what lookahead needs --model DIR (the routers)")
            kx = [int(x) for x in args.k_extra.split(",") if x.strip()]
            t = lookahead_recovery(trace, routers_from_model(model), range(0, args.distances + 1), kx, phase=phase)
            s = lookahead_summary(t)
            _print_table(s, "lookahead recovery, mean over layers (d=0 is a self-check: expect ~1.0)")
            written = _write(out, "lookahead", t, charts.lookahead_chart(t[t.source != "d=0"]), args.no_chart)
        elif args.what == "cosine":
            from workbench.analysis.cosine import cosine_pairs, cosine_summary, energy_curve, expert_grams, experts_from_model

            grams = expert_grams(experts_from_model(model), progress=True)
            s = cosine_summary(grams, share=args.share)
            _print_table(s, "expert cosine per layer")
            written = _write(out, "cosine", s, charts.cosine_chart(cosine_pairs(grams), s), args.no_chart)
            written += _write(out, "cosine_energy", energy_curve(grams), charts.energy_chart(energy_curve(grams), args.share),
                              args.no_chart)
        elif args.what == "gates":
            from workbench.analysis.gates import drop_weakest_error, gate_by_slot, gate_slot_mean, mlx_expert_outputs

            t = gate_by_slot(trace, phase=phase)
            _print_table(gate_slot_mean(t), "mean normalized gate weight by slot (mean over layers)")
            written = _write(out, "gates", t, charts.gate_slot_chart(t), args.no_chart)
            if model is not None and "moe_input" in trace.routes.columns:
                d = drop_weakest_error(trace, mlx_expert_outputs(model), phase=phase,
                                       max_rows_per_layer=args.max_rows, progress=True)
                _print_table(d.groupby(["dropped", "renorm"], as_index=False)["rel_error"].mean(),
                             "drop-weakest relative L2 error (mean over layers)")
                written += _write(out, "drop_weakest", d, charts.drop_weakest_chart(d), args.no_chart)
            else:
                print("(drop-weakest error skipped: needs --model DIR and a trace with moe_input)")
        elif args.what == "union":
            from workbench.analysis.union import fit_union_slope, speedup_bound, speedup_grid, union_table, union_by_window

            t = union_by_window(trace, range(1, args.g_max + 1), phase=phase)
            k = t.attrs["k"]
            s = fit_union_slope(t, k)
            _print_table(t[t.scope != "layer"], f"distinct experts per window of g tokens (k={k}, fitted slope s={s:.3f})")
            b = speedup_bound(t, k)
            _print_table(b, "speedup bound for streaming-bound decode (best g per acceptance)")
            written = _write(out, "union", t, charts.union_chart(t, s), args.no_chart)
            import numpy as np

            grid = speedup_grid(union_table(t), k, np.round(np.linspace(0, 1, 51), 3))
            written += _write(out, "speedup", grid, charts.speedup_chart(grid), args.no_chart)
        elif args.what == "calibration":
            from workbench.analysis.calibration import (calibration_scores, claim_candidates, fit_claim_model,
                                                        held_out_overlap, precision_table, reliability_table)

            routers = None
            if model is not None:
                from workbench.analysis.lookahead import routers_from_model

                routers = routers_from_model(model)
            else:
                print("note: fitting on the trace's live pred_ columns, which skip experts already mapped (a selection "
                      "bias); give --model DIR to fit on predictions made before they are removed", file=sys.stderr)
            c = claim_candidates(trace, routers, phase)
            p = precision_table(c)
            _print_table(p, "predictor precision by source and rank")
            written = _write(out, "precision", p, charts.precision_chart(p), args.no_chart)
            m = fit_claim_model(c)
            from workbench.fsutil import atomic_write

            atomic_write(out / "claim_model.json", lambda tmp: Path(tmp).write_text(m.to_json()))
            written.append(out / "claim_model.json")  # the fitted q: `workbench run ... --calibrated` reads it
            if args.eval_trace:
                held = read_trace(args.eval_trace)
                share = held_out_overlap(trace, held)
                if share > 0:
                    return _err(f"--eval-trace {args.eval_trace}: {share:.0%} of its routing rows are in the fit trace "
                                f"{args.trace} (the same or an overlapping prompt); give a trace of other prompts")
                ev = claim_candidates(held, routers, phase)
                r = reliability_table(m, ev)
                _print_table(calibration_scores(m, ev), "claim probability q, held-out scores")
                written += _write(out, "reliability", r, charts.reliability_chart(r), args.no_chart)
        elif args.what == "bounds":
            written = _bounds(args, trace, out)
            if written is None:
                return 2
    except (TraceError, ValueError) as e:
        return _err(str(e))
    for p in written:
        print(f"wrote {p}")
    return 0


def _bounds(args, trace, out: Path):
    """workbench.analysis.bounds: hit curves (LRU, Belady) and the knapsack bound."""
    try:
        from workbench.analysis import bounds
    except ImportError as e:
        _err(f"bounds analysis is not available yet (workbench.analysis.bounds: {e})")
        return None
    import pandas as pd

    from workbench.viz import charts

    phase = None if args.phase == "all" else args.phase
    caps = range(1, args.max_slots + 1)
    curves = pd.concat([bounds.hit_curves(trace, capacities=caps, policy=p, phase=phase)
                        for p in args.policies.split(",") if p.strip()], ignore_index=True)
    # all layers together: total hits / total lookups at the same slots per layer
    agg = curves.groupby(["policy", "slots"], as_index=False)[["hits", "lookups"]].sum()
    agg["hit_rate"] = agg["hits"] / agg["lookups"]
    _print_table(agg.pivot(index="slots", columns="policy", values="hit_rate").reset_index(),
                 "hit rate vs slots per layer (all layers)")
    written = _write(out, "hit_curves", curves, charts.hit_curve_chart(agg, x="slots", y="hit_rate", color="policy"),
                     args.no_chart)
    if args.budget:
        budgets = [_parse_size(b) for b in args.budget.split(",") if b.strip()]
        kb = bounds.knapsack_bound(trace, budgets, phase=phase)
        _print_table(kb, "static pinning upper bound (fractional knapsack over hits per byte)")
        written += _write(out, "knapsack_bound", kb, None, True)
    return written


def cmd_bound(args) -> int:
    from workbench.analysis.union import (break_even, ceiling, fit_union_slope, parse_union_table, speedup_bound)

    try:
        u = parse_union_table(args.union)
        if args.k < 1:
            raise ValueError(f"--k must be >= 1, got {args.k}")
        if 1 in u and abs(u[1] - args.k) > 1e-9:
            print(f"warning: union(1)={u[1]} differs from k={args.k}; cost(g) = union(g)/k uses k", file=sys.stderr)
        acc = [float(x) for x in args.acceptance.split(",") if x.strip()]
        gv = [int(x) for x in args.g.split(",") if x.strip()] or None
        b = speedup_bound(u, args.k, acc, mode=args.mode, g_values=gv)
        c = ceiling(u, args.k, mode=args.mode, g_values=gv)
        be = break_even(u, args.k, mode=args.mode, g_values=gv)
        slope = fit_union_slope(u, args.k) if len(u) > 1 else None
    except ValueError as e:
        return _err(str(e))
    over = ("g in {" + ",".join(map(str, gv)) + "}") if gv else (
        "the measured g" if args.mode == "table" else f"g = 1..{max(u)} ({args.mode})")
    free = (not gv) or 1 in gv
    assumptions = (f"streaming-bound decode: cost(g) = union(g)/k, E[tokens](g) = (1-a^g)/(1-a); best g over {over}; "
                   + ("g = 1 (no drafting) is allowed, so speedup >= 1 and break-even = lowest acceptance at which "
                      "some g >= 2 pays" if free else "g = 1 is not allowed, so speedup < 1 (net loss) below break-even")
                   + "; draft cost and compute ignored")
    if args.json:
        print(json.dumps({
            "k": args.k, "union": {str(g): v for g, v in u.items()}, "mode": args.mode, "slope": slope,
            "ceiling": c["speedup"], "ceiling_g": c["g"],
            "speedups": [{"acceptance": r.acceptance, "best_g": int(r.best_g), "speedup": r.speedup}
                         for r in b.itertuples()],
            "break_even": be["acceptance"] if be["g"] is not None else None, "break_even_g": be["g"],
            "break_even_by_g": {str(g): (None if a != a else a) for g, a in be["by_g"].items()},
            "assumptions": assumptions}))
        return 0
    print(f"union table (k={args.k}): " + ", ".join(f"g={g}: {v:g}" for g, v in u.items())
          + (f"; fitted slope s={slope:.3f}" if slope is not None else ""))
    print(f"ceiling (a -> 1): {c['speedup']:.3f}x at g={c['g']}")
    for r in b.itertuples():
        print(f"  acceptance {r.acceptance:5.1%}: {r.speedup:.3f}x (best g={int(r.best_g)})")
    if be["g"] is None:
        print("break-even: none - no window g >= 2 pays even at acceptance 1")
    else:
        print(f"break-even acceptance: {be['acceptance']:.4f} (g={be['g']}); per g: "
              + ", ".join(f"g={g}: {'never' if a != a else f'{a:.4f}'}" for g, a in be["by_g"].items()))
    print(f"assumptions: {assumptions}")
    return 0
