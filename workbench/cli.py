"""Command line: ``workbench pack | run | demo`` and the subcommands of the analysis modules."""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path

SUBCOMMAND_MODULES = ("workbench.cli_policy", "workbench.cli_sim", "workbench.cli_analysis", "workbench.cli_report",
                      "workbench.cli_scale", "workbench.cli_ledger")


def parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids wants comma-separated integers, got {text!r}") from None


def add_arena_args(p):
    """--arena, --policy, --hotlist (``arena_config``): one spelling for the engine and ioreplay."""
    p.add_argument("--arena", default="0.25",
                   help="fraction of routed experts (0.25, 25%%), slot count (64) or size (2GB = 2e9 bytes, 2GiB = 2^31)")
    p.add_argument("--policy", default="lru", help="eviction policy (lru, slru, twohit, ds4, static, s3fifo, lfu, fifo)")
    p.add_argument("--hotlist", help="hotlist file for --policy static or ds4 (KEY or LAYER EXPERT per line)")


def add_io_args(p):
    """--io-workers, --io-reserved, --io-mode (``io_config``): one spelling for the engine and ioreplay."""
    p.add_argument("--io-workers", type=int, default=8)
    p.add_argument("--io-reserved", type=int, default=2, help="workers that serve only urgent reads")
    p.add_argument("--io-mode", default="buffered", help="buffered | dontneed | direct | nocache")


def add_engine_args(p):
    add_arena_args(p)
    add_io_args(p)
    p.add_argument("--verify", default="changed",
                   help="checksum blobs: always | changed (first read, and again after experts.bin changed) | "
                        "first (first read of each) | never")
    p.add_argument("--device", default=None, help="cpu | gpu (default: MLX's default device)")
    p.add_argument("--decode", default="auto", help="auto | optimistic (one host sync per token, verified) | layer "
                                                    "(one sync per MoE layer)")
    p.add_argument("--slot-writes", default=None, help="direct (reads land in slot memory) | mapped (direct into "
                   "slot memory kept on the host, read by the GPU over the bus; CUDA) | staged (pinned bounce rows "
                   "landed in GPU memory by a kernel; CUDA); default: direct on CPU and Metal, on CUDA mapped for a "
                   "partial arena and staged for a full one")
    add_ahead_args(p.add_argument_group("read-ahead and cache-aware routing"), live=True)


def add_ahead_args(g, live: bool) -> None:
    """The AheadConfig flags, one spelling for ``run``/``demo``/``compare`` (``live``) and ``simulate``/``ioreplay``."""
    if live:
        g.add_argument("--predictor", default=None,
                       help="none | layer | prev | oracle (default: layer when --lookahead is given, else none)")
    else:
        g.add_argument("--predictor", default=None,
                       help="oracle, or a recorded source (the trace's pred_SRC column, e.g. layer); default: layer "
                            "when --lookahead is given, else no read-ahead")
    default = "1" if live else "from the predictor's name: dN, 1 for oracle, one token for prev"
    g.add_argument("--lookahead", type=int, default=None, help=f"distance D in MoE layers ahead (default {default}); "
                                                               "without --predictor it implies --predictor layer")
    g.add_argument("--mode", default="raw", help="raw: exact router, raw top-k read-ahead | resident_bonus: "
                   "cache-aware router p=3 (approximate) | cache_aware: cache-aware router with --moce-* (approximate); "
                   "the seed's names unpert1 | unpert0 | route also work"
                   + ("" if live else "; here it only ranks read-ahead candidates"))
    if live:  # deprecated spellings of --mode, kept for old command lines
        g.add_argument("--unpert", dest="mode", type=_unpert_mode, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        g.add_argument("--route", dest="mode", action="store_const", const="cache_aware", default=argparse.SUPPRESS,
                       help=argparse.SUPPRESS)
    g.add_argument("--ahead-width", type=int, default=None, help="candidates ranked per target layer (default top-k)")
    if live:
        g.add_argument("--oracle-trace", help="trace of the same prompt for --predictor oracle")
    g.add_argument("--moce-bonus", type=float, default=0.85, help="resident bonus b")
    g.add_argument("--moce-protect", type=int, default=3, help="protected width p")
    g.add_argument("--moce-r1", type=float, default=0.0, help="rank-1 resident bonus r1")
    g.add_argument("--gate", default="none", help="admission gate: none | confidence | cost")
    g.add_argument("--calibrated", metavar="CLAIM_MODEL_JSON", default=None,
                   help="cost gate with the fitted q per rank and layer (claim_model.json of `workbench analyze --what "
                        "calibration --out DIR`) instead of q = 0.5; implies --gate cost")
    if live:
        g.add_argument("--routing", dest="router", default=None, choices=("exact", "cache_aware"),
                       help="fix the router apart from --mode's ranking (the seed's UNPERT 2x2); default: as --mode says")


def _unpert_mode(text: str) -> str:
    from .config import SEED_MODE_NAMES

    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"--unpert must be 0 or 1, got {text!r} (deprecated: use --mode raw|resident_bonus)")
    return SEED_MODE_NAMES[f"unpert{text}"]


