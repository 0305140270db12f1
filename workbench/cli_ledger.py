"""`workbench ledger`: the claims ledger over a workload, from the command line.

    workbench ledger [--per-domain N] [--prompt-tokens N] [--max-tokens N] [--no-live] [--small] [--json]

Runs the reference model (or --model DIR) over the workload (N prompts from each of in-domain,
held-out and shifted-domain text; traces cached), measures every claim with a 95% bootstrap
interval over prompts and prints, per row: claim, seed value, ours, interval, method, rule, verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("ledger", help="the claims ledger over a workload, verdicts by rule",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="mlx-lm model directory (default: the shipped reference model)")
    p.add_argument("--per-domain", type=int, default=4, help="prompts per domain (3 domains; default 4)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="teacher-forced tokens per prompt (default 128)")
    p.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    p.add_argument("--no-live", action="store_true", help="skip the live engine runs (strata table, self-draft)")
    p.add_argument("--small", action="store_true", help="1 prompt per domain, short runs (seconds, for a smoke test)")
    p.add_argument("--json", action="store_true", help="print one JSON object: {model, rows: [...]}")
    p.set_defaults(func=cmd_ledger)


def _num(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def check_model_dir(path) -> None:
    """--model is an mlx-lm model directory (the ledger also runs it resident), not a store."""
    from pathlib import Path

    from workbench.model import load_config, weight_files
    from workbench.store.manifest import MANIFEST

    path = Path(path)
    if (path / MANIFEST).is_file():
        raise ValueError(f"--model {path} is a workbench store; the ledger also runs the model resident, so give the "
                         "mlx-lm model directory it was packed from (`workbench cache list` shows it)")
    load_config(path)
    if not weight_files(path):
        raise ValueError(f"--model {path} has no model*.safetensors; give an mlx-lm model directory")


def cmd_ledger(args) -> int:
    from workbench.analysis.ledger import workload_ledger
    from workbench.analysis.workload import record_workload, workload_set

    if args.small:
        args.per_domain, args.prompt_tokens, args.max_tokens = 1, 32, 8
    try:
        if args.model is not None:
            check_model_dir(args.model)
        w = record_workload(workload_set(args.per_domain), args.model, args.prompt_tokens, args.max_tokens,
                            progress=not args.json)
        led, _ = workload_ledger(w, live=not args.no_live, cosine_layers=2 if args.small else 0,
                                 strata_tokens=6 if args.small else None, readpath_repeats=2 if args.small else 5,
                                 progress=not args.json)
    except (ValueError, OSError) as e:
        print(f"workbench: error: {e}", file=sys.stderr)
        return 2
    cols = ["id", "claim", "seed", "seed_low", "seed_high", "ours", "low", "high", "n", "method", "rule", "verdict", "note"]
    if args.json:
        rows = [{c: _num(r[c]) for c in cols} for r in led[cols].to_dict("records")]
        print(json.dumps({"model": str(w.model), "prompts": [r.prompt.id for r in w.runs], "rows": rows}))
        return 0
    print(f"ledger: {w.model}, {len(w.runs)} prompts ({args.prompt_tokens} teacher-forced + {args.max_tokens} greedy tokens each)")
    for r in led.itertuples():
        seed = f"{r.seed_low:.4g}..{r.seed_high:.4g}" if r.seed_low != r.seed_high else f"{r.seed:.4g}"
        ours = "-" if math.isnan(r.ours) else f"{r.ours:.4g}"
        iv = "" if math.isnan(r.low) else f"[{r.low:.4g}, {r.high:.4g}] n={r.n}"
        print(f"{r.id:<30} {r.claim[:46]:<46} seed {seed:<13} ours {ours:<8} {iv:<24} {r.verdict:<12} "
              f"{r.rule}; {r.method}")
    counts = led["verdict"].value_counts().to_dict()
    print("verdicts: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0
