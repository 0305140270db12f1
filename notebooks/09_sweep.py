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
# # 09 · Policy sweeps: sync misses and bytes per token over policy x arena
#
# `workbench sweep` runs a grid (policy x arena x predictor x gate x workload) of simulator
# cells on Dask and writes one Parquet row per cell. This notebook reads such a dataset and
# draws, per predictor, heatmaps of **sync misses** (reads the decode loop waits for) and
# **bytes read per token** over policy x arena. Read the two together: read-ahead that trades
# sync misses for many more bytes is moving cost, not removing it.
#
# With `sweep_dir = None` it first runs a small sweep here, on the traces of the workload prompts
# (one workload per prompt) of the reference model, as
#
#     workbench sweep TRACE... --policy lru,fifo,slru --arena 0.1,0.25,0.5 --predictor none,oracle --out DIR
#
# so that the headline at the end carries a 95% interval over prompts.

# %% tags=["parameters"]
sweep_dir = None        # a sweep dataset (workbench sweep --out DIR); None: run a sweep here
model = None            # for the sweep here: mlx-lm model dir; None: the shipped reference model
max_tokens = 32         # the sweep here: greedy tokens decoded after each workload prompt
per_domain = 4          # the sweep here: prompts from each of in-domain, held-out and shifted-domain text
prompt_tokens = 128     # the sweep here: teacher-forced tokens of each prompt's text
policies = "lru,fifo,slru,twohit,s3fifo"  # the sweep here: policies
arenas = "0.1,0.25,0.5"  # the sweep here: arenas (any --arena form)
predictors = "none,oracle"  # the sweep here: read-ahead sources
workers = 2             # the sweep here: local Dask worker processes
small = False           # CI preset (a tiny sweep)

# %%
import tempfile

from workbench.analysis.workload import notebook_workload
from workbench.sim.sweep import Grid, load_sweep, sweep
from workbench.viz import controls as ui
from workbench.viz import display as wb
from workbench.viz import sweep as sv
from workbench.viz.panel import panel

wb.setup()
if sweep_dir is None:
    w = notebook_workload(model, per_domain, prompt_tokens, max_tokens, small, progress=not wb.is_static())
    sweep_dir = tempfile.mkdtemp(prefix="wb-sweep-")
    grid = Grid(traces=[(r.prompt.id, str(r.path)) for r in w.runs], policies=policies.split(","), arenas=arenas.split(","),
                predictors=predictors.split(","))
    res = sweep(grid, sweep_dir, workers=workers, progress=not wb.is_static())
    print(f"ran {res.ran} cells on {workers} workers in {res.seconds:.1f} s -> {sweep_dir}")
df = load_sweep(sweep_dir)
print(f"{len(df)} cells; " + "; ".join(f"{a}: {', '.join(sv.axis_values(df, a))}" for a in sv.SLICE_AXES))

# %% [markdown]
# ## Per predictor: sync misses and bytes per token

# %%
for pred in sv.axis_values(df, "predictor"):
    for metric in ("sync_misses", "bytes_per_token"):
        if metric in df.columns:
            wb.show(sv.slice_heatmap(df, metric, predictor=pred), f"{metric}_{pred}".replace(".", "_"))

# %% [markdown]
# ## What read-ahead buys, with its interval
#
# Sync misses per decode token with oracle read-ahead against none, for one policy at the
# sweep's middle arena, paired per workload and bootstrapped over workloads; bytes per token
# beside it, since read-ahead can trade one for the other.

# %%
from workbench.analysis.sweep_ci import paired_change
from workbench.viz.headline import headline

preds = set(sv.axis_values(df, "predictor"))
pol = "lru" if "lru" in set(df["policy"]) else sorted(set(df["policy"]))[0]
mid = df.drop_duplicates("arena").sort_values("slots")["arena"].tolist()
mid = mid[len(mid) // 2]
ahead = next((p for p in ("oracle", "layer") if p in preds), None)
if "none" in preds and ahead:
    per_token = df.assign(sync_misses_per_token=df["sync_misses"] / df["tokens"].clip(lower=1))
    sm = paired_change(per_token, "sync_misses_per_token", other=ahead, policy=pol, arena=mid, gate="none")
    by = paired_change(df, "bytes_per_token", other=ahead, policy=pol, arena=mid, gate="none")
    headline("How much do sync misses fall with read-ahead, and what does it cost in bytes read?",
             f"{ahead} read-ahead: {-sm['value']:.0%} fewer sync misses for {pol} at a {mid} arena "
             f"({sm['base_mean']:,.2f} to {sm['other_mean']:,.2f} per decode token); bytes per token {by['value']:+.0%}",
             f"virtual-time replay of recorded decode routes, not the live engine; {ahead} read-ahead "
             + ("knows the future routes, an upper bound for any predictor" if ahead == "oracle" else "is the layer predictor")
             + f"; {sm['n_workloads']} workload(s) of one model",
             uncertainty=f"95% interval over {sm['n_workloads']} workloads: {-sm['high']:.0%} to {-sm['low']:.0%} fewer "
                         f"sync misses; bytes per token {by['low']:+.0%} to {by['high']:+.0%}")

# %% [markdown]
# ## Live: pick the slice

# %%
def render(metric, predictor, workload, gate):
    return sv.slice_heatmap(df, metric, predictor=predictor, workload=workload, gate=gate)


panel(render, {
    "metric": ui.dropdown("metric", [m for m in sv.METRICS if m in df.columns]),
    "predictor": ui.dropdown("predictor", sv.axis_values(df, "predictor")),
    "workload": ui.dropdown("workload", sv.axis_values(df, "workload")),
    "gate": ui.dropdown("gate", sv.axis_values(df, "gate")),
}, name="sweep_live", title="Sweep slice")
