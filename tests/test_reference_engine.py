"""The shipped reference model through the streaming engine: exact, and with real structure."""

import numpy as np
import pytest

from conftest import resident_greedy
from workbench.data import REFERENCE, workload
from workbench.engine.engine import Engine
from workbench.trace.recorder import TraceRecorder
from workbench.trace.schema import read_trace

pytestmark = pytest.mark.skipif(not (REFERENCE / "config.json").exists(), reason="reference model not shipped")


@pytest.fixture(scope="module")
def prompt_ids():
    with Engine.open(REFERENCE, arena="1.0", progress=False) as eng:
        return eng.encode(workload("code_heldout")[0]["text"])[-40:]


def test_streamed_equals_resident_on_heldout_prompt(prompt_ids):
    ref, ref_lp = resident_greedy(REFERENCE, prompt_ids, 12)
    with Engine.open(REFERENCE, arena="0.1", progress=False) as eng:
        res = eng.generate(prompt_ids, max_tokens=12)
    assert res.tokens == ref
    np.testing.assert_allclose(res.logprobs, ref_lp, atol=1e-4)
    assert res.stats["misses"] > 0 and res.stats["evictions"] > 0


def test_trained_router_has_structure(prompt_ids, tmp_path):
    """Unlike a random router, the trained one predicts ahead: layer L+1's router applied to layer L's
    MoE input recovers far more of L+1's experts than chance (k/E = 12.5%)."""
    from workbench.analysis.lookahead import lookahead_recovery, lookahead_summary, routers_from_model

    path = tmp_path / "ref.parquet"
    with Engine.open(REFERENCE, arena="0.25", progress=False) as eng:
        eng.generate(prompt_ids, max_tokens=16, trace=TraceRecorder(path, moe_input=True))
    from mlx_lm.utils import load_model

    routers = routers_from_model(load_model(REFERENCE)[0])
    trace = read_trace(path)
    summary = lookahead_summary(lookahead_recovery(trace, routers, distances=(1,), prev_token=False))
    d1 = float(summary[summary.distance == 1].recovery.iloc[0]) if "distance" in summary else float(summary.recovery.iloc[0])
    assert d1 > 0.3, summary


def test_ledger_extras_measure_bounds_readpath_and_self_draft():
    from workbench.analysis.ledger import build_ledger, ledger_extras
    from workbench.analysis.workload import record_workload, workload_set

    w = record_workload(workload_set(1), prompt_tokens=32, max_tokens=8)
    extra = ledger_extras(w, self_draft=True, readpath_repeats=2, draft_tokens=8, readpath_blocks=4)
    assert set(extra) == {"bounds.static_below_lru", "policies.slru_cold", "calibration.q_e", "readpath.pread_heap",
                          "readpath.pread_fresh", "readpath.preadv_slot", "readpath.slot_above_heap",
                          "readpath.fresh_below_heap", "selfdraft.acceptance", "selfdraft.speed"}
    flat = [m for v in extra.values() for m in (v if isinstance(v, list) else [v])]
    assert all(np.isfinite(m.value) and m.low <= m.value <= m.high for m in flat)
    assert extra["bounds.static_below_lru"].n == 3 and extra["readpath.preadv_slot"].n == 2
    assert -1 <= extra["bounds.static_below_lru"].value <= 1 and 0 <= extra["selfdraft.acceptance"].value <= 1
    assert 0 <= extra["calibration.q_e"].value <= 1 and extra["calibration.q_e"].n == 2  # 1 fit, 2 held out
    ledger = build_ledger(extra)
    row = ledger.set_index("id").loc["bounds.static_below_lru"]
    assert row["ours"] == pytest.approx(extra["bounds.static_below_lru"].value) and row["verdict"] != "not measured"
