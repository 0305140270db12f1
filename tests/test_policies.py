"""Eviction policies: one shared conformance suite every policy passes, plus per-policy semantics.

The driving protocol used throughout (``workbench.sim.cache.SimCache`` and the policies'
``replay``): per request, a resident key is a hit -> ``access(key)``; a missing key is a
miss -> when full, ``remove(first of order() not pinned)``, then ``admit(key)``. A miss is
NOT followed by ``access``.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.arena.policies import POLICIES, load_all, make_policy
from workbench.arena.policies.hotlist import load_hotlist, save_hotlist
from workbench.sim.cache import NoVictimError, SimCache

load_all()
ALL = sorted(POLICIES)
# extra configurations that must pass the suite too
CONFIGS = [(name, {}) for name in ALL] + [
    ("static", {"keys": [3, 7, 11]}),  # needs >= 4 slots: see _mk
    ("ds4", {"hotlist": [1, 2, 3], "decay_every": 2}),
    ("slru", {"protected": 0.5}),
    ("s3fifo", {"move_to_main": 2, "small": 0.3}),
]
IDS = [f"{n}{'-' + '-'.join(map(str, o)) if o else ''}" for n, o in CONFIGS]


def test_every_module_is_registered():
    assert set(ALL) == {"lru", "slru", "twohit", "ds4", "static", "s3fifo", "lfu", "fifo"}


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ValueError) as e:
        make_policy("mru", 4)
    for name in ALL:
        assert name in str(e.value)


def test_unknown_option_is_a_clear_error():
    with pytest.raises(ValueError, match="does not take option"):
        make_policy("lru", 4, protected=0.5)
    make_policy("lru", 4, n_keys=100, n_experts=10)  # common options are accepted by all


@pytest.mark.parametrize("name", ALL)
def test_bad_capacity(name):
    with pytest.raises(ValueError, match="capacity"):
        make_policy(name, 0)


def test_one_line_docstrings():
    for cls in POLICIES.values():
        doc = (cls.__doc__ or "").strip()
        assert doc and "\n" not in doc, cls


def _mk(name, capacity, **opts):
    """make_policy, with room for a static hotlist plus one streaming slot."""
    if name == "static" and "keys" in opts:
        capacity = max(capacity, len(opts["keys"]) + 1)
    return make_policy(name, capacity, **opts)


def _check_consistent(cache: SimCache):
    order = list(cache.policy.order())
    assert len(order) == len(set(order)), "order() yielded a key twice"
    assert set(order) == cache.resident, "order() must yield exactly the resident keys"
    assert len(cache.resident) <= cache.capacity


def _drive(name, opts, seed, capacity=6, n_ops=300, n_keys=16):
    """Random lookups, prefetches, removes, pins and ticks; returns the hit/order log."""
    rng = np.random.default_rng(seed)
    cache = SimCache(_mk(name, capacity, **opts))
    log = []
    for _ in range(n_ops):
        op = rng.random()
        k = int(rng.integers(n_keys))
        if op < 0.6:
            log.append(cache.lookup(k))
        elif op < 0.75:
            if len(cache.unclaimed) < 2:  # keep room for demand misses (2 pins + 2 prefetches < 6)
                log.append(cache.prefetch(k))
        elif op < 0.82 and cache.resident:
            victim = sorted(cache.resident)[int(rng.integers(len(cache.resident)))]
            cache.remove(victim)
        elif op < 0.9:
            cache.unpin()
            cache.pin(sorted(cache.resident)[:2])
        else:
            cache.tick()
        _check_consistent(cache)
        log.append(tuple(cache.policy.order()))
    return log


@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
class TestConformance:
    def test_order_is_exactly_the_resident_set(self, name, opts):
        for seed in range(3):
            _drive(name, opts, seed)

    def test_deterministic(self, name, opts):
        assert _drive(name, opts, 7) == _drive(name, opts, 7)

    def test_remove(self, name, opts):
        p = _mk(name, 5, **opts)
        for k in (10, 20, 30):
            p.admit(k)
        p.remove(20)
        assert 20 not in list(p.order())
        p.remove(20)  # absent: no error
        p.remove(999)
        assert sorted(p.order()) == [10, 30]

    def test_capacity_respected_by_a_driving_cache(self, name, opts):
        cache = SimCache(_mk(name, 4, **opts))
        for k in list(range(20)) * 3:
            cache.lookup(k)
            assert len(cache.resident) <= 4
            _check_consistent(cache)

    def test_speculative_admit_and_claim(self, name, opts):
        cache = SimCache(_mk(name, 4, **opts))
        for k in (100, 101, 102):
            cache.lookup(k)
        assert cache.prefetch(103)
        assert 103 in list(cache.policy.order())
        # unclaimed speculation is never a victim of a demand miss
        cache.lookup(104)
        assert 103 in cache.resident
        assert cache.lookup(103) is True  # the claim is a hit
        assert 103 not in cache.unclaimed
        _check_consistent(cache)

    def test_prefetch_then_claim_equals_demand_admit_at_claim(self, name, opts):
        """The speculation rule in base.py: spec admit + first claim == demand admit at claim time."""
        def build(spec):
            p = _mk(name, 8, **opts)
            for k in (1, 2, 3, 4):
                p.admit(k)
            p.access(2)
            if spec:
                p.admit(9, speculative=True)
            p.access(3)
            p.tick()
            p.access(1)
            if spec:
                p.access(9, speculative=True)
            else:
                p.admit(9)
            p.access(4)
            return list(p.order())

        assert build(True) == build(False)

    def test_tick_is_safe(self, name, opts):
        p = _mk(name, 3, **opts)
        for _ in range(40):
            p.tick()
        cache = SimCache(p)
        for i in range(30):
            cache.lookup(i % 5)
            cache.tick()
            _check_consistent(cache)

    def test_replay_agrees_with_step_by_step_driving(self, name, opts):
        rng = np.random.default_rng(3)
        for cap in (1, 3, 7):
            keys = rng.integers(0, 12, 400)
            ends = rng.random(400) < 0.2
            fast = _mk(name, cap, **opts)
            hits = fast.replay(keys, token_end=ends)
            cache = SimCache(_mk(name, cap, **opts))
            slow = []
            for k, e in zip(keys, ends):
                slow.append(cache.lookup(int(k)))
                if e:
                    cache.tick()
            assert hits.dtype == np.bool_ and hits.tolist() == slow
            assert list(fast.order()) == list(cache.policy.order())

    def test_no_victim_is_a_clear_error(self, name, opts):
        cache = SimCache(_mk(name, 2, **opts))
        for k in range(50, 50 + cache.capacity):
            cache.lookup(k)
        cache.pin(cache.resident)
        with pytest.raises(NoVictimError, match="no evictable slot"):
            cache.lookup(999)


@settings(max_examples=40, deadline=None)
@given(keys=st.lists(st.integers(0, 9), min_size=0, max_size=120), cap=st.integers(1, 6), name=st.sampled_from(ALL))
def test_replay_matches_driving_property(keys, cap, name):
    fast = make_policy(name, cap).replay(np.array(keys, dtype=np.int64))
    cache = SimCache(make_policy(name, cap))
    assert fast.tolist() == [cache.lookup(k) for k in keys]


# --- the two-hit counterexample -------------------------------------------------

COUNTER = list("ABABAB") + list("CD") * 10


def _misses(name, protocol="demand"):
    cache = SimCache(make_policy(name, 3))
    ids = {c: i for i, c in enumerate("ABCD")}
    misses = 0
    for c in COUNTER:
        k = ids[c]
        hit = cache.lookup(k)
        if not hit and protocol == "admit+access":
            cache.policy.access(k)  # variant: a miss also counts as a claim
        misses += not hit
    return misses


def test_two_hit_counterexample():
    """capacity 3, A B A B A B then C D ten times, a cache driven by demand lookups
    (hit -> access; miss -> evict first of order() when full, then admit; no access on a miss):
    LRU misses 4 (A, B, C, D); two-hit misses 22: A and B are promoted (reuse 2), so C and D,
    each cold with reuse 0, evict each other on every request (2 + 20)."""
    assert _misses("lru") == 4
    assert _misses("twohit") == 22
    keys = np.array(["ABCD".index(c) for c in COUNTER])
    assert int((~make_policy("lru", 3).replay(keys)).sum()) == 4
    assert int((~make_policy("twohit", 3).replay(keys)).sum()) == 22
    # the numbers do not depend on whether a miss also counts as a claim
    assert _misses("lru", "admit+access") == 4
    assert _misses("twohit", "admit+access") == 22


# --- per-policy semantics ---------------------------------------------------------

def test_lru_order():
    p = make_policy("lru", 3)
    for k in (1, 2, 3):
        p.admit(k)
    p.access(1)
    assert list(p.order()) == [2, 3, 1]


def test_fifo_ignores_hits():
    p = make_policy("fifo", 3)
    for k in (1, 2, 3):
        p.admit(k)
    p.access(1)
    assert list(p.order()) == [1, 2, 3]


def test_lfu_ties_evict_least_recent():
    p = make_policy("lfu", 4)
    for k in (1, 2, 3):
        p.admit(k)
    p.access(1)
    p.access(1)
    p.access(3)
    p.access(2)
    # freq: 1 -> 3, 2 -> 2, 3 -> 2 (3 reached 2 before 2 did)
    assert list(p.order()) == [3, 2, 1]
    p.admit(4, speculative=True)  # unused prefetch ranks below everything
    assert list(p.order())[0] == 4
    assert p.frequency(1) == 3


def test_slru_promotes_only_on_demand_hit():
    p = make_policy("slru", 4, protected=0.5)
    for k in (1, 2, 3):
        p.admit(k)
    p.admit(4, speculative=True)
    p.access(4, speculative=True)  # first claim of a prefetch: stays probationary
    assert p.segment(4) == "probationary"
    p.access(1)
    assert p.segment(1) == "protected"
    p.access(2)
    p.access(3)  # protected holds 2: 1 is demoted to the probationary MRU end
    assert p.segment(1) == "probationary"
    assert list(p.order()) == [4, 1, 2, 3]


def test_twohit_reuse_counts():
    p = make_policy("twohit", 4)
    p.admit(1)
    p.admit(2)
    assert p.reuse(1) == 0
    p.access(1)
    assert p.reuse(1) == 1 and list(p.order()) == [1, 2]  # stays at the cold tail
    p.access(1)
    assert p.reuse(1) == 2 and list(p.order()) == [2, 1]  # promoted
    p.admit(3, speculative=True)
    p.access(3, speculative=True)  # speculation never counts
    assert p.reuse(3) == 0
    p.access(3)
    assert p.reuse(3) == 1


def test_ds4_hotness_and_decay():
    p = make_policy("ds4", 4, decay_every=16)
    p.admit(1)
    p.admit(2)
    for _ in range(5):
        p.access(2)
    p.admit(3, speculative=True)  # speculation does not count
    assert p.hot[1] == 1 and p.hot[2] == 6 and p.hot.get(3, 0) == 0
    assert list(p.order()) == [3, 1, 2]
    for _ in range(15):
        p.tick()
    assert p.hot[2] == 6
    p.tick()  # 16th decode token: all counters halved
    assert p.hot[2] == 3 and p.hot[1] == 0


def test_ds4_ties_by_least_recent_use_and_hotlist_seed(tmp_path):
    f = tmp_path / "hot.txt"
    f.write_text("# layer expert\n0 5\n1 2\n")
    p = make_policy("ds4", 4, hotlist=str(f), n_experts=8, seed=4)
    assert p.warm_keys() == [5, 10]
    assert p.hot[5] == 4 and p.hot[10] == 4
    p.admit(7)
    p.admit(6)
    assert list(p.order())[:2] == [7, 6]  # equal hotness: least recently used first


def test_static_pins_and_validation(tmp_path):
    p = make_policy("static", 4, keys=[(1, 0), (0, 3)], n_experts=4, n_keys=8)
    assert p.warm_keys() == [4, 3]
    cache = SimCache(p)
    cache.preload(p.warm_keys())
    for k in (0, 1, 2, 5, 6, 7, 0, 1):
        cache.lookup(k)
        assert {3, 4} <= cache.resident
    assert list(p.order())[-2:] == [3, 4]  # pinned last, the hottest last
    with pytest.raises(ValueError, match="outside the model"):
        make_policy("static", 4, keys=[9], n_keys=8)
    with pytest.raises(ValueError, match="not in the model"):
        make_policy("static", 4, keys=[(0, 4)], n_experts=4)
    with pytest.raises(ValueError, match="needs at least 4 slots"):
        make_policy("static", 3, keys=[0, 1, 2])
    assert make_policy("static", 3, keys=[0, 1, 2], top=2).pinned == [0, 1]
    f = tmp_path / "hot.json"
    f.write_text("[[0, 1], [1, 1]]")
    assert make_policy("static", 8, hotlist=str(f), n_experts=4).pinned == [1, 5]
    with pytest.raises(ValueError, match="does not exist"):
        make_policy("static", 8, hotlist=str(tmp_path / "missing.txt"))


def test_hotlist_roundtrip_and_errors(tmp_path):
    f = tmp_path / "h.txt"
    save_hotlist(f, [9, 2, 9, 5], n_experts=4)
    assert load_hotlist(str(f), n_experts=4, n_keys=16) == [9, 2, 5]
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 3\n")
    with pytest.raises(ValueError, match=r"bad.txt:1"):
        load_hotlist(str(bad))
    bad.write_text("x\n")
    with pytest.raises(ValueError, match="whole numbers"):
        load_hotlist(str(bad))
    with pytest.raises(ValueError, match="need n_experts"):
        load_hotlist([(0, 1)])


def test_s3fifo_one_hit_wonders_and_ghost():
    p = make_policy("s3fifo", 10, small=0.1)  # small queue holds 1
    cache = SimCache(p)
    for k in range(10):
        cache.lookup(k)
    for k in range(1, 10):
        cache.lookup(k)  # everything but 0 gets a hit
    cache.lookup(10)  # evicts from small (over its share): keys with a hit move to main, 0 goes
    assert 0 not in cache.resident
    assert 0 in p._G  # remembered in the ghost
    cache.lookup(0)  # a ghost hit enters main directly
    assert 0 in p._M


def test_s3fifo_order_is_pure_and_remove_commits():
    p = make_policy("s3fifo", 5, small=0.2)
    cache = SimCache(p)
    for k in (1, 2, 3, 4, 5, 1, 2):
        cache.lookup(k)
    o1 = list(p.order())
    assert o1 == list(p.order())  # no side effects
    v = next(iter(p.order()))
    p.remove(v)
    assert v not in list(p.order())


# --- the compiled recency loop (numba) and its interpreted twin -------------------------

@pytest.mark.parametrize("name", ["lru", "fifo"])
@pytest.mark.parametrize("compiled", [False, True])
def test_recency_kernel_equals_step_by_step_driving(name, compiled):
    """kernels._recency, compiled by numba and interpreted, against the policy class driven by SimCache:
    hits, final order, from an empty and from a preloaded policy, on trace-like and on sparse keys."""
    from workbench.arena.policies.kernels import have_numba, recency_replay

    if compiled and not have_numba():
        pytest.skip("numba is not installed: the interpreted loop is the only one")
    rng = np.random.default_rng(7)
    for cap, keys in ((1, rng.integers(0, 12, 300)), (5, rng.integers(0, 40, 3000)),
                      (9, rng.integers(-2**40, 2**40, 50)[rng.integers(0, 50, 2000)])):
        for warm in ([], [int(keys[0]), int(keys[1]) + 1]):
            policy = make_policy(name, cap)
            cache = SimCache(policy)
            cache.preload(dict.fromkeys(warm))
            start = list(policy.order())
            slow = [cache.lookup(int(k)) for k in keys]
            hits, order = recency_replay(keys, start, cap, name == "lru", compiled=compiled)
            assert hits.tolist() == slow and order.tolist() == list(policy.order())


@pytest.mark.parametrize("compiled", [False, True])
def test_lfu_kernel_equals_step_by_step_driving(compiled):
    """kernels._lfu, compiled and interpreted, against the LFU class driven by SimCache: hits, final
    order (lowest frequency first, then entry order) and frequencies, from an empty policy and from one
    holding prefetched (frequency 0), claimed and hit keys, on trace-like and on sparse keys."""
    from workbench.arena.policies.kernels import have_numba, lfu_replay

    if compiled and not have_numba():
        pytest.skip("numba is not installed: the interpreted loop is the only one")
    rng = np.random.default_rng(11)
    for cap, keys in ((1, rng.integers(0, 12, 300)), (5, rng.integers(0, 40, 3000)), (7, rng.zipf(1.3, 3000) % 60),
                      (4, np.concatenate([np.tile([3, 1, 4, 2], 6), np.tile([8, 5, 9, 6, 7], 8)])),
                      (9, rng.integers(-2**40, 2**40, 50)[rng.integers(0, 50, 2000)])):
        for warm in (0, 1, 2):
            policy = make_policy("lfu", cap)
            cache = SimCache(policy)
            if warm:  # prefetches (frequency 0), one claimed, one hit twice
                for k in keys[:cap].tolist():
                    cache.prefetch(int(k))
                if warm == 2:  # the first lookup claims the prefetch, the second is a hit
                    cache.lookup(int(keys[0]))
                    cache.lookup(int(keys[0]))
            start = list(policy.order())
            freq = [policy.frequency(k) for k in start]
            slow = [cache.lookup(int(k)) for k in keys]
            hits, order, freqs = lfu_replay(keys, start, freq, cap, compiled=compiled)
            assert hits.tolist() == slow and order.tolist() == list(policy.order())
            assert freqs.tolist() == [policy.frequency(k) for k in policy.order()]


def _belady_brute_force(keys, cap, bypass):
    """Belady's MIN spelled out: on a miss when full, scan the residents for the furthest next use
    (never again counts as furthest; which of several such keys goes cannot change a hit); with bypass,
    keep them all when the incoming key's next use is no nearer."""
    keys = [int(k) for k in keys]
    inf = len(keys)
    nxt = [next((j for j in range(i + 1, len(keys)) if keys[j] == k), inf) for i, k in enumerate(keys)]
    cur, hits = {}, []
    for i, k in enumerate(keys):
        hits.append(k in cur)
        if k not in cur and len(cur) >= cap:
            victim = max(cur, key=cur.get)
            if bypass and cur[victim] <= nxt[i]:
                continue
            del cur[victim]
        cur[k] = nxt[i]
    return hits


