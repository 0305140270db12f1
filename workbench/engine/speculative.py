"""Speculative decoding on the streaming engine: live decoding with a resident draft model
(``speculative_generate``), self-draft from resident experts, and the real cost of a verify pass
that reads the union of the drafted tokens' experts."""

from __future__ import annotations

import hashlib
import time

import mlx.core as mx

from ..arena.counters import summarize
from .run import Result, Run


class ResidentOnlyRouter:
    """APPROXIMATE: route only among published resident experts (weights renormalized over them);
    falls back to the router's own picks where a layer has fewer than k residents."""

    def __init__(self, engine):
        from ..routing.cache_aware import CacheAwareRouter

        self._router = CacheAwareRouter(engine, p=0, b=1e6, r1=0.0)

    def forward(self, engine, layer, block, x):
        return self._router.forward(engine, layer, block, x)


class SpeculativeMixin:
    def draft_resident_only(self, context, n: int) -> list[int]:
        """Greedy drafts of ``n`` tokens using resident experts only (approximate, opt-in).
        Draft step times land in ``self.last_draft_times``."""
        with self.routing(ResidentOnlyRouter(self)):
            res = self.generate(list(context), max_tokens=n, progress=False)
        self.last_draft_times = res.step_times
        return res.tokens

    def verify(self, prompt_ids, drafts) -> dict:
        """Run the exact verify pass over ``[last prompt token] + drafts`` as one batch after
        prefilling the rest; report what that pass read (the union of its experts) and took."""
        ids = self.encode(list(prompt_ids) + list(drafts))
        n_ctx = len(prompt_ids) - 1
        with self.routing():
            run = Run(self, ids)
            try:
                if n_ctx > 0:
                    run.prefill(mx.array(ids[:n_ctx]), protect=False)
                t0 = time.perf_counter()
                logits = run.batch(ids[n_ctx:], 1, "verify")
                greedy = mx.argmax(logits[0], axis=-1)
                mx.eval(greedy)
                seconds = time.perf_counter() - t0
            finally:
                run.close()
        tot = self.counters.totals("verify")
        target = [int(t) for t in greedy.tolist()]
        accepted = 0
        while accepted < len(drafts) and int(drafts[accepted]) == target[accepted]:
            accepted += 1
        return {"seconds": seconds, "bytes_read": int(tot.get("bytes_read", 0)),
                "experts_read": int(tot.get("misses", 0)), "union_experts": int(tot.get("hits", 0) + tot.get("misses", 0)),
                "tokens_in_pass": len(drafts) + 1, "accepted": accepted}


