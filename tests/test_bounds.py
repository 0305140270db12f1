"""Offline bounds: knapsack static pinning, Belady MIN, hit curves and slot allocation."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.analysis.bounds import (allocate_slots, belady, belady_misses, hit_curves, knapsack_bound, knapsack_set,
                                       stack_distances)
from workbench.arena.policies import POLICIES, load_all
from workbench.sim.replay import replay_keys
from workbench.sim.requests import next_use
from workbench.trace.synthetic import synthetic_trace

load_all()


def test_next_use():
    assert next_use([5, 3, 5, 5, 3, 9]).tolist() == [2, 4, 3, -1, -1, -1]
    assert next_use([]).tolist() == []


def test_knapsack_hand_made():
    # accesses: a=6, b=3, c=1; sizes a=2, b=1, c=1 -> densities a=3, b=3, c=1 (a before b by key)
    keys = [0] * 6 + [1] * 3 + [2]
    sizes = {0: 2.0, 1: 1.0, 2: 1.0}
    t = knapsack_bound(keys, [0, 1, 2, 3, 3.5, 4, 10], sizes=sizes)
    assert t["hits"].tolist() == pytest.approx([0, 3, 6, 9, 9.5, 10, 10])
    assert t["hit_rate"].tolist() == pytest.approx([0, 0.3, 0.6, 0.9, 0.95, 1.0, 1.0])
    assert t["keys_pinned"].tolist() == [0, 0, 1, 2, 2, 3, 3]
    assert t["fraction_last"].tolist() == pytest.approx([0, 0.5, 0, 0, 0.5, 0, 0])
    s = knapsack_set(keys, 3, sizes=sizes)
    assert s["key"].tolist() == [0, 1, 2] and s["take"].tolist() == [1, 1, 0]


def test_knapsack_bounds_static_pinning_from_the_same_trace():
    rng = np.random.default_rng(0)
    keys = rng.zipf(1.3, 3000) % 60
    for slots in (4, 10, 25):
        bound = knapsack_bound(keys, [slots], sizes=1.0)["hits"].iloc[0]
        hot = knapsack_set(keys, slots, sizes=1.0)["key"].tolist()[: slots - 1]  # leave one streaming slot
        static = replay_keys(keys, "static", slots, keys=hot).hits
        assert static <= bound + 1e-9


def test_belady_hand_made():
    # classic: 3 slots, 1 2 3 4 1 2 5 1 2 3 4 5 -> MIN misses 7
    keys = [1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5]
    assert belady_misses(keys, 3) == 7
    assert belady_misses(keys, 4) == 6
    # bypass may decline: 1 slot, A B A -> demand MIN 3 misses, with bypass 2
    assert belady_misses([0, 1, 0], 1) == 3
    assert belady_misses([0, 1, 0], 1, bypass=True) == 2
    with pytest.raises(ValueError, match="capacity"):
        belady([1], 0)


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.integers(0, 12), min_size=1, max_size=150), cap=st.integers(1, 8))
def test_belady_never_misses_more_than_any_policy(keys, cap):
    opt = belady_misses(keys, cap)
    assert belady_misses(keys, cap, bypass=True) <= opt
    for name in POLICIES:
        assert opt <= replay_keys(keys, name, cap, preload=False).misses, name


@settings(max_examples=40, deadline=None)
@given(keys=st.lists(st.integers(0, 15), min_size=1, max_size=200))
def test_hit_curves_non_decreasing(keys):
    for pol in ("lru", "belady"):
        c = hit_curves(np.array(keys), capacities=range(1, 12), policy=pol, per_layer=False)
        assert (np.diff(c["hits"].to_numpy()) >= 0).all()
        assert c["hit_rate"].between(0, 1).all()


def test_stack_distance_curve_equals_replays():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 20, 500)
    c = hit_curves(keys, capacities=range(1, 21), per_layer=False)
    for cap in (1, 5, 13, 20):
        assert c.loc[c["slots"] == cap, "hits"].iloc[0] == replay_keys(keys, "lru", cap).hits
    assert stack_distances([1, 2, 1, 1, 3, 2]).tolist() == [-1, -1, 1, 0, -1, 2]


def test_per_layer_curves_from_a_trace(tmp_path):
    p = tmp_path / "t.parquet"
    synthetic_trace(p, n_tokens=40, n_layers=3, n_experts=16, top_k=2, kind="periodic", period=3)
    c = hit_curves(p)
    assert sorted(c["layer"].unique()) == [0, 1, 2]
    assert c["slots"].max() == 16
    # period 3, top-2: at most 6 distinct experts per layer; with 6 slots only first uses miss
    for L, g in c.groupby("layer"):
        full = g.loc[g["slots"] == 16, "hits"].iloc[0]
        assert g.loc[g["slots"] == 6, "hits"].iloc[0] == full
        assert (np.diff(g["hits"].to_numpy()) >= 0).all()
    other = hit_curves(p, capacities=[2, 4], policy="fifo")
    assert len(other) == 6


def _curves(table):
    rows = []
    for L, hits in table.items():
        for s, h in enumerate(hits, 1):
            rows.append(dict(layer=L, slots=s, hits=h, lookups=100, hit_rate=h / 100, policy="x"))
    return pd.DataFrame(rows)


def test_allocation_concave_greedy_is_exact():
    c = _curves({0: [50, 70, 80, 85, 87], 1: [30, 55, 70, 80, 86], 2: [10, 15, 18, 20, 21]})
    for budget in range(0, 13):
        g = allocate_slots(c, budget)
        e = allocate_slots(c, budget, method="exact")
        assert g["hits"].sum() == e["hits"].sum()
        assert g["slots"].sum() <= budget
    g = allocate_slots(c, 4)
    assert g["slots"].tolist() == [2, 2, 0]  # marginals 50, 30, 20, 25, 10 ... -> 50, 30, 25, 20


def test_allocation_flat_start_needs_lookahead():
    # a top-2 layer gains nothing from its first slot: plain one-slot greedy would stall
    c = _curves({0: [0, 40, 41, 42], 1: [5, 6, 7, 8]})
    g = allocate_slots(c, 3)
    e = allocate_slots(c, 3, method="exact")
    assert g["hits"].sum() == e["hits"].sum() == 45
    assert g["slots"].tolist() == [2, 1]
    assert allocate_slots(c, 4, min_slots=2)["slots"].tolist() == [2, 2]
    with pytest.raises(ValueError, match="cannot give"):
        allocate_slots(c, 3, min_slots=2)


def test_knapsack_bound_charged_for_cold_misses():
    """A static set loaded by an empty replay pays one miss per pinned key: never above Belady with
    bypass (a static set declines to admit the other keys, which plain demand-paging MIN cannot)."""
    from workbench.analysis.bounds import belady_misses, knapsack_bound

    keys = np.array([1, 2, 1, 3, 1, 2, 4, 1, 2, 5] * 3)
    kb = knapsack_bound(keys, [2, 3, 5])
    assert (kb.hit_rate_cold <= kb.hit_rate).all()
    np.testing.assert_allclose(kb.hit_rate_cold * len(keys), kb.hits - kb.keys_pinned)
    for cap, cold in zip((2, 3, 5), kb.hit_rate_cold):
        assert cold <= 1 - belady_misses(keys, cap, bypass=True) / len(keys) + 1e-12
