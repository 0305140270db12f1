"""Measurements of the shipped models with mlx (CPU is fine): the model card's local numbers.

- held-out loss / perplexity (token-weighted over records, each cut to ``seq`` tokens),
- the unigram baseline (entropy of the empirical token distribution of the same text),
- routing statistics per layer (usage entropy of the top-k choices, busiest expert's share),
- greedy draft acceptance against the greedy target and the speculative-decoding yield.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np


def encode_records(tokenizer, records: list[dict], seq: int = 512) -> list[list[int]]:
    out = []
    for r in records:
        ids = tokenizer.encode(r["text"], add_special_tokens=False)[:seq]
        if len(ids) >= 2:
            out.append(ids)
    return out


def nll(model, ids_list: list[list[int]], progress: bool = False) -> tuple[float, int]:
    """Sum of next-token negative log-likelihoods (nats) and number of predicted tokens."""
    import mlx.core as mx

    total, n = 0.0, 0
    it = ids_list
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(ids_list, desc="nll", unit="rec")
    for ids in it:
        x = mx.array(ids)[None]
        logits = model(x[:, :-1]).astype(mx.float32)[0]
        lse = mx.logsumexp(logits, axis=-1)
        tgt = mx.take_along_axis(logits, x[0, 1:, None], axis=-1)[:, 0]
        total += float(mx.sum(lse - tgt).item())
        n += len(ids) - 1
    return total, n


def routing_counts(stores: list[list], num_experts: int, top_k: int) -> np.ndarray:
    """(layers, experts) counts of top-k choices in the router logits recorded by tap_routers."""
    import mlx.core as mx

    counts = np.zeros((len(stores), num_experts))
    for li, st in enumerate(stores):
        for g in st:
            g = g.astype(mx.float32).reshape(-1, num_experts)
            inds = mx.argpartition(-g, kth=top_k - 1, axis=-1)[:, :top_k]
            counts[li] += np.bincount(np.array(inds).reshape(-1), minlength=num_experts)
        st.clear()
    return counts


def summarize_routing(counts: np.ndarray, top_k: int, tokens: int) -> dict:
    E = counts.shape[1]
    share = counts / counts.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -(np.where(share > 0, share * np.log2(share), 0.0)).sum(1)
    return {
        "tokens": tokens,
        "top_k": top_k,
        "num_experts": E,
        "usage_entropy_bits": [round(float(v), 4) for v in ent],
        "max_entropy_bits": math.log2(E),
        "busiest_expert_slot_share": [round(float(v), 5) for v in share.max(1)],
        "uniform_slot_share": 1.0 / E,
        "busiest_expert_token_fraction": [round(float(v) * top_k, 4) for v in share.max(1)],
        "experts_never_used": [int(v) for v in (counts == 0).sum(1)],
    }


def unigram_entropy(ids_list: list[list[int]]) -> float:
    """Entropy (nats) of the empirical unigram distribution of the predicted tokens."""
    toks = np.concatenate([np.asarray(ids[1:]) for ids in ids_list])
    counts = np.bincount(toks).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


class _GateTap:
    """Callable stand-in for a router ``gate`` that records its logits."""

    def __init__(self, inner, store: list):
        self.inner, self.store = inner, store

    def __call__(self, x):
        y = self.inner(x)
        self.store.append(y)
        return y


@contextmanager
def tap_routers(model):
    """Record every MoE layer's router logits: yields a list (per layer) of lists of arrays."""
    layers = [l for l in model.layers if hasattr(l.mlp, "gate") and hasattr(l.mlp, "switch_mlp")]
    if not layers:
        raise ValueError("model has no MoE layers with a router 'gate'")
    stores: list[list] = [[] for _ in layers]
    for l, st in zip(layers, stores):
        object.__setattr__(l.mlp, "gate", _GateTap(l.mlp["gate"], st))
    try:
        yield stores
    finally:
        for l in layers:
            object.__delattr__(l.mlp, "gate")


def routing_stats(model, ids_list: list[list[int]], top_k: int | None = None) -> dict:
    """Per-layer usage entropy (bits) of top-k choices and the busiest expert's share."""
    import mlx.core as mx

    k = top_k or model.args.num_experts_per_tok
    E = model.args.num_experts
    counts = np.zeros((len(model.layers), E))
    tokens = 0
    with tap_routers(model) as stores:
        for ids in ids_list:
            model(mx.array(ids)[None])
            tokens += len(ids)
            counts += routing_counts(stores, E, k)
    return summarize_routing(counts, k, tokens)


