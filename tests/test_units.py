"""Every quantitative axis of every chart builder names its unit (workbench.viz.units)."""

import inspect

import numpy as np
import pandas as pd
import pytest

from tests.test_viz import _tables
from workbench.analysis.fit import fit_table
from workbench.analysis.ledger import Measurement, build_ledger
from workbench.engine.engine import Engine
from workbench.io.readpath import read_path_table
from workbench.viz import charts, counter_charts, sweep
from workbench.viz.render import chart_spec
from workbench.viz.units import axes_without_unit, axis_unit, field_titled_axes

PROMPT = [3, 17, 42, 5, 9, 77, 11, 2]
OUTCOMES = ["useful_timely", "useful_late", "completed_unused", "partially_read", "cancelled_before_read"]


def _iv(col, vals, **kw):
    v = np.asarray(vals, float)
    return pd.DataFrame({**kw, col: v, "low": v - 0.02, "high": v + 0.02, "n_prompts": 8})


@pytest.fixture(scope="module")
def built(tiny):
    """name -> chart, one or more per public builder; engine and read-path charts on real runs."""
    model, store = tiny("qwen3_moe")
    made = dict(_tables())
    rows, counters = [], None
    for arena in (0.25, 1.0):
        with Engine.open(store, arena=arena, progress=False) as eng:
            r = eng.generate(PROMPT, max_tokens=4, progress=False)
        counters = r.counters
        s = r.stats
        rows.append({"configuration": f"arena {arena:.0%}", "sync misses": s["sync_misses"],
                     "MB read / token": s["bytes_per_token"] / 1e6, "hit rate (%)": 100 * s["hit_rate"],
                     **{o: i for i, o in enumerate(OUTCOMES)}})
    df = pd.DataFrame(rows)
    made["token_counters"] = counter_charts.token_counters_chart(counters)
    made["compare"] = counter_charts.compare_chart(df, "configuration", ["sync misses", "MB read / token", "hit rate (%)"],
                                                   "t", labels={"sync misses": "sync misses (count)",
                                                                "MB read / token": "read (MB/token)"})
    made["outcome"] = counter_charts.outcome_chart(df, "configuration", OUTCOMES)
    made["readpath"] = charts.readpath_chart(read_path_table(store, threads=(1, 2), modes=("buffered",), progress=False))
    made["fit"] = charts.fit_chart(fit_table(model, PROMPT, arenas=("0.25", "1.0"), max_tokens=2))
    la = pd.concat([_iv("recovery", [0.78, 0.7, 0.3], source=["d=1", "d=2", "prev_token"], method=m, seed=[0.785, 0.725, 0.33])
                    for m in ("teacher-forced", "decode")])
    made["interval"] = charts.interval_chart(la, "source", "recovery", color="method", seed="seed", y_format="%")
    made["union_ci"] = charts.union_ci_chart({m: _iv("union", [8, 13, 18, 33], g=[1, 2, 3, 8]) for m in ("a", "b")})
    pol = pd.concat([_iv("value", [10, 5], metric="mb_read", policy=p, arena=[0.1, 0.5]) for p in ("lru", "slru")])
    made["policy_ci"] = charts.policy_ci_chart(pol, "mb_read", "Bytes read", "decode bytes read (MB)")
    made["ledger_ci"] = charts.ledger_chart(build_ledger({"lookahead.d1": Measurement(0.77, 0.76, 0.79, 8, "decode")}))
    made["paired"] = charts.paired_difference_chart(build_ledger({"unpert.sync_miss_paired": Measurement(
        0.04, 0.03, 0.05, 3, "decode", (0.03, 0.04, 0.05), quantity="paired difference")}).iloc[0])
    made["hit_curve_gb"] = charts.hit_curve_chart(pd.DataFrame({"arena_GB": [0.1, 0.2], "hit_rate": [0.5, 0.7],
                                                                "policy": ["lru", "lru"]}), x="arena_GB")
    cells = pd.DataFrame([dict(policy=p, arena=a, slots=s, value=v, cells=1)
                          for p in ("lru", "fifo") for (a, s), v in zip((("0.25", 2), ("0.5", 4)), (3.0, 1.0))])
    made["heatmap"] = sweep.heatmap(cells, "sync_misses")
    made["slice_heatmap"] = sweep.slice_heatmap(cells.rename(columns={"value": "sync_misses"}).assign(
        kind="sim", workload="code", predictor="none", gate="none", distance=0), "sync_misses", predictor="none")
    return made


