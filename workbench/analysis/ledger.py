"""The claims ledger: every claim of the two seed documents beside our measurement, with a
verdict by a rule stated in the row.

The documents: the **first** is the original engine's audit (its per-token strata at 17.6%
residency on a model of 48 layers x 512 experts, top-10; UNPERT, read-ahead, prefetch waste,
calibration of q_e, the routing and policy cases of DESIGN section 3); the **second** is the
measurement notes of DESIGN section 4 (lookahead, cosine, gates, MTP union, bounds, read path,
self-draft; MiniMax-M2.5, 256 experts, top-8) and its SLRU-cold table. ``Claim.doc`` says which.

Verdicts: ``reproduced``, ``differs``, ``not comparable`` (our regime is not the document's: the
reason is in the row), ``not measurable here`` (e.g. a number of the private engine's machine);
``not measured`` only when no measurement was passed in. Rules (``Claim.rule``):

  level       a level, compared with a practical tolerance of its kind (``tolerance.TOLERANCE``,
              defined once): "reproduced" when the document's value (or range) meets our interval
              widened by the tolerance. A document value from one prompt is compared with our
              95% *prediction* interval for one prompt (``uncertainty.prediction_interval``), not
              with the interval of our mean. Lookahead rows add the lift over chance
              (r - k/E) / (1 - k/E) beside the raw share, each against the document's own.
  ordering    a contrast: our paired per-prompt difference (A - B) with its bootstrap interval;
              "reproduced" when the interval lies on the document's side of 0.
  arithmetic  arithmetic on the document's own numbers (``@seed`` rows): |ours - seed| <= tolerance.
  exact       a constructed case with one right answer: ours == seed.
  regime      before any rule, a claim that depends on a regime (``Claim.regime``: e.g. the
              working set in tokens, slots / lookups per token) is "not comparable" when ours
              is not within a factor ``REGIME_FACTOR`` of the document's.

``build_ledger(measured)`` takes {claim id: Measurement | float | list of Measurements} and
computes the ``@seed`` and constructed rows itself, so it runs without a model.
``workload_measurements`` fills ``measured`` from the workload tables; ``ledger_extras`` adds the
rows that need the simulator, the disk or the engine. ``claim_verdicts`` gives one verdict per
claim id (its first row, the method closest to the document's); ``viz.tables.ledger_table`` renders rows
as a plain table. Every note and verdict is computed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from .tolerance import tolerance

VERDICTS = ("reproduced", "differs", "not comparable", "not measurable here", "not measured")
DOCS = {"first": "the engine audit (strata, UNPERT, read-ahead, prefetch, calibration, routing and policy cases)",
        "second": "the measurement notes (lookahead, cosine, gates, MTP union, bounds, read path, self-draft, SLRU)"}
REGIME_FACTOR = 1.5  # a regime quantity within this factor of the document's is comparable


@dataclass(frozen=True)
class Claim:
    id: str
    doc: str  # "first" | "second"
    area: str
    what: str
    seed: float | tuple | None  # a value, or a (low, high) range the document reports
    kind: str  # quantity kind: picks the tolerance (tolerance.TOLERANCE)
    context: str
    rule: str = "level"  # level | ordering | arithmetic | exact | not measurable
    single: bool = True  # level rule: the document's value is one prompt's (prediction interval)
    chance: float | None = None  # the document's chance floor k/E (lift rows)
    regime: tuple | None = None  # (what the claim depends on, the document's value of it)
    reason: str = ""  # not measurable: why
    timing: bool = False  # a wall-clock row: its verdict may change from run to run


@dataclass(frozen=True)
class Measurement:
    value: float
    low: float
    high: float
    n: int = 1
    method: str = ""
    per_unit: tuple = ()  # the per-prompt values (level rule: prediction interval)
    seed: float | None = None  # the document's value of this quantity when it is not the claim's (a lift)
    quantity: str = ""  # "" the claim's own; e.g. "lift over chance", "paired difference"
    regime: float | None = None  # our value of Claim.regime's quantity
    reason: str = ""  # a verdict-forcing reason (e.g. the machine was busy: not measurable here)

    @functools.cached_property
    def prediction(self) -> tuple[float, float]:
        """Our 95% prediction interval for one prompt (NaNs below two per-prompt values)."""
        from .uncertainty import prediction_interval

        return prediction_interval(self.per_unit)

    @classmethod
    def of(cls, x, method: str = "") -> "Measurement":
        if isinstance(x, Measurement):
            return x
        v = float(x)
        return cls(v, v, v, 1, method or "single value (no interval)")


def lift(share, chance):
    """Lift over chance of a recovery share: (r - c) / (1 - c); 0 = chance, 1 = perfect."""
    return (np.asarray(share, dtype=float) - chance) / (1 - chance)


_LA = "MiniMax-M2.5 4-bit, one prompt (256 experts, top-8)"
_GLM = "another report, GLM-class model (top-k / experts not given: no lift)"
_SEED_UNION = "from the seed's union table g in {1,2,3,8}, k=8"
_STRATA = "first seed, per decode token at 17.6% residency (48 layers x 512 experts, top-10: 480 lookups per token)"
_CHANCE_MINIMAX, _CHANCE_FIRST = 8 / 256, 10 / 512
# working set in tokens: arena slots / lookups per token (17.6% of 48 x 512 slots, 480 lookups per token)
_WORKING_SET = ("working set in tokens (arena slots / lookups per token)", 0.176 * 48 * 512 / 480)
_BUDGET = ("budget as a share of the routed set (9 GB: about 7-13% of the seed's)", 0.10)
BOUNDS_SHARE = _BUDGET[1]  # the budget our bounds rows use, matched to the document's


def _seed_strata(name):
    from .live import SEED_STRATA

    return SEED_STRATA[name]


def _strata(cid, what, seed, kind="share", timing=False):
    return Claim(cid, "first", "strata", what, seed, kind, _STRATA, regime=_WORKING_SET, timing=timing)


_ELSEWHERE = "a number of the document's own engine and machine"
CLAIMS: list[Claim] = [
    # ---- the second document: measurement notes (DESIGN section 4)
    Claim("lookahead.d1", "second", "lookahead", "recovery, router of L on input of L-1", 0.785, "share", _LA,
          chance=_CHANCE_MINIMAX),
    Claim("lookahead.d2", "second", "lookahead", "recovery, distance 2", 0.725, "share", _LA, chance=_CHANCE_MINIMAX),
    Claim("lookahead.d3", "second", "lookahead", "recovery, distance 3", 0.680, "share", _LA, chance=_CHANCE_MINIMAX),
    Claim("lookahead.prev_token", "second", "lookahead", "recovery, same layer previous token", 0.330, "share", _LA,
          chance=_CHANCE_MINIMAX),
    Claim("lookahead.glm_layer_input", "second", "lookahead", "recovery from the layer input (d=1)", 0.817, "share", _GLM),
    Claim("lookahead.glm_prev_token", "second", "lookahead", "recovery, previous token", 0.36, "share", _GLM),
    Claim("lookahead.glm_stale_router", "second", "lookahead", "recovery, stale router", 0.736, "share", _GLM,
          rule="not measurable", reason="the report does not define its 'stale router' predictor"),
    Claim("cosine.mean", "second", "cosine", "mean pairwise cosine of flattened experts", 0.096, "cosine",
          "seed model, per layer", single=False),
    Claim("cosine.resid_norm_share", "second", "cosine", "norm share left after subtracting layer mean expert", 0.986,
          "share", "seed model", single=False),
    Claim("cosine.resid_norm_share@seed", "second", "cosine",
          "norm share implied by the seed's mean cosine 0.096, 256 equal-norm experts", 0.986, "share",
          "arithmetic on the seed's numbers", "arithmetic"),
    Claim("cosine.energy_at_half_rank", "second", "cosine", "SV energy share at rank E/2 (seed: 128 of 256)", 0.83,
          "share", "256 experts", single=False),
    Claim("gates.slot1", "second", "gates", "mean normalized gate weight, slot 1", 0.192, "weight", "sigmoid top-8"),
    Claim("gates.slot8", "second", "gates", "mean normalized gate weight, slot 8", 0.093, "weight", "sigmoid top-8"),
    Claim("gates.drop_weakest", "second", "gates", "relative L2 block error, weakest expert dropped", 0.114, "share",
          "sigmoid top-8"),
    Claim("union.g1", "second", "union", "distinct experts, window g=1", 8.00, "experts", "top-8"),
    Claim("union.g1@seed", "second", "union", "distinct experts at g=1 by definition (k)", 8.00, "count", "definition",
          "arithmetic"),
    Claim("union.g2", "second", "union", "distinct experts, window g=2", 13.42, "experts", "top-8"),
    Claim("union.g3", "second", "union", "distinct experts, window g=3", 17.99, "experts", "top-8"),
    Claim("union.g8", "second", "union", "distinct experts, window g=8", 35.01, "experts", "top-8"),
    Claim("union.slope", "second", "union", "slope s in union ~ k(1+s(g-1))", 0.58, "slope", "top-8"),
    Claim("union.slope@seed", "second", "union", "slope of the seed's own union table", 0.58, "slope", _SEED_UNION,
          "arithmetic"),
    Claim("mtp.ceiling", "second", "mtp", "speedup bound as acceptance -> 1", 1.83, "speedup", "seed model"),
    Claim("mtp.ceiling@seed", "second", "mtp", "speedup bound as acceptance -> 1", 1.83, "speedup", _SEED_UNION,
          "arithmetic"),
    Claim("mtp.speedup_a90", "second", "mtp", "speedup bound at 90% acceptance", 1.30, "speedup", "seed model"),
    Claim("mtp.speedup_a90@seed", "second", "mtp", "speedup bound at 90% acceptance", 1.30, "speedup", _SEED_UNION,
          "arithmetic"),
    Claim("mtp.speedup_a80", "second", "mtp", "speedup bound at 80% acceptance", 1.08, "speedup", "seed model"),
    Claim("mtp.speedup_a80@seed", "second", "mtp", "speedup bound at 80% acceptance", 1.08, "speedup", _SEED_UNION,
          "arithmetic"),
    Claim("mtp.break_even", "second", "mtp", "acceptance below which MTP (g=3) is a net loss", 0.72, "acceptance",
          "seed model, window g=3"),
    Claim("mtp.break_even@seed", "second", "mtp", "acceptance below which MTP (g=3) is a net loss", 0.72, "acceptance",
          _SEED_UNION, "arithmetic"),
    Claim("bounds.static_below_lru", "second", "bounds", "static pinning bound below LRU (static - LRU hit rate)",
          0.450 - 0.530, "share", "seed trace, 9 GB", "ordering", regime=_BUDGET),
    Claim("bounds.static_knapsack", "second", "bounds", "static pinning bound hit rate at the budget", 0.450, "share",
          "seed trace, 9 GB", rule="not measurable",
          reason="a level of the document's own trace; the claim is the ordering (bounds.static_below_lru)"),
    Claim("bounds.lru", "second", "bounds", "LRU hit rate at the budget", 0.530, "share", "seed trace, 9 GB",
          rule="not measurable", reason="a level of the document's own trace; the claim is the ordering "
                                        "(bounds.static_below_lru)"),
    Claim("readpath.pread_heap", "second", "readpath", "buffered pread to a heap buffer", 1.89, "GB/s",
          "24 GB M4, 1.18 MB blocks", rule="not measurable", reason="GB/s of the document's M4 SSD", timing=True),
    Claim("readpath.pread_fresh", "second", "readpath", "pread into a fresh array", 1.49, "GB/s",
          "24 GB M4, 1.18 MB blocks", rule="not measurable", reason="GB/s of the document's M4 SSD", timing=True),
    Claim("readpath.preadv_slot", "second", "readpath", "preadv into a preallocated slot", 2.62, "GB/s",
          "24 GB M4, 1.18 MB blocks", rule="not measurable", reason="GB/s of the document's M4 SSD", timing=True),
    Claim("readpath.slot_above_heap", "second", "readpath", "preadv into a slot beats pread to a heap buffer "
          "(slot - heap GB/s)", 2.62 - 1.89, "GB/s", "24 GB M4, 1.18 MB blocks", "ordering", timing=True),
    Claim("readpath.fresh_below_heap", "second", "readpath", "pread into a fresh array is slower than to a heap "
          "buffer (fresh - heap GB/s)", 1.49 - 1.89, "GB/s", "24 GB M4, 1.18 MB blocks", "ordering", timing=True),
    Claim("selfdraft.speed", "second", "selfdraft", "draft speed vs full model", 5.6, "x", "seed engine", timing=True),
    Claim("selfdraft.acceptance", "second", "selfdraft", "self-draft acceptance", 0.167, "share", "seed engine"),
    Claim("policies.slru_cold", "second", "policies", "SLRU-cold reads fewer bytes than LRU (relative change)",
          (39.58 / 40.53 - 1, 47.84 / 48.56 - 1), "share", "second seed, arenas of 8 and 10 GB",
          "ordering"),
    # ---- the first document: the engine audit
    _strata("strata.arena_hit_share", "arena hits / lookups", _seed_strata("arena hit share")),
    _strata("strata.prefetch_hit_share", "prefetch hits / lookups", _seed_strata("prefetch hit share")),
    _strata("strata.sync_miss_share", "sync misses / lookups", _seed_strata("sync miss share")),
    _strata("strata.issued_per_lookup", "speculative reads issued / lookups", _seed_strata("issued per lookup")),
    _strata("strata.issue_usefulness", "prefetch hits / speculative issued", _seed_strata("issue usefulness")),
    # timely / late and bytes of partly read or cancelled reads depend on when a read completes: timing rows
    _strata("strata.timely_usefulness", "timely prefetch hits / speculative issued", _seed_strata("timely usefulness"),
            timing=True),
    _strata("strata.late_per_token", "late prefetch hits per decode token", _seed_strata("prefetch hits late"),
            "per token", timing=True),
    _strata("strata.wasted_per_lookup", "speculative reads that end unused (cancelled, partly read, completed "
            "unused) / lookups", ((76.4 - 28) / 480, (82.6 - 25) / 480)),
    _strata("strata.mb_per_token", "MB read per decode token", (131.8, 144.4), "MB", timing=True),
    _strata("strata.unnecessary_share", "share of bytes read that no claim used", 0.675, timing=True),
    Claim("lookahead.prev_token_shared", "first", "lookahead", "experts shared with the previous token, same layer",
          0.334, "share", "first seed's model (512 experts, top-10)", chance=_CHANCE_FIRST),
    Claim("unpert.sync_miss_paired", "first", "unpert", "UNPERT=0 lowers sync misses (UNPERT=0 - UNPERT=1 share of "
          "lookups, moce router held fixed)", -1.0, "share", "first seed, paired prompts; direction only (seed -1: "
          "lower)", "ordering"),
    Claim("readahead.l2_hit_rate", "first", "readahead", "L+2 read-ahead raises the hit rate (75.3% -> 76.7%)",
          0.767 - 0.753, "share", "first seed", "ordering"),
    Claim("readahead.l2_tokens_per_s", "first", "readahead", "L+2 read-ahead lowers tokens/s (2.34 -> 2.22)",
          2.22 - 2.34, "x", "first seed", rule="not measurable", reason=_ELSEWHERE + " (tokens/s)", timing=True),
    Claim("readahead.router_call_ms", "first", "readahead", "0.6 ms per extra router call", 0.6, "ms", "first seed",
          rule="not measurable", reason=_ELSEWHERE + " (Metal kernel time)", timing=True),
    Claim("prefetch.touch_regression", "first", "prefetch", "PREFETCH_TOUCH (a prefetch touches the policy) raises "
          "misses about 4%", 0.04, "share", "first seed", rule="not measurable",
          reason="no such switch here: a speculative read never touches the policy (DESIGN section 3)"),
    Claim("mtp.verify_union_wider", "first", "mtp", "a live verify pass reads more distinct experts than the trace's "
          "window union", None, "experts", "first seed", rule="not measurable",
          reason="not measured by this ledger: needs live verify passes with a draft model "
                 "(workbench run --draft-model reports experts read per verify pass)"),
    Claim("routing.moce_constructed", "first", "routing", "constructed moce case: reads needed (raw top-6 -> "
          "cache-consistent picks)", 3, "count", "z_e = -0.1 e, residents 6..19, p=3, b=0.85, K=6", "exact"),
    Claim("policies.twohit_counterexample", "first", "policies", "capacity 3, A B A B A B then C D x10: two-hit "
          "misses (LRU 4)", 22, "count", "constructed sequence", "exact"),
    Claim("calibration.q_e", "first", "calibration", "q_e (P(claimed | source, rank, layer)) is calibrated on held-out "
          "prompts: expected calibration error", 0.0, "share", "first seed: fit before mapped experts are removed",
          single=False),
]
CLAIM_IDS = [c.id for c in CLAIMS]
_BY_ID = {c.id: c for c in CLAIMS}
COLUMNS = ["id", "doc", "area", "claim", "quantity", "seed", "seed_low", "seed_high", "ours", "low", "high", "pi_low",
           "pi_high", "n", "method", "rule", "verdict", "reason", "timing", "unit", "context", "measured_on", "note",
           "per_prompt"]


def seed_of(claim_id: str) -> float:
    """The seed's value of a claim (the middle of a reported range)."""
    if claim_id not in _BY_ID:
        raise ValueError(f"unknown claim id {claim_id!r}; known ids: {CLAIM_IDS}")
    s = _BY_ID[claim_id].seed
    return (s[0] + s[1]) / 2 if isinstance(s, tuple) else float(s)


