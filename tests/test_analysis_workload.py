"""Workload runs on the shipped reference model: teacher-forced and greedy traces over prompts of
three domains, every analysis with an interval over prompts, the live strata counters, the CLI."""

import json

import pytest

from workbench.analysis.workload import phase, record_workload, workload_set
from workbench.data import REFERENCE

pytestmark = pytest.mark.skipif(not (REFERENCE / "config.json").exists(), reason="reference model not shipped")

PROMPT_TOKENS, MAX_TOKENS = 32, 8  # what `workbench ledger --small` runs, so the CLI test reuses the cache


@pytest.fixture(scope="module")
def wl():
    return record_workload(workload_set(1), prompt_tokens=PROMPT_TOKENS, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def routers(wl):
    from workbench.analysis._common import load_mlx_model
    from workbench.analysis.lookahead import routers_from_model

    return routers_from_model(load_mlx_model(wl.model))


def test_workload_set_spans_three_domains():
    ps = workload_set(3)
    assert len(ps) == 9 and {p.domain for p in ps} == {"in-domain", "held-out", "shifted"}
    assert len({p.id for p in ps}) == 9
    with pytest.raises(ValueError, match="cannot take"):
        workload_set(1000)


def test_traces_hold_teacher_forced_and_decode_rows_and_are_cached(wl):
    for run in wl.runs:
        r = run.trace.routes
        layers = r["layer"].nunique()
        assert (r["phase"] == "prefill").sum() == (PROMPT_TOKENS - 1) * layers
        assert (r["phase"] == "decode").sum() == MAX_TOKENS * layers
        assert len(run.tokens) == MAX_TOKENS and len(run.prompt_ids) == PROMPT_TOKENS
    stamp = [r.path.stat().st_mtime_ns for r in wl.runs]
    again = record_workload(workload_set(1), prompt_tokens=PROMPT_TOKENS, max_tokens=MAX_TOKENS)
    assert [r.path for r in again.runs] == [r.path for r in wl.runs]
    assert [r.path.stat().st_mtime_ns for r in again.runs] == stamp
    assert [r.tokens for r in again.runs] == [r.tokens for r in wl.runs]


def test_lookahead_and_union_intervals_by_method(wl, routers):
    from workbench.analysis.lookahead import lookahead_ci
    from workbench.analysis.union import mtp_ci, union_ci

    for method in ("teacher-forced", "decode"):
        t = lookahead_ci(wl.traces(), routers, phase=phase(method)).set_index("source")
        assert (t["n_prompts"] == 3).all()
        assert ((t["low"] <= t["recovery"]) & (t["recovery"] <= t["high"])).all()
        assert t.loc["d=1", "recovery"] > t.loc["d=3", "recovery"] > 0.125  # better than chance k/E
        u = union_ci(wl.traces(), phase=phase(method)).set_index("g")
        assert u.loc[1, "union"] == 8 and u.loc[1, "low"] == u.loc[1, "high"] == 8
        assert 8 < u.loc[2, "union"] < u.loc[3, "union"] < u.loc[8, "union"] <= 64
        m = mtp_ci(union_ci(wl.traces(), phase=phase(method))).set_index("quantity")
        assert (m["low"] <= m["value"]).all() and (m["value"] <= m["high"]).all()
        assert m.loc["ceiling", "value"] > m.loc["speedup@0.9", "value"] > m.loc["speedup@0.8", "value"]
    assert phase("teacher-forced") == "prefill"
    with pytest.raises(ValueError, match="method"):
        phase("forced")


def test_strata_counts_follow_their_definitions(wl):
    from workbench.analysis.live import CONFIGS, strata_runs, strata_table

    per = strata_runs(wl, configs={"raw, moce": CONFIGS["raw, moce"]}, max_tokens=4, prompt_tokens=16)
    for r in per.to_dict("records"):
        assert r["lookups"] == pytest.approx(r["arena hits"] + r["sync misses"] + r["prefetch hits"])
        assert r["lookups"] == pytest.approx(12 * 8)  # every MoE layer claims top-8 per decode token
        assert r["arena hit share"] + r["prefetch hit share"] + r["sync miss share"] == pytest.approx(1.0)
        assert 0 <= r["timely usefulness"] <= r["issue usefulness"] <= 1
        assert r["speculative issued"] > 0 and r["prefetch hits late"] <= r["prefetch hits"]
        wasted = r["cancelled_before_read per token"] + r["partially_read per token"] + r["completed_unused per token"]
        assert wasted == pytest.approx(r["speculative issued"] - r["prefetch hits"])  # every issued read ends once
        assert r["MB per token"] > 0 and 0 <= r["unnecessary share"] <= 1 and r["slots"] > 0
    t = strata_table(per)
    assert set(t["configuration"]) == {"raw, moce"} and (t["n_prompts"] == 3).all()
    assert t.set_index("quantity").loc["lookups", "seed_low"] == 480


def test_held_out_calibration_scores_unseen_prompts(wl, routers):
    from workbench.analysis.calibration import held_out_calibration

    tr = wl.traces()
    fit = {k: v for k, v in tr.items() if k.startswith("in-domain")}
    held = {k: v for k, v in tr.items() if not k.startswith("in-domain")}
    out = held_out_calibration(fit, held, routers, phase="prefill")
    s = out["scores"].set_index("source")
    assert {"all", "d1", "d2", "d3", "prev"} <= set(s.index) and (s["n_prompts"] == 2).all()
    assert ((s["low"] <= s["brier"]) & (s["brier"] <= s["high"])).all()
    assert s.loc["all", "brier"] < 0.25 and s.loc["d1", "brier"] < 0.2  # a constant q = 0.5 scores 0.25
    assert s.loc["d1", "brier"] < s.loc["prev", "brier"]
    assert {"source", "mean_q", "observed", "n"} <= set(out["reliability"].columns)
    with pytest.raises(ValueError, match="both the fit and the held-out"):
        held_out_calibration(tr, held, routers)


def test_cli_ledger_json(wl, capsys):
    from workbench.analysis.ledger import CLAIM_IDS, VERDICTS
    from workbench.cli import main

    assert main(["ledger", "--small", "--no-live", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {(r["id"], r["method"], r["quantity"]): r for r in out["rows"]}
    assert len(out["prompts"]) == 3 and len(out["teacher_forced_tokens"]) == 3
    assert list(out["claims"]) == CLAIM_IDS  # a row for every claim id of both documents
    assert out["headline"].startswith(f"{list(out['claims'].values()).count('reproduced')} of {len(CLAIM_IDS)} claims")
    for r in rows.values():
        assert {"doc", "claim", "seed", "ours", "low", "high", "method", "rule", "verdict", "reason", "timing"} <= set(r)
        assert r["verdict"] in VERDICTS and r["rule"]
    d1 = rows[("lookahead.d1", "decode, mean over layers, k'=k", "as claimed")]
    assert d1["low"] <= d1["ours"] <= d1["high"] and d1["pi_low"] <= d1["ours"] <= d1["pi_high"]
    assert d1["verdict"] == ("reproduced" if d1["pi_low"] - 0.02 <= 0.785 <= d1["pi_high"] + 0.02 else "differs")
    assert ("lookahead.d1", "decode, lift over chance, chance k/E = 0.125", "lift over chance") in rows
    assert rows[("mtp.ceiling@seed", "best g in {1,2,3,8}, table only", "as claimed")]["verdict"] == "reproduced"
    assert any(cid == "gates.drop_weakest" and "not renormalised" in m for cid, m, _ in rows)
    bounds = next(r for (cid, _, _), r in rows.items() if cid == "bounds.static_below_lru")
    assert bounds["quantity"] == "paired difference" and "charged its cold misses" in bounds["method"]
    assert all(r["timing"] for (cid, _, _), r in rows.items() if cid.startswith("readpath."))
    assert isinstance(d1["n"], int)
    # a rerun gives the same verdicts, timing rows (marked) excepted
    assert main(["ledger", "--small", "--no-live", "--json"]) == 0
    again = {(r["id"], r["method"], r["quantity"]): r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert again.keys() == rows.keys()
    assert {k: r["verdict"] for k, r in again.items() if not r["timing"]} == \
        {k: r["verdict"] for k, r in rows.items() if not r["timing"]}


def test_policy_table_pairs_prompts():
    import pandas as pd

    from workbench.analysis.live import policy_table, seed_slru_saving

    per = pd.DataFrame([dict(policy=p, arena=a, prompt=f"p{i}", mb_read=10.0 * (i + 1) * (0.9 if p == "slru" else 1),
                             tokens_per_s=5.0, hit_rate=0.0) for p in ("lru", "slru") for a in (0.1, 0.5) for i in range(6)])
    t = policy_table(per).set_index(["metric", "policy", "arena"])
    rel = t.loc[("mb_read", "slru / lru - 1", 0.1)]
    assert rel["value"] == pytest.approx(-0.1) and rel["low"] == pytest.approx(-0.1)  # paired: no prompt spread
    assert t.loc[("mb_read", "lru", 0.1), "low"] < t.loc[("mb_read", "lru", 0.1), "high"]  # unpaired: spread
    assert ("hit_rate", "slru / lru - 1", 0.1) not in t.index  # no ratio of a zero hit rate
    assert seed_slru_saving()[8] == pytest.approx(47.84 / 48.56 - 1)