BUILT_BY = {"lookahead": "lookahead_chart", "cosine": "cosine_chart", "energy": "energy_chart", "gates": "gate_slot_chart",
            "drop": "drop_weakest_chart", "union": "union_chart", "speedup": "speedup_chart",
            "acceptance": "acceptance_chart", "precision": "precision_chart", "reliability": "reliability_chart",
            "hit_curves": "hit_curve_chart", "ledger": "ledger_chart", "interval": "interval_chart",
            "union_ci": "union_ci_chart", "policy_ci": "policy_ci_chart", "fit": "fit_chart", "readpath": "readpath_chart",
            "token_counters": "token_counters_chart", "compare": "compare_chart", "outcome": "outcome_chart",
            "heatmap": "heatmap", "slice_heatmap": "slice_heatmap", "paired": "paired_difference_chart"}


def test_every_chart_builder_is_checked(built):
    builders = {n for m in (charts, counter_charts, sweep) for n, f in inspect.getmembers(m, inspect.isfunction)
                if f.__module__ == m.__name__ and (n.endswith("_chart") or n.endswith("heatmap"))}
    assert set(BUILT_BY) <= set(built)
    assert builders - {BUILT_BY[k] for k in built if k in BUILT_BY} == set(), \
        "chart builders without a units check: add them to `built`"


def test_every_quantitative_axis_names_its_unit(built):
    bad = {name: axes_without_unit(chart_spec(ch)) for name, ch in built.items()}
    assert {k: v for k, v in bad.items() if v} == {}


def test_every_axis_title_is_written_not_a_field_name(built):
    bad = {name: field_titled_axes(chart_spec(ch)) for name, ch in built.items()}
    assert {k: v for k, v in bad.items() if v} == {}


def test_a_merged_field_title_is_caught():
    import altair as alt

    df = pd.DataFrame({"a": [1.0, 2.0], "low": [0.5, 1.5], "high": [1.5, 2.5]})
    line = alt.Chart(df).mark_line().encode(x=alt.X("a:Q", title="arena (GB)"), y=alt.Y("a:Q", title="hit rate (%)"))
    err = alt.Chart(df).mark_errorbar().encode(x="a:Q", y="low:Q", y2="high:Q")
    assert field_titled_axes(chart_spec(alt.layer(err, line))) == ["low, hit rate (%)"]
    assert field_titled_axes(chart_spec(line)) == []


def test_the_rule_fails_where_it_should():
    import altair as alt

    df = pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0], "c": ["x", "y"]})
    assert axes_without_unit(chart_spec(alt.Chart(df).mark_point().encode(x="a:Q", y=alt.Y("b:Q", title="b (GB)")))) \
        == ["spec x: 'no title' (field a)"]
    wrong = alt.Chart(df).mark_point().encode(x=alt.X("a:Q", title="tokens per second"), y="c:N")
    assert len(axes_without_unit(chart_spec(wrong))) == 1
    layered = alt.layer(alt.Chart(df).mark_line().encode(x=alt.X("a:Q", title="arena (GB)"), y=alt.Y("b:Q", title="hit rate (%)")),
                        alt.Chart(df).mark_rule().encode(y="b:Q"))  # the untitled layer shares the titled axis
    assert axes_without_unit(chart_spec(layered)) == []
    assert axis_unit("ours / seed (ratio; bar: 95% interval)") == "ratio"
    assert axis_unit("speed (tokens / s)") is None and axis_unit("speed (tokens/s)") == "tokens/s"
