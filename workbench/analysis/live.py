"""Workload runs through the live streaming engine: the strata table and the policy table.

Each (configuration, prompt) runs on a fresh engine (no residency carried between prompts) and
is measured from the engine's public per-(step, layer) counters frame ``Result.counters``.

**Strata table** (the first seed's per-decode-token table, at 17.6% residency), definitions:

  lookups             arena hits + sync misses + prefetch hits (claims of experts, as the
                      engine's hit rate counts them)
  arena hits          wanted expert already resident (not claimed from a speculative read)
  prefetch hits       claimed from a speculative read: timely (complete) + late (in flight)
  sync misses         read synchronously on demand
  speculative issued  read-ahead reads issued
  issue usefulness    prefetch hits / speculative issued
  timely usefulness   timely prefetch hits / speculative issued

Counts are per decode token (totals of a prompt's decode steps over its tokens); the two
usefulness shares are ratios of a prompt's totals. Intervals: bootstrap over prompts.

**Policy table** (the second seed's LRU vs SLRU-cold): decode bytes read and tokens/s per
policy and arena size, and the paired per-prompt difference SLRU - LRU.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SEED_RESIDENCY = 0.176
# The first seed's figures per decode token (its model: 480 lookups per token), low..high.
SEED_STRATA = {
    "lookups": (480, 480), "arena hits": (436, 441), "prefetch hits": (25, 28), "prefetch hits late": (5, 5),
    "sync misses": (14.2, 16.6), "speculative issued": (76.4, 82.6), "issue usefulness": (0.325, 0.325),
    "timely usefulness": (0.2625, 0.2625),
}
# the same per lookup, so a model with another layer count compares in kind
for _q, _name in (("arena hits", "arena hit share"), ("prefetch hits", "prefetch hit share"),
                  ("sync misses", "sync miss share"), ("speculative issued", "issued per lookup")):
    SEED_STRATA[_name] = tuple(v / SEED_STRATA["lookups"][0] for v in SEED_STRATA[_q])
STRATA = tuple(SEED_STRATA)
# The second seed's SLRU-cold table: {arena GB of its model: (LRU GB read, SLRU-cold GB read)}
SEED_SLRU = {8: (48.56, 47.84), 10: (40.53, 39.58)}
# The seed's UNPERT experiment as a 2x2 factorial: read-ahead ranking (raw top-k = UNPERT=1, resident
# bonus beyond rank 3 = UNPERT=0) x router (exact, or cache-aware "moce" at p=3, b=0.85, r1=0). The
# seed's default is raw ranking with the moce router; its experiment changes only the ranking.
# (`route` at its defaults p=3, r1=0 ranks as UNPERT=0 does, so it is the "bonus, moce" cell.)
# Layer predictor throughout: router of L on the input of L-1.
CONFIGS = {
    "raw, exact": dict(mode="raw", router="exact"),
    "bonus, exact": dict(mode="resident_bonus", router="exact"),
    "raw, moce": dict(mode="raw", router="cache_aware"),
    "bonus, moce": dict(mode="resident_bonus", router="cache_aware"),
}
# the ledger's runs: the 2x2 and the seed's L+2 read-ahead beside its default (raw, moce)
LEDGER_CONFIGS = {**CONFIGS, "raw, moce, L+2": dict(mode="raw", router="cache_aware", lookahead=2)}
# the configuration the seed's strata table ran (its default): the ledger's strata rows
STRATA_CONFIG = "raw, moce"
# the seed's contrast: UNPERT=0 - UNPERT=1 with the moce router held fixed
UNPERT_CONTRAST = ("bonus, moce", "raw, moce")
# where a prefetched expert can end without being used (counts per decode token)
WASTE = ("cancelled_before_read", "partially_read", "completed_unused")


def strata_counts(counters: pd.DataFrame) -> dict:
    """The strata quantities of one run from its counters frame (decode steps only)."""
    d = counters[counters["phase"] == "decode"]
    n = d["step"].nunique()
    if n == 0:
        raise ValueError("counters have no decode steps")
    t = d[["hits", "sync_misses", "bytes_read", "prefetch_issued", "prefetch_useful_timely", "prefetch_useful_late"]
          + [f"prefetch_{w}" for w in WASTE] + [f"prefetch_{w}_bytes" for w in WASTE]].sum()
    wasted_bytes = sum(t[f"prefetch_{w}_bytes"] for w in WASTE)
    pf = t["prefetch_useful_timely"] + t["prefetch_useful_late"]
    issued = t["prefetch_issued"]
    lookups = t["hits"] + t["sync_misses"] + pf
    return {
        "lookups": lookups / n, "arena hits": t["hits"] / n, "prefetch hits": pf / n,
        "prefetch hits late": t["prefetch_useful_late"] / n, "sync misses": t["sync_misses"] / n,
        "speculative issued": issued / n,
        "issue usefulness": pf / issued if issued else np.nan,
        "timely usefulness": t["prefetch_useful_timely"] / issued if issued else np.nan,
        "arena hit share": t["hits"] / lookups if lookups else np.nan,
        "prefetch hit share": pf / lookups if lookups else np.nan,
        "sync miss share": t["sync_misses"] / lookups if lookups else np.nan,
        "issued per lookup": issued / lookups if lookups else np.nan,
        "MB per token": t["bytes_read"] / n / 1e6,
        "unnecessary share": wasted_bytes / t["bytes_read"] if t["bytes_read"] else np.nan,
        **{f"{w} per token": t[f"prefetch_{w}"] / n for w in WASTE},
        "decode tokens": n,
    }


def _run(store, ids, max_tokens, arena, policy="lru", ahead=None, lookahead=1):
    """One plain run (``ahead`` None) or one with layer read-ahead and ``ahead`` (AheadConfig
    keywords: mode, router, lookahead, ...)."""
    from ..config import AheadConfig, ArenaConfig
    from ..engine.engine import Engine

    if ahead is not None:
        kw = dict(ahead)
        ahead = AheadConfig("layer", kw.pop("lookahead", lookahead), **kw)
    with Engine(store, arena=ArenaConfig(str(arena), policy), ahead=ahead, progress=False) as eng:
        return eng.generate(ids, max_tokens=max_tokens)


def _jobs(outer, prompts, progress, desc):
    jobs = [(o, p) for o in outer for p in prompts]
    if progress:
        from tqdm.auto import tqdm

        jobs = tqdm(jobs, desc=desc, unit="run")
    return jobs


def strata_runs(workload, configs=CONFIGS, residency: float = SEED_RESIDENCY, max_tokens: int | None = None,
                prompt_tokens: int | None = None, lookahead: int = 1, progress: bool = False) -> pd.DataFrame:
    """Per (configuration, prompt): the strata quantities (one row each), from live runs of
    ``workload`` (a ``record_workload`` result: its prompts and store) at ``residency``."""
    rows = []
    for name, run in _jobs(list(configs), workload.runs, progress, "strata runs"):
        ids = run.prompt_ids[:prompt_tokens] if prompt_tokens else run.prompt_ids
        res = _run(workload.store, ids, max_tokens or workload.max_tokens, residency, ahead=configs[name],
                   lookahead=lookahead)
        rows.append(dict(configuration=name, prompt=run.prompt.id, slots=res.stats["arena_slots"],
                         **strata_counts(res.counters)))
    return pd.DataFrame(rows)


def paired_difference(per_prompt: pd.DataFrame, quantity: str, a: str, b: str, by: str = "configuration") -> pd.Series:
    """Per prompt: ``quantity`` of configuration ``a`` minus that of ``b`` (prompts both ran), indexed by prompt."""
    wide = per_prompt.pivot_table(index="prompt", columns=by, values=quantity)
    for c in (a, b):
        if c not in wide.columns:
            raise ValueError(f"no {by} {c!r} in the per-prompt table; have {sorted(wide.columns)}")
    return (wide[a] - wide[b]).dropna()


def strata_table(per_prompt: pd.DataFrame, **ci) -> pd.DataFrame:
    """One row per (quantity, configuration): value, low, high, n_prompts, and the seed's low..high."""
    from .uncertainty import interval_table

    long = per_prompt.melt(id_vars=["configuration", "prompt"], value_vars=list(STRATA), var_name="quantity",
                           value_name="value")
    out = interval_table(long, ["quantity", "configuration"], "value", **ci)
    out["seed_low"] = out["quantity"].map(lambda q: SEED_STRATA[q][0])
    out["seed_high"] = out["quantity"].map(lambda q: SEED_STRATA[q][1])
    return out


