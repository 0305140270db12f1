"""Lookahead recovery on constructed inputs whose answer is known in closed form."""

import numpy as np
import pytest

from workbench.analysis.lookahead import Router, lookahead_recovery, lookahead_summary, routers_from_model
from workbench.trace.synthetic import routes_trace

E, D, K = 16, 12, 4


def _trace(tmp_path, xs_by_layer, routers, n_layers, selector=None, extra_layer_shift=None):
    """selected[t][j] = top-k of router j on x[t][j] (or a custom selector)."""
    n_tok = len(xs_by_layer)
    sel = []
    for t in range(n_tok):
        row = []
        for j in range(n_layers):
            s = routers[j].scores(xs_by_layer[t][j][None])[0] if selector is None else selector(t, j)
            row.append(np.argsort(-s, kind="stable")[:K].tolist() if selector is None else s)
        sel.append(row)
    return routes_trace(tmp_path / "t.parquet", sel, E, moe_input=xs_by_layer)


def test_perfect_lookahead_when_inputs_and_routers_repeat(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(E, D)).astype(np.float32)
    routers = {j: Router(w) for j in range(5)}
    xs = [[x] * 5 for x in rng.normal(size=(10, D)).astype(np.float16)]  # same input at every layer
    tr = _trace(tmp_path, xs, routers, 5)
    t = lookahead_recovery(tr, routers, distances=(0, 1, 2, 3), k_extra=(6, E))
    s = lookahead_summary(t).set_index(["source", "k_pred"])["recovery"]
    for d in (0, 1, 2, 3):
        assert s[(f"d={d}", K)] == pytest.approx(1.0)
    assert s[("prev_token", E)] == pytest.approx(1.0)  # all E candidates always cover
    # layers 0..d-1 have no layer L-d: d=3 is evaluated only on layers 3, 4
    assert sorted(t[(t.source == "d=3") & (t.k_pred == K)]["layer"]) == [3, 4]


def test_disjoint_prediction_gives_zero_and_prev_token_exact(tmp_path):
    rng = np.random.default_rng(1)
    # router of layer 1 maps the input to experts 0..3, but layer 1 actually selected 8..11
    w = np.zeros((E, D), np.float32)
    w[:K, :K] = 5 * np.eye(K)
    routers = {0: Router(w), 1: Router(w)}
    xs = [[np.r_[np.ones(K), rng.normal(size=D - K) * 0.01].astype(np.float16)] * 2 for _ in range(6)]
    # layer 0 always selects {0..3}, layer 1 always {8..11}
    sel = lambda t, j: (list(range(K)) if j == 0 else list(range(8, 12)))
    tr = _trace(tmp_path, xs, routers, 2, selector=sel)
    t = lookahead_recovery(tr, routers, distances=(1,))
    s = lookahead_summary(t).set_index("source")["recovery"]
    assert s["d=1"] == pytest.approx(0.0)
    assert s["prev_token"] == pytest.approx(1.0)  # the same set every token


def test_partial_overlap_matches_numpy(tmp_path):
    rng = np.random.default_rng(2)
    routers = {j: Router(rng.normal(size=(E, D)).astype(np.float32)) for j in range(3)}
    xs = [[rng.normal(size=D).astype(np.float16) for _ in range(3)] for _ in range(20)]
    tr = _trace(tmp_path, xs, routers, 3)
    t = lookahead_recovery(tr, routers, distances=(1, 2), prev_token=True)
    # independent computation for d=1, layer 2
    hits = []
    for tok in range(20):
        pred = set(np.argsort(-routers[2].scores(np.float32(xs[tok][1])[None])[0], kind="stable")[:K])
        act = set(np.argsort(-routers[2].scores(np.float32(xs[tok][2])[None])[0], kind="stable")[:K])
        hits.append(len(pred & act) / K)
    got = t[(t.source == "d=1") & (t.layer == 2)]["recovery"].item()
    assert got == pytest.approx(np.mean(hits))
    prev = []
    for tok in range(1, 20):
        a = set(np.argsort(-routers[1].scores(np.float32(xs[tok][1])[None])[0], kind="stable")[:K])
        b = set(np.argsort(-routers[1].scores(np.float32(xs[tok - 1][1])[None])[0], kind="stable")[:K])
        prev.append(len(a & b) / K)
    assert t[(t.source == "prev_token") & (t.layer == 1)]["recovery"].item() == pytest.approx(np.mean(prev))