@pytest.mark.parametrize("compiled", [False, True])
def test_belady_kernel_equals_brute_force(compiled):
    """kernels._belady (behind analysis.bounds.belady), compiled and interpreted, against a brute-force
    MIN: with and without bypass, many keys never used again, dense and sparse keys."""
    from workbench.arena.policies.kernels import belady_replay, have_numba
    from workbench.sim.requests import next_use

    if compiled and not have_numba():
        pytest.skip("numba is not installed: the interpreted loop is the only one")
    rng = np.random.default_rng(5)
    for cap, keys in ((1, rng.integers(0, 6, 200)), (4, rng.integers(0, 30, 600)), (5, rng.integers(0, 300, 600)),
                      (8, np.arange(40)), (5, np.arange(40)[::-1]), (3, np.tile([9, 2, 7, 4, 0], 5)),
                      (6, rng.integers(-2**40, 2**40, 20)[rng.integers(0, 20, 500)])):
        for bypass in (False, True):
            hits = belady_replay(keys, next_use(keys), cap, bypass, compiled=compiled)
            assert hits.tolist() == _belady_brute_force(keys, cap, bypass)


@pytest.mark.parametrize("compiled", [False, True])
def test_s3fifo_kernel_equals_step_by_step_driving(compiled):
    """kernels._s3fifo, compiled and interpreted, against the S3FIFO class driven by SimCache: hits and
    the final small, main and ghost queues and frequencies, from an empty policy and from one whose
    queues and ghosts an earlier stretch filled, on trace-like, skewed and sparse keys."""
    from workbench.arena.policies.kernels import have_numba, s3fifo_replay

    if compiled and not have_numba():
        pytest.skip("numba is not installed: the interpreted loop is the only one")
    rng = np.random.default_rng(13)
    for cap, keys in ((1, rng.integers(0, 12, 300)), (5, rng.integers(0, 40, 3000)), (20, rng.zipf(1.3, 4000) % 90),
                      (9, rng.integers(-2**40, 2**40, 50)[rng.integers(0, 50, 2000)])):
        for warm in (0, 1):
            policy = make_policy("s3fifo", cap)
            cache = SimCache(policy)
            for k in keys[:200 * warm].tolist():  # queues, frequencies and ghosts to start from
                cache.lookup(int(k))
            small, main, ghost = list(policy._S), list(policy._M), list(policy._G)
            freq = [policy._freq[k] for k in small + main]
            slow = [cache.lookup(int(k)) for k in keys]
            hits, S, M, G, fr = s3fifo_replay(keys, small, main, ghost, freq, cap, policy.small_cap, policy.ghost_cap,
                                             policy.move_to_main, compiled=compiled)
            assert hits.tolist() == slow
            assert (S.tolist(), M.tolist(), G.tolist()) == (list(policy._S), list(policy._M), list(policy._G))
            assert fr.tolist() == [policy._freq[k] for k in list(policy._S) + list(policy._M)]