def greedy(model, prompt: list[int], n_new: int) -> list[int]:
    """Greedy continuation with a KV cache (mlx-lm's prompt cache)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array(prompt)[None], cache=cache)
    out: list[int] = []
    for _ in range(n_new):
        t = int(mx.argmax(logits[0, -1]).item())
        out.append(t)
        logits = model(mx.array([[t]]), cache=cache)
    return out


def draft_acceptance(target, draft, prompts: list[list[int]], n_new: int = 32, gamma: int = 4) -> dict:
    """Greedy draft vs greedy target on the target's own continuation (teacher forcing).

    ``acceptance``: share of continuation positions where the draft's greedy next token equals
    the target's. ``tokens_per_verify``: tokens produced per target forward in greedy
    speculative decoding with ``gamma`` drafted tokens (exact: the draft's context equals the
    target's sequence up to the first mismatch, which is where a round stops).
    """
    import mlx.core as mx

    matches_all: list[np.ndarray] = []
    for p in prompts:
        cont = greedy(target, p, n_new)
        seq = p + cont
        logits = draft(mx.array(seq[:-1])[None])[0, len(p) - 1 :]
        pred = np.array(mx.argmax(logits, axis=-1))
        matches_all.append(pred == np.array(cont))
    m = np.concatenate(matches_all)
    rounds = produced = 0
    for mm in matches_all:
        i = 0
        while i < len(mm):
            acc = 0
            while acc < gamma and i + acc < len(mm) and mm[i + acc]:
                acc += 1
            rounds += 1
            produced += acc + 1
            i += acc + 1
    return {"prompts": len(prompts), "new_tokens_each": n_new, "acceptance": float(m.mean()),
            "gamma": gamma, "tokens_per_verify": produced / max(1, rounds)}


def distinct_ratio(tokens: list[int]) -> float:
    return len(set(tokens)) / max(1, len(tokens))


def measure(models_dir: str | Path, workloads_dir: str | Path, n_eval: int | None = None,
            n_prompts: int = 12, n_new: int = 32, seq: int = 512, export_dir: str | Path | None = None) -> dict:
    """All local numbers for the model card (shipped 4-bit models; optionally the float export).

    Routing statistics are recorded during the held-out loss pass of the shipped MoE.
    """
    import json

    import mlx.core as mx
    from mlx_lm import load

    from .sets import read_jsonl

    models_dir, workloads_dir = Path(models_dir), Path(workloads_dir)
    moe, tok = load(str(models_dir / "ref-moe"))
    draft, _ = load(str(models_dir / "ref-draft"))
    float_moe = None
    if export_dir is not None:
        from .convert import build_model, float_weights, unpack_meta

        meta = unpack_meta(Path(export_dir))
        cfg = json.loads((meta / "moe_config.json").read_text())
        float_moe = build_model(cfg, float_weights(Path(export_dir), "moe"), "float32")
    res: dict = {"seq": seq, "n_eval": n_eval, "mlx": mx.__version__}
    for name in ("eval_heldout", "eval_indomain", "prose_shifted"):
        recs = read_jsonl(workloads_dir / f"{name}.jsonl")[:n_eval]
        ids = encode_records(tok, recs, seq)
        if name == "eval_heldout":
            k, E = moe.args.num_experts_per_tok, moe.args.num_experts
            with tap_routers(moe) as stores:
                s, n = 0.0, 0
                counts = np.zeros((len(stores), E))
                for one in ids:
                    s1, n1 = nll(moe, [one])
                    s, n = s + s1, n + n1
                    counts += routing_counts(stores, E, k)
            res["routing_heldout"] = summarize_routing(counts, k, sum(len(i) - 1 for i in ids))
        else:
            s, n = nll(moe, ids, progress=True)
        sd, _ = nll(draft, ids)
        res[name] = {"records": len(ids), "tokens": n, "moe_loss": s / n, "moe_ppl": math.exp(s / n),
                     "draft_loss": sd / n, "draft_ppl": math.exp(sd / n),
                     "unigram_entropy": unigram_entropy(ids)}
        if float_moe is not None:
            sf, _ = nll(float_moe, ids)
            res[name]["float_moe_loss"] = sf / n
            res[name]["float_moe_ppl"] = math.exp(sf / n)
        print(json.dumps({name: res[name]}), flush=True)
    for name in ("code_heldout", "prose_shifted"):
        prompts = [tok.encode(r["text"], add_special_tokens=False)
                   for r in read_jsonl(workloads_dir / f"{name}.jsonl")[:n_prompts]]
        res[f"draft_{name}"] = draft_acceptance(moe, draft, prompts, n_new)
        print(json.dumps({f"draft_{name}": res[f"draft_{name}"]}), flush=True)
    return res
