"""`workbench report`: execute the notebooks headless and write a static HTML + figure report."""

from __future__ import annotations

import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="run the notebooks (papermill) and write HTML pages + PNG/SVG figures",
        description="Execute notebooks/NN_*.ipynb with papermill and write, for each, a static "
                    "HTML page and every chart as PNG and SVG (vl-convert), plus index.html.")
    p.add_argument("--params", default=None, metavar="FILE|PRESET",
                   help="YAML/JSON parameters file, or a preset name: small (CI, seconds) or full "
                        "(the notebooks' own defaults; the default)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output directory (default: reports/latest): new, empty, or a previous report, replaced atomically")
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated notebook names or NN prefixes, e.g. 01,05_mtp_union")
    p.add_argument("--kernel", default="python3",
                   help="Jupyter kernel name (installed for this Python if missing; default python3)")
    p.add_argument("--timeout", type=int, default=900, metavar="SECONDS",
                   help="per-cell execution timeout (default 900)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="notebooks executed at once (default: 2 on a machine with 2+ cores)")
    p.set_defaults(func=run_report)


def run_report(args) -> int:
    from workbench.report import build_report

    try:
        rep = build_report(args.out, params=args.params, only=args.only, kernel=args.kernel,
                           timeout=args.timeout, jobs=args.jobs)
    except ValueError as e:
        print(f"workbench report: {e}", file=sys.stderr)
        return 2
    for r in rep.notebooks:
        mark = "ok  " if r.ok else "FAIL"
        print(f"{mark} {r.name:<16} {r.seconds:6.1f} s  {len(r.charts):2d} figures"
              + (f"  {r.error}" if r.error else ""))
    if not rep.published:
        print(f"workbench report: every notebook failed; {rep.out} was left as it was", file=sys.stderr)
        return 1
    print(f"report: {rep.out}/index.html ({rep.seconds:.1f} s)")
    return 0 if rep.ok else 1
