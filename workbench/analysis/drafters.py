"""Drafter acceptance for speculative decoding (DESIGN section 4, issue 5 item 4).

The target's greedy continuation is decoded once (``greedy_decode``); each drafter is then
replayed against it as speculative decoding with window g would run it: a verify pass covers the
current token plus up to g - 1 drafted tokens; the drafts are accepted up to the first mismatch
with the target's greedy tokens, and the pass yields the accepted drafts plus one target token.
Greedy verification makes this exact: the accepted prefix depends only on the target's greedy
tokens, so the target never has to be re-run.

Per drafter and g the table reports
  acceptance      accepted / tested: per-token acceptance a of the geometric model used by the
                  speedup bound (a draft is "tested" if every draft before it was accepted)
  drafted_match   accepted / drafted: the fraction of all drafted tokens that the target kept
  tokens_per_pass (accepted + passes) / passes: measured E[tokens](g)

Drafters: ``ModelDrafter`` (an mlx-lm draft model sharing the tokenizer; greedy, with a KV cache
that is trimmed on rejection), ``NGramDrafter`` (prompt lookup: the continuation of the most
recent earlier occurrence of the trailing n-gram), any callable ``(context, n) -> tokens``.

On the streaming engine: ``self_draft_drafter(engine)`` drafts with only resident experts
(approximate, opt-in); ``verify_union_cost(engine, ...)`` is the real read cost of a verify pass
over the union of a window's experts.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

import pandas as pd


def _prompt_cache(model):
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


def _forward(model, cache, tokens: Sequence[int]):
    import mlx.core as mx

    logits = model(mx.array([list(tokens)], dtype=mx.int32), cache=cache)
    return logits[0, -1]


def greedy_decode(model, prompt_ids: Sequence[int], max_tokens: int, progress: bool = False) -> list[int]:
    """The target model's greedy continuation of ``prompt_ids`` (``max_tokens`` new token ids)."""
    import mlx.core as mx

    if not prompt_ids:
        raise ValueError("prompt_ids is empty; give at least one token id")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    cache = _prompt_cache(model)
    logits = _forward(model, cache, prompt_ids)
    out = []
    it = range(max_tokens)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="greedy decode", unit="tok")
    for _ in it:
        t = int(mx.argmax(logits).item())
        out.append(t)
        logits = _forward(model, cache, [t])
    return out


class ModelDrafter:
    """Greedy drafts from an mlx-lm draft model (same tokenizer as the target)."""

    name = "draft_model"

    def __init__(self, model):
        self.model = model
        self.reset()

    def reset(self):
        self.cache = _prompt_cache(self.model)
        self.tokens: list[int] = []  # tokens whose K/V are in the cache

    def _sync(self, context: Sequence[int]):
        """Make the cache hold context[:-1] exactly, then feed context[-1:] and return its logits."""
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        context = list(context)
        c = 0
        lim = min(len(self.tokens), len(context) - 1)
        while c < lim and self.tokens[c] == context[c]:
            c += 1
        extra = len(self.tokens) - c
        if extra:
            if can_trim_prompt_cache(self.cache) and trim_prompt_cache(self.cache, extra) == extra:
                self.tokens = self.tokens[:c]
            else:
                self.reset()
                c = 0
        logits = _forward(self.model, self.cache, context[c:])
        self.tokens = context[:]
        return logits

    def __call__(self, context: Sequence[int], n: int) -> list[int]:
        import mlx.core as mx

        if n <= 0:
            return []
        logits = self._sync(context)
        drafts = []
        for i in range(n):
            t = int(mx.argmax(logits).item())
            drafts.append(t)
            if i < n - 1:
                logits = _forward(self.model, self.cache, [t])
                self.tokens.append(t)
        return drafts


class NGramDrafter:
    """Prompt lookup: continue the most recent earlier occurrence of the trailing n-gram."""

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def __call__(self, context: Sequence[int], n: int) -> list[int]:
        ctx = list(context)
        if n <= 0:
            return []
        for size in range(min(self.max_ngram, len(ctx) - 1), self.min_ngram - 1, -1):
            tail = ctx[-size:]
            for start in range(len(ctx) - size - 1, -1, -1):  # most recent earlier match first
                if ctx[start:start + size] == tail:
                    cont = ctx[start + size:start + size + n]
                    if cont:
                        return cont
        return []


