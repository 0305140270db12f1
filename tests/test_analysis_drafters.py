"""Drafter acceptance: replay logic in closed form, and mlx-lm draft models."""

import numpy as np

from workbench.analysis.drafters import (ModelDrafter, NGramDrafter, acceptance_table, drafter_acceptance,
                                         greedy_decode, measure_acceptance, self_draft_drafter)


def _oracle(seq):
    return lambda ctx, n: list(seq[len(ctx):len(ctx) + n])


def test_perfect_and_hopeless_drafters():
    prompt, target = [1, 2, 3], list(range(10, 30))
    seq = prompt + target
    r = measure_acceptance(prompt, target, _oracle(seq), g=4)
    assert r["acceptance"] == 1.0 and r["drafted_match"] == 1.0
    assert r["passes"] == 5 and r["tokens_per_pass"] == 4.0  # 20 tokens, 4 per pass
    bad = measure_acceptance(prompt, target, lambda ctx, n: [0] * n, g=4)
    assert bad["acceptance"] == 0.0 and bad["passes"] == 20 and bad["tokens_per_pass"] == 1.0
    g1 = measure_acceptance(prompt, target, _oracle(seq), g=1)
    assert g1["drafted"] == 0 and np.isnan(g1["acceptance"]) and g1["passes"] == 20


def test_geometric_estimator_counts_only_tested_drafts():
    prompt, target = [0], [1, 2, 3, 4, 5, 6, 7, 8]
    seq = prompt + target
    # first draft right, second wrong, third (untested) right
    def half(ctx, n):
        truth = seq[len(ctx):len(ctx) + n]
        return [truth[0]] + [-1] + truth[2:] if n >= 2 else truth
    r = measure_acceptance(prompt, target, half, g=4)
    assert r["accepted"] / r["tested"] == r["acceptance"]
    assert r["acceptance"] > r["drafted_match"]


def test_ngram_prompt_lookup():
    d = NGramDrafter(max_ngram=2)
    assert d([1, 2, 3, 1, 2], 3) == [3, 1, 2]
    assert d([5, 6, 7], 2) == []
    cyc = [4, 5, 6, 7] * 10
    r = measure_acceptance(cyc[:4], cyc[4:], NGramDrafter(), g=4)
    assert r["acceptance"] == 1.0


def _tiny(seed):
    import mlx.core as mx
    from mlx_lm.models import qwen3_moe

    args = qwen3_moe.ModelArgs(model_type="qwen3_moe", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                               num_attention_heads=2, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                               mlp_only_layers=[], moe_intermediate_size=16, rms_norm_eps=1e-6, vocab_size=48,
                               num_key_value_heads=1, head_dim=16, rope_theta=1e4, tie_word_embeddings=False,
                               max_position_embeddings=128, norm_topk_prob=True)
    mx.random.seed(seed)
    m = qwen3_moe.Model(args)
    mx.eval(m.parameters())
    return m


def test_model_drafter_matches_stateless_and_self_acceptance_is_one():
    import mlx.core as mx

    target, draft = _tiny(0), _tiny(1)
    prompt = [3, 9, 27, 11, 5]
    toks = greedy_decode(target, prompt, 12)
    assert len(toks) == 12
    # a stateless re-computation of the draft model's greedy drafts
    def stateless(ctx, n):
        ctx, out = list(ctx), []
        for _ in range(n):
            t = int(mx.argmax(draft(mx.array([ctx]))[0, -1]).item())
            out.append(t)
            ctx.append(t)
        return out
    md = ModelDrafter(draft)
    seq = prompt + toks
    for p in (5, 6, 9, 7, 12):  # jumps back and forth exercise cache trimming
        assert md(seq[:p], 3) == stateless(seq[:p], 3)
    tab = acceptance_table(prompt, toks, {"self": ModelDrafter(target), "other": md}, g_values=(2, 4))
    assert (tab[tab.drafter == "self"]["acceptance"] == 1.0).all()
    df = drafter_acceptance(target, prompt, 10, draft_model=target, g_values=(3,))
    assert set(df["drafter"]) == {"draft_model", "ngram"}
    assert df.set_index("drafter").loc["draft_model", "acceptance"] == 1.0


def test_engine_drafter_plumbing():
    class FakeEngine:
        def draft_resident_only(self, ctx, n):
            return [7] * n

    d = self_draft_drafter(FakeEngine())
    assert d([1, 2], 3) == [7, 7, 7]
