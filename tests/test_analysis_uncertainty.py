"""The one bootstrap over prompts and the interval tables built on it."""

import warnings

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.uncertainty import bootstrap_ci, interval_table, over_prompts, per_prompt


def test_interval_brackets_the_mean_and_is_seeded():
    x = np.random.default_rng(1).normal(0.7, 0.05, 12)
    a, b = bootstrap_ci(x, seed=3), bootstrap_ci(x, seed=3)
    assert a == b and a.n == 12
    assert a.estimate == pytest.approx(x.mean())
    assert a.low < a.estimate < a.high
    # the percentile interval of the mean is about +-1.96 standard errors wide
    se = x.std(ddof=1) / np.sqrt(len(x))
    assert (a.high - a.low) == pytest.approx(2 * 1.96 * se, rel=0.3)
    assert bootstrap_ci(x, level=0.5).high - bootstrap_ci(x, level=0.5).low < a.high - a.low


def test_coverage_over_repeated_samples():
    rng = np.random.default_rng(0)
    hits = sum(bootstrap_ci(rng.normal(1.0, 1.0, 20), n_boot=400, seed=i).contains(1.0) for i in range(200))
    assert 0.85 <= hits / 200 <= 0.99  # nominal 95%, percentile bootstrap is a little narrow at n=20


def test_edge_cases():
    assert bootstrap_ci([0.3]).low == bootstrap_ci([0.3]).high == 0.3
    c = bootstrap_ci([2.0, 2.0, 2.0])
    assert (c.low, c.high) == (2.0, 2.0)
    n = bootstrap_ci([np.nan, 1.0, 3.0])
    assert n.n == 2 and n.estimate == 2.0
    assert np.isnan(bootstrap_ci([]).estimate)
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci([1, 2], level=95)


def test_a_statistic_undefined_on_every_resample_gives_no_interval_and_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "All-NaN slice" would be one
        ci = bootstrap_ci([0.0, 0.0, 0.0], stat=lambda x: np.nan)
    assert np.isnan(ci.low) and np.isnan(ci.high) and ci.n == 3


def test_vector_rows_with_a_custom_statistic():
    rows = np.array([[1.0, 10.0], [3.0, 30.0], [2.0, 20.0]])
    ci = bootstrap_ci(rows, stat=lambda m: m.mean(axis=0)[1] / m.mean(axis=0)[0])
    assert ci.estimate == pytest.approx(10.0) and ci.low == pytest.approx(10.0) and ci.high == pytest.approx(10.0)


def test_interval_table_and_over_prompts():
    per = pd.DataFrame({"prompt": ["a", "b", "c"] * 2, "src": ["x"] * 3 + ["y"] * 3, "v": [1, 2, 3, 5, 5, 5.0]})
    t = interval_table(per, ["src"], "v").set_index("src")
    assert list(t.columns) == ["v", "low", "high", "n_prompts"]
    assert t.loc["x", "v"] == 2 and t.loc["x", "low"] < 2 < t.loc["x", "high"] and t.loc["y", "low"] == 5
    with pytest.raises(ValueError, match="several rows"):
        interval_table(pd.concat([per, per]), ["src"], "v")
    out = over_prompts({"p1": 1.0, "p2": 3.0}, lambda x: pd.DataFrame({"g": [1], "u": [x]}), ["g"], "u")
    assert out["u"].iloc[0] == 2.0 and out["n_prompts"].iloc[0] == 2
    assert set(per_prompt(out)["prompt"]) == {"p1", "p2"}
    both = pd.concat([out.assign(m="a"), out.assign(m="b")])  # tables with per-prompt rows concatenate
    assert len(both) == 2
