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
# # 03 · Expert cosine: are a layer's experts alike?
#
# If experts were near copies, a missing expert could be approximated by a resident one, or
# all experts compressed into a shared part plus small deltas. Three measures per layer, on
# the flattened expert weights (gate, up and down projections together):
#
# * the **mean pairwise cosine** of experts (reference: +0.096),
# * the **norm left after subtracting the layer's mean expert** (reference: 98.6 %),
# * the **rank needed for a share of the energy** of the stacked experts (reference: 83 % of
#   the energy at rank 128 of 256).

# %% tags=["parameters"]
model = None        # mlx-lm model dir; None: the shipped reference model
max_layers = 0      # analyse only the first N MoE layers (0: all)
share = 0.9         # energy share for "rank needed"
small = False       # CI preset (fewer layers)

# %%
from workbench.analysis._common import load_mlx_model
from workbench.analysis.cosine import cosine_pairs, cosine_summary, energy_curve, expert_grams, experts_from_model
from workbench.viz import charts
from workbench.viz import controls as ui
from workbench.viz import display as wb
from workbench.viz.headline import headline
from workbench.viz.panel import panel
from workbench.viz.session import model_path

wb.setup()
model_dir = model_path(model)
experts = experts_from_model(load_mlx_model(model_dir))
if max_layers:
    experts = {layer: experts[layer] for layer in sorted(experts)[:max_layers]}
grams = expert_grams(experts, progress=True)  # one E x E Gram matrix per layer; everything below reuses it
print(f"model: {model_dir}; {len(grams)} MoE layers analysed")

# %%
summary = cosine_summary(grams, share=share)
wb.show_table(summary[["layer", "n_experts", "mean_cosine", "min_cosine", "max_cosine", "resid_norm_share",
                       "rank_for_share", "at_rank", "energy_at_rank"]], f"Per layer (rank for {share:.0%} of the energy)")

# %%
wb.show(charts.cosine_chart(cosine_pairs(grams), summary), "cosine_histogram")
headline("How alike are a layer's experts (could they be compressed as a shared part plus small deltas)?",
         f"mean pairwise cosine {summary['mean_cosine'].mean():+.3f}; {summary['resid_norm_share'].mean():.1%} of the "
         "norm is left after subtracting the layer mean",
         "the shipped model's experts (4-bit, dequantized); the interval below resamples layers",
         uncertainty=f"range over {len(summary)} layers: {summary['mean_cosine'].min():+.3f} to {summary['mean_cosine'].max():+.3f}")

# %% [markdown]
# ## Mean over layers with a 95% interval
#
# The weights do not depend on a prompt, so the resampled unit is the layer: how much the
# layer average would move with other layers of the same kind.

# %%
from workbench.analysis.cosine import cosine_ci

wb.show_table(cosine_ci(summary), "Mean over layers, 95% bootstrap interval over layers")

# %% [markdown]
# ## Energy vs rank (live)
#
# *centered* subtracts the layer's mean expert first: what is left is what makes experts
# different from each other.

# %%
def render(share, center):
    e = energy_curve(grams, center=center)
    s = cosine_summary(grams, share=share, center=center)
    note = (f"Rank needed for **{share:.0%}** of the energy: median **{int(s['rank_for_share'].median())}** of "
            f"{int(s['n_experts'].iloc[0])} experts ({'centered' if center else 'not centered'}).")
    return [("energy_curve", charts.energy_chart(e, share)), note]


panel(render, {
    "share": ui.slider("energy share", 0.5, 0.99, 0.01, value=float(share), readout_format=".0%"),
    "center": ui.checkbox("subtract the layer mean (centered)", False),
}, name="energy_curve", title="Energy vs rank")