@pytest.mark.parametrize("compiled", [False, True])
def test_ds4_kernel_equals_step_by_step_driving(compiled):
    """kernels._ds4, compiled and interpreted, against the DS4 class driven by SimCache with token ends:
    hits, residents and their last uses, hotness (decayed every 4 tokens here), the clock and token
    count, from an empty policy and from one an earlier stretch and a hotlist seeded, on trace-like,
    skewed and sparse keys."""
    from workbench.arena.policies.kernels import ds4_replay, have_numba

    if compiled and not have_numba():
        pytest.skip("numba is not installed: the interpreted loop is the only one")
    rng = np.random.default_rng(17)
    for cap, keys in ((1, rng.integers(0, 12, 300)), (5, rng.integers(0, 40, 3000)), (20, rng.zipf(1.3, 4000) % 90),
                      (9, rng.integers(-2**40, 2**40, 50)[rng.integers(0, 50, 2000)])):
        ends = rng.random(len(keys)) < 0.25
        for warm in (0, 1):
            policy = make_policy("ds4", cap, decay_every=4, hotlist=[int(k) for k in keys[:2] if k >= 0] if warm else None)
            cache = SimCache(policy)
            for k in keys[:150 * warm].tolist():
                cache.lookup(int(k))
                cache.tick()
            resident, hot = list(policy._last), dict(policy.hot)
            state = (resident, [policy._last[k] for k in resident], hot, cap, 4, policy._clock, policy._tokens)
            slow = []
            for k, e in zip(keys.tolist(), ends.tolist()):
                slow.append(cache.lookup(int(k)))
                if e:
                    cache.tick()
            hits, res, last, hot_after, clock, tokens = ds4_replay(keys, ends, *state, compiled=compiled)
            assert hits.tolist() == slow and (clock, tokens) == (policy._clock, policy._tokens)
            assert dict(zip(res.tolist(), last.tolist())) == policy._last
            assert {k: v for k, v in hot_after.items()} == {k: v for k, v in policy.hot.items() if v or k in policy._last}


