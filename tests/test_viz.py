"""Charts build from the analysis tables and save offline to PNG and SVG."""

import warnings

import altair as alt
import numpy as np
import pandas as pd
import pytest

from workbench.analysis.cosine import cosine_pairs, cosine_summary, energy_curve
from workbench.analysis.ledger import build_ledger
from workbench.analysis.union import REFERENCE_UNION, speedup_grid
from workbench.viz import charts
from workbench.viz.render import save_chart, use_offline_renderer


def _tables():
    rng = np.random.default_rng(0)
    experts = {l: rng.normal(size=(8, 20)) + 0.2 for l in range(3)}
    la = pd.DataFrame([dict(source=s, distance=d, layer=l, k=4, k_pred=kp, n=10, recovery=rng.uniform())
                       for s, d in (("d=1", 1), ("d=2", 2), ("prev_token", np.nan)) for l in range(4) for kp in (4, 6, 8)])
    gates = pd.DataFrame([dict(layer=l, slot=s, mean_weight=w, std_weight=0, n=5, normalized=True)
                          for l in range(3) for s, w in enumerate([0.4, 0.3, 0.2, 0.1], 1)])
    drop = pd.DataFrame([dict(layer=l, dropped=m, renorm=r, n=5, rel_error=0.1 * m, rel_error_median=0.1, dropped_weight=0.1)
                         for l in range(3) for m in (1, 2, 3) for r in (False, True)])
    union = pd.DataFrame([dict(scope="layer", layer=l, g=g, union=4 * min(g, 3), n_windows=10, union_over_k=1.0)
                          for l in range(2) for g in range(1, 6)]
                         + [dict(scope="mean", layer=pd.NA, g=g, union=4 * min(g, 3), n_windows=10, union_over_k=1.0)
                            for g in range(1, 6)])
    union.attrs["k"] = 4
    acc = pd.DataFrame([dict(drafter=d, g=g, acceptance=rng.uniform(), tokens_per_pass=1.5)
                        for d in ("draft_model", "ngram") for g in (2, 4)])
    prec = pd.DataFrame([dict(source=s, rank=r, n=100, claimed=int(100 * (1 - r / 8)), precision=1 - r / 8, ci_lo=0.5, ci_hi=0.9)
                         for s in ("d=1", "prev_token") for r in range(1, 7)])
    rel = pd.DataFrame(dict(bin=range(5), q_lo=np.arange(5) / 5, q_hi=np.arange(1, 6) / 5, mean_q=np.arange(5) / 5 + 0.1,
                            observed=np.arange(5) / 5 + 0.12, n=[10, 50, 80, 40, 5]))
    hc = pd.DataFrame([dict(policy=p, slots=s, hit_rate=min(1, s / 10 * f)) for p, f in (("lru", 1), ("belady", 1.3)) for s in range(1, 9)])
    return {
        "lookahead": charts.lookahead_chart(la),
        "cosine": charts.cosine_chart(cosine_pairs(experts), cosine_summary(experts)),
        "energy": charts.energy_chart(energy_curve(experts)),
        "gates": charts.gate_slot_chart(gates),
        "drop": charts.drop_weakest_chart(drop),
        "union": charts.union_chart(union, 0.5),
        "speedup": charts.speedup_chart(speedup_grid(REFERENCE_UNION, 8, np.linspace(0, 1, 21))),
        "acceptance": charts.acceptance_chart(acc),
        "precision": charts.precision_chart(prec),
        "reliability": charts.reliability_chart(rel),
        "hit_curves": charts.hit_curve_chart(hc),
        "ledger": charts.ledger_chart(build_ledger({"union.g1": 8.0, "gates.slot1": 0.25})),
    }


def test_all_charts_build_valid_specs():
    for name, ch in _tables().items():
        spec = ch.to_dict()  # validates against the Vega-Lite schema
        assert "$schema" in spec, name


def test_charts_save_png_and_svg_offline(tmp_path):
    ch = _tables()
    for name in ("lookahead", "speedup"):
        paths = save_chart(ch[name], tmp_path / name)
        assert [p.suffix for p in paths] == [".png", ".svg"]
        assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<svg" in paths[1].read_text()[:200]
    for name in ("union", "reliability", "ledger"):
        (p,) = save_chart(ch[name], tmp_path / name, formats=("svg",))
        assert p.stat().st_size > 1000


def test_offline_renderer_and_row_cap(tmp_path):
    use_offline_renderer()
    assert alt.renderers.active == "svg"
    big = pd.DataFrame({"x": np.arange(6000), "y": np.arange(6000) % 7})
    chart = alt.Chart(big).mark_point().encode(x="x:Q", y="y:Q")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        spec = chart.to_dict()
    assert any("sampling 5000" in str(x.message) for x in w)
    vals = spec["datasets"][next(iter(spec["datasets"]))]
    assert len(vals) == 5000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bundle = chart._repr_mimebundle_()
    mb = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "image/svg+xml" in mb
    alt.data_transformers.enable("default")
    alt.renderers.enable("default")
    with pytest.raises(ValueError, match="offline"):
        use_offline_renderer("html")