def test_sigmoid_selection_bias_changes_ranking(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.normal(size=(E, D)).astype(np.float32)
    bias = np.zeros(E, np.float32)
    bias[-K:] = 10.0  # selection bias forces the last K experts
    r = Router(w, scoring="sigmoid", selection_bias=bias)
    xs = [[rng.normal(size=D).astype(np.float16)] * 2 for _ in range(5)]
    tr = _trace(tmp_path, xs, {0: r, 1: r}, 2)
    with_bias = lookahead_summary(lookahead_recovery(tr, {0: r, 1: r}, distances=(1,)))
    assert with_bias.set_index("source").loc["d=1", "recovery"] == pytest.approx(1.0)
    plain = {0: Router(w), 1: Router(w)}
    no_bias = lookahead_summary(lookahead_recovery(tr, plain, distances=(1,)))
    assert no_bias.set_index("source").loc["d=1", "recovery"] < 1.0
    # the same through score_fn
    via_fn = lookahead_recovery(tr, plain, distances=(1,), score_fn=lambda l, z: 1 / (1 + np.exp(-z)) + bias)
    assert lookahead_summary(via_fn).set_index("source").loc["d=1", "recovery"] == pytest.approx(1.0)


def test_quantized_router_and_mlx_model(tmp_path):
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import qwen3_moe

    args = qwen3_moe.ModelArgs(model_type="qwen3_moe", hidden_size=64, num_hidden_layers=2, intermediate_size=64,
                               num_attention_heads=2, num_experts=E, num_experts_per_tok=K, decoder_sparse_step=1,
                               mlp_only_layers=[], moe_intermediate_size=16, rms_norm_eps=1e-6, vocab_size=32,
                               num_key_value_heads=1, head_dim=16, rope_theta=1e4, tie_word_embeddings=False,
                               max_position_embeddings=64, norm_topk_prob=True)
    mx.random.seed(0)
    model = qwen3_moe.Model(args)
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: p.endswith("mlp.gate"))
    assert hasattr(model.model.layers[0].mlp.gate, "scales")
    routers = routers_from_model(model)
    assert sorted(routers) == [0, 1] and routers[0].weight.shape == (E, 64)
    rng = np.random.default_rng(4)
    xs = [[rng.normal(size=64).astype(np.float16) for _ in range(2)] for _ in range(8)]
    sel = []
    for t in range(8):  # actual routing = the quantized model's own gate
        row = []
        for j in range(2):
            z = model.model.layers[j].mlp.gate(mx.array(xs[t][j], dtype=mx.float32)[None])
            row.append(np.argsort(-np.array(z[0]), kind="stable")[:K].tolist())
        sel.append(row)
    tr = routes_trace(tmp_path / "q.parquet", sel, E, moe_input=xs)
    s = lookahead_summary(lookahead_recovery(tr, routers, distances=(0,), prev_token=False))
    assert s["recovery"].item() == pytest.approx(1.0)
    # the raw quantized dict form works too
    spec = {l: dict(weight=m.mlp.gate.weight, scales=m.mlp.gate.scales, biases=m.mlp.gate.biases, group_size=32, bits=4)
            for l, m in enumerate(model.model.layers)}
    s2 = lookahead_summary(lookahead_recovery(tr, spec, distances=(0,), prev_token=False))
    assert s2["recovery"].item() == pytest.approx(1.0)


def test_missing_moe_input_is_a_clear_error(tmp_path):
    tr = routes_trace(tmp_path / "n.parquet", [[[0, 1]], [[1, 2]]], 4)
    with pytest.raises(ValueError, match="moe_input"):
        lookahead_recovery(tr, {0: np.zeros((4, 3))})


def test_recovery_bounded_and_monotone_in_candidates(tmp_path):
    rng = np.random.default_rng(5)
    routers = {j: Router(rng.normal(size=(E, D)).astype(np.float32)) for j in range(3)}
    xs = [[rng.normal(size=D).astype(np.float16) for _ in range(3)] for _ in range(15)]
    tr = _trace(tmp_path, xs, routers, 3)
    t = lookahead_recovery(tr, routers, distances=(1, 2), k_extra=(5, 8, 12, E))
    assert t["recovery"].between(0, 1).all()
    for (src, layer), grp in t.groupby(["source", "layer"]):
        r = grp.sort_values("k_pred")["recovery"].to_numpy()
        assert np.all(np.diff(r) >= -1e-12), (src, layer)
        assert r[-1] == pytest.approx(1.0)  # k' = E covers everything