LOOKAHEAD_IDS = {"d=1": "lookahead.d1", "d=2": "lookahead.d2", "d=3": "lookahead.d3", "prev_token": "lookahead.prev_token"}
GATE_SLOT_IDS = {1: "gates.slot1", 8: "gates.slot8"}
UNION_IDS = {g: f"union.g{g}" for g in (1, 2, 3, 8)}


def _seed_arithmetic() -> dict[str, list[tuple[Measurement, str]]]:
    """Rows computed without a model: the ``@seed`` arithmetic and the constructed cases."""
    from .cosine import cosine_for_norm_share, residual_share_from_cosine
    from .union import REFERENCE_K, REFERENCE_UNION, _mtp_value, break_even, slope_fits

    u, k = REFERENCE_UNION, REFERENCE_K
    gs = "{" + ",".join(map(str, u)) + "}"
    out = {}
    for cid, q in (("mtp.ceiling@seed", "ceiling"), ("mtp.speedup_a90@seed", "speedup@0.9"),
                   ("mtp.speedup_a80@seed", "speedup@0.8")):
        out[cid] = [(Measurement.of(_mtp_value(u, k, q), f"best g in {gs}, table only"), "")]
    be = break_even(u, k)
    out["mtp.break_even@seed"] = [(Measurement.of(be["by_g"][3], "window g=3 of the table"),
                                   "per-window break-even: " + ", ".join(f"g={g}: {a:.4f}" for g, a in be["by_g"].items())
                                   + f"; the lowest over g is g={be['g']}")]
    s = slope_fits(u, k)
    out["union.slope@seed"] = [(Measurement.of(s["through_k"], "least squares through (1, k)"), (
        f"free intercept {s['free_intercept']:.3f}, mean of per-point slopes {s['mean_per_point']:.3f}; "
        f"a line fits poorly: s=0.58 predicts {k * (1 + 0.58 * 7):.1f} at g=8 against {u[8]:.2f}"))]
    out["union.g1@seed"] = [(Measurement.of(float(k), "k by definition"), "")]
    r = residual_share_from_cosine(0.096, 256)["resid_norm_share"]
    out["cosine.resid_norm_share@seed"] = [(Measurement.of(r, "sqrt(1 - (1 + (E-1) c) / E), c=0.096, E=256"), (
        f"a norm share of 0.986 needs a mean cosine of 1 - 0.986^2*256/255 = {cosine_for_norm_share(0.986, 256):.3f} "
        f"({cosine_for_norm_share(0.986, 256, energy=True):.3f} would hold for an energy share)"))]
    out["routing.moce_constructed"] = _moce_constructed()
    out["policies.twohit_counterexample"] = _twohit_counterexample()
    return out


