"""Configurations side by side on one prompt: counters, output identity and quality cost."""

from __future__ import annotations

from ..engine.engine import Engine
from ..engine.quality import quality_cost
from ..store.cache import resolve_store


def compare(model, prompt, max_tokens, variants: dict, progress=True) -> list[dict]:
    """Run each variant (name -> Engine keyword arguments: ``arena=ArenaConfig(...)``,
    ``ahead=AheadConfig(...)``, ...) on the same prompt; the first variant is the reference for
    output identity, and exact decoding is the reference for quality cost."""
    store = resolve_store(model, progress=progress)
    out, exact_lp, ref_tokens = [], None, None
    for name, kw in variants.items():
        with Engine(store, progress=progress, **kw) as eng:
            res = eng.generate(prompt, max_tokens=max_tokens, progress=progress)
            seq = res.prompt + res.tokens
            if exact_lp is None:
                with eng.routing():
                    exact_lp = eng.score(seq)
                exact_tokens = seq
            approx_lp = eng.score(exact_tokens)
        s = dict(res.stats)
        s.update(quality_cost(exact_lp, approx_lp, exact_tokens))
        ref_tokens = ref_tokens or res.tokens
        s["same_tokens"] = res.tokens == ref_tokens
        s["name"], s["tokens_out"] = name, res.tokens
        out.append(s)
    return out
