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
# # 05 · MTP union: does speculative decoding pay when every verify pass streams experts?
#
# A verify pass over g drafted tokens must read the **union** of the experts all g tokens
# route to. If decode is streaming-bound (time ∝ experts read), a pass costs
# cost(g) = union(g) / k plain steps and yields E(g) = (1 − aᵍ) / (1 − a) tokens at
# per-token acceptance a. The **speedup bound** is the best over g of E(g) / cost(g).
#
# Reference (top-8): union 8.00, 13.42, 17.99, 35.01 for g = 1, 2, 3, 8 (about
# k(1 + 0.58(g − 1))); claimed 1.83× ceiling, 1.30× at 90 %, 1.08× at 80 %, a net loss
# below about 72 %. We measure the union on our model and recompute the claims from their
# own table (type any table in below).

# %% tags=["parameters"]
model = None        # mlx-lm model dir; None: the shipped reference model
prompt = None       # text or token ids; None: the first held-out workload prompt
max_tokens = 64     # decoded tokens in the recorded trace
g_max = 8           # largest window g
union_text = "1:8,2:13.42,3:17.99,8:35.01"  # a typed-in union table G:UNION (the reference)
union_k = 8         # top-k of the typed-in table
per_domain = 4      # workload: prompts from each of in-domain, held-out and shifted-domain text
workload_prompt_tokens = 128  # workload: teacher-forced tokens of each prompt's text
workload_max_tokens = 32      # workload: greedy tokens decoded after them
small = False       # CI preset (fewer tokens, one prompt per domain)

# %%
import numpy as np

from workbench.analysis.union import (break_even, ceiling, fit_union_slope, parse_union_table, speedup_bound,
                                      speedup_grid, union_by_window, union_table)
from workbench.viz import charts
from workbench.viz import controls as ui
from workbench.viz import display as wb
from workbench.viz.panel import panel
from workbench.viz.session import record

wb.setup()
run = record(model, prompt, max_tokens=max_tokens)
measured = union_by_window(run.trace, range(1, min(g_max, max_tokens) + 1))
k = int(measured.attrs["k"])
slope = fit_union_slope(measured, k)
print(f"model: {run.model}; top-{k}; {run.stats['tokens']} tokens ({run.stats['distinct_tokens']} distinct); "
      f"fitted slope s = {slope:.3f}")

# %% [markdown]
# ## Union on our model

# %%
wb.show(charts.union_chart(measured, slope), "union_measured")

# %%
ACC = np.round(np.linspace(0, 0.99, 100), 3)
grid = speedup_grid(union_table(measured), k, ACC)
wb.show(charts.speedup_chart(grid), "speedup_measured")

# %%
c, be = ceiling(measured, k), break_even(measured, k)
wb.show_table(speedup_bound(measured, k, [0.6, 0.7, 0.8, 0.9, 0.95, 0.99]),
              f"Best window per acceptance (measured union). Ceiling {c['speedup']:.3f}x at g={c['g']}; "
              + (f"drafting pays above a = {be['acceptance']:.3f} (g={be['g']})" if be["g"] else "drafting never pays"))

# %% [markdown]
# ## Over the workload, with 95% intervals, like for like
#
# union(g) on every workload prompt, teacher-forced and greedy, at the seed's windows
# g in {1, 2, 3, 8}; the bound quantities are recomputed from each bootstrap resample's mean
# union table over those same windows (the seed's numbers use no others).

# %%
import pandas as pd

from workbench.analysis.drafters import ModelDrafter, NGramDrafter, acceptance_ci
from workbench.analysis.union import mtp_ci, union_ci
from workbench.analysis.workload import METHODS, notebook_workload, phase

w = notebook_workload(model, per_domain, workload_prompt_tokens, workload_max_tokens, small, progress=not wb.is_static())
unions = {m: union_ci(w.traces(), phase=phase(m)) for m in METHODS}
wb.show(charts.union_ci_chart(unions), "union_workload")

# %%
from workbench.viz.headline import headline

mtp = pd.concat([mtp_ci(u).assign(method=m) for m, u in unions.items()], ignore_index=True)
wb.show_table(mtp, "Speedup bound quantities from our union table (g in {1,2,3,8}), 95% interval over prompts")
q = mtp[mtp["method"] == "decode"].set_index("quantity")
s90, be = q.loc["speedup@0.9"], q.loc["break_even"]
pays = be["value"] == be["value"]  # NaN: no window ever pays
headline("Does speculative decoding pay when every verify pass streams the union of the drafted tokens' experts?",
         f"at 90% acceptance the speedup bound is {s90['value']:.2f}x; "
         + (f"drafting pays above a per-token acceptance of {be['value']:.0%}" if pays else "no window g pays at any acceptance"),
         f"an upper bound for streaming-bound decode (time ∝ experts read) from union(g), g in {{{s90['g_values']}}}, "
         "on this model's greedy decode routes; real drafters' acceptance is measured below",
         uncertainty=f"95% interval over {int(s90['n_prompts'])} prompts: {s90['low']:.2f}-{s90['high']:.2f}x"
                     + (f"; break-even {be['low']:.0%}-{be['high']:.0%}" if pays else ""))

