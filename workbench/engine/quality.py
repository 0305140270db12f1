"""Quality cost of an approximate configuration against exact decoding."""

from __future__ import annotations

import numpy as np


def quality_cost(exact_logprobs: np.ndarray, approx_logprobs: np.ndarray, tokens) -> dict:
    """Mean KL(exact || approx) of next-token distributions and both perplexities on ``tokens``.

    Both log-prob arrays are [T, vocab] for the same token sequence (``Engine.score``).
    """
    p = np.exp(exact_logprobs)
    kl = (p * (exact_logprobs - approx_logprobs)).sum(-1)
    nxt = np.asarray(tokens[1:])
    rows = np.arange(len(nxt))
    return {
        "mean_kl": float(kl[:-1].mean()) if len(kl) > 1 else 0.0,
        "ppl_exact": float(np.exp(-exact_logprobs[rows, nxt].mean())),
        "ppl_approx": float(np.exp(-approx_logprobs[rows, nxt].mean())),
    }
