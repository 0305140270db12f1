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
# Every claim of the two seed documents beside our measurement on the shipped model, over a
# workload (prompts of in-domain code, held-out packages and shifted-domain prose), each row with
# its method, its rule and one verdict: **reproduced**, **differs**, **not comparable** (our
# regime is not the document's; the reason is in the row) or **not measurable here** (a number
# of the document's own machine, or a switch we do not have).
#
# The rules (``workbench.analysis.ledger``):
#
# * **level**: the document's value (one prompt's) against our 95% *prediction* interval for
#   one prompt, widened by a practical tolerance of the quantity's kind (defined once, in
#   ``workbench.analysis.tolerance``); lookahead rows add the lift over chance (r − k/E)/(1 − k/E)
#   beside the raw share, since k/E is 1/8 here and 1/32 there;
# * **ordering**: a contrast as the paired per-prompt difference with its interval (the UNPERT
#   2x2 with the router held fixed, static pinning against LRU at a matched budget, SLRU-cold
#   against LRU, L+2 against L+1, the read paths); reproduced when the interval lies on the
#   document's side of 0;
# * **arithmetic** on the document's own numbers (rows `@seed`) and **exact** constructed cases;
# * **regime**: a claim that depends on the working set in tokens (slots / lookups per token) is
#   not comparable when ours is far from the document's (here 1.4 tokens against 9); a
#   constructed random model in the document's regime (256 experts, top-5: 9 tokens at 17.6%)
#   answers those rows too, in rows labelled CONSTRUCTED (its routing is random, not trained).
#
# Timing rows (read path, self-draft speed) are marked: their verdicts may change from run to
# run, and a machine busy with other work gives none.

# %% tags=["parameters"]
model = None        # mlx-lm model dir; None: the shipped reference model
per_domain = 4      # workload: prompts from each of in-domain, held-out and shifted-domain text
workload_prompt_tokens = 128  # workload: teacher-forced tokens of each prompt's text (at most)
workload_max_tokens = 32      # workload: greedy tokens decoded after them
live = True         # also the live engine rows (the UNPERT 2x2, strata, L+2, self-draft)
max_layers = 0      # cosine: only the first N MoE layers (0: all)
small = False       # CI preset (one prompt per domain, no live runs, two cosine layers)

# %%
from workbench.analysis.ledger import DOCS, headline_counts, workload_ledger
from workbench.analysis.workload import notebook_workload
from workbench.viz import charts
from workbench.viz import controls as ui
from workbench.viz import display as wb
from workbench.viz.headline import headline
from workbench.viz.panel import panel

wb.setup()
w = notebook_workload(model, per_domain, workload_prompt_tokens, workload_max_tokens, small, progress=not wb.is_static())
ledger, tables = workload_ledger(w, live=live and not small, cosine_layers=2 if small else max_layers,
                                 readpath_repeats=2 if small else 5,
                                 progress=not wb.is_static())
lengths = sorted(len(r.prompt_ids) for r in w.runs)
print(f"model: {w.model}; {len(w.runs)} prompts of {lengths[0]}-{lengths[-1]} teacher-forced tokens; "
      f"{len(ledger)} rows for {ledger['id'].nunique()} claim ids")
headline("Which of the documents' claims reproduce on our model?", headline_counts(ledger),
         "one verdict per claim id (its first row, the method closest to the document's); another model, so "
         "'differs' is a finding, not a failure",
         uncertainty=f"{len(w.runs)} workload prompts")

# %%
cols = ["id", "quantity", "seed_low", "seed_high", "ours", "low", "high", "pi_low", "pi_high", "n", "verdict",
        "reason", "timing", "rule", "method"]
comparable = ledger[~ledger["verdict"].isin(["not comparable", "not measurable here"])]
for doc, what in DOCS.items():
    t = comparable[comparable["doc"] == doc]
    wb.show_table(t[cols], f"The {doc} document, {what}: {len(t)} rows; "
                  + headline_counts(ledger[ledger["doc"] == doc]), precision=4)

# %% [markdown]
# ## Not comparable and not measurable here, apart

# %%
apart = ledger[ledger["verdict"].isin(["not comparable", "not measurable here"])]
wb.show_table(apart[["doc", "id", "quantity", "seed", "ours", "verdict", "reason", "method"]],
              f"{apart['id'].nunique()} claims ({len(apart)} rows) with no verdict on this model, and why", precision=4)

# %% [markdown]
# ## Contrasts: the paired difference per prompt
#
# Each dot is one prompt's (or one read-path repeat's) difference A − B; the bar is the 95%
# interval of the mean difference; the dashed line is no difference.

# %%
contrasts = ledger[(ledger["quantity"] == "paired difference") & (ledger["per_prompt"].map(len) > 0)]
for i, (_, row) in enumerate(contrasts.iterrows()):
    wb.show(charts.paired_difference_chart(row), f"contrast_{i}")

# %%
measured = ledger[ledger["ours"].notna() & (ledger["quantity"] != "paired difference")]
wb.show(charts.ledger_chart(measured[measured["verdict"].isin(["reproduced", "differs"])]), "ledger")

# %% [markdown]
# ## The seed's own arithmetic and the constructed cases

# %%
seed_rows = ledger[ledger["measured_on"] != str(w.model)]
wb.show_table(seed_rows[["id", "quantity", "seed", "ours", "method", "rule", "verdict", "note"]],
              "Arithmetic on the seed's own numbers and constructed cases", precision=4)

# %% [markdown]
# ## Live: filter by document, area and verdict

# %%
def render(doc, area, verdict):
    t = ledger if doc == "all" else ledger[ledger["doc"] == doc]
    t = t if area == "all" else t[t["area"] == area]
    if verdict != "all":
        t = t[t["verdict"] == verdict]
    out = [wb.table(t[cols], f"{len(t)} rows, {t['id'].nunique()} claims", precision=4)]
    lv = t[t["ours"].notna() & (t["quantity"] != "paired difference") & t["verdict"].isin(["reproduced", "differs"])]
    if len(lv):
        out.insert(0, ("ledger_live", charts.ledger_chart(lv)))
    return out


panel(render, {
    "doc": ui.dropdown("document", ["all"] + list(DOCS)),
    "area": ui.dropdown("area", ["all"] + sorted(ledger["area"].unique())),
    "verdict": ui.dropdown("verdict", ["all", "reproduced", "differs", "not comparable", "not measurable here"]),
}, name="ledger_live", title="Ledger", static=False)