def _logprobs(logits):
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def speculative_generate(engine, draft_model, prompt, max_tokens=32, num_draft_tokens=3, sampler=None,
                         eos_token_ids=(), progress=None, on_token=None):
    """Draft ``num_draft_tokens`` with the resident ``draft_model``, verify them in one batched pass
    through the streamed target (which reads the union of the drafted tokens' experts), keep the
    agreeing prefix plus the target's own next token, and trim both KV caches of the rejected
    positions. The order of work (and so of sampler calls) is ``mlx_lm``'s
    ``speculative_generate_step``; at temperature 0 the tokens equal plain greedy decoding.
    ``on_token(token)`` is called for each kept token as its verify pass settles."""
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
    from mlx_lm.sample_utils import greedy_sampler
    from tqdm.auto import tqdm

    if max_tokens < 1 or num_draft_tokens < 1:
        raise ValueError(f"max_tokens and num_draft_tokens must be at least 1, got {max_tokens}, {num_draft_tokens}")
    ids = engine.encode(prompt)
    sampler = sampler or greedy_sampler
    eos = {int(t) for t in eos_token_ids or ()}
    draft_cache = make_prompt_cache(draft_model)
    if not can_trim_prompt_cache(make_prompt_cache(engine.model)) or not can_trim_prompt_cache(draft_cache):
        raise ValueError("speculative decoding needs trimmable KV caches (plain attention models)")
    if engine.planner is not None:
        raise ValueError("speculative decoding runs without a trace or a read-ahead predictor (drop --trace / --predictor)")
    target = Run(engine, ids)  # verify passes run per-layer: claim the union of the pass's experts, then compute
    target_cache = target.cache
    tokens, pass_times, passes = [], [], []
    residency = hashlib.sha256()
    draft_s = 0.0
    bar = tqdm(total=max_tokens, desc="speculative", unit="tok",
               disable=not (engine.progress if progress is None else progress))
    try:
        if len(ids) > 1:
            target.prefill(mx.array(ids[:-1], mx.uint32), protect=False)
            draft_model(mx.array(ids[:-1], mx.uint32)[None], cache=draft_cache)
            mx.eval([c.state for c in draft_cache])
        y = draft_y = mx.array(ids[-1:], mx.uint32)
        while len(tokens) < max_tokens:
            n_draft = min(max_tokens - len(tokens), num_draft_tokens)
            t0 = time.perf_counter()
            drafts = []
            for _ in range(n_draft):
                draft_y = sampler(_logprobs(draft_model(draft_y[None], cache=draft_cache)[:, -1, :]))
                mx.async_eval(draft_y)
                drafts.append(draft_y)
            drafts = mx.concatenate(drafts)
            mx.eval(drafts)
            t1 = time.perf_counter()
            passes_done = len(passes) + 1
            logits = target.batch(mx.concatenate([y, drafts]).tolist(), passes_done, "verify")
            verified = sampler(_logprobs(logits[0, -(n_draft + 1):, :]))
            mx.eval(verified)
            t2 = time.perf_counter()
            engine.arena.policy.tick()
            residency.update(repr(engine.arena.map.signature()).encode())
            drafts, verified = drafts.tolist(), verified.tolist()
            n = 0
            while n < n_draft and verified[n] == drafts[n]:
                n += 1
            new = verified[:n + 1][:max_tokens - len(tokens)]
            if any(t in eos for t in new):
                new = new[:next(i for i, t in enumerate(new) if t in eos) + 1]
            tokens.extend(new)
            bar.update(len(new))
            for t in new if on_token is not None else ():
                on_token(t)
            pass_times.append(t2 - t0)
            draft_s += t1 - t0
            passes.append({"step": passes_done, "drafted": n_draft, "accepted": n, "emitted": len(new),
                           "draft_s": t1 - t0, "verify_s": t2 - t1})
            trim_prompt_cache(target_cache, n_draft - n)
            trim_prompt_cache(draft_cache, max(n_draft - n - 1, 0))
            if len(tokens) >= max_tokens or tokens[-1] in eos:
                break
            y = mx.array([verified[n]], mx.uint32)
            draft_y = mx.concatenate([mx.array(drafts[-1:], mx.uint32), y]) if n == n_draft else y
    finally:
        bar.close()
        target.close()
    return Result(tokens, ids, _spec_stats(engine, passes, pass_times, tokens, num_draft_tokens, residency.hexdigest()),
                  engine.counters.frame(), None, None, pass_times)


def _spec_stats(engine, passes, pass_times, tokens, num_draft_tokens, residency_hash) -> dict:
    """The engine's stats shape over the verify passes, plus what speculation did per pass."""
    stats = summarize(engine.counters.totals("verify"))
    stats["prefill"] = summarize(engine.counters.totals("prefill"))
    frame = engine.counters.frame()
    per = frame[frame.phase == "verify"].groupby("step")[["hits", "misses", "bytes_read"]].sum()
    total_s = float(sum(pass_times))
    drafted = sum(p["drafted"] for p in passes)
    accepted = sum(p["accepted"] for p in passes)
    n = max(1, len(passes))
    stats.update(tokens=len(tokens), distinct_tokens=len(set(tokens)), decode_s=total_s,
                 tokens_per_s=len(tokens) / total_s if total_s > 0 else 0.0,
                 median_token_ms=1e3 * total_s / max(1, len(tokens)),
                 arena_slots=engine.n_slots, routed_experts=engine.m.n_routed, expert_bytes=engine.m.expert_bytes,
                 residency_hash=residency_hash[:16], slot_writes=engine.arena.writes, device=str(mx.default_device()))
    stats["bytes_per_token"] = stats["bytes_read"] / max(1, len(tokens))
    stats["speculative"] = {
        "num_draft_tokens": num_draft_tokens, "verify_passes": len(passes), "drafted": drafted, "accepted": accepted,
        "acceptance": accepted / drafted if drafted else 0.0, "tokens_per_pass": len(tokens) / n,
        "union_experts_per_pass": float((per.hits + per.misses).mean()) if len(per) else 0.0,
        "experts_read_per_pass": float(per.misses.mean()) if len(per) else 0.0,
        "bytes_read_per_pass": float(per.bytes_read.mean()) if len(per) else 0.0,
        "experts_per_plain_token": engine.top_k * len(engine.m.moe_layers),
        "draft_s": sum(p["draft_s"] for p in passes), "verify_s": sum(p["verify_s"] for p in passes),
        "passes": passes,
    }
    return stats
