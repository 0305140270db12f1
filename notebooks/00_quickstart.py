# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     notebook_metadata_filter: kernelspec,jupytext
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · Quick start: stream a MoE model through a bounded expert arena
#
# The engine keeps every non-expert weight resident and streams routed experts from the
# expert store on SSD into a fixed number of **arena slots**. With the cache-aware options
# off it is **exact**: the tokens equal mlx-lm's resident output.
#
# This notebook runs one generation and shows, per decoded token, how many expert lookups
# hit the arena, how many missed (a synchronous read), and how many bytes were read.
# Move the controls to re-run the engine with another arena size or eviction policy.

# %% tags=["parameters"]
model = None        # mlx-lm model dir or workbench store; None: the shipped reference model
prompt = None       # text or a list of token ids; None: the first held-out workload prompt
max_tokens = 32     # tokens to decode
arena = "0.25"      # fraction of all routed experts ("0.25"), a slot count ("64") or a size ("2GB")
policy = "lru"      # eviction policy
small = False       # CI preset (fewer tokens)

# %%
from workbench.arena.policies import POLICIES, load_all
from workbench.config import ArenaConfig
from workbench.engine.engine import Engine
from workbench.hooks import run_with_hooks
from workbench.viz import controls as ui
from workbench.viz import counter_charts
from workbench.viz import display as wb
from workbench.viz.headline import headline
from workbench.viz.panel import panel, stream
from workbench.viz.session import default_prompt, model_path
from workbench.viz.tables import summary_table

wb.setup()
load_all()
model_dir = model_path(model)
print(f"model: {model_dir}")

# %% [markdown]
# ## One generation

# %%
with Engine.open(model_dir, arena=ArenaConfig(arena, policy)) as eng:
    ids = prompt if prompt is not None else default_prompt(eng)
    res = eng.generate(ids, max_tokens=max_tokens)
    if res.text is not None:  # the model ships a tokenizer
        print(f"prompt (end): …{eng.tokenizer.decode(list(ids))[-160:]!r}\ncontinuation: {res.text[:300]!r}\n")
print(summary_table(res.stats))
headline("How often does the arena hit, and how fast does the streamed model decode?",
         f"hit rate {res.stats['hit_rate']:.1%} with {res.stats['arena_slots']} of {res.stats['routed_experts']} "
         f"experts resident; {res.stats['tokens_per_s']:.1f} tokens/s",
         f"one prompt, {res.stats['tokens']} greedy tokens, policy {policy}, CPU; the live panel below moves "
         "the arena and policy",
         uncertainty="one run: the counters repeat exactly, tokens/s varies from run to run")

# %% [markdown]
# ## Hits, misses and bytes per token (live)
#
# Change the arena or the policy and the engine runs again; the chart redraws while it
# decodes (a `token.end` hook streams the counters). Larger arenas hit more; at 100 % every
# expert fits and only the first touch of each expert misses.

# %%
def run_engine(arena_fraction, policy, max_tokens):
    with Engine.open(model_dir, arena=ArenaConfig(float(arena_fraction), policy), progress=False) as eng:
        sub = f"arena {arena_fraction:.0%} = {eng.n_slots} of {eng.m.n_routed} experts, policy {policy}"

        def live(token, **ctx):  # redraw every ~0.3 s while decoding
            stream(counter_charts.token_counters_chart(eng.counters.frame(), subtitle=sub + " (decoding…)"))

        r = run_with_hooks(eng, ids, [("token.end", live)], max_tokens=max_tokens, progress=False)
    s = r.stats
    summary = f"**{s['tokens']} tokens** ({s['distinct_tokens']} distinct) · hit rate **{s['hit_rate']:.1%}** · " \
              f"{s['bytes_per_token'] / 1e6:.3f} MB read per token · {s['tokens_per_s']:.1f} tokens/s"
    return {"token_counters": counter_charts.token_counters_chart(r.counters, subtitle=sub + f", hit rate {s['hit_rate']:.1%}"),
            "summary": summary}


panel(run_engine, {
    "arena_fraction": ui.slider("arena (share of experts)", 0.05, 1.0, 0.05, value=float(arena), readout_format=".0%"),
    "policy": ui.dropdown("policy", sorted(POLICIES), value=policy),
    "max_tokens": ui.slider("tokens", 4, max(64, max_tokens), 4, value=max_tokens),
}, name="token_counters", title="Engine run")


# %% [markdown]
# ## Fit my machine
#
# How large an arena can this machine afford, and what does it buy? One run per arena size on
# the same prompt: decode speed, hit rate and peak MLX memory against the arena in GB (the
# non-expert weights stay resident on top; the table says how much).

# %%
from workbench.analysis.fit import fit_table
from workbench.viz.charts import fit_chart

fit = fit_table(model_dir, ids, arenas=("0.1", "1.0") if small else ("0.1", "0.25", "0.5", "1.0"),
                max_tokens=4 if small else max_tokens, policy=policy)
wb.show_table(fit, caption="one run per arena size (tokens/s varies from run to run; hit rate and memory repeat)")
wb.show(fit_chart(fit), "fit_my_machine")
