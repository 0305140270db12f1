"""The claims ledger: every seed number of DESIGN section 4 beside our measurement, with a
verdict by a stated rule.

Rules (the ``rule`` column says which one a row uses):

  interval   "reproduced" when the seed's value (or its low..high range) lies inside (meets) our
             95% bootstrap interval; "differs" otherwise. Used for everything measured on our
             model over a workload (or over layers / repeats, named in ``method``).
  tolerance  "reproduced" when |ours - seed| <= the stated tolerance. Used only where the
             quantity is a definition or arithmetic on the seed's own numbers (rows ``@seed``:
             the MTP bounds from the seed's union table, the norm share its mean cosine implies,
             the slope of its union table).

  not measured  no measurement was passed in.

``build_ledger(measured)`` takes {claim id: Measurement | float | list of Measurements} (one
per method; a bare float is a single value with a zero-width interval) and computes the
``@seed`` rows itself, so it runs without a model. ``workload_measurements`` fills ``measured``
from the workload tables (``workbench.analysis.workload.analyze_workload``). Every note is
computed; no verdict is written by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Claim:
    id: str
    area: str
    what: str
    seed: float | tuple  # a value, or a (low, high) range the seed reports
    unit: str
    context: str
    rule: str = "interval"  # "interval" | "tolerance"
    tol: float = 0.0  # tolerance rule only


@dataclass(frozen=True)
class Measurement:
    value: float
    low: float
    high: float
    n: int = 1
    method: str = ""

    @classmethod
    def of(cls, x, method: str = "") -> "Measurement":
        if isinstance(x, Measurement):
            return x
        v = float(x)
        return cls(v, v, v, 1, method or "single value (no interval)")


_LA = "MiniMax-M2.5 4-bit, one prompt"
_SEED_UNION = "from the seed's union table g in {1,2,3,8}, k=8"
_STRATA = "first seed, per decode token at 17.6% residency (480 lookups per token)"


def _seed_strata(name):
    from .live import SEED_STRATA

    return SEED_STRATA[name]


CLAIMS: list[Claim] = [
    Claim("lookahead.d1", "lookahead", "recovery, router of L on input of L-1", 0.785, "fraction", _LA),
    Claim("lookahead.d2", "lookahead", "recovery, distance 2", 0.725, "fraction", _LA),
    Claim("lookahead.d3", "lookahead", "recovery, distance 3", 0.680, "fraction", _LA),
    Claim("lookahead.prev_token", "lookahead", "recovery, same layer previous token", 0.330, "fraction", _LA),
    Claim("cosine.mean", "cosine", "mean pairwise cosine of flattened experts", 0.096, "cosine", "seed model, per layer"),
    Claim("cosine.resid_norm_share", "cosine", "norm share left after subtracting layer mean expert", 0.986, "fraction", "seed model"),
    Claim("cosine.resid_norm_share@seed", "cosine", "norm share implied by the seed's mean cosine 0.096, 256 equal-norm experts",
          0.986, "fraction", "arithmetic on the seed's numbers", "tolerance", 0.0005),
    Claim("cosine.energy_at_half_rank", "cosine", "SV energy share at rank E/2 (seed: 128 of 256)", 0.83, "fraction", "256 experts"),
    Claim("gates.slot1", "gates", "mean normalized gate weight, slot 1", 0.192, "weight", "sigmoid top-8"),
    Claim("gates.slot8", "gates", "mean normalized gate weight, slot 8", 0.093, "weight", "sigmoid top-8"),
    Claim("gates.drop_weakest", "gates", "relative L2 block error, weakest expert dropped", 0.114, "fraction", "sigmoid top-8"),
    Claim("union.g1", "union", "distinct experts, window g=1", 8.00, "experts", "top-8"),
    Claim("union.g1@seed", "union", "distinct experts at g=1 by definition (k)", 8.00, "experts", "definition", "tolerance", 0.0),
    Claim("union.g2", "union", "distinct experts, window g=2", 13.42, "experts", "top-8"),
    Claim("union.g3", "union", "distinct experts, window g=3", 17.99, "experts", "top-8"),
    Claim("union.g8", "union", "distinct experts, window g=8", 35.01, "experts", "top-8"),
    Claim("union.slope", "union", "slope s in union ~ k(1+s(g-1))", 0.58, "slope", "top-8"),
    Claim("union.slope@seed", "union", "slope of the seed's own union table", 0.58, "slope", _SEED_UNION, "tolerance", 0.005),
    Claim("mtp.ceiling", "mtp", "speedup bound as acceptance -> 1", 1.83, "x", "seed model"),
    Claim("mtp.ceiling@seed", "mtp", "speedup bound as acceptance -> 1", 1.83, "x", _SEED_UNION, "tolerance", 0.005),
    Claim("mtp.speedup_a90", "mtp", "speedup bound at 90% acceptance", 1.30, "x", "seed model"),
    Claim("mtp.speedup_a90@seed", "mtp", "speedup bound at 90% acceptance", 1.30, "x", _SEED_UNION, "tolerance", 0.005),
    Claim("mtp.speedup_a80", "mtp", "speedup bound at 80% acceptance", 1.08, "x", "seed model"),
    Claim("mtp.speedup_a80@seed", "mtp", "speedup bound at 80% acceptance", 1.08, "x", _SEED_UNION, "tolerance", 0.005),
    Claim("mtp.break_even", "mtp", "acceptance below which MTP is a net loss", 0.72, "acceptance", "seed model"),
    Claim("mtp.break_even@seed", "mtp", "acceptance below which MTP is a net loss", 0.72, "acceptance", _SEED_UNION,
          "tolerance", 0.005),
    Claim("bounds.static_knapsack", "bounds", "static pinning bound hit rate at the budget", 0.450, "hit rate", "seed trace, 9 GB"),
    Claim("bounds.lru", "bounds", "LRU hit rate at the budget", 0.530, "hit rate", "seed trace, 9 GB"),
    Claim("readpath.pread_heap", "readpath", "buffered pread to a heap buffer", 1.89, "GB/s", "24 GB M4, 1.18 MB blocks"),
    Claim("readpath.pread_fresh", "readpath", "pread into a fresh array", 1.49, "GB/s", "24 GB M4, 1.18 MB blocks"),
    Claim("readpath.preadv_slot", "readpath", "preadv into a preallocated slot", 2.62, "GB/s", "24 GB M4, 1.18 MB blocks"),
    Claim("selfdraft.speed", "selfdraft", "draft speed vs full model", 5.6, "x", "seed engine"),
    Claim("selfdraft.acceptance", "selfdraft", "self-draft acceptance", 0.167, "fraction", "seed engine"),
    Claim("strata.arena_hit_share", "strata", "arena hits / lookups", _seed_strata("arena hit share"), "fraction", _STRATA),
    Claim("strata.prefetch_hit_share", "strata", "prefetch hits / lookups", _seed_strata("prefetch hit share"), "fraction", _STRATA),
    Claim("strata.sync_miss_share", "strata", "sync misses / lookups", _seed_strata("sync miss share"), "fraction", _STRATA),
    Claim("strata.issued_per_lookup", "strata", "speculative reads issued / lookups", _seed_strata("issued per lookup"), "fraction", _STRATA),
    Claim("strata.issue_usefulness", "strata", "prefetch hits / speculative issued", _seed_strata("issue usefulness"), "fraction", _STRATA),
    Claim("strata.timely_usefulness", "strata", "timely prefetch hits / speculative issued", _seed_strata("timely usefulness"), "fraction", _STRATA),
]
CLAIM_IDS = [c.id for c in CLAIMS]
_BY_ID = {c.id: c for c in CLAIMS}
COLUMNS = ["id", "area", "claim", "seed", "seed_low", "seed_high", "ours", "low", "high", "n", "method", "rule",
           "verdict", "unit", "context", "measured_on", "note"]


def seed_of(claim_id: str) -> float:
    """The seed's value of a claim (the middle of a reported range)."""
    if claim_id not in _BY_ID:
        raise ValueError(f"unknown claim id {claim_id!r}; known ids: {CLAIM_IDS}")
    s = _BY_ID[claim_id].seed
    return (s[0] + s[1]) / 2 if isinstance(s, tuple) else float(s)


