"""Paths of what ships in data/: the reference model, its draft, and the workloads."""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
REFERENCE = DATA / "models" / "ref-moe"
DRAFT = DATA / "models" / "ref-draft"
WORKLOADS = DATA / "workloads"


def default_model() -> Path:
    """The shipped reference model. It lives in the checkout's data/, not in the package: an install
    made without the checkout has none, and is told so (never given a random model in its place)."""
    if not (REFERENCE / "config.json").is_file():
        from .model import ModelError

        raise ModelError(f"the shipped reference model is not at {REFERENCE} (workbench was installed apart from "
                         "its checkout's data/); install from the checkout (pip install -e .), or name a model "
                         "directory (workbench run DIR, --model DIR)")
    return REFERENCE


def workload(name: str) -> list[dict]:
    """Prompts of ``data/workloads/NAME.jsonl`` as dicts with ``id`` and ``text``."""
    path = WORKLOADS / f"{name}.jsonl"
    if not path.exists():
        have = sorted(p.stem for p in WORKLOADS.glob("*.jsonl"))
        raise ValueError(f"no workload {name!r}; available: {', '.join(have) or '(none shipped)'}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