def policy_runs(workload, policies=("lru", "slru"), arenas=(0.1, 0.25, 0.5), max_tokens: int = 32,
                prompt_tokens: int | None = 32, progress: bool = False) -> pd.DataFrame:
    """Per (policy, arena, prompt): decode bytes read, tokens/s, hit rate (plain streaming, no read-ahead)."""
    combos = [(p, a) for p in policies for a in arenas]
    # prompt by prompt, alternating the order of the configurations, after one discarded warm-up
    # run, so neither policy always runs first (tokens/s on a shared CPU drifts)
    jobs = [(c, run) for i, run in enumerate(workload.runs) for c in (combos if i % 2 == 0 else combos[::-1])]
    if progress:
        from tqdm.auto import tqdm

        jobs = tqdm(jobs, desc="policy runs", unit="run")
    first = workload.runs[0]
    _run(workload.store, first.prompt_ids[:prompt_tokens or None], max_tokens, arenas[0], policy=policies[0])
    rows = []
    for (pol, arena), run in jobs:
        ids = run.prompt_ids[:prompt_tokens] if prompt_tokens else run.prompt_ids
        s = _run(workload.store, ids, max_tokens, arena, policy=pol).stats
        rows.append(dict(policy=pol, arena=float(arena), prompt=run.prompt.id, mb_read=s["bytes_read"] / 1e6,
                         tokens_per_s=s["tokens_per_s"], hit_rate=s["hit_rate"], tokens=s["tokens"]))
    return pd.DataFrame(rows)