def _moce_constructed():
    from ..routing.rank import cache_aware_select, topk

    z = -0.1 * np.arange(32)
    resident = np.zeros(32, bool)
    resident[6:20] = True
    raw, moce = topk(z, 6), cache_aware_select(z, resident, 6, p=3, b=0.85)
    picks = f"raw top-6 {sorted(raw.tolist())}, cache-aware {sorted(moce.tolist())}"
    return [(Measurement.of(float((~resident[moce]).sum()), "cache_aware_select, reads = picks not resident"), picks),
            (Measurement(float((~resident[raw]).sum()), np.nan, np.nan, 1, "topk, reads = picks not resident",
                         seed=6.0, quantity="raw top-6 reads"), picks)]


def _twohit_counterexample():
    from ..sim import replay_keys

    keys = [0, 1, 0, 1, 0, 1] + [2, 3] * 10
    miss = {p: replay_keys(keys, policy=p, capacity=3, preload=False) for p in ("twohit", "lru")}
    miss = {p: float(r.lookups - r.hits) for p, r in miss.items()}
    return [(Measurement.of(miss["twohit"], "replay_keys, capacity 3, cold"), ""),
            (Measurement(miss["lru"], np.nan, np.nan, 1, "replay_keys, capacity 3, cold", seed=4.0,
                         quantity="LRU misses"), "")]