def ahead_config(args):
    """The AheadConfig the read-ahead flags describe."""
    from .config import AheadConfig

    oracle = getattr(args, "oracle_trace", None)
    gate, options = args.gate, None
    if args.calibrated:
        if gate not in ("none", "cost"):
            raise ValueError(f"--calibrated sets the cost gate's q; it does not apply to --gate {gate}")
        gate, options = "cost", {"q_table": calibrated_q(args.calibrated, args.predictor, args.lookahead)}
    return AheadConfig(predictor=args.predictor, lookahead=args.lookahead, width=args.ahead_width, mode=args.mode,
                       moce_bonus=args.moce_bonus, moce_protect=args.moce_protect, moce_r1=args.moce_r1, gate=gate,
                       gate_options=options, router=getattr(args, "router", None), oracle_trace=_oracle_trace(oracle) if oracle else None)


def calibrated_q(path, predictor, lookahead) -> dict:
    """--calibrated FILE: the fitted claim model's q table for the predictor that reads ahead."""
    from .analysis.calibration import ClaimModel
    from .checks import read_text

    text = read_text("--calibrated", path, fix="give the claim_model.json that "
                     "`workbench analyze --what calibration --out DIR` writes")
    try:
        model = ClaimModel.from_json(text)
    except (json.JSONDecodeError, TypeError):
        raise ValueError(f"--calibrated {path}: not a claim model (JSON of `workbench analyze --what calibration`); "
                         "write one with `workbench analyze TRACE --what calibration --model DIR --out DIR`") from None
    predictor = predictor or ("layer" if lookahead else "none")
    source = {"layer": f"d{lookahead or 1}", "prev": "prev"}.get(predictor)
    if source is None:
        raise ValueError(f"--calibrated needs a layer or prev predictor (got {predictor}): give --lookahead D")
    return model.gate_table(source)