def measure_acceptance(prompt_ids: Sequence[int], target_tokens: Sequence[int],
                       drafter: Callable[[Sequence[int], int], Sequence[int]], g: int) -> dict:
    """Replay speculative decoding with window g against the target's greedy tokens."""
    if g < 1:
        raise ValueError(f"window g must be >= 1, got {g}")
    if not target_tokens:
        raise ValueError("target_tokens is empty; decode some tokens with greedy_decode first")
    seq = list(prompt_ids) + list(target_tokens)
    p = len(prompt_ids)
    if p < 1:
        raise ValueError("prompt_ids is empty; give at least one token id")
    passes = drafted = accepted = tested = 0
    while p < len(seq):
        n = min(g - 1, len(seq) - p - 1)
        drafts = list(drafter(seq[:p], n))[:n] if n > 0 else []
        m = 0
        while m < len(drafts) and drafts[m] == seq[p + m]:
            m += 1
        passes += 1
        drafted += len(drafts)
        accepted += m
        tested += m + (1 if m < len(drafts) else 0)
        p += m + 1
    return dict(g=g, passes=passes, drafted=drafted, accepted=accepted, tested=tested,
                acceptance=accepted / tested if tested else float("nan"),
                drafted_match=accepted / drafted if drafted else float("nan"),
                tokens_per_pass=(accepted + passes) / passes, tokens=len(target_tokens))


def acceptance_table(prompt_ids: Sequence[int], target_tokens: Sequence[int],
                     drafters: Mapping[str, Callable], g_values: Iterable[int] = (2, 3, 4, 8),
                     progress: bool = False) -> pd.DataFrame:
    """One row per (drafter, g): passes, drafted, accepted, tested, acceptance, drafted_match, tokens_per_pass."""
    jobs = [(name, d, int(g)) for name, d in drafters.items() for g in g_values]
    if progress:
        from tqdm.auto import tqdm

        jobs = tqdm(jobs, desc="drafter acceptance")
    rows = []
    for name, d, g in jobs:
        if hasattr(d, "reset"):
            d.reset()
        rows.append(dict(drafter=name, **measure_acceptance(prompt_ids, target_tokens, d, g)))
    return pd.DataFrame(rows)


def drafter_acceptance(target_model, prompt_ids: Sequence[int], max_tokens: int, draft_model=None,
                       ngram: bool | NGramDrafter = True, extra: Mapping[str, Callable] | None = None,
                       g_values: Iterable[int] = (2, 3, 4, 8), progress: bool = False) -> pd.DataFrame:
    """Greedy-decode the target, then measure the draft model and n-gram lookup (and ``extra`` drafters)."""
    target = greedy_decode(target_model, prompt_ids, max_tokens, progress=progress)
    drafters: dict[str, Callable] = {}
    if draft_model is not None:
        drafters["draft_model"] = ModelDrafter(draft_model)
    if ngram:
        drafters["ngram"] = ngram if isinstance(ngram, NGramDrafter) else NGramDrafter()
    drafters.update(extra or {})
    if not drafters:
        raise ValueError("no drafter to measure: pass draft_model=, ngram=True or extra={name: drafter}")
    df = acceptance_table(prompt_ids, target, drafters, g_values, progress=progress)
    df.attrs["target_tokens"] = target
    df.attrs["distinct_tokens"] = len(set(target))
    return df


# --------------------------------------------------------------------------- engine hooks
def self_draft_drafter(engine, **options) -> Callable[[Sequence[int], int], list[int]]:
    """Self-draft from resident experts only (approximate, opt-in): ``engine.draft_resident_only``
    (greedy drafts with missing experts dropped and the gate weights renormalized over the resident
    ones). The result plugs into ``acceptance_table``; draft speed is measured on the engine side."""

    def draft(context, n):
        return list(engine.draft_resident_only(list(context), n, **options)) if n > 0 else []

    draft.name = "self_draft"
    return draft


def verify_union_cost(engine, prompt_ids: Sequence[int], drafts: Sequence[int], **options) -> dict:
    """Real cost of one verify pass that reads the union of the window's experts
    (``engine.verify``: ``bytes_read``, ``experts_read``, ``seconds``, ...). The trace-based
    estimate is ``union_by_window`` in union.py."""
    return dict(engine.verify(list(prompt_ids), list(drafts), **options))


def acceptance_ci(sequences: Mapping[str, tuple], drafters: Mapping[str, Callable],
                  g_values: Iterable[int] = (2, 3, 4, 8), **ci) -> pd.DataFrame:
    """Drafter acceptance over a workload: ``sequences`` is {prompt: (prompt_ids, target greedy
    tokens)}; returns drafter, g, acceptance, low, high, n_prompts (tokens_per_pass in attrs)."""
    from .uncertainty import interval_table

    per = [acceptance_table(p, t, drafters, g_values).assign(prompt=name) for name, (p, t) in sequences.items()]
    per = pd.concat(per, ignore_index=True)
    return interval_table(per[["drafter", "g", "prompt", "acceptance"]], ["drafter", "g"], "acceptance", **ci)
