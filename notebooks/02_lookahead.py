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
# # 02 · Router lookahead: how early can we know the next layers' experts?
#
# To read an expert before layer *L* needs it, we must predict it while an earlier layer runs.
# The predictor applies layer *L*'s router to the MoE input of layer *L − d*. **Recovery** is
# |predicted top-k ∩ actual top-k| / k, per layer and averaged, for d = 1, 2, 3, and for
# "same layer, previous token" (the experts layer *L* used one token ago).
#
# Reference numbers (another model, MiniMax-M2.5 4-bit, one prompt): 78.5 %, 72.5 %, 68.0 %
# for d = 1, 2, 3 and 33.0 % for the previous token. Reading more candidates than k (k′ > k)
# buys coverage with bytes.

# %% tags=["parameters"]
model = None        # mlx-lm model dir; None: the shipped reference model
prompt = None       # text or token ids; None: the first held-out workload prompt
max_tokens = 48     # decoded tokens in the recorded trace
max_distance = 3    # largest lookahead distance d
per_domain = 4      # workload: prompts from each of in-domain, held-out and shifted-domain text
workload_prompt_tokens = 128  # workload: teacher-forced tokens of each prompt's text
workload_max_tokens = 32      # workload: greedy tokens decoded after them
small = False       # CI preset (fewer tokens, one prompt per domain)

# %%
from workbench.analysis._common import load_mlx_model
from workbench.analysis.lookahead import lookahead_recovery, lookahead_summary, routers_from_model
from workbench.viz import charts
from workbench.viz import controls as ui
from workbench.viz import display as wb
from workbench.viz.headline import headline
from workbench.viz.panel import panel
from workbench.viz.session import record

wb.setup()
run = record(model, prompt, max_tokens=max_tokens, moe_input=True)  # exact run, MoE inputs recorded
routers = routers_from_model(load_mlx_model(run.model))
k = run.trace.top_k
print(f"model: {run.model}; trace: {len(run.trace.decode())} decode rows, top-{k}, "
      f"{run.stats['distinct_tokens']} distinct of {run.stats['tokens']} tokens")

# %%
table = lookahead_recovery(run.trace, routers, distances=range(1, max_distance + 1), k_extra=(k + k // 2, 2 * k))
wb.show_table(lookahead_summary(table)[["source", "k_pred", "recovery", "recovery_min", "recovery_max", "layers"]],
              "Mean recovery over layers (k_pred = candidates read per layer)")

# %% [markdown]
# ## Over the workload, teacher-forced and greedy, with 95% intervals
#
# One prompt says little: greedy output loops, and which prompt moves the numbers by more than
# the seed's rounding. Every prompt of the workload (in-domain code, held-out packages,
# shifted-domain prose) is measured twice: **teacher-forced** on the workload text itself and
# from **greedy decode** after it. Bars are 95% bootstrap intervals over prompts; black ticks
# are the seed's values (another model).

# %%
import pandas as pd

from workbench.analysis.ledger import LOOKAHEAD_IDS, seed_of
from workbench.analysis.lookahead import lookahead_ci
from workbench.analysis.workload import METHODS, notebook_workload, phase

w = notebook_workload(model, per_domain, workload_prompt_tokens, workload_max_tokens, small, progress=not wb.is_static())
la = pd.concat([lookahead_ci(w.traces(), routers, (1, 2, 3), phase=phase(m)).assign(method=m) for m in METHODS],
               ignore_index=True)
la["seed"] = la["source"].map(LOOKAHEAD_IDS).map(seed_of)
print(f"workload: {len(w.runs)} prompts, {w.prompt_tokens} teacher-forced + {w.max_tokens} greedy tokens each")
wb.show(charts.interval_chart(la, "source", "recovery", color="method", seed="seed", y_format="%",
                              title="Lookahead recovery over the workload"), "lookahead_workload")

# %%
wb.show_table(la[["method", "source", "recovery", "low", "high", "n_prompts", "seed"]],
              "Mean recovery over layers (k' = k), 95% bootstrap interval over prompts")
best = la.sort_values("recovery", ascending=False).iloc[0]
headline("How early can the next layers' experts be predicted?",
         f"{best['source']} recovers {best['recovery']:.1%} of the top-k ({best['method']})",
         "the reference model's trained routers; recovery is |predicted top-k ∩ actual top-k| / k, averaged over layers",
         uncertainty=f"95% interval over {int(best['n_prompts'])} prompts: {best['low']:.1%}-{best['high']:.1%}")

# %% [markdown]
# ## Calibration of the predictors on prompts the fit never saw
#
# The cost gate admits a read-ahead candidate when q_e · stall_saved pays for its bytes, so
# q_e (the probability that the router really claims a candidate, by source, rank and layer)
# must be measured, not assumed. It is fitted on the in-domain prompts and scored on the
# held-out and shifted-domain prompts (Brier score, 95% interval over those prompts).

# %%
from workbench.analysis.calibration import held_out_calibration

cal = held_out_calibration(w.by_domain("in-domain"), {**w.by_domain("held-out"), **w.by_domain("shifted")},
                           routers, phase="decode")
wb.show(charts.reliability_chart(cal["reliability"]), "calibration_reliability")

# %%
wb.show_table(cal["scores"], "Brier score per source on held-out prompts (fit on in-domain prompts only)")

# %% [markdown]
# ## Recovery by layer and by candidate budget (live)
#
# *max distance* adds sources d = 1..D; *extra candidates* reads k′ experts per predicted
# layer (k′ = k is the plain top-k).

# %%
def render(max_distance, k_pred, prev_token):
    t = lookahead_recovery(run.trace, routers, distances=range(1, max_distance + 1),
                           k_extra=sorted({k, k_pred}), prev_token=prev_token)
    s = lookahead_summary(t)
    s = s[s["k_pred"] == k_pred]
    best = s.sort_values("recovery", ascending=False).iloc[0]
    note = (f"With k′ = {k_pred} candidates, the best source is **{best['source']}** at "
            f"**{best['recovery']:.1%}** of the actual top-{k}.")
    return [("lookahead_recovery", charts.lookahead_chart(t)), note]


panel(render, {
    "max_distance": ui.slider("max distance d", 1, max(4, max_distance), 1, value=max_distance),
    "k_pred": ui.slider("candidates k′", k, 3 * k, 1, value=k + k // 2),
    "prev_token": ui.checkbox("include previous token", True),
}, name="lookahead_recovery", title="Lookahead recovery")
