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
small = False       # CI preset (fewer tokens)

# %%
from workbench.analysis._common import load_mlx_model
from workbench.analysis.lookahead import lookahead_recovery, lookahead_summary, routers_from_model
from workbench.viz import charts
from workbench.viz import widgets as wb

wb.setup()
run = wb.record(model, prompt, max_tokens=max_tokens, moe_input=True)  # exact run, MoE inputs recorded
routers = routers_from_model(load_mlx_model(run.model))
k = run.trace.top_k
print(f"model: {run.model}; trace: {len(run.trace.decode())} decode rows, top-{k}, "
      f"{run.stats['distinct_tokens']} distinct of {run.stats['tokens']} tokens")

# %%
table = lookahead_recovery(run.trace, routers, distances=range(1, max_distance + 1), k_extra=(k + k // 2, 2 * k))
wb.table(lookahead_summary(table)[["source", "k_pred", "recovery", "recovery_min", "recovery_max", "layers"]],
         "Mean recovery over layers (k_pred = candidates read per layer)")

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


wb.panel(render, {
    "max_distance": wb.slider("max distance d", 1, max(4, max_distance), 1, value=max_distance),
    "k_pred": wb.slider("candidates k′", k, 3 * k, 1, value=k + k // 2),
    "prev_token": wb.checkbox("include previous token", True),
}, name="lookahead_recovery", title="Lookahead recovery")
