"""Speculative decoding on the streaming engine: self-draft from resident experts and the
real cost of a verify pass that reads the union of the drafted tokens' experts."""

from __future__ import annotations

import time

import mlx.core as mx

from .counters import Counters


class ResidentOnlyRouter:
    """APPROXIMATE: route only among published resident experts (weights renormalized over them);
    falls back to the router's own picks where a layer has fewer than k residents."""

    def __init__(self, engine):
        from ..routing.moce import CacheAwareRouter

        self._moce = CacheAwareRouter(engine, p=0, b=1e6, r1=0.0)

    def forward(self, engine, layer, block, x):
        return self._moce.forward(engine, layer, block, x)


class SpeculativeMixin:
    def draft_resident_only(self, context, n: int) -> list[int]:
        """Greedy drafts of ``n`` tokens using resident experts only (approximate, opt-in).
        Draft step times land in ``self.last_draft_times``."""
        router, planner = self.router, self.planner
        self.router, self.planner = ResidentOnlyRouter(self), None
        try:
            res = self.generate(list(context), max_tokens=n, progress=False)
        finally:
            self.router, self.planner = router, planner
        self.last_draft_times = res.step_times
        return res.tokens

    def verify(self, prompt_ids, drafts) -> dict:
        """Run the exact verify pass over ``[last prompt token] + drafts`` as one batch after
        prefilling the rest; report what that pass read (the union of its experts) and took."""
        from mlx_lm.models.cache import make_prompt_cache

        ids = self.encode(list(prompt_ids) + list(drafts))
        n_ctx = len(prompt_ids) - 1
        router, planner = self.router, self.planner
        self.router = self.planner = None
        self.counters = self.arena.counters = Counters()
        cache = make_prompt_cache(self.model)
        try:
            if n_ctx > 0:
                self._begin_step(0, "prefill", ids[:n_ctx])
                self._prompt_hot = []
                self.model(mx.array(ids[:n_ctx])[None], cache=cache)
                mx.eval([c.state for c in cache])
            self._begin_step(1, "verify", ids[n_ctx:])
            t0 = time.perf_counter()
            logits = self.model(mx.array(ids[n_ctx:])[None], cache=cache)
            greedy = mx.argmax(logits[0], axis=-1)
            mx.eval(greedy)
            seconds = time.perf_counter() - t0
        finally:
            self.arena.finish_speculation()
            self.arena.release()
            self.router, self.planner = router, planner
        tot = self.counters.totals("verify")
        target = [int(t) for t in greedy.tolist()]
        accepted = 0
        while accepted < len(drafts) and int(drafts[accepted]) == target[accepted]:
            accepted += 1
        return {"seconds": seconds, "bytes_read": int(tot.get("bytes_read", 0)),
                "experts_read": int(tot.get("misses", 0)), "union_experts": int(tot.get("hits", 0) + tot.get("misses", 0)),
                "tokens_in_pass": len(drafts) + 1, "accepted": accepted}
