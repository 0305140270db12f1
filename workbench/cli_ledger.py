"""`workbench ledger`: the claims ledger over a workload, from the command line.

    workbench ledger [--per-domain N] [--prompt-tokens N] [--max-tokens N] [--no-live] [--small] [--json]

Runs the reference model (or --model DIR) over the workload (N prompts from each of in-domain,
held-out and shifted-domain text, up to --prompt-tokens each; traces cached), measures every claim
of both seed documents and prints, per row: claim, seed value, ours, 95% interval (and prediction
interval for one prompt), verdict (reproduced / differs / not comparable / not measurable here,
with the reason), rule and method; then one verdict per claim id. Timing rows are marked.
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
    p.add_argument("--small", action="store_true", help="the report's small preset: 1 prompt per domain, short runs, "
                                                         "no live rows (seconds; its totals are the small report's)")
    p.add_argument("--json", action="store_true", help="print one JSON object: {model, prompts, teacher_forced_tokens, "
                                                      "claims, headline, rows: [...]}")
    p.set_defaults(func=cmd_ledger)


def _num(x):
    x = x.item() if hasattr(x, "item") and not isinstance(x, (list, str)) else x  # numpy scalars -> Python
    return None if isinstance(x, float) and math.isnan(x) else x


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
    from workbench.analysis.ledger import COLUMNS, claim_verdicts, headline_counts, workload_ledger
    from workbench.analysis.workload import SMALL, record_workload, workload_set
    from workbench.viz.tables import ledger_table

    if args.small:  # the report's small preset (notebook 08): the same workload, no live rows, 2 cosine layers
        args.per_domain, args.prompt_tokens, args.max_tokens = SMALL["per_domain"], SMALL["prompt_tokens"], SMALL["max_tokens"]
        args.no_live = True
    try:
        if args.model is not None:
            check_model_dir(args.model)
        w = record_workload(workload_set(args.per_domain), args.model, args.prompt_tokens, args.max_tokens,
                            progress=not args.json)
        led, _ = workload_ledger(w, live=not args.no_live, cosine_layers=2 if args.small else 0,
                                 readpath_repeats=2 if args.small else 5, progress=not args.json)
    except (ValueError, OSError) as e:
        print(f"workbench: error: {e}", file=sys.stderr)
        return 2
    lengths = sorted(len(r.prompt_ids) for r in w.runs)
    tokens = (f"{lengths[0]}" if lengths[0] == lengths[-1] else f"{lengths[0]}-{lengths[-1]}")
    if args.json:
        rows = [{c: _num(r[c]) for c in COLUMNS} for r in led.to_dict("records")]
        print(json.dumps({"model": str(w.model), "prompts": [r.prompt.id for r in w.runs],
                          "teacher_forced_tokens": [len(r.prompt_ids) for r in w.runs],
                          "claims": claim_verdicts(led).to_dict(), "headline": headline_counts(led), "rows": rows}))
        return 0
    print(f"ledger: {w.model}, {len(w.runs)} prompts ({tokens} teacher-forced + {args.max_tokens} greedy tokens each)")
    print(ledger_table(led.to_dict("records")))
    print(headline_counts(led) + (" (the report's small preset)" if args.small else ""))
    return 0
