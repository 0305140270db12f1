"""Paths of what ships in data/: the reference model, its draft, and the workloads."""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
REFERENCE = DATA / "models" / "ref-moe"
DRAFT = DATA / "models" / "ref-draft"
WORKLOADS = DATA / "workloads"


def default_model() -> Path:
    """The shipped reference model; until it exists, a seeded random qwen3_moe built on first use."""
    if (REFERENCE / "config.json").exists():
        return REFERENCE
    from .fsutil import cache_dir
    from .randmodel import make_random_model

    path = cache_dir() / "models" / "random-qwen3-moe-8x64"
    if not (path / "config.json").exists():
        make_random_model(path, "qwen3_moe", seed=0, quantize_bits=4, group_size=32, moving=True,
                          layers=8, experts=64, top_k=8, hidden=128, expert_width=64, vocab=512)
    return path


def workload(name: str) -> list[dict]:
    """Prompts of ``data/workloads/NAME.jsonl`` as dicts with ``id`` and ``text``."""
    path = WORKLOADS / f"{name}.jsonl"
    if not path.exists():
        have = sorted(p.stem for p in WORKLOADS.glob("*.jsonl"))
        raise ValueError(f"no workload {name!r}; available: {', '.join(have) or '(none shipped)'}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