LOOKAHEAD_IDS = {"d=1": "lookahead.d1", "d=2": "lookahead.d2", "d=3": "lookahead.d3", "prev_token": "lookahead.prev_token"}
GATE_SLOT_IDS = {1: "gates.slot1", 8: "gates.slot8"}
UNION_IDS = {g: f"union.g{g}" for g in (1, 2, 3, 8)}


def _seed_arithmetic() -> dict[str, tuple[Measurement, str]]:
    """The ``@seed`` rows: {id: (our arithmetic on the seed's numbers, computed note)}."""
    from .cosine import cosine_for_norm_share, residual_share_from_cosine
    from .union import REFERENCE_K, REFERENCE_UNION, _mtp_value, break_even, slope_fits

    u, k = REFERENCE_UNION, REFERENCE_K
    gs = "{" + ",".join(map(str, u)) + "}"
    out = {}
    for cid, q in (("mtp.ceiling@seed", "ceiling"), ("mtp.speedup_a90@seed", "speedup@0.9"),
                   ("mtp.speedup_a80@seed", "speedup@0.8")):
        out[cid] = (Measurement.of(_mtp_value(u, k, q), f"best g in {gs}, table only"), "")
    be = break_even(u, k)
    out["mtp.break_even@seed"] = (Measurement.of(be["acceptance"], f"lowest a at which some g >= 2 in {gs} pays"),
                                  "per-window break-even: " + ", ".join(f"g={g}: {a:.4f}" for g, a in be["by_g"].items()))
    s = slope_fits(u, k)
    out["union.slope@seed"] = (Measurement.of(s["through_k"], "least squares through (1, k)"), (
        f"free intercept {s['free_intercept']:.3f}, mean of per-point slopes {s['mean_per_point']:.3f}; "
        f"a line fits poorly: s=0.58 predicts {k * (1 + 0.58 * 7):.1f} at g=8 against {u[8]:.2f}"))
    out["union.g1@seed"] = (Measurement.of(float(k), "k by definition"), "")
    r = residual_share_from_cosine(0.096, 256)["resid_norm_share"]
    out["cosine.resid_norm_share@seed"] = (Measurement.of(r, "sqrt(1 - (1 + (E-1) c) / E), c=0.096, E=256"), (
        f"a norm share of 0.986 needs a mean cosine of 1 - 0.986^2*256/255 = {cosine_for_norm_share(0.986, 256):.3f} "
        f"({cosine_for_norm_share(0.986, 256, energy=True):.3f} would hold for an energy share)"))
    return out


