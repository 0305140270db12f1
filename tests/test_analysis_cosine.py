"""Expert cosine / residual norm / energy curve on constructed experts."""

import numpy as np
import pytest

from workbench.analysis._common import QuantizedTensor
from workbench.analysis.cosine import (cosine_histogram, cosine_pairs, cosine_summary, energy_curve, expert_gram,
                                       experts_from_model, rank_for_share, residual_share_from_cosine)


def test_identical_experts_have_cosine_one_and_no_residual():
    rng = np.random.default_rng(0)
    one = rng.normal(size=(6, 5)).astype(np.float32)
    experts = {0: np.stack([one] * 8)}
    s = cosine_summary(experts, share=0.99).iloc[0]
    assert s.mean_cosine == pytest.approx(1.0, abs=1e-6)
    assert s.resid_norm_share == pytest.approx(0.0, abs=1e-3)
    assert s.rank_for_share == 1
    assert (cosine_pairs(experts)["cosine"] > 1 - 1e-6).all()


def test_orthogonal_experts_cosine_zero_flat_energy():
    e = 8
    experts = {3: (np.eye(e, 20) * 2.0).reshape(e, 4, 5)}  # orthogonal rows, equal norms
    s = cosine_summary(experts, share=0.5).iloc[0]
    assert s.layer == 3 and s.mean_cosine == pytest.approx(0.0, abs=1e-9)
    assert s.resid_energy_share == pytest.approx(1 - 1 / e)
    assert s.rank_for_share == e // 2
    assert s.energy_at_rank == pytest.approx(0.5)
    curve = energy_curve(experts)
    assert np.allclose(curve["energy_share"], np.arange(1, e + 1) / e)


def test_mean_subtraction_identity_for_equal_norms():
    rng = np.random.default_rng(1)
    m = rng.normal(size=(16, 300)) + 0.4  # positive mean cosine
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    s = cosine_summary({0: m}).iloc[0]
    want = residual_share_from_cosine(s.mean_cosine, 16)
    assert s.resid_energy_share == pytest.approx(want["resid_energy_share"], rel=1e-9)
    assert s.resid_norm_share == pytest.approx(want["resid_norm_share"], rel=1e-9)


def test_multi_tensor_experts_are_concatenated_and_chunking_is_exact():
    rng = np.random.default_rng(2)
    gate, up, down = rng.normal(size=(5, 7, 9)), rng.normal(size=(5, 7, 9)), rng.normal(size=(5, 9, 7))
    flat = np.concatenate([gate.reshape(5, -1), up.reshape(5, -1), down.reshape(5, -1)], axis=1)
    g = expert_gram({"gate_proj": gate, "up_proj": up, "down_proj": down}, max_chunk_elems=40)
    assert np.allclose(g, flat @ flat.T, rtol=1e-5)


def test_quantized_experts_match_dequantized():
    import mlx.core as mx

    rng = np.random.default_rng(3)
    w = mx.array(rng.normal(size=(4, 16, 64)).astype(np.float32))
    wq, sc, bi = mx.quantize(w, group_size=32, bits=4)
    qt = QuantizedTensor(wq, sc, bi, group_size=32, bits=4)
    deq = np.array(mx.dequantize(wq, sc, bi, group_size=32, bits=4)).reshape(4, -1)
    g = expert_gram(qt, max_chunk_elems=4 * 64 * 3)  # several row chunks
    assert np.allclose(g, deq @ deq.T, rtol=1e-4)
    # and the dict spec form
    g2 = expert_gram(dict(weight=wq, scales=sc, biases=bi, group_size=32, bits=4))
    assert np.allclose(g, g2)


def test_experts_from_tiny_mlx_model_plain_and_4bit():
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import qwen3_moe

    args = qwen3_moe.ModelArgs(model_type="qwen3_moe", hidden_size=64, num_hidden_layers=2, intermediate_size=64,
                               num_attention_heads=2, num_experts=6, num_experts_per_tok=2, decoder_sparse_step=1,
                               mlp_only_layers=[], moe_intermediate_size=32, rms_norm_eps=1e-6, vocab_size=32,
                               num_key_value_heads=1, head_dim=16, rope_theta=1e4, tie_word_embeddings=False,
                               max_position_embeddings=64, norm_topk_prob=True)
    mx.random.seed(1)
    model = qwen3_moe.Model(args)
    plain = cosine_summary(experts_from_model(model))
    assert list(plain["layer"]) == [0, 1] and (plain["n_experts"] == 6).all()
    # random init: near-orthogonal experts
    assert abs(plain["mean_cosine"]).max() < 0.1
    nn.quantize(model, group_size=32, bits=4)
    ex = experts_from_model(model)
    assert isinstance(ex[0]["up_proj"], QuantizedTensor)
    q = cosine_summary(ex)
    assert np.allclose(q["mean_cosine"], plain["mean_cosine"], atol=0.05)


def test_histogram_and_rank_helpers():
    rng = np.random.default_rng(4)
    pairs = cosine_pairs({0: rng.normal(size=(10, 30)), 1: rng.normal(size=(10, 30))})
    assert len(pairs) == 2 * 45
    h = cosine_histogram(pairs, bins=10)
    assert h.groupby("layer")["count"].sum().tolist() == [45, 45]
    assert rank_for_share(np.array([0.5, 0.8, 1.0]), 0.8) == 2
    with pytest.raises(ValueError):
        rank_for_share(np.array([1.0]), 0)