def _oracle_trace(path):
    """--oracle-trace, read once while the file stays the same (every variant of ``compare``
    shares it; planners only read it)."""
    try:
        st = os.stat(path)
    except OSError:
        return _read_trace(path, None)  # read_trace names the problem
    return _read_trace(path, (st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=1)
def _read_trace(path, stamp):
    from .trace.schema import read_trace

    return read_trace(path)


def arena_config(args, **extra):
    """The ArenaConfig of --arena, --policy and --hotlist (``extra``: more ArenaConfig fields)."""
    from .arena.policies.static import require_hotlist
    from .config import ArenaConfig

    options = {"hotlist": args.hotlist} if getattr(args, "hotlist", None) else None
    require_hotlist(args.policy, options or {}, "--hotlist FILE")
    return ArenaConfig(size=args.arena, policy=args.policy, policy_options=options, **extra)


def io_config(args, verify):
    """The IOConfig of --io-workers, --io-reserved and --io-mode."""
    from .config import IOConfig

    return IOConfig(workers=args.io_workers, reserved=args.io_reserved, mode=args.io_mode, verify=verify)


def engine_config(args) -> dict:
    """Engine keyword arguments from the flags, every value checked before a store is opened or a thread started."""
    from .checks import whole

    if getattr(args, "max_tokens", None) is not None:
        whole("--max-tokens", args.max_tokens, 1)
    whole("--seed", getattr(args, "seed", None), 0, 2**64 - 1, none_ok=True)  # MLX's generator takes a uint64
    return dict(arena=arena_config(args, writes=args.slot_writes), io=io_config(args, args.verify),
                ahead=ahead_config(args), device=args.device, decode=args.decode, seed=getattr(args, "seed", None),
                kv=kv_config(args))


def kv_config(args):
    """The KVConfig of --max-kv-size, --kv-bits, --kv-group-size, --quantized-kv-start, --prefill-step-size."""
    from .config import KVConfig

    return KVConfig(max_size=args.max_kv_size, bits=args.kv_bits, group_size=args.kv_group_size,
                    quantized_start=args.quantized_kv_start, prefill_step=args.prefill_step_size)


def cmd_pack(args) -> int:
    from .store.pack import pack

    out = pack(args.model_dir, args.store_dir)
    print(f"packed {args.model_dir} -> {out}")
    return 0


def cmd_cache(args) -> int:
    from .store.cache import list_stores, remove_store, stores_dir

    if args.action == "path":
        print(stores_dir())  # where the stores are ($WORKBENCH_CACHE/stores)
        return 0
    if args.action == "list":
        rows = list_stores()
        if args.json:
            print(json.dumps(rows))
        for r in [] if args.json else rows:
            what = "dead packer's temp folder (workbench cache rm NAME)" if r["stale"] else (r["source"] or "?")
            print(f"{r['name']:<48} {r['bytes'] / 1e6:10.1f} MB  {what}")
        if not rows and not args.json:
            print(f"no cached stores in {stores_dir()}")
        return 0
    if not args.names and not args.all:
        raise ValueError("workbench cache rm: name the stores to remove (see `workbench cache list`) or pass --all")
    names = [r["name"] for r in list_stores()] if args.all else args.names
    for name in names:
        print(f"removed {remove_store(name)}")
    return 0


def open_engine(args, progress, kw):
    """An Engine on ``args.model`` with the engine keyword arguments ``kw`` (``check_run_flags``' result)."""
    from .engine.engine import Engine
    from .store.cache import resolve_store

    return Engine(resolve_store(args.model, progress=progress, store=getattr(args, "store", None)), progress=progress, **kw)


def max_tokens_arg(text: str) -> int:
    """``-m``/``--max-tokens``: an integer; a model path given to ``-m`` gets a hint (``-m`` is mlx-lm's)."""
    try:
        return int(text)
    except ValueError:
        if "/" not in text and not Path(text).exists():
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        raise argparse.ArgumentTypeError(f"-m is --max-tokens, as in mlx_lm generate; got {text!r}: give the model "
                                         f"as the first argument or with --model {text}") from None


def str2bool(text: str) -> bool:
    """``--verbose``, read as ``mlx_lm generate`` reads it (only false/f, any case, is false)."""
    return text.lower() not in ("false", "f")


def add_generation_args(p, max_tokens=None):
    """mlx-lm's generation flags (same names and defaults as ``mlx_lm generate`` 0.32; ``max_tokens``
    replaces its --max-tokens default)."""
    from .generate import DEFAULT_MAX_TOKENS

    max_tokens = max_tokens or DEFAULT_MAX_TOKENS
    g = p.add_argument_group("generation (as mlx_lm generate)")
    g.add_argument("--max-tokens", "-m", type=max_tokens_arg, default=max_tokens,
                   help=f"most tokens to generate (default {max_tokens})")
    g.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0: greedy)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling")
    g.add_argument("--min-p", type=float, default=0.0, help="min-p sampling")
    g.add_argument("--top-k", type=int, default=0, help="top-k sampling (0: off)")
    g.add_argument("--seed", type=int, default=None,
                   help="PRNG seed, set where mlx_lm generate sets it (before the models are built)")
    g.add_argument("--system-prompt", default=None, help="system message for the chat template")
    g.add_argument("--ignore-chat-template", action="store_true", help="use the raw prompt without the chat template")
    g.add_argument("--chat-template-config", default=None,
                   help="JSON object of extra apply_chat_template arguments, e.g. '{\"enable_thinking\": false}'")
    g.add_argument("--extra-eos-token", nargs="+", default=(), help="more tokens (strings or ids) that stop generation")
    g.add_argument("--verbose", type=str2bool, default=True,
                   help="True (default): stream the text, then the summary and counters; False or F: only the text")
    g.add_argument("--max-kv-size", type=int, default=None,
                   help="most KV cache entries (a rotating cache keeping the first 4); tokens then run layer by layer")
    g.add_argument("--kv-bits", type=int, default=None, help="quantize the KV cache to this many bits (default: not); "
                                                             "tokens then run layer by layer")
    g.add_argument("--kv-group-size", type=int, default=64, help="group size of KV cache quantization (default 64)")
    g.add_argument("--quantized-kv-start", type=int, default=5000,
                   help="with --kv-bits: quantize once the cache holds this many entries (default 5000)")
    g.add_argument("--prefill-step-size", type=int, default=2048, help="prompt tokens per prefill pass (default 2048)")
    g.add_argument("--draft-model", default=None, help="mlx-lm model directory (or cached HF repo id) to draft with")
    g.add_argument("--num-draft-tokens", type=int, default=3, help="tokens drafted per verify pass")
    g.add_argument("--compare-plain", action="store_true",
                   help="with --draft-model: also run plain streaming on a fresh engine and report both")


