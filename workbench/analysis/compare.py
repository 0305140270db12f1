"""Configurations side by side on one prompt: counters, output identity and quality cost."""

from __future__ import annotations

from typing import Callable, Mapping

from ..engine.quality import quality_cost


def compare(prompt, max_tokens, engines: Mapping[str, Callable], progress=True) -> list[dict]:
    """Run each configuration (name -> a function returning a configured, not yet used ``Engine``)
    on the same prompt. The first configuration is the reference for output identity, and exact
    decoding (its engine with the router and read-ahead planner off) the reference for quality cost.
    Each result is the run's stats plus ``mean_kl``, ``ppl_exact``, ``ppl_approx``, ``same_tokens``,
    ``name`` and ``tokens_out``."""
    out, exact_lp, exact_tokens, ref_tokens = [], None, None, None
    for name, open_engine in engines.items():
        with open_engine() as eng:
            res = eng.generate(prompt, max_tokens=max_tokens, progress=progress)
            if exact_lp is None:
                router, planner = eng.router, eng.planner
                eng.router = eng.planner = None
                exact_tokens = res.prompt + res.tokens
                exact_lp = eng.score(exact_tokens)
                eng.router, eng.planner = router, planner
            approx_lp = eng.score(exact_tokens)
        s = dict(res.stats)
        s.update(quality_cost(exact_lp, approx_lp, exact_tokens))
        ref_tokens = ref_tokens or res.tokens
        s["same_tokens"] = res.tokens == ref_tokens
        s["name"], s["tokens_out"] = name, res.tokens
        out.append(s)
    return out