def _range(seed):
    return seed if isinstance(seed, tuple) else (seed, seed)


def _interval(claim: Claim, m: Measurement) -> tuple[float, float, str]:
    """The interval the level rule compares with, and its name."""
    if claim.single and len(m.per_unit) >= 2:
        return (*m.prediction, "our 95% prediction interval for one prompt")
    return m.low, m.high, "our 95% interval"


def judge(claim: Claim, m: Measurement) -> tuple[str, str]:
    """(verdict, reason) of ``claim``'s rule applied to ``m``."""
    if claim.rule == "not measurable":
        return "not measurable here", claim.reason
    if m.reason:
        return "not measurable here", m.reason
    if m.value is None or np.isnan(m.value):
        return "not measured", "no measurement"
    if claim.regime is not None and m.regime is not None:
        what, theirs = claim.regime
        if not (theirs / REGIME_FACTOR <= m.regime <= theirs * REGIME_FACTOR):
            return "not comparable", f"{what}: ours {m.regime:.3g}, the document's {theirs:.3g}"
    seed = claim.seed if m.seed is None else m.seed
    lo_s, hi_s = _range(seed)
    if claim.rule == "exact":
        ok = m.value == lo_s
        return ("reproduced" if ok else "differs"), ""
    tol = tolerance(claim.kind)
    if claim.rule == "arithmetic":
        ok = abs(m.value - lo_s) <= tol + 1e-12
        return ("reproduced" if ok else "differs"), ""
    if claim.rule == "ordering":
        side = np.sign(lo_s)
        if (m.low > 0 and side > 0) or (m.high < 0 and side < 0):
            return "reproduced", ""
        if (m.low > 0 and side < 0) or (m.high < 0 and side > 0):
            return "differs", "the opposite ordering: our interval lies on the other side of 0"
        return "differs", "the ordering is not shown: our interval contains 0"
    lo, hi, _ = _interval(claim, m)
    ok = hi_s >= lo - tol - 1e-12 and lo_s <= hi + tol + 1e-12
    return ("reproduced" if ok else "differs"), ""


