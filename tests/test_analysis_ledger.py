"""The claims ledger, built without a model: verdicts by rule, the seed's own arithmetic."""

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.ledger import (CLAIM_IDS, CLAIMS, Measurement, build_ledger, verdict,
                                       workload_measurements)


def _row(led, cid, method=None):
    r = led[led["id"] == cid]
    return r[r["method"] == method].iloc[0] if method else r.iloc[0]


def test_every_claim_listed_and_unmeasured_by_default():
    led = build_ledger()
    assert list(dict.fromkeys(led["id"])) == CLAIM_IDS
    measured = led[~led["id"].str.endswith("@seed")]
    assert (measured["verdict"] == "not measured").all()
    seed = dict(zip(led["id"], led["seed"]))
    assert seed["lookahead.d1"] == 0.785 and seed["union.g8"] == 35.01 and seed["readpath.preadv_slot"] == 2.62
    assert not any("~" in n or "rounded" in n for n in led["note"])  # notes are computed, not verdicts


def test_interval_rule():
    c = next(c for c in CLAIMS if c.id == "lookahead.d1")
    assert verdict(c, Measurement(0.77, 0.76, 0.79, 8)) == "reproduced"
    assert verdict(c, Measurement(0.77, 0.76, 0.78, 8)) == "differs"
    rng = next(c for c in CLAIMS if c.id == "strata.sync_miss_share")  # a seed range: overlap
    lo, hi = rng.seed
    assert verdict(rng, Measurement(hi + 0.01, hi - 0.001, hi + 0.02, 8)) == "reproduced"
    assert verdict(rng, Measurement(hi + 0.01, hi + 0.001, hi + 0.02, 8)) == "differs"
    led = build_ledger({"lookahead.d1": [Measurement(0.77, 0.76, 0.79, 8, "decode"),
                                         Measurement(0.70, 0.69, 0.71, 8, "teacher-forced")]})
    assert _row(led, "lookahead.d1", "decode")["verdict"] == "reproduced"
    assert _row(led, "lookahead.d1", "teacher-forced")["verdict"] == "differs"
    assert _row(led, "lookahead.d1")["rule"] == "seed inside our 95% interval"
    with pytest.raises(ValueError, match="unknown claim"):
        build_ledger({"nope": 1.0})


def test_seed_arithmetic_rows_use_the_tolerance_rule():
    led = build_ledger()
    ceil = _row(led, "mtp.ceiling@seed")
    assert ceil["ours"] == pytest.approx(1.828, abs=1e-3) and ceil["verdict"] == "reproduced"
    assert ceil["rule"] == "|ours - seed| <= 0.005" and "{1,2,3,8}" in ceil["method"]
    assert _row(led, "mtp.speedup_a90@seed")["verdict"] == "reproduced"
    a80 = _row(led, "mtp.speedup_a80@seed")  # 1.085 is not 1.08 to two digits
    assert a80["ours"] == pytest.approx(1.0850, abs=1e-4) and a80["verdict"] == "differs"
    be = _row(led, "mtp.break_even@seed")
    assert be["ours"] == pytest.approx(0.6775, abs=1e-4) and be["verdict"] == "differs" and "g=2: 0.6775" in be["note"]
    s = _row(led, "union.slope@seed")
    assert s["ours"] == pytest.approx(0.496, abs=1e-3) and s["method"] == "least squares through (1, k)"
    assert "free intercept 0.467" in s["note"] and "mean of per-point slopes 0.595" in s["note"]
    assert "predicts 40.5 at g=8 against 35.01" in s["note"]
    cos = _row(led, "cosine.resid_norm_share@seed")
    assert cos["ours"] == pytest.approx(0.949, abs=1e-3) and cos["verdict"] == "differs"
    assert "1 - 0.986^2*256/255 = 0.024" in cos["note"] and "0.010 would hold for an energy share" in cos["note"]
    assert _row(led, "union.g1@seed")["verdict"] == "reproduced"


def test_workload_measurements_name_the_method():
    iv = lambda col, vals, **kw: pd.DataFrame({**kw, col: vals, "low": np.array(vals) - 0.01,
                                               "high": np.array(vals) + 0.01, "n_prompts": 8})
    la = iv("recovery", [0.78, 0.72, 0.66, 0.3], source=["d=1", "d=2", "d=3", "prev_token"], k=8, k_pred=8)
    gates = iv("mean_weight", list(np.linspace(0.3, 0.05, 8)), slot=range(1, 9))
    drop = iv("rel_error", [0.09, 0.11], dropped=1, renorm=[False, True])
    union = iv("union", [8.0, 13.0, 18.0, 33.0], g=[1, 2, 3, 8])
    mtp = iv("value", [1.9, 1.3, 1.1, 0.7, 0.5], quantity=["ceiling", "speedup@0.9", "speedup@0.8", "break_even", "slope"],
             g_values="1,2,3,8")
    tables = {"methods": {"decode": dict(lookahead=la, gates=gates, drop_weakest=drop, union=union, mtp=mtp)}}
    m = workload_measurements(tables, extra={"bounds.lru": 0.5})
    assert {x.method for x in m["gates.drop_weakest"]} == {"decode, kept weights not renormalised, mean over layers",
                                                           "decode, kept weights renormalised, mean over layers"}
    assert m["mtp.ceiling"][0].method == "decode, our union table, best g in {1,2,3,8}"
    assert m["union.slope"][0].value == 0.5 and "least squares through (1, k)" in m["union.slope"][0].method
    led = build_ledger(m)
    assert _row(led, "union.g2")["verdict"] == "differs" and _row(led, "lookahead.d2")["verdict"] == "reproduced"
    assert _row(led, "bounds.lru")["method"] == "single value (no interval)"


def test_ledger_table_has_a_header_whole_claims_and_the_verdict_apart():
    from workbench.viz.tables import ledger_table, verdict_totals

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