def check_run_flags(args) -> dict:
    """``run``'s values that need no model, checked before anything is packed or opened; returns the
    engine keyword arguments (arena, policy, I/O, read-ahead, seed; --max-tokens checked)."""
    from .checks import whole

    kw = engine_config(args)
    if args.draft_model:
        whole("--num-draft-tokens", args.num_draft_tokens, 1)
    return kw


def prompt_ids(args, eng, tok, template_kwargs):
    """The prompt's ids and whether the chat template built them: ``--prompt-ids`` as they are,
    else the prompt text (mlx-lm's default ``hello`` when neither is given), through the chat
    template with ``template_kwargs`` (``--chat-template-config``)."""
    from . import generate as gen

    if args.prompt_ids is not None:
        return eng.encode(args.prompt_ids), False
    if tok is None:
        raise ValueError(f"{eng.root} has no tokenizer; pass token ids (--prompt-ids) instead of text")
    text = gen.DEFAULT_PROMPT if args.prompt is None else args.prompt
    text = text if args.raw_prompt else gen.read_prompt(text)
    ids = gen.build_prompt(tok, text, args.system_prompt, args.ignore_chat_template, template_kwargs)
    return eng.encode(ids), gen.uses_chat_template(tok, args.ignore_chat_template)


def cmd_run(args) -> int:
    run_and_print(args)
    return 0


def run_and_print(args):
    """``workbench run``: generate and print as ``mlx_lm generate`` does; returns (tokens, prompt ids)."""
    from . import generate as gen
    from .data import default_model
    from .store.cache import resolve_store
    from .engine.speculative import speculative_generate
    from .trace.recorder import TraceRecorder

    name = args.model_flag or args.model or str(default_model())
    if args.model_flag and args.model and args.model_flag != args.model:
        raise ValueError(f"two models given ({args.model} and --model {args.model_flag}); give one")
    if args.draft_model and args.trace:
        raise ValueError("--draft-model runs without --trace; drop one of them")
    template_kwargs = gen.chat_template_config(args.chat_template_config)  # checked before anything is packed
    sampler = gen.make_sampler(args.temp, args.top_p, args.min_p, args.top_k)
    talk = args.verbose and not args.json  # progress bars and the streamed text
    kw = check_run_flags(args)
    trace = TraceRecorder(args.trace, moe_input=args.trace_moe_input, io_events=args.trace_io) if args.trace else None
    args.model = str(resolve_store(gen.resolve_model(name), progress=talk, store=getattr(args, "store", None)))  # packs on first use
    with open_engine(args, talk, kw) as eng:
        draft = gen.load_draft_model(args.draft_model) if args.draft_model else None
        tok = gen.tokenizer_of(eng)
        ids, chat = prompt_ids(args, eng, tok, template_kwargs)
        eos = gen.eos_ids(tok, eng.config, args.extra_eos_token)
        stream = gen.TextStream(tok, eos) if talk and tok is not None else None
        gen.check_context(eng.config, len(ids))  # before prefill
        if draft is not None:
            gen.check_draft(draft, eng.config)
            run = lambda: speculative_generate(eng, draft[0], ids, args.max_tokens, args.num_draft_tokens,  # noqa: E731
                                               sampler=sampler, eos_token_ids=eos, progress=False, on_token=stream)
        else:
            run = lambda: eng.generate(ids, max_tokens=args.max_tokens, trace=trace, sampler=sampler,  # noqa: E731
                                       eos_token_ids=eos, progress=stream is None and talk, on_token=stream)
        if stream is not None:
            print("=" * 10, flush=True)
        res, timing = gen.timed(run, len(ids))
        text = stream.finish() if stream is not None else gen.decode(tok, res.tokens, eos)
        config = gen.run_config(eng, name, ids, args, chat)
    if draft is not None and args.compare_plain:  # a fresh engine, so neither run inherits a warm arena
        with open_engine(args, False, kw) as plain:
            base = plain.generate(ids, max_tokens=args.max_tokens, sampler=sampler, eos_token_ids=eos).stats
        sp = res.stats["speculative"]
        sp["plain"] = {"tokens_per_s": base["tokens_per_s"], "bytes_per_token": base["bytes_per_token"],
                       "hit_rate": base["hit_rate"], "speedup": res.stats["tokens_per_s"] / base["tokens_per_s"]
                       if base["tokens_per_s"] else None}
    stats = res.stats
    if not eng.reader.through_page_cache:  # speculative runs report through the same stats
        stats["page_cache_hits"] = stats["prefill"]["page_cache_hits"] = None
    stats["peak_memory_gb"] = timing.peak_memory_gb
    if args.json:
        print(json.dumps({"tokens": res.tokens, "text": text, "stats": stats, "timing": timing.as_dict(),
                          "finish_reason": "stop" if res.tokens and res.tokens[-1] in eos else "length",
                          "config": config}))
    elif not args.verbose:  # mlx_lm generate --verbose False prints the response only
        print(text if text is not None else ",".join(map(str, res.tokens)))
    else:
        _print_summary(res, text, timing, stream is not None, args.verify)
    return res.tokens, ids