def verdict(claim: Claim, m: Measurement) -> str:
    """The rule of ``claim`` applied to ``m`` (one of ``VERDICTS``)."""
    return judge(claim, m)[0]


def rule_text(claim: Claim, m: Measurement | None = None) -> str:
    """The rule of a row, in words."""
    if claim.rule == "not measurable":
        return "not measurable here"
    pre = (f"comparable when {claim.regime[0]} is within x{REGIME_FACTOR:g} of the document's; then "
           if claim.regime else "")
    if claim.rule == "exact":
        return pre + "ours == seed"
    tol = tolerance(claim.kind)
    if claim.rule == "arithmetic":
        return pre + f"|ours - seed| <= {tol:g} ({claim.kind})"
    if claim.rule == "ordering":
        side = "< 0" if np.sign(_range(claim.seed)[0]) < 0 else "> 0"
        return pre + f"paired difference {side}: our 95% interval on the document's side of 0"
    where = _interval(claim, m)[2] if m is not None else "our 95% interval"
    return pre + f"seed within {where} widened by {tol:g} ({claim.kind})"


def build_ledger(measured: Mapping[str, object] | None = None, model: str = "") -> pd.DataFrame:
    """One row per (claim, measurement): the columns of ``COLUMNS``."""
    measured = dict(measured or {})
    unknown = set(measured) - set(CLAIM_IDS)
    if unknown:
        raise ValueError(f"unknown claim ids {sorted(unknown)}; known ids: {CLAIM_IDS}")
    computed = _seed_arithmetic()
    rows = []
    for c in CLAIMS:
        if c.id in computed:
            pairs = computed[c.id]
        else:
            got = measured.get(c.id)
            got = [] if got is None else (got if isinstance(got, (list, tuple)) else [got])
            pairs = [(Measurement.of(g), "") for g in got]
        if not pairs:
            pairs = [(Measurement(np.nan, np.nan, np.nan, 0, ""), "")]
        for m, note in pairs:
            seed = c.seed if m.seed is None else m.seed
            lo_s, hi_s = _range(seed) if seed is not None else (np.nan, np.nan)
            pi = m.prediction
            v, why = judge(c, m)
            rows.append(dict(id=c.id, doc=c.doc, area=c.area, claim=c.what, quantity=m.quantity or "as claimed",
                             seed=(lo_s + hi_s) / 2, seed_low=lo_s, seed_high=hi_s, ours=m.value, low=m.low,
                             high=m.high, pi_low=pi[0], pi_high=pi[1], n=m.n, method=m.method, rule=rule_text(c, m),
                             verdict=v, reason=why, timing=c.timing, unit=c.kind, context=c.context,
                             measured_on="constructed / the seed's numbers" if c.id in computed else model, note=note,
                             per_prompt=[float(x) for x in m.per_unit]))
    return pd.DataFrame(rows, columns=COLUMNS)


def claim_verdicts(ledger: pd.DataFrame) -> pd.Series:
    """One verdict per claim id: that of its first row (the method closest to the document's)."""
    return ledger.groupby("id", sort=False)["verdict"].first()


def verdict_totals(verdicts) -> str:
    """Totals worded once, for the command line, notebook 08 and the report's index:
    "14 of 57 claims reproduced, 35 differ, 8 not measured" (in ``VERDICTS`` order)."""
    v = pd.Series(list(verdicts), dtype=object).value_counts()
    rest = [f"{int(v[k])} {'differ' if k == 'differs' else k}" for k in VERDICTS[1:] if k in v]
    return ", ".join([f"{int(v.get('reproduced', 0))} of {int(v.sum())} claims reproduced"] + rest)


def headline_counts(ledger: pd.DataFrame) -> str:
    """``verdict_totals`` over claim ids (one verdict each: ``claim_verdicts``), not rows."""
    return verdict_totals(claim_verdicts(ledger))