# %%
from workbench.analysis._common import load_mlx_model
from workbench.data import DRAFT

wl_drafters = {"ngram": NGramDrafter()}
if (DRAFT / "config.json").exists():
    wl_drafters["draft_model"] = ModelDrafter(load_mlx_model(DRAFT))
acc_wl = acceptance_ci(w.sequences(), wl_drafters, g_values=(2, 4, 8))
wb.show(charts.interval_chart(acc_wl, "g", "acceptance", color="drafter", y_format="%",
                              title="Drafter acceptance over the workload (greedy target)"), "acceptance_workload")

# %% [markdown]
# ## Three drafters on our model, and what a verify pass really reads
#
# Acceptance *a* (per drafted token, the *a* of the bound above) for the draft model
# (`data/models/ref-draft`), n-gram prompt lookup, and self-draft from the experts already
# resident (APPROXIMATE: the draft routes among residents only; verification stays exact).
# Then the real cost of one verify pass of g tokens through the streaming engine (25% arena).

# %%
from workbench.analysis.drafters import acceptance_table, greedy_decode, ModelDrafter, NGramDrafter
from workbench.analysis.drafters import self_draft_drafter, verify_union_cost
from workbench.analysis._common import load_mlx_model
from workbench.data import DRAFT
from workbench.engine.engine import Engine
import pandas as pd

ids = list(run.result.prompt)
n_draft = 12 if small else 32
target = greedy_decode(load_mlx_model(run.model), ids, n_draft)
drafters = {"ngram": NGramDrafter()}
if DRAFT.exists() and str(run.model).rstrip("/").endswith("ref-moe"):
    drafters["draft_model"] = ModelDrafter(load_mlx_model(DRAFT))
with Engine.open(run.model, arena="0.25", progress=False) as eng:
    drafters["self_draft"] = self_draft_drafter(eng)
    acc = acceptance_table(ids, target, drafters, g_values=(2, 4) if small else (2, 3, 4, 8))
    verify = [dict(g=g, **verify_union_cost(eng, ids, target[:g - 1])) for g in (1, 2, 4, 8)]
wb.show_table(acc[["drafter", "g", "acceptance", "drafted_match", "tokens_per_pass"]],
              "Drafter acceptance against the target's greedy tokens")
wb.show_table(pd.DataFrame(verify), "One verify pass of g tokens (g-1 drafts + the current token) through the 25% arena")

# %% [markdown]
# ## Typed-in union tables
#
# Type a union table as `G:UNION` pairs. *mode* says which windows the bound may use: only the
# typed g (`table`), every g in between by linear interpolation (`interp`), or the linear fit
# (`fit`). These choices move the claimed numbers; the chart shows how much.

# %%
def render(union_text, union_k, mode):
    u = parse_union_table(union_text)
    if union_k < 1:
        raise ValueError("k must be >= 1")
    grid = speedup_grid(u, int(union_k), ACC, mode=mode)
    c, be = ceiling(u, int(union_k), mode=mode), break_even(u, int(union_k), mode=mode)
    bound = speedup_bound(u, int(union_k), [0.7, 0.72, 0.8, 0.9, 0.99], mode=mode)
    note = (f"k = {int(union_k)}, slope s = {fit_union_slope(u, int(union_k)):.3f}: ceiling **{c['speedup']:.3f}×** "
            f"(g={c['g']}); " + (f"drafting pays above **a = {be['acceptance']:.3f}** (g={be['g']})"
                                 if be["g"] else "no window g ≥ 2 ever pays"))
    return [("speedup_typed", charts.speedup_chart(grid, "MTP speedup bound from the typed union table")), note, ("bound", wb.table(bound, "Best window per acceptance"))]


panel(render, {
    "union_text": ui.text("union table", union_text, placeholder="1:8,2:13.42,3:17.99,8:35.01"),
    "union_k": ui.slider("k", 1, 16, 1, value=int(union_k), expensive=False),
    "mode": ui.dropdown("mode", ["table", "interp", "fit"], value="table"),
}, name="speedup_typed", title="Speedup bound from a typed union table")