@pytest.mark.parametrize("name", ["slru", "twohit"])
@pytest.mark.parametrize("compiled", [False, True])
def test_segments_kernel_equals_step_by_step_driving(name, compiled):
    """kernels._segments, compiled and interpreted, against the SLRU and TwoHit classes driven by SimCache:
    hits and both final lists (with TwoHit's reuse counts), from an empty policy and from one an earlier
    stretch filled, on trace-like, skewed and sparse keys; SLRU also with no protected room."""
    from workbench.arena.policies.kernels import have_numba, segments_replay

    if compiled and not have_numba():
        pytest.skip("numba is not installed: the interpreted loop is the only one")
    rng = np.random.default_rng(19)
    for cap, keys in ((1, rng.integers(0, 12, 300)), (5, rng.integers(0, 40, 3000)), (20, rng.zipf(1.3, 4000) % 90),
                      (9, rng.integers(-2**40, 2**40, 50)[rng.integers(0, 50, 2000)])):
        for warm, opts in ((0, {}), (1, {}), (1, {"protected": 0.0} if name == "slru" else {})):
            policy = make_policy(name, cap, **opts)
            cache = SimCache(policy)
            for k in keys[:150 * warm].tolist():
                cache.lookup(int(k))
            a, b = (policy._prob, policy._prot) if name == "slru" else (policy._cold, policy._hot)
            a, b, reuse = list(a), list(b), [0] * len(a) if name == "slru" else list(policy._cold.values())
            slow = [cache.lookup(int(k)) for k in keys]
            hits, got_a, got_reuse, got_b = segments_replay(keys, a, b, reuse, cap, twohit=name == "twohit",
                                                            pcap=getattr(policy, "protected_cap", 0), compiled=compiled)
            assert hits.tolist() == slow
            if name == "slru":
                assert (got_a.tolist(), got_b.tolist()) == (list(policy._prob), list(policy._prot))
            else:
                assert dict(zip(got_a.tolist(), got_reuse.tolist())) == dict(policy._cold)
                assert (got_a.tolist(), got_b.tolist()) == (list(policy._cold), list(policy._hot))