# --------------------------------------------------------------------------- from workload tables
def _per_unit(table, keys: Mapping[str, object], value: str) -> tuple:
    """The per-prompt values of one group of an interval table (``uncertainty.per_prompt``)."""
    from .uncertainty import per_prompt

    try:
        p = per_prompt(table)
    except ValueError:
        return ()
    for k, v in keys.items():
        p = p[p[k] == v]
    return tuple(float(x) for x in p[value])


def _m(row, method: str, value: str, n_col: str = "n_prompts", per_unit: tuple = ()) -> Measurement:
    return Measurement(float(row[value]), float(row["low"]), float(row["high"]), int(row[n_col]), method, per_unit)


def _lift_row(m: Measurement, chance: float, claim: Claim, method: str) -> Measurement:
    vals = lift(m.per_unit, chance) if m.per_unit else lift([m.value], chance)
    return _iv(vals, f"{method}, chance k/E = {chance:.3f}", seed=float(lift(claim.seed, claim.chance)),
               quantity="lift over chance")


def workload_measurements(tables: Mapping[str, object], extra: Mapping[str, object] | None = None) -> dict[str, list]:
    """{claim id: [Measurement per method]} from ``analyze_workload``'s tables:
    ``tables["methods"][method]`` holds lookahead, gates, drop_weakest, union, mtp tables;
    ``tables["cosine"]`` the cosine interval table; ``tables["strata_per_prompt"]`` the strata runs;
    ``tables["chance"]`` our top-k / experts (lift rows); ``tables["strata_constructed"]`` the
    constructed model's strata runs (``live.constructed_workload``)."""
    out: dict[str, list] = {}

    def add(cid, m):
        out.setdefault(cid, []).append(m)

    chance = tables.get("chance")
    for method, t in (tables.get("methods") or {}).items():
        if "lookahead" in t:
            la0 = t["lookahead"]
            la = la0[la0["k_pred"] == la0["k"]].set_index("source")
            for src, cid in LOOKAHEAD_IDS.items():
                if src in la.index:
                    r = la.loc[src]
                    pu = _per_unit(la0, {"source": src, "k_pred": int(r["k"])}, "recovery")
                    m = _m(r, f"{method}, mean over layers, k'=k", value="recovery", per_unit=pu)
                    ids = [cid] + {"d=1": ["lookahead.glm_layer_input"],
                                   "prev_token": ["lookahead.glm_prev_token", "lookahead.prev_token_shared"]}.get(src, [])
                    for i in ids:
                        add(i, m)
                        if chance is not None and _BY_ID[i].chance is not None:
                            add(i, _lift_row(m, chance, _BY_ID[i], f"{method}, lift over chance"))
        if "gates" in t:
            g = t["gates"].set_index("slot")
            k = int(g.index.max())
            add("gates.slot1", _m(g.loc[1], f"{method}, normalized weights, mean over layers", value="mean_weight",
                                  per_unit=_per_unit(t["gates"], {"slot": 1}, "mean_weight")))
            if 8 in g.index:
                add("gates.slot8", _m(g.loc[8], f"{method}, normalized weights, mean over layers (top-{k})",
                                      value="mean_weight", per_unit=_per_unit(t["gates"], {"slot": 8}, "mean_weight")))
        if "drop_weakest" in t:
            dw = t["drop_weakest"]
            for r in dw[dw["dropped"] == 1].itertuples():
                name = "renormalised" if r.renorm else "not renormalised"
                add("gates.drop_weakest", Measurement(r.rel_error, r.low, r.high, r.n_prompts,
                                                      f"{method}, kept weights {name}, mean over layers",
                                                      _per_unit(dw, {"dropped": 1, "renorm": r.renorm}, "rel_error")))
        if "union" in t:
            u = t["union"].set_index("g")
            for g, cid in UNION_IDS.items():
                if g in u.index:
                    add(cid, _m(u.loc[g], f"{method}, mean over layers", value="union",
                                per_unit=_per_unit(t["union"], {"g": g}, "union")))
        if "mtp" in t:
            mt = t["mtp"].set_index("quantity")
            gsel = mt["g_values"].iloc[0]
            pu = _mtp_per_prompt(t.get("union"))
            for q, cid, how in (("ceiling", "mtp.ceiling", f"best g in {{{gsel}}}"),
                                ("speedup@0.9", "mtp.speedup_a90", f"best g in {{{gsel}}}"),
                                ("speedup@0.8", "mtp.speedup_a80", f"best g in {{{gsel}}}"),
                                ("break_even@g3", "mtp.break_even", "window g=3 (like for like)"),
                                ("break_even", "mtp.break_even", f"lowest over g in {{{gsel}}}"),
                                ("slope", "union.slope", f"least squares through (1, k), g in {{{gsel}}}")):
                if q in mt.index:
                    add(cid, _m(mt.loc[q], f"{method}, our union table, {how}", value="value", per_unit=pu.get(q, ())))
    if tables.get("cosine") is not None:
        c = tables["cosine"].set_index("quantity")
        for q, cid in (("mean_cosine", "cosine.mean"), ("resid_norm_share", "cosine.resid_norm_share"),
                       ("energy_at_rank", "cosine.energy_at_half_rank")):
            if q in c.index:
                add(cid, _m(c.loc[q], "weights, mean over layers, bootstrap over layers", "value", "n_layers"))
    sp = tables.get("strata_per_prompt")
    if sp is not None and len(sp):
        from .live import STRATA_CONFIG, UNPERT_CONTRAST, paired_difference

        _strata_measurements(sp[sp["configuration"] == STRATA_CONFIG], add,
                             f"decode, {STRATA_CONFIG}, read-ahead d=1, 17.6% residency")
        for x, y, why in ((*UNPERT_CONTRAST, "17.6% residency, moce router fixed"),
                          ("bonus, exact", "raw, exact", "exact router fixed"),
                          ("bonus, moce", "raw, exact", "the old confounded contrast: ranking and router both change")):
            if {x, y} <= set(sp["configuration"]):
                add("unpert.sync_miss_paired", _iv(paired_difference(sp, "sync miss share", x, y),
                                                   f"decode, ({x}) - ({y}) per prompt, {why}",
                                                   quantity="paired difference"))
        if {"raw, moce, L+2", "raw, moce"} <= set(sp["configuration"]):
            hit = sp.assign(hit=1 - sp["sync miss share"])
            add("readahead.l2_hit_rate", _iv(paired_difference(hit, "hit", "raw, moce, L+2", "raw, moce"),
                                             "decode, raw ranking, moce router, hit rate L+2 - L+1 per prompt",
                                             quantity="paired difference"))
    cp = tables.get("strata_constructed")
    if cp is not None and len(cp):
        from .workload import CONSTRUCTED

        c = CONSTRUCTED
        _strata_measurements(cp, add, f"CONSTRUCTED random model ({c['layers']} layers x {c['experts']} experts, "
                                      f"top-{c['top_k']}, tokens kept moving), decode, raw, moce, 17.6% residency")
    for cid, v in (extra or {}).items():
        for m in (v if isinstance(v, (list, tuple)) else [v]):
            add(cid, Measurement.of(m))
    return out


