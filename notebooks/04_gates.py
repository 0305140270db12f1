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
per_domain = 4      # workload: prompts from each of in-domain, held-out and shifted-domain text
workload_prompt_tokens = 128  # workload: teacher-forced tokens of each prompt's text
workload_max_tokens = 32      # workload: greedy tokens decoded after them
small = False         # CI preset (fewer tokens, one prompt per domain)

# %%
from workbench.analysis._common import load_mlx_model
from workbench.analysis.gates import drop_weakest_error, gate_by_slot, gate_slot_mean, mlx_expert_outputs
from workbench.viz import charts
from workbench.viz import controls as ui
from workbench.viz import display as wb
from workbench.viz.headline import headline
from workbench.viz.panel import panel
from workbench.viz.session import record

wb.setup()
run = record(model, prompt, max_tokens=max_tokens, moe_input=True)
expert_outputs = mlx_expert_outputs(load_mlx_model(run.model))
print(f"model: {run.model}; top-{run.trace.top_k}; {len(run.trace.decode())} decode rows")

# %%
slots = gate_by_slot(run.trace)
wb.show_table(gate_slot_mean(slots), "Mean normalized gate weight by slot (mean over layers)")

# %% [markdown]
# ## Over the workload, teacher-forced and greedy, with 95% intervals
#
# The same two measures on every workload prompt, teacher-forced on its text and from greedy
# decode; bars are 95% bootstrap intervals over prompts, black ticks the seed. The drop-weakest
# error is given both ways: kept weights **not renormalised** (the dropped expert just
# vanishes) and **renormalised** (the kept weights rescaled to the full sum).

# %%
import pandas as pd

from workbench.analysis.gates import drop_weakest_ci, gate_slots_ci
from workbench.analysis.ledger import GATE_SLOT_IDS, seed_of
from workbench.analysis.workload import METHODS, notebook_workload, phase

w = notebook_workload(model, per_domain, workload_prompt_tokens, workload_max_tokens, small, progress=not wb.is_static())
gs = pd.concat([gate_slots_ci(w.traces(), phase(m)).assign(method=m) for m in METHODS], ignore_index=True)
gs["seed"] = gs["slot"].map(GATE_SLOT_IDS).map(lambda c: seed_of(c) if isinstance(c, str) else float("nan"))
wb.show(charts.interval_chart(gs, "slot", "mean_weight", color="method", seed="seed", y_title="mean gate weight (share)",
                              title="Gate weight by slot over the workload"), "gate_slots_workload")

# %%
dw = pd.concat([drop_weakest_ci(w.traces(), expert_outputs, phase(m), max_rows_per_layer=min(max_rows, 64)).assign(method=m)
                for m in METHODS], ignore_index=True)
dw["kept weights"] = dw["renorm"].map({True: "renormalised", False: "not renormalised"})
dw["seed"] = seed_of("gates.drop_weakest")
wb.show(charts.interval_chart(dw, "kept weights", "rel_error", color="method", seed="seed", y_format="%",
                              title="Drop-weakest block error over the workload"), "drop_weakest_workload")

# %%
wb.show_table(dw[["method", "kept weights", "rel_error", "low", "high", "n_prompts", "seed"]],
              "Relative L2 error with the weakest expert dropped (mean over layers), 95% interval over prompts")
r = dw.iloc[-1]
headline("What does dropping the weakest routed expert cost?",
         f"{r['rel_error']:.1%} relative L2 error of the MoE block ({r['kept weights']}, {r['method']})",
         "measured by re-running the model's experts on recorded inputs; approximate by construction",
         uncertainty=f"95% interval over {int(r['n_prompts'])} prompts: {r['low']:.1%}-{r['high']:.1%}")

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


panel(render, {
    "phase": ui.dropdown("phase", ["decode", "prefill"], value="decode"),
    "normalize": ui.checkbox("normalize weights per token", True),
    "max_rows": ui.slider("rows per layer", 16, max(512, max_rows), 16, value=max_rows),
}, name="gates_live", title="Gate weights and drop-weakest error")
