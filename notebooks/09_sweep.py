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
# With `sweep_dir = None` it first runs a small sweep here, on a trace of the reference model:
#
#     workbench sweep TRACE --policy lru,fifo,slru --arena 0.1,0.25,0.5 --predictor none,oracle --out DIR

# %% tags=["parameters"]
sweep_dir = None        # a sweep dataset (workbench sweep --out DIR); None: run a sweep here
model = None            # for the sweep here: mlx-lm model dir; None: the shipped reference model
max_tokens = 64         # decoded tokens in the trace the sweep here replays
policies = "lru,fifo,slru,twohit,s3fifo"  # the sweep here: policies
arenas = "0.1,0.25,0.5"  # the sweep here: arenas (any --arena form)
predictors = "none,oracle"  # the sweep here: read-ahead sources
workers = 2             # the sweep here: local Dask worker processes
small = False           # CI preset (a tiny sweep)

# %%
import tempfile

from workbench.sim.sweep import Grid, load_sweep, sweep
from workbench.viz import controls as ui
from workbench.viz import display as wb
from workbench.viz import sweep as sv
from workbench.viz.panel import panel
from workbench.viz.session import record

wb.setup()
if sweep_dir is None:
    run = record(model, max_tokens=max_tokens)
    sweep_dir = tempfile.mkdtemp(prefix="wb-sweep-")
    grid = Grid(traces=[("reference", str(run.path))], policies=policies.split(","), arenas=arenas.split(","),
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
