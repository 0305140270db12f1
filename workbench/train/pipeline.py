"""One command on the GPU machine: corpus -> tokenizer -> sets -> train -> bf16 eval -> export.

``python -m workbench.train device-run --out $OUT`` writes at most 8 files under ``--out``
(each < 16 MiB): ``experts_*.safetensors`` (int8 rows), ``moe_dense.safetensors``,
``draft.safetensors``, ``meta.tar.gz`` (tokenizer, configs, metrics, corpus stats, eval sets
and workloads, training log). The tokenized corpus and checkpoints stay in ``--cache`` on the
machine so a following command (while the machine is warm) reuses them and ``--resume`` works.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
import time
from pathlib import Path

import numpy as np

from .configs import DRAFT_SHAPE, EOS_TOKEN, MOE_SHAPE, count_params, mlx_config
from .corpus import DEFAULT_HELDOUT, build_corpus, collect_prose, default_site_packages
from .sets import build_sets, read_jsonl
from .tokenizer import encode_texts, load_tokenizer, save_tokenizer, train_tokenizer

SET_NAMES = ("eval_heldout", "eval_indomain", "code_in_domain", "code_heldout", "prose_shifted")


def _sha(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()[:12]


def prepare(cache: Path, tokenizer: Path | None, site: str | None, heldout: tuple[str, ...],
            vocab: int, tok_sample_mod: int = 8) -> dict:
    """Build (or reuse from ``cache``) the tokenizer, token streams, eval sets and workloads."""
    cache.mkdir(parents=True, exist_ok=True)
    tokdir = cache / "tokenizer"
    if tokenizer is not None:
        if Path(tokenizer).resolve() != (tokdir / "tokenizer.json").resolve():
            tokdir.mkdir(parents=True, exist_ok=True)
            save_tokenizer(load_tokenizer(tokenizer), tokdir)
    stamp = cache / "prepared.json"
    if stamp.is_file() and (tokdir / "tokenizer.json").is_file():
        info = json.loads(stamp.read_text())
        if info.get("tokenizer_sha") == _sha(tokdir / "tokenizer.json") and tuple(info["heldout"]) == tuple(heldout):
            print(f"reusing prepared corpus in {cache}", flush=True)
            return info
    t0 = time.time()
    site = site or default_site_packages()
    corpus = build_corpus(site, heldout)
    stats = corpus.stats()
    print(f"corpus: train {stats['train']['bytes'] / 1e6:.1f} MB in {stats['train']['files']} files, "
          f"val {stats['val']['bytes'] / 1e6:.1f} MB, held-out {stats['heldout']['bytes'] / 1e6:.1f} MB "
          f"({time.time() - t0:.0f}s)", flush=True)
    if not (tokdir / "tokenizer.json").is_file():
        t1 = time.time()
        sample = [f.text for f in corpus.train if int(hashlib.sha1(f.path.encode()).hexdigest(), 16) % tok_sample_mod == 0]
        tok = train_tokenizer(sample, vocab)
        save_tokenizer(tok, tokdir)
        stats["tokenizer_sample_bytes"] = sum(len(t.encode()) for t in sample)
        print(f"tokenizer: {vocab} tokens from {stats['tokenizer_sample_bytes'] / 1e6:.1f} MB ({time.time() - t1:.0f}s)", flush=True)
    tok = load_tokenizer(tokdir)
    if tok.get_vocab_size() != MOE_SHAPE["vocab_size"]:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, model wants {MOE_SHAPE['vocab_size']}")
    eos = tok.token_to_id(EOS_TOKEN)
    t2 = time.time()
    streams = {}
    for split, files in (("train", corpus.train), ("val", corpus.val), ("heldout", corpus.heldout)):
        arr = encode_texts(tok, [f.text for f in files], eos)
        np.save(cache / f"tokens_{split}.npy", arr)
        streams[split] = int(arr.size)
    print(f"encoded: {streams} tokens ({time.time() - t2:.0f}s)", flush=True)
    prose = collect_prose(site)
    stats["prose_paragraphs"] = len(prose)
    counts = build_sets(tok, corpus, prose, cache / "sets")
    stats["tokens"] = streams
    stats["bytes_per_token"] = {s: stats[s]["bytes"] / max(1, streams[s]) for s in streams}
    info = {"tokenizer_sha": _sha(tokdir / "tokenizer.json"), "heldout": list(heldout), "stats": stats,
            "sets": counts, "prepare_seconds": time.time() - t0}
    (cache / "corpus_stats.json").write_text(json.dumps(stats, indent=1))
    stamp.write_text(json.dumps(info, indent=1))
    return info


def _tar(out: Path, members: dict[str, bytes | Path]) -> None:
    with tarfile.open(out, "w:gz") as tf:
        for name, src in members.items():
            data = src.read_bytes() if isinstance(src, Path) else src
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mtime = int(time.time())
            tf.addfile(ti, io.BytesIO(data))


def device_run(args) -> int:
    import torch

    from . import torch_train as tt

    t_begin = time.time()
    deadline = t_begin + args.max_seconds if args.max_seconds else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache)
    heldout = tuple(args.heldout.split(",")) if args.heldout else DEFAULT_HELDOUT
    info = prepare(cache, Path(args.tokenizer) if args.tokenizer else None, args.site_packages, heldout, MOE_SHAPE["vocab_size"])
    tok = load_tokenizer(cache / "tokenizer")
    torch.backends.cuda.matmul.allow_tf32 = True
    train_tokens = torch.from_numpy(np.load(cache / "tokens_train.npy").astype(np.int32)).to(tt.DEVICE)
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(0) if tt.DEVICE == "cuda" else "cpu"}
    import transformers

    env["transformers"] = transformers.__version__
    metrics: dict = {"env": env, "prepare": info}
    if args.bench:
        metrics["bench"] = tt.bench(train_tokens, tuple(int(b) for b in args.bench.split(",")), args.seq,
                                    steps=10 if tt.DEVICE == "cuda" else 2)
    a = tt.TrainArgs(batch=args.batch, seq=args.seq, steps=args.steps, train_seconds=args.train_seconds,
                     lr=args.lr, draft_every=args.draft_every, aux_coef=args.aux_coef)
    resume = cache / "ckpt_stable.pt" if args.resume else None
    if resume is None and (cache / "train_log.jsonl").exists():
        (cache / "train_log.jsonl").unlink()  # a fresh run starts a fresh log
    res = tt.train(train_tokens, a, cache, cache / "train_log.jsonl", resume=resume, deadline=deadline)
    moe, draft = res["moe"], res["draft"]
    env["experts_implementation"] = str(getattr(moe.config, "_experts_implementation", None))
    env["attn_implementation"] = str(getattr(moe.config, "_attn_implementation", None))
    metrics["train"] = res["summary"]
    metrics["train"]["param_counts_expected"] = {"moe": count_params(MOE_SHAPE), "draft": count_params(DRAFT_SHAPE)}
    files = tt.export_compact(moe, draft, out)  # first: the weights must come back whatever follows
    t_eval = time.time()
    metrics["eval_bf16"] = {}
    try:
        for name in ("eval_heldout", "eval_indomain", "prose_shifted"):
            recs = read_jsonl(cache / "sets" / f"{name}.jsonl")
            metrics["eval_bf16"][name] = tt.evaluate(moe, draft, tok, recs, 512)
            e = metrics["eval_bf16"][name]
            print(f"eval {name}: moe loss {e['moe_loss']:.4f} (ppl {e['moe_ppl']:.2f}), draft {e['draft_loss']:.4f}, "
                  f"agree {e['greedy_agreement']:.3f}, min entropy {min(e['routing_usage_entropy_bits']):.3f} bits, "
                  f"max share {max(e['busiest_expert_slot_share']):.4f}", flush=True)
    except Exception as exc:  # keep the exported weights and say what broke
        import traceback

        traceback.print_exc()
        metrics["eval_error"] = repr(exc)
    metrics["eval_seconds"] = time.time() - t_eval
    eos = tok.token_to_id(EOS_TOKEN)
    metrics["export_files"] = files
    metrics["wall_seconds_total"] = time.time() - t_begin
    members: dict[str, bytes | Path] = {
        "tokenizer.json": cache / "tokenizer" / "tokenizer.json",
        "tokenizer_config.json": cache / "tokenizer" / "tokenizer_config.json",
        "moe_config.json": json.dumps(mlx_config(MOE_SHAPE, eos), indent=1).encode(),
        "draft_config.json": json.dumps(mlx_config(DRAFT_SHAPE, eos), indent=1).encode(),
        "metrics.json": json.dumps(metrics, indent=1).encode(),
        "corpus_stats.json": cache / "corpus_stats.json",
        "train_log.jsonl": cache / "train_log.jsonl",
    }
    for name in SET_NAMES:
        members[f"sets/{name}.jsonl"] = cache / "sets" / f"{name}.jsonl"
    _tar(out / "meta.tar.gz", members)
    for p in sorted(out.iterdir()):
        print(f"out: {p.name} {p.stat().st_size / 2**20:.2f} MiB", flush=True)
    print(json.dumps({"tokens": metrics["train"]["tokens"], "train_s": round(metrics["train"]["train_seconds"], 1),
                      "tok_s": round(metrics["train"]["tokens_per_s"]),
                      "heldout_loss": metrics["eval_bf16"]["eval_heldout"]["moe_loss"],
                      "wall_s": round(metrics["wall_seconds_total"], 1)}), flush=True)
    return 0
