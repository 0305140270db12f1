"""The claims ledger, built without a model: each rule on constructed inputs whose verdict is known."""

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.ledger import (CLAIM_IDS, CLAIMS, DOCS, REGIME_FACTOR, VERDICTS, Measurement, build_ledger,
                                       claim_verdicts, headline_counts, judge, lift, verdict,
                                       workload_measurements)
from workbench.analysis.tolerance import TOLERANCE, tolerance
from workbench.analysis.uncertainty import prediction_interval

BY_ID = {c.id: c for c in CLAIMS}


def _row(led, cid, method=None, quantity=None):
    r = led[led["id"] == cid]
    if method:
        r = r[r["method"] == method]
    if quantity:
        r = r[r["quantity"] == quantity]
    return r.iloc[0]


def test_every_claim_has_a_row_a_document_and_a_kind():
    led = build_ledger()
    assert list(dict.fromkeys(led["id"])) == CLAIM_IDS and len(set(CLAIM_IDS)) == len(CLAIM_IDS)
    assert set(led["doc"]) == set(DOCS) and set(led["verdict"]) <= set(VERDICTS)
    assert all(c.kind in TOLERANCE for c in CLAIMS)
    assert all(c.reason for c in CLAIMS if c.rule == "not measurable")
    for cid in ("policies.slru_cold", "readahead.l2_hit_rate", "lookahead.prev_token_shared", "strata.mb_per_token",
                "strata.late_per_token", "strata.wasted_per_lookup", "routing.moce_constructed",
                "policies.twohit_counterexample", "prefetch.touch_regression", "unpert.sync_miss_paired",
                "calibration.q_e", "mtp.verify_union_wider"):
        assert cid in CLAIM_IDS
    seed = dict(zip(led["id"], led["seed"]))
    assert seed["lookahead.d1"] == 0.785 and seed["union.g8"] == 35.01 and seed["readpath.preadv_slot"] == 2.62
    assert (led[led["id"] == "readpath.pread_heap"]["verdict"] == "not measurable here").all()


def test_headline_counts_claim_ids_not_rows():
    led = build_ledger({"lookahead.d1": [Measurement(0.785, 0.78, 0.79, 8, "a"), Measurement(0.5, 0.49, 0.51, 8, "b")]})
    v = claim_verdicts(led)
    assert len(v) == len(CLAIM_IDS) < len(led)
    assert v["lookahead.d1"] == "reproduced"  # the first row (the method closest to the document's)
    h = headline_counts(led)
    assert h.startswith(f"{(v == 'reproduced').sum()} of {len(CLAIM_IDS)} claims reproduced")
    assert f"{(v == 'not measured').sum()} not measured" in h


def test_prediction_interval():
    x = [0.70, 0.72, 0.74, 0.71, 0.73]
    lo, hi = prediction_interval(x)
    half = 2.776 * np.std(x, ddof=1) * np.sqrt(1 + 1 / 5)  # t(4)
    assert (lo, hi) == pytest.approx((np.mean(x) - half, np.mean(x) + half))
    assert np.isnan(prediction_interval([0.7])[0])


def test_level_rule_single_prompt_value_against_the_prediction_interval():
    c = BY_ID["lookahead.d2"]  # 0.725 from one prompt
    per = (0.69, 0.67, 0.71, 0.69, 0.68, 0.70, 0.69, 0.69)  # every prompt below 0.725
    mean_only = Measurement(0.69, 0.685, 0.695, 8, "decode")
    assert verdict(c, mean_only) == "differs"  # 0.725 is outside the mean's interval + 0.02
    assert verdict(c, Measurement(0.69, 0.685, 0.695, 8, "decode", per)) == "reproduced"  # one prompt may reach it
    far = tuple(v - 0.2 for v in per)
    assert verdict(c, Measurement(0.50, 0.495, 0.505, 8, "decode", far)) == "differs"
    # the tolerance widens the interval by exactly its kind's value
    tol = tolerance("share")
    assert verdict(c, Measurement(0.70, 0.70, 0.725 - tol, 1)) == "reproduced"
    assert verdict(c, Measurement(0.70, 0.70, 0.725 - tol - 1e-6, 1)) == "differs"
    led = build_ledger({"lookahead.d2": Measurement(0.69, 0.685, 0.695, 8, "decode", per)})
    r = _row(led, "lookahead.d2")
    assert "prediction interval" in r["rule"] and r["pi_low"] < 0.67 and r["pi_high"] > 0.71
    cos = BY_ID["cosine.mean"]  # a model-level value: the interval of the mean, not a prediction interval
    assert not cos.single and verdict(cos, Measurement(0.05, 0.04, 0.06, 12, "", (0.0, 0.1, 0.05))) == "differs"