def policy_table(per_prompt: pd.DataFrame, base: str = "lru", **ci) -> pd.DataFrame:
    """Intervals of MB read and tokens/s per (policy, arena), plus each policy's paired per-prompt
    difference from ``base`` (policy "<p> - <base>", and for bytes and speed "<p> / <base> - 1"):
    metric, policy, arena, value, low, high, n_prompts."""
    from .uncertainty import interval_table

    metrics = ["mb_read", "tokens_per_s", "hit_rate"]
    long = per_prompt.melt(id_vars=["policy", "arena", "prompt"], value_vars=metrics, var_name="metric",
                           value_name="value")
    wide = long.pivot_table(index=["metric", "arena", "prompt"], columns="policy", values="value").reset_index()
    others = [p for p in per_prompt["policy"].unique() if p != base and base in wide]
    diffs = [wide[["metric", "arena", "prompt"]].assign(policy=f"{p} - {base}", value=wide[p] - wide[base])
             for p in others]
    counts = wide[wide["metric"] != "hit_rate"]  # relative differences of bytes and speed only
    diffs += [counts[["metric", "arena", "prompt"]].assign(
        policy=f"{p} / {base} - 1", value=(counts[p] / counts[base].where(counts[base] > 0)) - 1) for p in others]
    both = pd.concat([long] + diffs, ignore_index=True)
    return interval_table(both, ["metric", "policy", "arena"], "value", **ci)


def seed_slru_saving() -> dict:
    """The second seed's relative saving of SLRU-cold over LRU in bytes read, per arena GB."""
    return {gb: slru / lru - 1 for gb, (lru, slru) in SEED_SLRU.items()}


def with_interval_text(table: pd.DataFrame, value: str = "value", digits: int = 3) -> pd.Series:
    """"value [low, high]" strings of an interval table, for side-by-side display."""
    f = f"{{:.{digits}g}}"
    return table.apply(lambda r: f"{f.format(r[value])} [{f.format(r['low'])}, {f.format(r['high'])}]", axis=1)


def strata_display(table: pd.DataFrame) -> pd.DataFrame:
    """The strata table wide: quantity, the seed's figure, then one "value [low, high]" column per configuration."""
    t = table.assign(cell=with_interval_text(table))
    wide = t.pivot(index="quantity", columns="configuration", values="cell")
    wide = wide.reindex([q for q in STRATA if q in wide.index])[[c for c in CONFIGS if c in wide.columns]]
    seed = {q: (f"{lo:.4g}" if lo == hi else f"{lo:.4g}-{hi:.4g}") for q, (lo, hi) in SEED_STRATA.items()}
    wide.insert(0, "seed", [seed[q] for q in wide.index])
    return wide.reset_index()

