"""The analyses on traces recorded by the real engine (tiny random models of real families)."""

import numpy as np
import pytest

from workbench.analysis._common import load_mlx_model
from workbench.analysis.gates import drop_weakest_error, gate_by_slot, mlx_expert_outputs
from workbench.analysis.lookahead import lookahead_recovery, lookahead_summary, routers_from_model
from workbench.analysis.union import union_by_window


@pytest.mark.parametrize("family,bits", [("qwen3_moe", 4), ("deepseek_v3", None), ("gpt_oss", None)])
def test_engine_trace_is_consistent_with_the_model(tiny, tmp_path, family, bits):
    from workbench.engine.engine import Engine
    from workbench.trace.recorder import TraceRecorder
    from workbench.trace.schema import read_trace

    model_dir, store = tiny(family, bits)
    path = tmp_path / "run.parquet"
    with Engine(store, arena=1.0, progress=False) as eng:
        eng.generate([1, 2, 3, 4, 5], max_tokens=8, trace=TraceRecorder(path, moe_input=True))
    tr = read_trace(path)
    model = load_mlx_model(model_dir)
    # the router applied to its own recorded input reproduces every recorded selection
    # (for deepseek_v3 this includes sigmoid + correction bias + group-limited selection)
    s = lookahead_summary(lookahead_recovery(tr, routers_from_model(model), distances=(0, 1), phase="all"))
    assert s.set_index("source").loc["d=0", "recovery"] == pytest.approx(1.0)
    g = gate_by_slot(tr)
    assert g.groupby("layer")["mean_weight"].sum().to_numpy() == pytest.approx(1.0)
    assert (union_by_window(tr, [1]).query("scope == 'mean'")["union"] == tr.top_k).all()
    d = drop_weakest_error(tr, mlx_expert_outputs(model))
    assert np.isfinite(d["rel_error"]).all() and (d["rel_error"] > 0).all()
