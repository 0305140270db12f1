"""Gate weight by slot and drop-weakest error on constructed inputs."""

import numpy as np
import pytest

from workbench.analysis.gates import drop_weakest_error, gate_by_slot, gate_slot_mean, mlx_expert_outputs
from workbench.trace.synthetic import routes_trace


def test_gate_by_slot_sorts_and_normalizes(tmp_path):
    # weights given out of order and unnormalized: 2,4,1,3 -> 0.4,0.3,0.2,0.1
    sel = [[[5, 1, 7, 2], [0, 1, 2, 3]]] * 3
    w = [[[2.0, 4.0, 1.0, 3.0], [8.0, 6.0, 4.0, 2.0]]] * 3
    tr = routes_trace(tmp_path / "g.parquet", sel, 8, weights=w)
    t = gate_by_slot(tr)
    assert t[t.layer == 0]["mean_weight"].tolist() == pytest.approx([0.4, 0.3, 0.2, 0.1])
    assert t[t.layer == 1]["mean_weight"].tolist() == pytest.approx([0.4, 0.3, 0.2, 0.1])
    assert gate_slot_mean(t)["mean_weight"].sum() == pytest.approx(1.0)
    raw = gate_by_slot(tr, normalize=False)
    assert raw[raw.layer == 1]["mean_weight"].tolist() == pytest.approx([8, 6, 4, 2])


def test_drop_weakest_closed_form_with_orthonormal_outputs(tmp_path):
    d, k = 8, 4
    rng = np.random.default_rng(0)
    w = rng.uniform(0.1, 1.0, size=(6, k)).astype(np.float32)
    sel = [[list(range(k))] for _ in range(6)]
    tr = routes_trace(tmp_path / "d.parquet", sel, 8, weights=[[list(r)] for r in w],
                      moe_input=[[rng.normal(size=d)] for _ in range(6)])

    def orthonormal(layer, x, ids):  # expert e outputs the unit vector e (independent of x)
        return np.eye(d)[ids]

    t = drop_weakest_error(tr, orthonormal).set_index(["dropped", "renorm"])
    ws = -np.sort(-w, axis=1)
    for m in range(1, k):
        want = np.mean(np.sqrt((ws[:, k - m:] ** 2).sum(1)) / np.sqrt((ws ** 2).sum(1)))
        assert t.loc[(m, False), "rel_error"] == pytest.approx(want, rel=1e-5)
        assert t.loc[(m, False), "dropped_weight"] == pytest.approx(np.mean(ws[:, k - m:].sum(1) / ws.sum(1)), rel=1e-5)
    # identical outputs: renormalizing the kept weights reproduces the block exactly
    same = drop_weakest_error(tr, lambda l, x, ids: np.ones(ids.shape + (d,)))
    assert same[same.renorm]["rel_error"].max() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="1..3"):
        drop_weakest_error(tr, orthonormal, drop=[4])


def test_mlx_expert_outputs_rebuild_the_qwen3_block(tmp_path):
    import mlx.core as mx
    from mlx_lm.models import qwen3_moe

    args = qwen3_moe.ModelArgs(model_type="qwen3_moe", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                               num_attention_heads=2, num_experts=8, num_experts_per_tok=3, decoder_sparse_step=1,
                               mlp_only_layers=[], moe_intermediate_size=16, rms_norm_eps=1e-6, vocab_size=32,
                               num_key_value_heads=1, head_dim=16, rope_theta=1e4, tie_word_embeddings=False,
                               max_position_embeddings=64, norm_topk_prob=True)
    mx.random.seed(2)
    model = qwen3_moe.Model(args)
    blk = model.model.layers[1].mlp
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 32)).astype(np.float16).astype(np.float32)
    probs = np.array(mx.softmax(blk.gate(mx.array(x)), axis=-1))
    ids = np.argsort(-probs, axis=1)[:, :3]
    w = np.take_along_axis(probs, ids, 1)
    w = w / w.sum(1, keepdims=True)
    fn = mlx_expert_outputs(model)
    y = fn(1, x, ids)
    assert y.shape == (5, 3, 32)
    rebuilt = np.einsum("nk,nkd->nd", w, y)
    want = np.array(blk(mx.array(x)))
    assert np.allclose(rebuilt, want, atol=1e-4)
    tr = routes_trace(tmp_path / "m.parquet", [[ids[i].tolist()] for i in range(5)], 8,
                      weights=[[w[i].tolist()] for i in range(5)], moe_input=[[x[i]] for i in range(5)], layers=[1])
    t = drop_weakest_error(tr, fn)
    assert set(t["dropped"]) == {1, 2} and (t["rel_error"] > 0).all()
    # more dropped -> more error (without renormalization the dropped mass only grows)
    nr = t[~t.renorm].sort_values("dropped")["dropped_weight"].tolist()
    assert nr[0] < nr[1]