def _iv(vals, method, **kw) -> Measurement:
    """A measurement from per-prompt values: their mean with the bootstrap interval over prompts."""
    from .uncertainty import bootstrap_ci

    b = bootstrap_ci(list(vals))
    return Measurement(b.estimate, b.low, b.high, b.n, method, tuple(float(v) for v in vals), **kw)


STRATA_IDS = {"arena hit share": "strata.arena_hit_share", "prefetch hit share": "strata.prefetch_hit_share",
              "sync miss share": "strata.sync_miss_share", "issued per lookup": "strata.issued_per_lookup",
              "issue usefulness": "strata.issue_usefulness", "timely usefulness": "strata.timely_usefulness",
              "prefetch hits late": "strata.late_per_token", "wasted per lookup": "strata.wasted_per_lookup",
              "MB per token": "strata.mb_per_token", "unnecessary share": "strata.unnecessary_share"}


def _strata_measurements(per_prompt, add, method: str) -> None:
    """The strata rows of one configuration's per-prompt table, each with our working set in tokens."""
    from .live import WASTE

    sp = per_prompt.assign(**{"wasted per lookup": sum(per_prompt[f"{w} per token"] for w in WASTE)
                              / per_prompt["lookups"]})
    ws = float((sp["slots"] / sp["lookups"]).mean())
    for q, cid in STRATA_IDS.items():
        if q in sp:
            add(cid, _iv(sp[q], method + ", bootstrap over prompts", regime=ws))


def _mtp_per_prompt(union) -> dict[str, tuple]:
    """Each MTP quantity computed on each prompt's own union table."""
    from .uncertainty import per_prompt
    from .union import MTP_QUANTITIES, _mtp_value

    if union is None or "k" not in union.attrs:
        return {}
    per = per_prompt(union).pivot(index="prompt", columns="g", values="union").dropna()
    k = int(union.attrs["k"])
    return {q: tuple(_mtp_value(dict(zip([int(g) for g in per.columns], row)), k, q) for row in per.to_numpy())
            for q in MTP_QUANTITIES}


def _busy(load_before: float, load_after: float, cpus: int) -> str:
    """A reason to give no timing verdict: the machine ran other work (1-minute load above half its CPUs)."""
    worst = max(load_before, load_after)
    return (f"machine busy with other work: load {load_before:.1f} before, {load_after:.1f} after on {cpus} CPUs"
            if worst > cpus / 2 else "")


def readpath_measurements(block_bytes: int = 1_180_000, n_blocks: int = 64, repeats: int = 5, seed: int = 0,
                          directory=None) -> dict[str, list]:
    """The read-path rows at the document's block size: a scratch file of ``n_blocks`` blocks,
    each repeat cold (dontneed) in a fresh shuffled order, the three variants interleaved; the
    machine's load checked before and after (a busy machine gives no verdict)."""
    import os

    from ..io.readpath import copy_variants_file_gbps

    before = os.getloadavg()[0]
    reps = copy_variants_file_gbps(block_bytes, n_blocks, repeats, seed=seed, directory=directory)
    busy = _busy(before, os.getloadavg()[0], os.cpu_count() or 1)
    how = f"{n_blocks} x {block_bytes / 1e6:.2f} MB blocks, cold, shuffled, {repeats} repeats, bootstrap over repeats"
    out = {}
    for cid, key in (("readpath.pread_heap", "pread_heap"), ("readpath.pread_fresh", "pread_fresh_array"),
                     ("readpath.preadv_slot", "preadv_slot")):
        out[cid] = _iv([r[key] for r in reps], how, reason=busy)
    for cid, a in (("readpath.slot_above_heap", "preadv_slot"), ("readpath.fresh_below_heap", "pread_fresh_array")):
        out[cid] = _iv([r[a] - r["pread_heap"] for r in reps], how + ", paired per repeat",
                       quantity="paired difference", reason=busy)
    return out