def _print_summary(res, text, timing, streamed, verify) -> None:
    """After the streamed text: mlx-lm's summary lines (or its "No text generated"), then the counters."""
    from . import generate as gen
    from .config import VERIFY_NEVER_RISK
    from .viz.tables import speculative_table, summary_table

    stats = res.stats
    if streamed:
        print()
        print("=" * 10)
    else:
        print(f"tokens: {res.tokens} (this store has no tokenizer)")
    print(gen.NO_TEXT if streamed and not text else timing.summary())
    print(summary_table(stats))
    if verify == "never":
        print(VERIFY_NEVER_RISK)
    if "speculative" in stats:
        print(speculative_table(stats))


def _share(arena: str) -> str:
    """An --arena value as a user reads it, as ``sizes.arena_slots`` reads it: a fraction 0.25 -> 25%,
    a whole number is slots (64 -> 64-slot), anything else as written (25%, 2GB)."""
    text = str(arena).strip()
    if re.fullmatch(r"[0-9]*\.[0-9]+", text):
        return f"{float(text):.0%}"
    return f"{text}-slot" if text.isdigit() else text


def cmd_demo(args) -> int:
    """The case in a minute (``workbench.demo``): a held-out prompt streamed through a 25% arena, equal
    to resident mlx-lm; the same prompt over arenas with and without read-ahead; then the report."""
    from . import demo
    from .data import default_model
    from .viz.render import save_chart

    model = default_model()
    if not args.no_report:
        from .report import check_out

        check_out(args.out)  # refuse a directory the report may not replace before running anything
    prompt = demo.demo_prompt()
    args.model, args.model_flag, args.prompt, args.prompt_ids = str(model), None, prompt, None
    args.json, args.trace, args.trace_moe_input, args.trace_io = False, None, False, False
    tail = "\n".join(prompt.rstrip("\n").splitlines()[-6:])
    print(f"demo: {model}, prompt: the held-out file {demo.PROMPT[1]} (its last lines):\n{tail}\n")
    print(f"1. streamed through a {_share(args.arena)} arena (workbench run):")
    streamed, ids = run_and_print(args)
    reference = demo.resident_tokens(model, ids, args.max_tokens)
    same = "equal" if streamed == reference else "DIFFERENT (a bug: please report it)"
    print(f"\n   resident mlx-lm (generate_step, all weights in memory), same prompt: {len(reference)} tokens, "
          f"{same} to the streamed ones")
    print("\n2. the same prompt at 100%, 25% and 10% arenas, without and with read-ahead (one run each):")
    runs = demo.arena_runs(Path(args.model), ids, args.max_tokens, reference)  # the store run_and_print resolved
    print(demo.table_text(runs))
    print("   (this store is small: its reads come from the OS page cache here; with a model larger than RAM each MB "
          "read per token is an SSD read, notebook 07 measures that path)")
    chart = Path(args.out).with_name(Path(args.out).name + "_arenas")
    saved = save_chart(demo.demo_chart(runs), chart)
    print(f"   chart: {', '.join(map(str, saved))}")
    rc = 0 if runs["equals mlx-lm"].all() and streamed == reference else 1
    if rc == 0 and not args.no_report:
        from .report import build_report

        out = build_report(out=args.out, preset="small")
        if not out.published:
            print(f"demo: every report notebook failed; {out} was left as it was", file=sys.stderr)
            return 1
        print(f"\n3. the report: {out}/index.html (built with the reduced 'small' preset: its numbers check that "
              "everything runs, they are not the measurements; the full report: workbench report --params full)")
    return rc


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="workbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pack", help="split an mlx-lm MoE model into an expert store")
    p.add_argument("model_dir")
    p.add_argument("store_dir")
    p.set_defaults(func=cmd_pack)

    p = sub.add_parser("run", help="generate with experts streamed through a bounded arena")
    p.add_argument("model", metavar="MODEL_OR_STORE", nargs="?",
                   help="mlx-lm model directory, workbench store, or Hugging Face repo id in the local cache "
                        "(default: the shipped reference model; mlx-lm's default model is not a MoE)")
    p.add_argument("--model", dest="model_flag", metavar="MODEL_OR_STORE",
                   help="the same, as a flag (as in mlx_lm generate; -m is --max-tokens there and here)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt", "-p", help="prompt text ('-' reads stdin; default 'hello', as mlx_lm generate); "
                                         "the chat template applies if there is one")
    g.add_argument("--prompt-ids", type=parse_ids, help="prompt token ids, used as they are")
    p.add_argument("--trace", help="write a Parquet trace here")
    p.add_argument("--trace-moe-input", action="store_true", help="also record MoE inputs (lookahead analysis)")
    p.add_argument("--trace-io", action="store_true", help="also record the I/O event table")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--store", help="where to pack MODEL_DIR (default: the cache, $WORKBENCH_CACHE/stores)")
    add_generation_args(p)
    add_engine_args(p)
    p.set_defaults(func=cmd_run, raw_prompt=False)

    p = sub.add_parser("cache", help="the store cache: list | rm NAME... | path (of the stores folder)",
                       description="Stores packed by `workbench run MODEL_DIR` live in $WORKBENCH_CACHE/stores "
                                   "(default ~/.cache/workbench).")
    p.add_argument("action", choices=("list", "rm", "path"))
    p.add_argument("names", nargs="*", help="for rm: store names as `list` prints them")
    p.add_argument("--all", action="store_true", help="for rm: every cached store")
    p.add_argument("--json", action="store_true", help="for list: print JSON")
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("demo", help="the main job on the shipped reference model, then a report")
    p.add_argument("--out", default="reports/demo")
    p.add_argument("--no-report", action="store_true")
    add_generation_args(p, max_tokens=48)
    add_engine_args(p)
    p.set_defaults(func=cmd_demo, raw_prompt=True)

    for name in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            if e.name != name:
                raise
            continue
        mod.register(sub)
    return parser


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (the flag, the problem, where the help is)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def _exit_at_start_up(signum, frame):
    os._exit(130)  # only imports ran: nothing to clean up, and no library's ``except:`` can swallow it


def main(argv=None) -> int:
    # Ctrl-C during the imports of mlx-lm (seconds) exits at once, where Ctrl-C raises KeyboardInterrupt at
    # all: a caller that ignores it (a script's background job inherits SIGINT ignored) or handles it in C
    # keeps its choice for the whole run
    start_up = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if start_up:
        signal.signal(signal.SIGINT, _exit_at_start_up)
    try:
        parser = build_parser()
    finally:
        if start_up:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except OSError as e:
        from .fsutil import os_error_hint

        print(f"workbench: error: {os_error_hint(e)}", file=sys.stderr)
        return 2
    except MemoryError:
        print("workbench: error: out of memory; use a smaller --arena or a smaller model", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError, KeyError, OverflowError) as e:
        msg = " ".join(str(e).split()) or type(e).__name__
        print(f"workbench: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
