"""Fit my machine: decode speed, hit rate and peak memory against the arena's size in GB.

The first question of someone with a 24 GB laptop: how large an arena can I afford, and what
does it buy? One engine run per arena size on the user's own model and prompt.
"""

from __future__ import annotations

import mlx.core as mx
import pandas as pd

from ..config import ArenaConfig
from ..engine.engine import Engine
from ..store.cache import resolve_store
from ..store.manifest import RESIDENT


def fit_table(model, prompt, arenas=("0.1", "0.25", "0.5", "1.0"), max_tokens=16, policy="lru") -> pd.DataFrame:
    """One row per arena: arena GB, resident (non-expert) GB, tokens/s, hit rate, peak MLX memory GB."""
    store = resolve_store(model, progress=False)
    resident_gb = (store / RESIDENT).stat().st_size / 1e9
    rows = []
    for arena in arenas:
        with Engine(store, arena=ArenaConfig(arena, policy), progress=False) as eng:
            mx.reset_peak_memory()
            res = eng.generate(prompt, max_tokens=max_tokens, progress=False)
            s = res.stats
            rows.append({"arena": str(arena), "arena_slots": eng.n_slots, "arena_gb": eng.n_slots * eng.m.expert_bytes / 1e9,
                         "resident_gb": resident_gb, "tokens_per_s": s["tokens_per_s"], "hit_rate": s["hit_rate"],
                         "peak_memory_gb": mx.get_peak_memory() / 1e9, "tokens": s["tokens"],
                         "distinct_tokens": s["distinct_tokens"]})
    return pd.DataFrame(rows)