def test_level_rule_with_a_seed_range():
    rng = BY_ID["strata.sync_miss_share"]
    lo, hi = rng.seed
    tol = tolerance(rng.kind)
    assert verdict(rng, Measurement(hi + tol + 0.01, hi + tol - 0.001, hi + 0.05, 8)) == "reproduced"
    assert verdict(rng, Measurement(hi + tol + 0.01, hi + tol + 0.001, hi + 0.05, 8)) == "differs"


def test_lift_over_chance_beside_the_raw_share():
    assert lift(0.33, 8 / 256) == pytest.approx(0.3084, abs=1e-4) and lift(0.125, 0.125) == 0
    la = pd.DataFrame({"source": ["prev_token"], "distance": [0], "k": [8], "k_pred": [8], "recovery": [0.31],
                       "low": [0.30], "high": [0.32], "n_prompts": [4]})
    la.attrs["per_prompt"] = {"source": ["prev_token"] * 4, "distance": [0] * 4, "k": [8] * 4, "k_pred": [8] * 4,
                              "recovery": [0.30, 0.31, 0.32, 0.31], "prompt": list("abcd")}
    m = workload_measurements({"methods": {"decode": {"lookahead": la}}, "chance": 0.125})
    led = build_ledger(m)
    raw, lifted = _row(led, "lookahead.prev_token", quantity="as claimed"), _row(led, "lookahead.prev_token",
                                                                                 quantity="lift over chance")
    assert raw["verdict"] == "reproduced"  # 0.33 within 0.31's prediction interval + 0.02
    assert lifted["seed"] == pytest.approx(lift(0.33, 8 / 256)) and lifted["ours"] == pytest.approx(lift(0.31, 0.125))
    assert lifted["verdict"] == "differs"  # 0.21 against 0.31 once chance (1/8 here, 1/32 there) is taken out
    # the first document's 33.4% shared with the previous token is the same measurement, its own chance (10/512)
    shared = _row(led, "lookahead.prev_token_shared", quantity="lift over chance")
    assert shared["seed"] == pytest.approx(lift(0.334, 10 / 512))
    assert "lookahead.glm_prev_token" in m and all(x.quantity == "" for x in m["lookahead.glm_prev_token"])


def test_ordering_rule_on_paired_differences():
    c = BY_ID["unpert.sync_miss_paired"]  # claimed: UNPERT=0 - UNPERT=1 < 0
    assert judge(c, Measurement(-0.05, -0.08, -0.02, 6)) == ("reproduced", "")
    v, why = judge(c, Measurement(0.04, 0.02, 0.06, 6))
    assert v == "differs" and "opposite" in why
    v, why = judge(c, Measurement(0.01, -0.01, 0.03, 6))
    assert v == "differs" and "contains 0" in why
    up = BY_ID["readahead.l2_hit_rate"]  # claimed > 0
    assert verdict(up, Measurement(0.01, 0.002, 0.02, 6)) == "reproduced"
    assert verdict(up, Measurement(-0.01, -0.02, -0.002, 6)) == "differs"


def test_unpert_row_is_the_paired_factorial_contrast():
    # 2x2 per prompt: with the router held at moce, the bonus ranking raises sync misses on every prompt,
    # while the old confounded contrast (bonus+moce against raw+exact) would call it better
    cells = {"raw, exact": 0.22, "bonus, exact": 0.30, "raw, moce": 0.12, "bonus, moce": 0.16}
    rows = [dict(configuration=c, prompt=f"p{i}", **{"sync miss share": v + 0.01 * i, "lookups": 96.0, "slots": 135,
                                                   "cancelled_before_read per token": 0.0, "partially_read per token": 0.0,
                                                   "completed_unused per token": 1.0})
            for c, v in cells.items() for i in range(6)]
    sp = pd.DataFrame(rows)
    m = workload_measurements({"strata_per_prompt": sp})
    led = build_ledger(m)
    first = _row(led, "unpert.sync_miss_paired")
    assert "moce router fixed" in first["method"] and first["ours"] == pytest.approx(0.04)
    assert first["verdict"] == "differs" and "opposite" in first["reason"]
    old = _row(led, "unpert.sync_miss_paired", method=next(x.method for x in m["unpert.sync_miss_paired"]
                                                          if "confounded" in x.method))
    assert old["ours"] == pytest.approx(-0.06) and old["verdict"] == "reproduced"
    assert claim_verdicts(led)["unpert.sync_miss_paired"] == "differs"  # the headline takes the document's contrast


