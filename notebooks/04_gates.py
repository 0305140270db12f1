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
# # 04 · Gate distribution and the cost of dropping the weakest expert
#
# Each token mixes its top-k experts with gate weights. If the weights fall off quickly, the
# weakest experts matter little, and skipping a missing weak expert might be cheap. Two
# measures from a recorded trace:
#
# * **mean normalized gate weight by slot** (slot 1 = strongest; reference 0.192 at slot 1
#   and 0.093 at slot 8 for a sigmoid top-8 router),
# * **relative L2 error of the MoE block output** when the weakest m experts are dropped,
#   with and without renormalizing the kept weights (reference 11.4 % for m = 1).

# %% tags=["parameters"]
model = None          # mlx-lm model dir; None: the shipped reference model
prompt = None         # text or token ids; None: the first held-out workload prompt
max_tokens = 48       # decoded tokens in the recorded trace
max_rows = 256        # recorded MoE inputs per layer re-run for the drop-weakest error
small = False         # CI preset (fewer tokens)

# %%
from workbench.analysis._common import load_mlx_model
from workbench.analysis.gates import drop_weakest_error, gate_by_slot, gate_slot_mean, mlx_expert_outputs
from workbench.viz import charts
from workbench.viz import widgets as wb

wb.setup()
run = wb.record(model, prompt, max_tokens=max_tokens, moe_input=True)
expert_outputs = mlx_expert_outputs(load_mlx_model(run.model))
print(f"model: {run.model}; top-{run.trace.top_k}; {len(run.trace.decode())} decode rows")

# %%
slots = gate_by_slot(run.trace)
wb.table(gate_slot_mean(slots), "Mean normalized gate weight by slot (mean over layers)")

# %% [markdown]
# ## Gate weight by slot and drop-weakest error (live)
#
# *prefill* uses the prompt's rows instead of the decoded tokens; unnormalized weights show
# what the router gives before the top-k weights are rescaled to sum to 1.

# %%
def render(phase, normalize, max_rows):
    t = gate_by_slot(run.trace, phase=phase, normalize=normalize)
    d = drop_weakest_error(run.trace, expert_outputs, phase=phase, max_rows_per_layer=max_rows)
    one = d[(d["dropped"] == 1)].groupby("renorm")["rel_error"].mean()
    note = (f"Dropping the weakest expert: **{one.get(False, float('nan')):.1%}** relative error "
            f"(**{one.get(True, float('nan')):.1%}** with renormalized weights), {phase} rows.")
    return [("gate_by_slot", charts.gate_slot_chart(t)), ("drop_weakest", charts.drop_weakest_chart(d)), note]


wb.panel(render, {
    "phase": wb.dropdown("phase", ["decode", "prefill"], value="decode"),
    "normalize": wb.checkbox("normalize weights per token", True),
    "max_rows": wb.slider("rows per layer", 16, max(512, max_rows), 16, value=max_rows),
}, name="gates_live", title="Gate weights and drop-weakest error")