def ledger_extras(workload, budget_share: float = BOUNDS_SHARE, self_draft: bool = True, readpath_repeats: int = 5,
                  draft_tokens: int = 16, readpath_blocks: int = 64) -> dict[str, Measurement]:
    """The rows that need the simulator, the disk or the engine, over ``workload``: static pinning
    (knapsack, charged its cold misses) against LRU from cold at ``budget_share`` of the routed
    experts (paired per prompt, decode rows), SLRU-cold against LRU (replay, paired), held-out
    calibration of q, the read path, self-draft acceptance and speed."""
    from ..sim import replay
    from .bounds import knapsack_bound

    def iv(vals, method, **kw):
        return _iv(vals, f"{method}, bootstrap over prompts", **kw)

    diff, slru = [], {0.176: [], 0.5: []}
    for tr in workload.traces().values():
        budget = budget_share * len(tr.moe_layers) * tr.n_experts * tr.meta["expert_bytes"]
        kn = float(knapsack_bound(tr, [budget], phase="decode")["hit_rate_cold"].iloc[0])
        lru = float(replay(tr, "lru", arena=budget_share, phase="decode", preload=False).to_dict()["hit_rate"])
        diff.append(kn - lru)
        for a in slru:
            h = {p: replay(tr, p, arena=a, phase="decode", preload=False).to_dict()["hit_rate"] for p in ("lru", "slru")}
            slru[a].append((1 - h["slru"]) / (1 - h["lru"]) - 1 if h["lru"] < 1 else 0.0)
    out = {"bounds.static_below_lru": iv(diff, f"decode, budget {budget_share:.0%} of routed experts, knapsack charged "
                                               "its cold misses - LRU from cold, paired", quantity="paired difference",
                                         regime=budget_share),
           "policies.slru_cold": [iv(v, f"decode replay from cold, arena {a:.1%}, SLRU / LRU misses - 1, paired",
                                     quantity="paired difference") for a, v in slru.items()]}
    out["calibration.q_e"] = _calibration(workload)
    out.update(readpath_measurements(n_blocks=readpath_blocks, repeats=readpath_repeats))
    if self_draft:
        from ..engine.engine import Engine
        from .drafters import acceptance_table, self_draft_drafter

        acc, speed = [], []
        with Engine(workload.store, arena=str(0.25), progress=False) as eng:
            for run in workload.runs:
                full = eng.generate(run.prompt_ids, max_tokens=draft_tokens)
                eng.draft_resident_only(run.prompt_ids, draft_tokens)
                speed.append(float(np.median(full.step_times) / np.median(eng.last_draft_times)))
                df = acceptance_table(run.prompt_ids, full.tokens, {"self_draft": self_draft_drafter(eng)}, g_values=(4,))
                acc.append(float(df["acceptance"].iloc[0]))
        m = f"decode, arena 25%, g=4, {draft_tokens} tokens"
        out.update({"selfdraft.acceptance": iv(acc, m), "selfdraft.speed": iv(speed, m + ", median step times")})
    return out


def _calibration(workload) -> Measurement:
    """Held-out expected calibration error of q: fit on the first half of the prompts, scored on
    each of the rest, candidates predicted offline (before mapped experts would be removed)."""
    from ._common import load_mlx_model
    from .calibration import calibration_scores, claim_candidates, fit_claim_model
    from .lookahead import routers_from_model
    from .uncertainty import bootstrap_ci

    traces = workload.traces()
    names = list(traces)
    if len(names) < 2:
        return Measurement(np.nan, np.nan, np.nan, 0, "needs 2 prompts or more (fit and held-out)")
    half = max(1, len(names) // 2)
    routers = routers_from_model(load_mlx_model(workload.model))
    cands = {p: claim_candidates(traces[p], routers, "decode") for p in names}
    model = fit_claim_model(pd.concat([cands[p] for p in names[:half]], ignore_index=True))
    ece = [float(calibration_scores(model, cands[p]).set_index("source").loc["all", "ece"]) for p in names[half:]]
    b = bootstrap_ci(ece)
    return Measurement(b.estimate, b.low, b.high, b.n, f"fit on {half} prompts, ECE on each of {len(names) - half} "
                       "held out, offline candidates d=1..3 and previous token, bootstrap over held-out prompts",
                       tuple(ece))


def workload_ledger(workload, live: bool = True, cosine_layers: int = 0, strata_tokens: int | None = None,
                    readpath_repeats: int = 5, self_draft: bool = True, progress: bool = False, **ci):
    """(ledger, tables): every analysis over ``workload`` (``analyze_workload``), the extras
    (bounds, policies, calibration, read path, and with ``live`` the engine's factorial runs, the
    constructed model's strata runs in the seed's regime and self-draft), then the ledger by rule."""
    from .workload import analyze_workload

    from .live import LEDGER_CONFIGS, strata_runs

    tables = analyze_workload(workload, cosine_layers=cosine_layers, strata=False, progress=progress, **ci)
    if live:
        from .live import CONFIGS, STRATA_CONFIG
        from .workload import constructed_workload

        tables["strata_per_prompt"] = strata_runs(workload, LEDGER_CONFIGS, max_tokens=strata_tokens, progress=progress)
        tables["strata_constructed"] = strata_runs(constructed_workload(max_tokens=strata_tokens or 16),
                                                   {STRATA_CONFIG: CONFIGS[STRATA_CONFIG]}, progress=progress)
    tr = next(iter(workload.traces().values()))
    tables["chance"] = int(tr.meta["top_k"]) / int(tr.n_experts)
    extra = ledger_extras(workload, self_draft=live and self_draft, readpath_repeats=readpath_repeats)
    tables["extras"] = extra
    return build_ledger(workload_measurements(tables, extra), model=str(workload.model)), tables