def test_regime_rule_marks_not_comparable_with_the_reason():
    c = BY_ID["strata.sync_miss_share"]
    what, theirs = c.regime
    assert theirs == pytest.approx(0.176 * 48 * 512 / 480)
    v, why = judge(c, Measurement(0.03, 0.029, 0.033, 6, regime=135 / 96))
    assert v == "not comparable" and "ours 1.41" in why and "9.01" in why
    inside = theirs * REGIME_FACTOR * 0.99
    assert verdict(c, Measurement(0.03, 0.029, 0.033, 6, regime=inside)) == "reproduced"
    assert verdict(c, Measurement(0.03, 0.029, 0.033, 6, regime=theirs * REGIME_FACTOR * 1.01)) == "not comparable"


def test_not_measurable_and_busy_machine():
    assert judge(BY_ID["readpath.pread_heap"], Measurement(1.0, 0.9, 1.1, 5))[0] == "not measurable here"
    c = BY_ID["readpath.slot_above_heap"]
    assert c.timing and verdict(c, Measurement(0.5, 0.4, 0.6, 5)) == "reproduced"
    v, why = judge(c, Measurement(0.5, 0.4, 0.6, 5, reason="machine busy"))
    assert v == "not measurable here" and why == "machine busy"
    from workbench.analysis.ledger import _busy

    assert _busy(0.2, 0.3, 16) == "" and "load 3.0 before" in _busy(3.0, 0.1, 2)


def test_seed_arithmetic_and_constructed_rows():
    led = build_ledger()
    ceil = _row(led, "mtp.ceiling@seed")
    assert ceil["ours"] == pytest.approx(1.828, abs=1e-3) and ceil["verdict"] == "reproduced"
    assert ceil["rule"] == f"|ours - seed| <= {TOLERANCE['speedup']:g} (speedup)" and "{1,2,3,8}" in ceil["method"]
    a80 = _row(led, "mtp.speedup_a80@seed")  # 1.085 is within the two-digit tolerance of 1.08
    assert a80["ours"] == pytest.approx(1.0850, abs=1e-4) and a80["verdict"] == "reproduced"
    be = _row(led, "mtp.break_even@seed")  # like for like at g=3 (the lowest over g, g=2, is 0.6775)
    assert be["ours"] == pytest.approx(0.7242, abs=1e-4) and be["verdict"] == "reproduced"
    assert "g=2: 0.6775" in be["note"] and "g=3: 0.7242" in be["note"]
    s = _row(led, "union.slope@seed")
    assert s["ours"] == pytest.approx(0.496, abs=1e-3) and s["verdict"] == "differs"
    assert "free intercept 0.467" in s["note"] and "predicts 40.5 at g=8 against 35.01" in s["note"]
    cos = _row(led, "cosine.resid_norm_share@seed")
    assert cos["ours"] == pytest.approx(0.949, abs=1e-3) and cos["verdict"] == "differs"
    moce = led[led["id"] == "routing.moce_constructed"]
    assert list(moce["ours"]) == [3, 6] and (moce["verdict"] == "reproduced").all()
    assert "cache-aware [0, 1, 2, 6, 7, 8]" in moce["note"].iloc[0]
    two = led[led["id"] == "policies.twohit_counterexample"]
    assert list(two["ours"]) == [22, 4] and (two["verdict"] == "reproduced").all()
    exact = BY_ID["routing.moce_constructed"]
    assert verdict(exact, Measurement.of(4)) == "differs"


def test_one_tolerance_per_kind_shared_with_the_mtp_check():
    from workbench.analysis.union import mtp_reference_check

    t = mtp_reference_check().set_index(["assumption", "quantity"])
    g3 = t.loc[("fixed g=3", "break_even")]
    assert g3["value"] == pytest.approx(0.7242, abs=1e-4)
    assert bool(g3["matches"]) == (abs(g3["value"] - 0.72) <= TOLERANCE["acceptance"])
    with pytest.raises(ValueError, match="no tolerance"):
        tolerance("furlongs")


