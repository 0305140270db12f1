"""MTP union and the speedup bound: closed forms and the reference arithmetic."""

import numpy as np
import pytest

from workbench.trace.synthetic import periodic_routes, routes_trace
from workbench.analysis.union import (REFERENCE_UNION, break_even, ceiling, expected_tokens, fit_union_slope,
                                      mtp_reference_check, parse_union_table, speedup_bound, speedup_grid,
                                      union_by_window, union_model)


@pytest.mark.parametrize("period", [1, 2, 3, 5])
def test_periodic_trace_union_is_k_min_g_p(tmp_path, period):
    k = 4
    tr = routes_trace(tmp_path / "p.parquet", periodic_routes(30, 3, k, period, offset_per_layer=1), period * k)
    t = union_by_window(tr, range(1, 8))
    layer_rows = t[t.scope == "layer"]
    for g in range(1, 8):
        assert (layer_rows[layer_rows.g == g]["union"] == k * min(g, period)).all()
    mean = t[t.scope == "mean"].set_index("g")["union"]
    total = t[t.scope == "total"].set_index("g")["union"]
    assert mean[4] == k * min(4, period) and total[4] == 3 * k * min(4, period)
    assert t[t.scope == "total"]["union_over_k"].tolist() == pytest.approx(t[t.scope == "mean"]["union_over_k"].tolist())
    assert t[(t.scope == "layer") & (t.g == 1)]["n_windows"].iloc[0] == 30


def test_window_longer_than_trace_is_skipped_or_error(tmp_path):
    tr = routes_trace(tmp_path / "s.parquet", periodic_routes(3, 1, 2, 3), 6)
    t = union_by_window(tr, [1, 3, 4])
    assert sorted(t["g"].unique()) == [1, 3]
    with pytest.raises(ValueError, match="fewer"):
        union_by_window(tr, [5])


def test_parse_union_table():
    assert parse_union_table("1:8,2:13.42, 3:17.99,8:35.01") == REFERENCE_UNION
    for bad in ("1-8", "", "0:8", "1:8,1:9", "a:b"):
        with pytest.raises(ValueError):
            parse_union_table(bad)


def test_expected_tokens_and_trivial_bounds():
    assert expected_tokens(1.0, 5) == 5
    assert expected_tokens(0.0, 5) == 1
    assert expected_tokens(0.5, 3) == pytest.approx(1.75)
    # g = 1 only: speedup is exactly 1 at every acceptance
    b = speedup_bound({1: 8}, 8, [0.0, 0.5, 1.0])
    assert (b["speedup"] == 1).all()
    # no overlap at all (union = k g): drafting never pays, break-even does not exist
    assert np.isnan(break_even({1: 8, 2: 16, 4: 32}, 8)["acceptance"])
    # perfect overlap (union = k): ceiling = largest g, break-even = 0
    assert ceiling({1: 8, 2: 8, 4: 8}, 8) == {"speedup": 4.0, "g": 4}
    assert break_even({1: 8, 2: 8}, 8)["acceptance"] == 0.0


def test_reference_arithmetic():
    u, k = REFERENCE_UNION, 8
    c = ceiling(u, k)
    assert c["g"] == 8 and c["speedup"] == pytest.approx(8 / (35.01 / 8))
    b = speedup_bound(u, k, [0.9, 0.8]).set_index("acceptance")
    assert b.loc[0.9, "best_g"] == 8 and b.loc[0.9, "speedup"] == pytest.approx(1.3014, abs=1e-4)
    assert b.loc[0.8, "best_g"] == 3 and b.loc[0.8, "speedup"] == pytest.approx(1.0850, abs=1e-4)
    be = break_even(u, k)
    assert be["g"] == 2 and be["acceptance"] == pytest.approx(13.42 / 8 - 1, abs=1e-8)  # 1 + a = cost(2)
    assert be["by_g"][3] == pytest.approx(0.7242, abs=1e-4)  # 1 + a + a^2 = cost(3)
    chk = mtp_reference_check()
    ok = chk.groupby("assumption", sort=False)["matches"].all()
    assert ok["best g in table without g=2 {1,3,8}"]
    assert not ok["best g in table {1,2,3,8}"]
    assert not chk[(chk.assumption == "best g in table {1,2,3,8}") & (chk.quantity == "break_even")]["matches"].item()


def test_fit_and_models():
    lin = {g: 8 * (1 + 0.3 * (g - 1)) for g in (1, 2, 5, 9)}
    assert fit_union_slope(lin, 8) == pytest.approx(0.3)
    assert fit_union_slope(REFERENCE_UNION, 8) == pytest.approx(26.80875 / 54)
    m = union_model(REFERENCE_UNION, 8, "interp")
    assert sorted(m) == list(range(1, 9)) and m[5] == pytest.approx(17.99 + 2 * (35.01 - 17.99) / 5)
    with pytest.raises(ValueError, match="extrapolate"):
        union_model(REFERENCE_UNION, 8, "interp", g_max=12)
    grid = speedup_grid(REFERENCE_UNION, 8, [0.5, 0.9], mode="fit", slope=0.58)
    assert len(grid) == 2 * 8
    with pytest.raises(ValueError, match="acceptance"):
        speedup_grid(REFERENCE_UNION, 8, [1.5])


def test_union_from_trace_feeds_the_bound(tmp_path):
    tr = routes_trace(tmp_path / "p.parquet", periodic_routes(40, 2, 4, 2), 8)
    t = union_by_window(tr, [1, 2, 3, 4])
    # period 2: union saturates at 2k, so the ceiling is g / min(g, 2) at the largest g
    assert ceiling(t, 4)["speedup"] == pytest.approx(2.0)


from hypothesis import given, settings, strategies as st


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(5, 12))
def test_union_properties(tmp_path_factory, seed, k, n_tok):
    """union(1) = k, union is non-decreasing in g and at most min(k g, E); the bound grows with a."""
    rng = np.random.default_rng(seed)
    e = 8
    sel = [[rng.choice(e, k, replace=False).tolist()] for _ in range(n_tok)]
    tr = routes_trace(tmp_path_factory.mktemp("u") / "r.parquet", sel, e)
    u = union_by_window(tr, range(1, n_tok + 1)).query("scope == 'layer'").set_index("g")["union"]
    assert u[1] == k
    assert np.all(np.diff(u.to_numpy()) >= -1e-9)
    for g in u.index:
        assert u[g] <= min(k * g, e) + 1e-9
    b = speedup_bound(union_table_from(u), k, [0.0, 0.5, 0.9, 1.0])
    assert np.all(np.diff(b["speedup"].to_numpy()) >= -1e-12)  # the bound grows with acceptance
    assert (b["speedup"] >= 1 - 1e-12).all()  # g = 1 is always available


def union_table_from(series):
    return {int(g): float(v) for g, v in series.items()}