def verdict(claim: Claim, m: Measurement) -> str:
    """The rule of ``claim`` applied to ``m``: "reproduced" or "differs"."""
    seed_lo, seed_hi = claim.seed if isinstance(claim.seed, tuple) else (claim.seed, claim.seed)
    if np.isnan(m.value):
        return "not measured"
    if claim.rule == "tolerance":
        ok = abs(m.value - seed_lo) <= claim.tol + 1e-12
    else:
        ok = seed_hi >= m.low - 1e-12 and seed_lo <= m.high + 1e-12
    return "reproduced" if ok else "differs"


def rule_text(claim: Claim) -> str:
    if claim.rule == "tolerance":
        return f"|ours - seed| <= {claim.tol:g}"
    ranged = isinstance(claim.seed, tuple) and claim.seed[0] != claim.seed[1]
    return "seed range meets our 95% interval" if ranged else "seed inside our 95% interval"


def build_ledger(measured: Mapping[str, object] | None = None, model: str = "") -> pd.DataFrame:
    """One row per (claim, method): the columns of ``COLUMNS``."""
    measured = dict(measured or {})
    unknown = set(measured) - set(CLAIM_IDS)
    if unknown:
        raise ValueError(f"unknown claim ids {sorted(unknown)}; known ids: {CLAIM_IDS}")
    seed_rows = _seed_arithmetic()
    rows = []
    for c in CLAIMS:
        seed_lo, seed_hi = c.seed if isinstance(c.seed, tuple) else (c.seed, c.seed)
        if c.id in seed_rows:
            ms, note = [seed_rows[c.id][0]], seed_rows[c.id][1]
        else:
            got = measured.get(c.id)
            got = [] if got is None else (got if isinstance(got, (list, tuple)) else [got])
            ms, note = [Measurement.of(g) for g in got], ""
        if not ms:
            ms = [Measurement(np.nan, np.nan, np.nan, 0, "")]
        for m in ms:
            rows.append(dict(id=c.id, area=c.area, claim=c.what, seed=(seed_lo + seed_hi) / 2, seed_low=seed_lo,
                             seed_high=seed_hi, ours=m.value, low=m.low, high=m.high, n=m.n, method=m.method,
                             rule=rule_text(c), verdict=verdict(c, m), unit=c.unit, context=c.context,
                             measured_on="the seed's numbers" if c.id in seed_rows else model, note=note))
    return pd.DataFrame(rows, columns=COLUMNS)