def test_workload_measurements_name_the_method():
    iv = lambda col, vals, **kw: pd.DataFrame({**kw, col: vals, "low": np.array(vals) - 0.01,
                                               "high": np.array(vals) + 0.01, "n_prompts": 8})
    la = iv("recovery", [0.78, 0.72, 0.66, 0.3], source=["d=1", "d=2", "d=3", "prev_token"], k=8, k_pred=8)
    gates = iv("mean_weight", list(np.linspace(0.3, 0.05, 8)), slot=range(1, 9))
    drop = iv("rel_error", [0.09, 0.11], dropped=1, renorm=[False, True])
    union = iv("union", [8.0, 13.0, 18.0, 33.0], g=[1, 2, 3, 8])
    mtp = iv("value", [1.9, 1.3, 1.1, 0.7, 0.72, 0.5],
             quantity=["ceiling", "speedup@0.9", "speedup@0.8", "break_even", "break_even@g3", "slope"],
             g_values="1,2,3,8")
    tables = {"methods": {"decode": dict(lookahead=la, gates=gates, drop_weakest=drop, union=union, mtp=mtp)}}
    m = workload_measurements(tables, extra={"selfdraft.acceptance": 0.2})
    assert {x.method for x in m["gates.drop_weakest"]} == {"decode, kept weights not renormalised, mean over layers",
                                                           "decode, kept weights renormalised, mean over layers"}
    assert m["mtp.break_even"][0].method == "decode, our union table, window g=3 (like for like)"
    assert m["mtp.break_even"][0].value == 0.72
    led = build_ledger(m)
    assert _row(led, "union.g2")["verdict"] == "differs" and _row(led, "lookahead.d2")["verdict"] == "reproduced"
    assert _row(led, "selfdraft.acceptance")["method"] == "single value (no interval)"
    from workbench.viz.tables import ledger_table

    assert "lookahead.d1" in ledger_table(led.to_dict("records"))


def test_constructed_model_rows_in_the_documents_regime_get_a_verdict():
    def per(slots, lookups, share):
        return pd.DataFrame([dict(configuration="raw, moce", prompt=f"p{i}", slots=slots, lookups=lookups,
                                  **{"sync miss share": share, "cancelled_before_read per token": 0.0,
                                     "partially_read per token": 0.0, "completed_unused per token": 1.0})
                             for i in range(4)])
    m = workload_measurements({"strata_per_prompt": per(135, 96.0, 0.12), "strata_constructed": per(180, 20.0, 0.032)})
    led = build_ledger(m)
    rows = led[led["id"] == "strata.sync_miss_share"]
    assert list(rows["verdict"]) == ["not comparable", "reproduced"]  # ours first (the claim's verdict), then constructed
    assert "CONSTRUCTED random model" in rows["method"].iloc[1] and "ours 1.41" in rows["reason"].iloc[0]
    assert claim_verdicts(led)["strata.sync_miss_share"] == "not comparable"


def test_ledger_table_has_a_header_whole_claims_and_the_verdict_apart():
    from workbench.analysis.ledger import verdict_totals
    from workbench.viz.tables import ledger_table

    nan = float("nan")
    claim = "Router lookahead recovers most of the next layer's top-k experts when read one layer ahead of time"
    rows = [dict(id="lookahead.d1", claim=claim, seed=0.785, seed_low=0.785, seed_high=0.785, ours=0.77, low=0.76,
                 high=0.79, n=8, method="decode", rule="seed inside our 95% interval", verdict="reproduced"),
            dict(id="x@seed", claim="short", seed=1.0, seed_low=0.9, seed_high=1.1, ours=nan, low=nan, high=nan, n=0,
                 method="-", rule="tolerance 0.01", verdict="not measured")]
    text = ledger_table(rows, width=40)
    lines = text.splitlines()
    assert lines[0].split() == ["id", "claim", "seed", "ours", "95%", "interval", "n", "verdict"]
    assert " ".join(" ".join(lines).split()).count(claim) == 0  # wrapped over lines...
    words = [w for line in lines for w in line.split()]
    assert all(w in words for w in claim.split())  # ...but whole
    first = next(line for line in lines if line.startswith("lookahead.d1"))
    assert first.rstrip().endswith("reproduced") and "rule:" not in first
    assert any(line.strip().startswith("rule: seed inside our 95% interval") for line in lines)
    assert "0.9..1.1" in text and all(len(line) <= 120 for line in lines)
    assert verdict_totals(["reproduced", "differs", "differs", "not measured"]) == \
        "1 of 4 claims reproduced, 2 differ, 1 not measured"
