"""Cache-aware ranking, ahead() candidate ranking and admission gates."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from workbench.routing.gates import ConfidenceGate, make_gate
from workbench.routing.rank import ahead_candidates, cache_aware_select, cache_aware_weights, topk

Z = -0.1 * np.arange(32)
R = np.zeros(32, dtype=bool)
R[6:20] = True


def test_constructed_check_from_design():
    """z_e = -0.1 e, residents 6..19, p=3, b=0.85, K=6."""
    assert set(topk(Z, 6).tolist()) == set(range(6))
    picks = cache_aware_select(Z, R, 6, p=3, b=0.85)
    assert picks.tolist() == [0, 1, 2, 6, 7, 8]
    need_reading = [e for e in picks.tolist() if not R[e]]
    assert need_reading == [0, 1, 2]
    # ahead(): raw reads the top-6 minus mapped; resident_bonus and cache_aware only {0, 1, 2}
    assert ahead_candidates(Z, R, 6, mode="raw").tolist() == [0, 1, 2, 3, 4, 5]
    assert ahead_candidates(Z, R, 6, mode="resident_bonus").tolist() == [0, 1, 2]
    assert ahead_candidates(Z, R, 6, mode="cache_aware", p=3, b=0.85).tolist() == [0, 1, 2]
    # the seed's names (UNPERT=1, UNPERT=0, route) still name the same rankings
    for seed, name in (("unpert1", "raw"), ("unpert0", "resident_bonus"), ("route", "cache_aware")):
        assert ahead_candidates(Z, R, 6, mode=seed).tolist() == ahead_candidates(Z, R, 6, mode=name).tolist()
    with pytest.raises(ValueError, match="unknown ahead mode 'unpert2'"):
        ahead_candidates(Z, R, 6, mode="unpert2")


@settings(max_examples=60, deadline=None)
@given(z=hnp.arrays(np.float64, st.integers(4, 40), elements=st.floats(-5, 5, width=32)), data=st.data())
def test_nonpositive_bonus_is_exactly_plain_topk(z, data):
    E = len(z)
    k = data.draw(st.integers(1, E))
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=E, max_size=E)))
    b = data.draw(st.sampled_from([0.0, -0.5]))
    r1 = data.draw(st.sampled_from([0.0, 0.3]))
    assert cache_aware_select(z, mask, k, p=data.draw(st.integers(0, 5)), b=b, r1=r1).tolist() == topk(z, k).tolist()
    assert ahead_candidates(z, mask, k, mode="cache_aware", b=b).tolist() == ahead_candidates(z, mask, k, mode="raw").tolist()


def test_ties_break_by_expert_id():
    z = np.zeros(8)
    assert topk(z, 3).tolist() == [0, 1, 2]
    mask = np.array([0, 1, 0, 1, 0, 0, 0, 1], dtype=bool)
    assert cache_aware_select(z, mask, 4, p=1, b=0.5).tolist() == [0, 1, 3, 7]
    assert cache_aware_select(z, mask, 4, p=0, b=0.5).tolist() == [1, 3, 7, 0]


def test_protected_width_and_r1():
    z = np.array([1.0, 0.9, 0.8, 0.7, 0.0])
    mask = np.array([0, 0, 1, 0, 1], dtype=bool)
    # p=1: after the top pick, the resident bonus lifts 2 above 1 and 4 above 3
    assert cache_aware_select(z, mask, 4, p=1, b=0.85).tolist() == [0, 2, 1, 4]
    # r1 lifts a resident within the protected picks: z+0.3R = [1, .9, 1.1, .7, .3]
    assert cache_aware_select(z, mask, 2, p=2, b=0.85, r1=0.3).tolist() == [2, 0]
    # p >= k: every pick is protected, plain top-k without r1
    assert cache_aware_select(z, mask, 3, p=5, b=0.85).tolist() == [0, 1, 2]


def test_batch_rows_match_single_rows():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 16))
    mask = rng.random(16) < 0.4
    batch = cache_aware_select(z, mask, 6, p=2, b=0.7, r1=0.1)
    for i in range(5):
        assert batch[i].tolist() == cache_aware_select(z[i], mask, 6, p=2, b=0.7, r1=0.1).tolist()


@settings(max_examples=60, deadline=None)
@given(z=hnp.arrays(np.float64, st.integers(4, 40), elements=st.floats(-5, 5, width=32)), data=st.data())
def test_one_token_ranks_as_a_batch_of_it_merges(z, data):
    """One token's candidates (its picks in order, mapped ones dropped) equal the merge of a batch
    of that token twice, in every mode, ties included (z has repeats)."""
    E = len(z)
    z = np.round(z)  # ties
    k = data.draw(st.integers(1, E))
    mapped = np.array(data.draw(st.lists(st.booleans(), min_size=E, max_size=E)))
    mode = data.draw(st.sampled_from(["raw", "resident_bonus", "cache_aware"]))
    one = ahead_candidates(z, mapped, k, mode=mode, r1=0.2)
    assert one.tolist() == ahead_candidates(np.stack([z, z]), mapped, k, mode=mode, r1=0.2).tolist()
    assert one.dtype == np.int64 and not mapped[one].any()


def test_ahead_merges_batch_by_best_rank_then_id_and_skips_mapped():
    z = np.full((2, 8), -10.0)
    z[0, [5, 1, 2]] = [3, 2, 1]  # row 0 ranks 5, 1, 2
    z[1, [4, 1, 6]] = [3, 2, 1]  # row 1 ranks 4, 1, 6
    mapped = np.zeros(8, dtype=bool)
    mapped[6] = True
    got = ahead_candidates(z, mapped, 3, mode="raw")
    assert got.tolist() == [4, 5, 1, 2]  # rank 0: {4, 5}; rank 1: {1}; rank 2: {2, 6 mapped}


def test_cache_aware_weights_use_unboosted_probs():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    w = cache_aware_weights(probs, np.array([0, 3]))
    assert np.allclose(w, [0.8, 0.2])
    assert np.allclose(cache_aware_weights(probs, np.array([0, 3]), normalize=False), [0.4, 0.1])


def test_bad_inputs_are_clear():
    with pytest.raises(ValueError, match="k must be"):
        cache_aware_select(Z, R, 40)
    with pytest.raises(ValueError, match="mask"):
        cache_aware_select(Z, R[:5], 4)
    with pytest.raises(ValueError, match="unknown ahead mode"):
        ahead_candidates(Z, R, 4, mode="fast")


def test_gates():
    assert make_gate("none").filter(0, [3, 1]) == [3, 1]
    with pytest.raises(ValueError, match="valid gates: confidence, cost, none"):
        make_gate("magic")
    g = make_gate("confidence")
    assert isinstance(g, ConfidenceGate)
    assert g.admit(0, 5)  # init 2 admits
    g.update(0, [5, 6], selected=[6])  # 5 rejected, 6 confirmed
    assert not g.admit(0, 5) and g.counter(0, 5) == 1 and g.counter(0, 6) == 3
    for _ in range(5):
        g.update(0, [6], selected=[])
    assert g.counter(0, 6) == 0  # saturates at 0
    for _ in range(5):
        g.update(0, [6], selected=[6])
    assert g.counter(0, 6) == 3  # saturates at 3
    assert g.counter(1, 6) == 2  # per layer
    c = make_gate("cost", stall_saved=1e-3, price=1e-9, bytes=500_000)
    # q * 1e-3 > 1e-9 * 5e5 = 5e-4  <=> q > 0.5
    assert c.admit(0, 1, q=0.6) and not c.admit(0, 1, q=0.4)
    assert not c.admit(0, 1, q=0.6, victim_loss=2e-4)
    with pytest.raises(ValueError, match="bad options"):
        make_gate("confidence", bonus=1)
