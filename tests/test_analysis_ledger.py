"""The claims ledger, built without a model."""

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.ledger import CLAIM_IDS, CLAIMS, build_ledger, measured_from_tables


def test_every_claim_listed_and_unmeasured_by_default():
    led = build_ledger()
    assert list(led["id"]) == CLAIM_IDS and len(led) == 26
    assert (led["verdict"] == "not measured").all()
    ref = dict(zip(led["id"], led["reference"]))
    assert ref["lookahead.d1"] == 0.785 and ref["union.g8"] == 35.01 and ref["readpath.preadv_slot"] == 2.62


def test_verdicts_and_reference_arithmetic():
    measured = {c.id: c.reference for c in CLAIMS}
    measured["gates.slot1"] = 0.25
    measured["lookahead.d3"] = 0.60
    led = build_ledger(measured, model="tiny").set_index("id")
    assert led.loc["union.g2", "verdict"] == "matches"
    assert led.loc["gates.slot1", "verdict"] == "differs: higher"
    assert led.loc["lookahead.d3", "verdict"] == "differs: lower"
    # MTP: three speedups reproduce from the union table, the break-even does not
    assert led.loc["mtp.ceiling", "from_inputs"] == pytest.approx(1.828, abs=1e-3)
    assert "reproduces" in led.loc["mtp.speedup_a90", "inputs_verdict"]
    assert "NOT reproduce" in led.loc["mtp.break_even", "inputs_verdict"]
    assert led.loc["mtp.break_even", "from_inputs"] == pytest.approx(0.6775)
    assert "inconsistent" in led.loc["cosine.resid_norm_share", "inputs_verdict"]
    with pytest.raises(ValueError, match="unknown claim"):
        build_ledger({"nope": 1.0})


def test_measured_from_tables():
    la = pd.DataFrame({"source": ["d=1", "d=2", "prev_token", "d=1"], "k_pred": [8, 8, 8, 12], "k": 8,
                       "recovery": [0.8, 0.7, 0.3, 0.9]})
    union = pd.DataFrame({"scope": "mean", "g": [1, 2, 3, 8], "union": [8.0, 13.42, 17.99, 35.01]})
    union.attrs["k"] = 8
    gates = pd.DataFrame({"layer": 0, "slot": range(1, 9), "mean_weight": np.linspace(0.2, 0.05, 8)})
    m = measured_from_tables(lookahead_summary=la, union=union, gate_slots=gates, extra={"bounds.lru": 0.5})
    assert m["lookahead.d1"] == 0.8 and m["lookahead.prev_token"] == 0.3 and "lookahead.d3" not in m
    assert m["mtp.break_even"] == pytest.approx(0.6775)
    assert m["gates.slot1"] == pytest.approx(0.2) and m["gates.slot8"] == pytest.approx(0.05)
    led = build_ledger(m).set_index("id")
    assert led.loc["union.g3", "verdict"] == "matches" and led.loc["mtp.break_even", "verdict"].startswith("differs")