# --------------------------------------------------------------------------- from workload tables
def _m(row, method: str, value: str, n_col: str = "n_prompts") -> Measurement:
    return Measurement(float(row[value]), float(row["low"]), float(row["high"]), int(row[n_col]), method)


def workload_measurements(tables: Mapping[str, object], extra: Mapping[str, object] | None = None) -> dict[str, list]:
    """{claim id: [Measurement per method]} from ``analyze_workload``'s tables:
    ``tables["methods"][method]`` holds lookahead, gates, drop_weakest, union, mtp tables;
    ``tables["cosine"]`` the cosine interval table; ``tables["strata"]`` the strata table."""
    out: dict[str, list] = {}

    def add(cid, m):
        out.setdefault(cid, []).append(m)

    for method, t in (tables.get("methods") or {}).items():
        if "lookahead" in t:
            la = t["lookahead"]
            la = la[la["k_pred"] == la["k"]].set_index("source")
            for src, cid in LOOKAHEAD_IDS.items():
                if src in la.index:
                    add(cid, _m(la.loc[src], f"{method}, mean over layers, k'=k", value="recovery"))
        if "gates" in t:
            g = t["gates"].set_index("slot")
            k = int(g.index.max())
            add("gates.slot1", _m(g.loc[1], f"{method}, normalized weights, mean over layers", value="mean_weight"))
            if 8 in g.index:
                add("gates.slot8", _m(g.loc[8], f"{method}, normalized weights, mean over layers (top-{k})",
                                      value="mean_weight"))
        if "drop_weakest" in t:
            for r in t["drop_weakest"][t["drop_weakest"]["dropped"] == 1].itertuples():
                name = "renormalised" if r.renorm else "not renormalised"
                add("gates.drop_weakest", Measurement(r.rel_error, r.low, r.high, r.n_prompts,
                                                      f"{method}, kept weights {name}, mean over layers"))
        if "union" in t:
            u = t["union"].set_index("g")
            for g, cid in UNION_IDS.items():
                if g in u.index:
                    add(cid, _m(u.loc[g], f"{method}, mean over layers", value="union"))
        if "mtp" in t:
            mt = t["mtp"].set_index("quantity")
            gsel = mt["g_values"].iloc[0]
            for q, cid in (("ceiling", "mtp.ceiling"), ("speedup@0.9", "mtp.speedup_a90"),
                           ("speedup@0.8", "mtp.speedup_a80"), ("break_even", "mtp.break_even")):
                if q in mt.index:
                    add(cid, _m(mt.loc[q], f"{method}, our union table, best g in {{{gsel}}}", value="value"))
            if "slope" in mt.index:
                add("union.slope", _m(mt.loc["slope"], f"{method}, least squares through (1, k), g in {{{gsel}}}",
                                      value="value"))
    if tables.get("cosine") is not None:
        c = tables["cosine"].set_index("quantity")
        for q, cid in (("mean_cosine", "cosine.mean"), ("resid_norm_share", "cosine.resid_norm_share"),
                       ("energy_at_rank", "cosine.energy_at_half_rank")):
            if q in c.index:
                add(cid, _m(c.loc[q], "weights, mean over layers, bootstrap over layers", "value", "n_layers"))
    if tables.get("strata") is not None:
        s = tables["strata"]
        for q, cid in (("arena hit share", "strata.arena_hit_share"), ("prefetch hit share", "strata.prefetch_hit_share"),
                       ("sync miss share", "strata.sync_miss_share"), ("issued per lookup", "strata.issued_per_lookup"),
                       ("issue usefulness", "strata.issue_usefulness"), ("timely usefulness", "strata.timely_usefulness")):
            for r in s[s["quantity"] == q].itertuples():
                add(cid, Measurement(r.value, r.low, r.high, r.n_prompts,
                                     f"decode, {r.configuration}, read-ahead d=1, 17.6% residency"))
    for cid, v in (extra or {}).items():
        for m in (v if isinstance(v, (list, tuple)) else [v]):
            add(cid, Measurement.of(m))
    return out


