"""Predictor precision and the claim probability q on constructed predictors."""

import numpy as np
import pytest

from workbench.analysis.calibration import (ClaimModel, calibration_scores, candidate_table, fit_claim_model,
                                            precision_table, reliability_table)
from workbench.trace.synthetic import routes_trace

E, K = 16, 4
P_RANK = [0.9, 0.7, 0.5, 0.3, 0.15, 0.05]


def _trace(path, seed, n_tok=300, n_layers=2):
    rng = np.random.default_rng(seed)
    sel, pa, pb = [], [], []
    for _ in range(n_tok):
        rs, ra, rb = [], [], []
        for _ in range(n_layers):
            s = rng.choice(E, K, replace=False)
            others = [e for e in range(E) if e not in set(s)]
            rng.shuffle(others)
            a, si, oi = [], list(s), others
            for p in P_RANK:  # rank r is a claimed expert with probability ~P_RANK[r]
                a.append(si.pop() if si and rng.random() < p else oi.pop())
            rs.append(s.tolist()), ra.append(a), rb.append(s.tolist())
        sel.append(rs), pa.append(ra), pb.append(rb)
    return routes_trace(path, sel, E, preds={"noisy": pa, "exact": pb})


def test_precision_by_source_and_rank(tmp_path):
    c = candidate_table(_trace(tmp_path / "a.parquet", 0))
    assert set(c["source"]) == {"noisy", "exact"}
    p = precision_table(c).set_index(["source", "rank"])["precision"]
    assert (p.loc["exact"] == 1.0).all() and len(p.loc["exact"]) == K
    noisy = p.loc["noisy"].to_numpy()
    assert np.all(np.diff(noisy) < 0)  # precision falls with rank
    assert noisy[0] == pytest.approx(0.9, abs=0.05)
    by_layer = precision_table(c, by=("source", "layer"))
    assert set(by_layer["layer"]) == {0, 1}
    pt = precision_table(c)
    assert (pt["ci_lo"] <= pt["precision"]).all() and (pt["precision"] <= pt["ci_hi"] + 1e-12).all()


@pytest.mark.parametrize("method", ["binned", "logistic"])
def test_claim_model_is_calibrated_on_held_out_trace(tmp_path, method):
    train = candidate_table(_trace(tmp_path / "tr.parquet", 1))
    test = candidate_table(_trace(tmp_path / "te.parquet", 2))
    m = fit_claim_model(train, method=method)
    rel = reliability_table(m, test, bins=10)
    big = rel[rel["n"] >= 100]
    assert len(big) >= 3
    assert np.abs(big["observed"] - big["mean_q"]).max() < 0.08
    sc = calibration_scores(m, test).set_index("source")
    base = sc.loc["all", "base_rate"]
    assert sc.loc["all", "brier"] < base * (1 - base)  # beats the constant predictor
    q1, q6 = m.q("noisy", 1, 0), m.q("noisy", 6, 0)
    assert q1 > q6 and 0 < q6 < q1 < 1
    assert m.q("exact", 1, 1) > 0.9
    # round trip for the engine's admission gate
    m2 = ClaimModel.from_json(m.to_json())
    assert m2.q("noisy", 2, 1) == pytest.approx(m.q("noisy", 2, 1))
    tab = m.table()
    assert set(tab.columns) == {"source", "layer", "rank", "q"} and len(tab) == 2 * 2 * 6
    with pytest.raises(ValueError, match="not in the training"):
        m.q("unknown", 1, 0)


def test_no_predictor_columns_is_a_clear_error(tmp_path):
    tr = routes_trace(tmp_path / "n.parquet", [[[0, 1]]], 4)
    with pytest.raises(ValueError, match="pred_"):
        candidate_table(tr)
