"""Per (step, layer) counters: hits, misses, evictions, bytes, waits, compute, prefetch outcomes.

Definitions (the same everywhere: CLI, --json, notebooks, reports):
  lookups        one per distinct routed expert a layer claims
  hits           arena hits: the expert was resident and published
  prefetch_hits  claims served by a speculative read: useful_timely (complete) + useful_late (in flight)
  sync_misses    demand reads issued and waited for (``misses`` counts the same reads)
  hit_rate       (hits + prefetch_hits) / lookups
Decode-mode counters: ``optimistic`` tokens, ``recomputes`` (recovery passes after a miss),
``recomputed_layers`` (decoder layers run again) and ``handshake`` tokens (per-layer decode whose
ids reached the host through the device's stream, not a sync: engine/handshake.py).
"""

from __future__ import annotations

from collections import defaultdict

import pandas as pd

from .arena import OUTCOMES

PREFETCH_KEYS = ("issued",) + OUTCOMES
BASE = ("hits", "misses", "sync_misses", "page_cache_hits", "evictions", "bytes_read", "io_wait_ns", "compute_ns",
        "predict_ns", "optimistic", "recomputes", "recomputed_layers", "handshake")


class Counters:
    def __init__(self):
        self.rows: dict[tuple, defaultdict] = {}
        self.phase: dict[int, str] = {}

    def row(self, step: int, layer: int) -> defaultdict:
        r = self.rows.get((step, layer))
        if r is None:
            r = self.rows[(step, layer)] = defaultdict(int)
        return r

    def frame(self) -> pd.DataFrame:
        """One row per (step, layer) with every counter (zeros filled)."""
        cols = list(BASE) + [f"prefetch_{k}" for k in PREFETCH_KEYS] + [f"prefetch_{k}_bytes" for k in PREFETCH_KEYS]
        recs = [{"step": s, "layer": l, "phase": self.phase.get(s, "decode"), **{c: r.get(c, 0) for c in cols}}
                for (s, l), r in sorted(self.rows.items())]
        return pd.DataFrame.from_records(recs, columns=["step", "layer", "phase"] + cols)

    def totals(self, phase: str) -> dict:
        tot = defaultdict(int)
        for (s, _), r in self.rows.items():
            if self.phase.get(s, "decode") == phase:
                for k, v in r.items():
                    tot[k] += v
        return tot


def summarize(tot: dict) -> dict:
    """Counters of one phase as the JSON ``stats`` shape; checks issued == sum of outcomes."""
    prefetch = {k: int(tot.get(f"prefetch_{k}", 0)) for k in PREFETCH_KEYS}
    prefetch_bytes = {k: int(tot.get(f"prefetch_{k}_bytes", 0)) for k in PREFETCH_KEYS}
    for d in (prefetch, prefetch_bytes):
        if d["issued"] != sum(d[k] for k in OUTCOMES):
            raise RuntimeError(f"prefetch accounting broken: issued {d['issued']} != sum of outcomes {d}")
    hits, misses = int(tot.get("hits", 0)), int(tot.get("misses", 0))
    prefetch_hits = prefetch["useful_late"] + prefetch["useful_timely"]
    lookups = hits + misses + prefetch_hits
    return {
        "lookups": lookups, "hits": hits, "prefetch_hits": prefetch_hits, "misses": misses,
        "sync_misses": int(tot.get("sync_misses", 0)), "page_cache_hits": int(tot.get("page_cache_hits", 0)),
        "evictions": int(tot.get("evictions", 0)), "bytes_read": int(tot.get("bytes_read", 0)),
        "hit_rate": (hits + prefetch_hits) / lookups if lookups else 0.0,
        "io_wait_s": tot.get("io_wait_ns", 0) / 1e9, "compute_s": tot.get("compute_ns", 0) / 1e9,
        "prefetch": prefetch, "prefetch_bytes": prefetch_bytes,
        "optimistic_tokens": int(tot.get("optimistic", 0)), "recomputes": int(tot.get("recomputes", 0)),
        "recomputed_layers": int(tot.get("recomputed_layers", 0)),
        "handshake_tokens": int(tot.get("handshake", 0)),
    }