def ledger_extras(workload, budget_share: float = 0.25, self_draft: bool = True, readpath_repeats: int = 5,
                  draft_tokens: int = 16) -> dict[str, Measurement]:
    """The rows that need the simulator, the disk or the engine, over ``workload``: static-pinning
    knapsack bound and LRU hit rate at ``budget_share`` of all routed experts (per prompt, decode
    rows), the three single-copy read paths (``readpath_repeats`` cold repeats), self-draft
    acceptance and speed (drafting with resident experts only, per prompt)."""
    from ..io.readpath import copy_variants_gbps
    from ..sim import replay
    from .bounds import knapsack_bound
    from .uncertainty import bootstrap_ci

    def iv(vals, method, unit="prompts"):
        b = bootstrap_ci(vals)
        return Measurement(b.estimate, b.low, b.high, b.n, f"{method}, bootstrap over {unit}")

    kn, lru = [], []
    for tr in workload.traces().values():
        budget = budget_share * len(tr.moe_layers) * tr.n_experts * tr.meta["expert_bytes"]
        kn.append(float(knapsack_bound(tr, [budget], phase="decode")["hit_rate"].iloc[0]))
        lru.append(float(replay(tr, "lru", arena=budget_share, phase="decode").to_dict()["hit_rate"]))
    where = f"decode, budget {budget_share:.0%} of routed experts"
    out = {"bounds.static_knapsack": iv(kn, where), "bounds.lru": iv(lru, where + ", replay")}
    reps = [copy_variants_gbps(workload.store, cold=True) for _ in range(readpath_repeats)]
    for cid, key in (("readpath.pread_heap", "pread_heap"), ("readpath.pread_fresh", "pread_fresh_array"),
                     ("readpath.preadv_slot", "preadv_slot")):
        out[cid] = iv([r[key] for r in reps], "our store, cold, 64 blobs", "repeats")
    if self_draft:
        from ..engine.engine import Engine
        from .drafters import acceptance_table, self_draft_drafter

        acc, speed = [], []
        with Engine(workload.store, arena=str(budget_share), progress=False) as eng:
            for run in workload.runs:
                full = eng.generate(run.prompt_ids, max_tokens=draft_tokens)
                eng.draft_resident_only(run.prompt_ids, draft_tokens)
                speed.append(float(np.median(full.step_times) / np.median(eng.last_draft_times)))
                df = acceptance_table(run.prompt_ids, full.tokens, {"self_draft": self_draft_drafter(eng)}, g_values=(4,))
                acc.append(float(df["acceptance"].iloc[0]))
        m = f"decode, arena {budget_share:.0%}, g=4, {draft_tokens} tokens"
        out.update({"selfdraft.acceptance": iv(acc, m), "selfdraft.speed": iv(speed, m + ", median step times")})
    return out


def workload_ledger(workload, live: bool = True, cosine_layers: int = 0, strata_tokens: int | None = None,
                    readpath_repeats: int = 5, self_draft: bool = True, progress: bool = False, **ci):
    """(ledger, tables): every analysis over ``workload`` (``analyze_workload``), the extras
    (bounds, read path, and with ``live`` the engine's strata runs and self-draft), then the
    ledger by rule."""
    from .workload import analyze_workload

    tables = analyze_workload(workload, cosine_layers=cosine_layers, strata=live, strata_tokens=strata_tokens,
                              progress=progress, **ci)
    extra = ledger_extras(workload, self_draft=live and self_draft, readpath_repeats=readpath_repeats)
    tables["extras"] = extra
    return build_ledger(workload_measurements(tables, extra), model=str(workload.model)), tables
