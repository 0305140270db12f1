"""``workbench demo``: the case for streaming, in a minute, on the shipped reference model.

1. A held-out prompt streamed through a 25% arena (``workbench run``'s output), and resident
   mlx-lm's greedy output for the same ids: equal.
2. The same prompt at 100%, 25% and 10% arenas, without and with read-ahead: tokens/s and MB
   read per token, one small table and one chart (and whether each run's tokens equal mlx-lm's).
3. Where the report is (``cli.cmd_demo``).
"""

from __future__ import annotations

import altair as alt
import mlx.core as mx
import pandas as pd

from .config import AheadConfig, ArenaConfig
from .data import workload
from .engine.engine import Engine
from .viz.palette import color_scale

# A held-out file whose greedy continuation does not loop on the reference model (48 tokens, 34
# distinct; measured over every code_heldout prompt with a 100% arena).
PROMPT = ("code_heldout", "networkx/algorithms/centrality/trophic.py:1")
ARENAS = ("100%", "25%", "10%")
READ_AHEAD = {"none": None, "next layer": AheadConfig(predictor="layer", lookahead=1)}


def demo_prompt() -> str:
    """The demo's prompt: the held-out file's text up to its last complete line (never mid-word)."""
    name, pid = PROMPT
    text = next(p["text"] for p in workload(name) if p["id"] == pid)
    return text[: text.rfind("\n") + 1]


def resident_tokens(model_dir, ids, max_tokens) -> list[int]:
    """mlx-lm's own greedy decoding on the resident model (its ``generate_step``), stopping at EOS as
    ``mlx_lm generate`` does (the stop token kept, as the engine keeps it)."""
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load

    model, tokenizer = load(str(model_dir))
    out = []
    for tok, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens):
        out.append(int(tok))
        if tok in tokenizer.eos_token_ids:
            break
    return out


def arena_runs(store, ids, max_tokens, reference, arenas=ARENAS) -> pd.DataFrame:
    """One greedy run per arena and read-ahead setting: tokens/s (of the run's median token, steadier
    on a busy machine than the mean), MB read per token, hit rate (the counters repeat from run to
    run), and whether the tokens (up to the tokenizer's EOS) equal ``reference`` (resident mlx-lm's)."""
    with Engine(store, arena="100%", progress=False) as eng:  # warm-up: a process's first run loads kernels
        eng.generate(ids, max_tokens=2, progress=False)
    rows = []
    for arena in arenas:
        for ahead_name, ahead in READ_AHEAD.items():
            with Engine(store, arena=ArenaConfig(arena), ahead=ahead, progress=False) as eng:
                res = eng.generate(ids, max_tokens=max_tokens, stop_at_eos=True, progress=False)
            s = res.stats
            rows.append({"arena": arena, "read-ahead": ahead_name, "tokens/s": 1e3 / s["median_token_ms"],
                         "MB read per token": s["bytes_per_token"] / 1e6, "hit rate": s["hit_rate"],
                         "equals mlx-lm": res.tokens == reference})
    return pd.DataFrame(rows)


def table_text(runs: pd.DataFrame) -> str:
    """The runs as an aligned text table for the terminal."""
    shown = runs.assign(**{"tokens/s": runs["tokens/s"].map("{:.1f}".format),
                           "MB read per token": runs["MB read per token"].map("{:.3f}".format),
                           "hit rate": runs["hit rate"].map("{:.1%}".format),
                           "equals mlx-lm": runs["equals mlx-lm"].map({True: "yes", False: "NO"})})
    return shown.to_string(index=False)


def demo_chart(runs: pd.DataFrame) -> alt.HConcatChart:
    """Tokens/s and MB read per token by arena, bars side by side without and with read-ahead."""
    order = list(dict.fromkeys(runs["arena"]))
    colour = alt.Color("read-ahead:N", scale=color_scale(READ_AHEAD), title="read-ahead")
    base = alt.Chart(runs).mark_bar().encode(
        x=alt.X("arena:N", sort=order, title="arena, share of routed experts (%)", axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("read-ahead:N", sort=list(READ_AHEAD)), color=colour,
        tooltip=["arena", "read-ahead", alt.Tooltip("tokens/s:Q", format=".1f"),
                 alt.Tooltip("MB read per token:Q", format=".3f"), alt.Tooltip("hit rate:Q", format=".1%")])
    return alt.hconcat(
        base.encode(y=alt.Y("tokens/s:Q", title="decode speed (tokens/s)")).properties(
            width=220, height=180, title="Speed"),
        base.encode(y=alt.Y("MB read per token:Q", title="read from the store per token (MB)")).properties(
            width=220, height=180, title="Reads"),
    ).properties(title=alt.TitleParams(
        "What a smaller arena costs and what read-ahead buys (reference model, one held-out prompt)",
        subtitle=["one run per bar, tokens/s of its median token (it varies from run to run; the bytes repeat)"], anchor="start"))
