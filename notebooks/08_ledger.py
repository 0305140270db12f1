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
# # 08 · The claims ledger
#
# Every reference number of the design brief beside our own measurement on the shipped model,
# with a verdict. Some references also follow from *other* reference numbers (the MTP speedups
# from the union table, the norm share from the mean cosine): the ledger recomputes those from
# their own inputs (`from_inputs`, `inputs_verdict`), so a claim that does not reproduce even
# on its own data is visible.
#
# Our model is not the reference's model: "differs" is a finding about *this* model, not an
# error; the `reference_context` column says what each reference was measured on.

# %% tags=["parameters"]
model = None        # mlx-lm model dir; None: the shipped reference model
prompt = None       # text or token ids; None: the first held-out workload prompt
max_tokens = 64     # decoded tokens in the recorded trace
max_layers = 0      # cosine: only the first N MoE layers (0: all)
small = False       # CI preset (fewer tokens and layers)

# %%
import pandas as pd

from workbench.analysis._common import load_mlx_model
from workbench.analysis.cosine import cosine_summary, expert_grams, experts_from_model
from workbench.analysis.gates import drop_weakest_error, gate_by_slot, mlx_expert_outputs
from workbench.analysis.ledger import build_ledger, ledger_extras, measured_from_tables
from workbench.analysis.lookahead import lookahead_recovery, lookahead_summary, routers_from_model
from workbench.analysis.union import union_by_window
from workbench.viz import charts
from workbench.viz import widgets as wb

wb.setup()
run = wb.record(model, prompt, max_tokens=max_tokens, moe_input=True)
mlx_model = load_mlx_model(run.model)
experts = experts_from_model(mlx_model)
if max_layers:
    experts = {layer: experts[layer] for layer in sorted(experts)[:max_layers]}
tables = dict(
    lookahead_summary=lookahead_summary(lookahead_recovery(run.trace, routers_from_model(mlx_model), (1, 2, 3))),
    cosine_summary=cosine_summary(expert_grams(experts), share=0.9, at_rank=None),
    gate_slots=gate_by_slot(run.trace),
    drop_weakest=drop_weakest_error(run.trace, mlx_expert_outputs(mlx_model), max_rows_per_layer=128),
    union=union_by_window(run.trace, range(1, min(8, max_tokens) + 1)),
)
extra = ledger_extras(run, self_draft=not small)
measured = measured_from_tables(**tables, extra=extra)
ledger = build_ledger(measured, model=str(run.model))
print(f"model: {run.model}; {len(measured)} of {len(ledger)} claims measured")

# %%
wb.show(charts.ledger_chart(ledger), "ledger")

# %%
cols = ["id", "what", "reference", "measured", "unit", "verdict", "reference_context"]
wb.table(ledger[cols], "Claims: reference vs measured on our model", precision=3)

# %% [markdown]
# ## Do the references reproduce from their own inputs?

# %%
checks = ledger[ledger["inputs_verdict"] != ""]
wb.table(checks[["id", "reference", "from_inputs", "inputs_verdict"]],
         "Reference claims recomputed from the other reference numbers", precision=3)

# %% [markdown]
# ## Live: filter by area and verdict

# %%
def render(area, verdict):
    t = ledger if area == "all" else ledger[ledger["area"] == area]
    if verdict != "all":
        t = t[t["verdict"].str.startswith(verdict)]
    out = [wb.table(t[cols], f"{len(t)} claims")]
    if t["measured"].notna().any():
        out.insert(0, ("ledger_live", charts.ledger_chart(t)))
    return out


wb.panel(render, {
    "area": wb.dropdown("area", ["all"] + sorted(ledger["area"].unique())),
    "verdict": wb.dropdown("verdict", ["all", "matches", "differs", "not measured"]),
}, name="ledger_live", title="Ledger", static=False)
