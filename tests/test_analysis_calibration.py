"""Predictor precision and the claim probability q on constructed predictors."""

import numpy as np
import pandas as pd
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


def test_held_out_overlap_and_the_cli_refuses_the_fit_trace_as_eval(tmp_path, capsys):
    from workbench.analysis.calibration import held_out_overlap
    from workbench.cli import main

    a, b = _trace(tmp_path / "a.parquet", 0), _trace(tmp_path / "b.parquet", 1)
    assert held_out_overlap(a, a) == 1.0 and held_out_overlap(a, b) == 0.0
    out = tmp_path / "out"
    rc = main(["analyze", str(tmp_path / "a.parquet"), "--what", "calibration", "--eval-trace",
               str(tmp_path / "a.parquet"), "--out", str(out), "--no-chart"])
    err = capsys.readouterr().err
    assert rc == 2 and "100% of its routing rows are in the fit trace" in err and "Traceback" not in err
    assert "selection bias" in err  # no --model: the live pred_ columns, said so
    assert main(["analyze", str(tmp_path / "a.parquet"), "--what", "calibration", "--eval-trace",
                 str(tmp_path / "b.parquet"), "--out", str(out), "--no-chart"]) == 0
    m = ClaimModel.from_json((out / "claim_model.json").read_text())
    assert m.q("noisy", 1, 0) > m.q("noisy", 6, 0)


def test_calibrated_cost_gate_uses_the_fitted_q_per_rank():
    from workbench.routing.gates import make_gate

    model = fit_claim_model(pd.DataFrame(
        {"source": ["d1"] * 200, "rank": [1] * 100 + [2] * 100, "layer": [0] * 200,
         "claimed": [True] * 90 + [False] * 10 + [True] * 10 + [False] * 90}))
    table = model.gate_table("d1")
    assert list(table) == [0] and table[0][0] > 0.8 and table[0][1] < 0.2
    # admit when q * stall_saved > price * bytes: with q 0.5 both pass, with the fitted q only rank 1
    kw = dict(stall_saved=1.0, price=1.0, bytes=0.4)
    assert make_gate("cost", **kw).filter(0, [7, 9]) == [7, 9]
    gate = make_gate("cost", q_table=table, **kw)
    assert gate.filter(0, [7, 9]) == [7] and gate.filter(0, [7, 9], ranks=[2, 1]) == [9]
    with pytest.raises(ValueError, match="probabilities in"):
        make_gate("cost", q_table={0: [1.5]})
    with pytest.raises(ValueError, match="no source 'prev'"):
        model.gate_table("prev")
