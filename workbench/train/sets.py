"""Evaluation sets and prompt workloads (JSONL ``{"id", "text", ...}``), cut on token boundaries."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from .corpus import SourceFile
from .tokenizer import cut_to_tokens


def _line_starts(text: str) -> list[int]:
    starts = [0]
    i = text.find("\n")
    while i != -1 and i + 1 < len(text):
        starts.append(i + 1)
        i = text.find("\n", i + 1)
    return starts


def sample_chunks(
    tok,
    files: list[SourceFile] | list[tuple[str, str]],
    n: int,
    min_tokens: int,
    max_tokens: int,
    seed: int,
    prefix: str,
    exclude_ids: set[str] | None = None,
) -> list[dict]:
    """``n`` records from distinct files, each starting at a line start, ``min..max`` tokens long.

    ``files`` holds SourceFile objects or ``(source, text)`` pairs. Records start at the top of
    the file half the time (where docstrings and imports live) and at a random line otherwise.
    """
    rng = random.Random(seed)
    items = [(f.path, f.text) if isinstance(f, SourceFile) else (f[0], f[1]) for f in files]
    order = list(range(len(items)))
    rng.shuffle(order)
    out: list[dict] = []
    exclude_ids = exclude_ids or set()
    used_sources: set[str] = {i.split(":", 1)[0] for i in exclude_ids}
    for idx in order:
        if len(out) >= n:
            break
        src, text = items[idx]
        if src in used_sources:
            continue
        starts = _line_starts(text)
        # leave room for max_tokens after the start: try a few candidate starts
        for attempt in range(4):
            s = 0 if (attempt == 0 and rng.random() < 0.5) else starts[rng.randrange(len(starts))]
            body = text[s : s + 12 * max_tokens]
            if not body.strip():
                continue
            want = rng.randint(min_tokens, max_tokens)
            cut = cut_to_tokens(tok, body, want)
            ntok = len(tok.encode(cut, add_special_tokens=False).ids)
            if ntok < min_tokens or len(cut.strip()) < 40:
                continue
            line = text.count("\n", 0, s) + 1
            out.append({"id": f"{src}:{line}", "text": cut, "source": src, "line": line, "n_tokens": ntok})
            used_sources.add(src)
            break
    if len(out) < min(n, 8):
        raise ValueError(f"{prefix}: only {len(out)} of {n} records could be cut: add source files or lower the count")
    if len(out) < n:
        print(f"warning: {prefix}: {len(out)} of {n} records (too few long-enough sources)", flush=True)
    return out


def write_jsonl(path: str | Path, records: list[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist: ship the workloads (python -m workbench.train convert)")
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "id" not in r or "text" not in r:
                raise ValueError(f"{path}:{i}: each line needs 'id' and 'text'")
            out.append(r)
    return out


def build_sets(tok, corpus, prose: list[tuple[str, str]], out_dir: str | Path, seed: int = 0) -> dict[str, int]:
    """Write eval sets and prompt workloads to ``out_dir``; returns record counts."""
    out_dir = Path(out_dir)
    eval_heldout = sample_chunks(tok, corpus.heldout, 128, 512, 512, seed + 1, "eval_heldout")
    eval_indomain = sample_chunks(tok, corpus.val, 64, 512, 512, seed + 2, "eval_indomain")
    ex = {r["id"] for r in eval_heldout}
    sets = {
        "eval_heldout": eval_heldout,
        "eval_indomain": eval_indomain,
        "code_in_domain": sample_chunks(
            tok, corpus.val, 24, 96, 256, seed + 3, "code_in_domain", {r["id"] for r in eval_indomain}
        ),
        "code_heldout": sample_chunks(tok, corpus.heldout, 24, 96, 256, seed + 4, "code_heldout", ex),
        "prose_shifted": sample_chunks(tok, prose, 24, 96, 256, seed + 5, "prose_shifted"),
    }
    for name, recs in sets.items():
        write_jsonl(out_dir / f"{name}.jsonl", recs)
    return {k: len(v) for k, v in sets.items()}
