"""Interval charts: every chart of a workload table draws its 95% interval and renders offline."""

import numpy as np
import pandas as pd

from workbench.analysis.ledger import Measurement, build_ledger
from workbench.viz import charts
from workbench.viz.render import save_chart, spec_nodes


def _iv(col, vals, **kw):
    v = np.asarray(vals, float)
    return pd.DataFrame({**kw, col: v, "low": v - 0.02, "high": v + 0.02, "n_prompts": 8})


def _marks(spec):
    marks = (node.get("mark") for node in spec_nodes(spec))
    return [m if isinstance(m, str) else m.get("type") for m in marks if m is not None]


def test_interval_charts_draw_bars_and_render(tmp_path):
    la = pd.concat([_iv("recovery", [0.78, 0.7, 0.3], source=["d=1", "d=2", "prev_token"], method=m, seed=[0.785, 0.725, 0.33])
                    for m in ("teacher-forced", "decode")])
    union = {m: _iv("union", [8, 13, 18, 33], g=[1, 2, 3, 8]) for m in ("teacher-forced", "decode")}
    pol = pd.concat([_iv("value", [10, 5], metric="mb_read", policy=p, arena=[0.1, 0.5]) for p in ("lru", "slru")])
    led = build_ledger({"lookahead.d1": Measurement(0.77, 0.76, 0.79, 8, "decode"), "gates.slot1": 0.3})
    made = {
        "interval": charts.interval_chart(la, "source", "recovery", color="method", title="Recovery", seed="seed"),
        "union": charts.union_ci_chart(union),
        "policy": charts.policy_ci_chart(pol, "mb_read", "Bytes read", "MB"),
        "ledger": charts.ledger_chart(led),
    }
    for name, ch in made.items():
        spec = ch.to_dict()
        marks = _marks(spec)
        assert "errorbar" in marks or "area" in marks or "rule" in marks, (name, marks)
        (svg,) = save_chart(ch, tmp_path / name, formats=("svg",))
        assert svg.stat().st_size > 1000
