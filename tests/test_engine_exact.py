"""Streamed output equals resident mlx-lm output, for every family, plain and 4-bit, at 10/50/100% arenas."""

import numpy as np
import pytest

from conftest import resident_greedy
from workbench.engine.engine import Engine

FAMILIES = ["qwen3_moe", "mixtral", "deepseek_v3", "qwen2_moe", "olmoe", "gpt_oss", "glm4_moe"]
PROMPT = [5, 17, 3, 99, 42, 8, 77, 1, 64, 23, 11, 90, 31, 7, 56, 2, 88, 14, 70, 45]  # 19 prefill tokens


@pytest.mark.parametrize("bits", [None, 4])
@pytest.mark.parametrize("family", FAMILIES)
def test_streamed_equals_resident(tiny, family, bits):
    model_dir, store = tiny(family, bits)
    ref_tokens, ref_logprobs = resident_greedy(model_dir, PROMPT, 10)
    assert len(set(ref_tokens)) > 3, "the random model must keep tokens moving for the test to mean anything"
    for arena in ("0.1", "0.5", "1.0"):
        with Engine(store, arena=arena, progress=False) as eng:
            res = eng.generate(PROMPT, max_tokens=10)
        assert res.tokens == ref_tokens, f"{family} bits={bits} arena={arena}"
        np.testing.assert_allclose(res.logprobs, ref_logprobs, atol=1e-4, rtol=1e-4)
        routed = res.stats["hits"] + res.stats["misses"]
        assert routed == 10 * len(eng.m.moe_layers) * eng.top_k
        if arena == "0.1":  # the prefill batch needed more experts than the arena holds: waves
            assert eng.n_slots < eng.m.n_experts and res.stats["prefill"]["misses"] > eng.n_slots


def test_small_arena_is_not_silently_wrong(tiny):
    """The smallest legal arena (k slots) evicts constantly and still matches exactly."""
    model_dir, store = tiny("qwen3_moe", 4)
    ref, _ = resident_greedy(model_dir, PROMPT, 8)
    with Engine(store, arena="2", progress=False) as eng:
        res = eng.generate(PROMPT, max_tokens=8)
    assert res.tokens == ref
    assert res.stats["evictions"] > 0 and res.stats["misses"] > res.stats["hits"]


def test_model_dir_is_packed_on_first_use(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    model_dir, _ = tiny("mixtral", None)
    with Engine.open(model_dir, arena="1.0", progress=False) as eng:
        first = eng.generate([1, 2, 3], max_tokens=3).tokens
    stores = list((tmp_path / "stores").iterdir())
    assert len(stores) == 1
    with Engine.open(model_dir, arena="1.0", progress=False) as eng:  # reuses the cached store
        assert eng.generate([1, 2, 3], max_tokens=3).tokens == first
    assert list((tmp_path / "stores").iterdir()) == stores


def test_read_modes_agree(tiny):
    from workbench.store.reader import available_modes

    _, store = tiny("qwen3_moe", 4)
    outs = {}
    for mode in available_modes():
        with Engine(store, arena="0.25", io_mode=mode, verify="always", progress=False) as eng:
            outs[mode] = eng.generate(PROMPT, max_tokens=6).tokens
    assert len(set(map(tuple, outs.values()))) == 1, outs


def test_all_resident_fast_path_is_exact(tiny):
    """Once every expert is resident, slots are mapped on the device without a host sync per layer."""
    model_dir, store = tiny("qwen3_moe", 4)
    ref, ref_lp = resident_greedy(model_dir, PROMPT, 40)
    with Engine(store, arena="1.0", progress=False) as eng:
        eng.generate(list(range(0, 128, 3)), max_tokens=2)  # touch every expert
        res = eng.generate(PROMPT, max_tokens=40)
        slow = Engine(store, arena="1.0", progress=False, fast_resident=False)
        slow.generate(list(range(0, 128, 3)), max_tokens=2)
        res_slow = slow.generate(PROMPT, max_tokens=40)
        slow.close()
    assert res.stats["fast_path_tokens"] > 30 and res_slow.stats["fast_path_tokens"] == 0
    assert res.tokens == ref == res_slow.tokens
    np.testing.assert_allclose(res.logprobs, ref_lp, atol=1e-4)
    assert res.stats["hits"] == res_slow.stats["hits"] == 40 * 2 * 2 and res.stats["misses"] == 0
    assert list(eng.arena.policy.order()) == list(slow.arena.policy.order())
