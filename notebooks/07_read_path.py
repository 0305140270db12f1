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
# # 07 · Read path: is the store's read path at the device's limit?
#
# Streaming decode is bounded by how fast expert blobs reach arena slots. We compare, cold
# (page cache dropped) and warm, in each read mode this OS offers:
#
# * a plain **sequential read** of the experts file: the device's practical limit,
# * the **store's blob reads** into preallocated arena slots (`preadv`, zero-copy) through the
#   real I/O scheduler at 1..N threads,
# * single-thread copies: `pread` into a heap buffer, `pread` into a fresh array, `preadv` into
#   a slot.
#
# Reference (24 GB M4, 1.18 MB blocks): 1.89 / 1.49 / 2.62 GB/s for heap / fresh array / slot.
# Small blobs (our reference model's experts are far smaller than 1 MB) are latency-bound:
# pass `store=` a store with big experts (e.g. `bench/bench_readpath.py` builds one) to study
# the SSD regime of a large model.

# %% tags=["parameters"]
store = None              # a workbench store (or mlx-lm model dir); None: the reference model's store
threads = "1,2,4,8"       # I/O worker counts to try
modes = "buffered,dontneed,direct"  # read modes to try (those this OS lacks are skipped)
reps = 3                  # repeats per point (the chart draws their range, the table their median)
small = False             # CI preset (two thread counts and two modes; the repeats stay)

# %%
import platform

import pandas as pd

from workbench.store.cache import resolve_store
from workbench.io.readpath import blobs_gbps, read_path_table, sequential_gbps
from workbench.store.manifest import EXPERTS, Manifest
from workbench.store.reader import available_modes
from workbench.viz import charts
from workbench.viz import controls as ui
from workbench.viz import display as wb
from workbench.viz.headline import headline
from workbench.viz.panel import panel
from workbench.viz.session import model_path

wb.setup()
store_dir = resolve_store(model_path(store))
m = Manifest.load(store_dir)
THREADS = [int(t) for t in str(threads).split(",") if t.strip()][: 2 if small else None]
MODES = [x for x in str(modes).split(",") if x.strip() in available_modes()][: 2 if small else None]
print(f"store: {store_dir}\n{len(m.blobs)} blobs of {m.expert_bytes / 1e6:.3f} MB "
      f"({len(m.blobs) * m.expert_bytes / 1e6:.1f} MB in all); read modes here: {', '.join(available_modes())}; "
      f"{platform.system()} {platform.machine()}")

# %%
table = read_path_table(store_dir, threads=THREADS, modes=MODES, reps=reps)
wb.show_table(table[table.cold].drop(columns="cold"),
              f"Cold (page cache dropped first): GB/s and the share of a sequential read of the same file, the "
              f"device's limit (median, min and max of {reps} repeats)")
wb.show_table(table[~table.cold].drop(columns=["cold", "share_of_sequential"]),
              f"Warm: every read comes from the OS page cache, so this is memory bandwidth and no device limit "
              f"applies (median, min and max of {reps} repeats)")

# %%
reads = table[table.method.str.startswith("store")]  # what the engine does: blobs into slots
reads = reads[reads.cold]  # the device's limit is a cold question; warm reads are the page cache's
best = reads.loc[reads["share_of_sequential"].idxmax()]
random_best = reads[reads.method.str.contains("random")]["share_of_sequential"].max()
headline("Is the store's read path at the device's sequential limit?",
         f"{best['share_of_sequential']:.0%} of a sequential read of the same file "
         f"({best['gbps']:.2f} GB/s: {best['method']} into slots, {best['mode']}, {int(best['threads'])} threads, "
         f"{'cold' if best['cold'] else 'warm'})",
         f"decode reads blobs in random order: at best {random_best:.0%} of the sequential read here; "
         f"{m.expert_bytes / 1e6:.3f} MB blobs are latency-bound, a large model's experts (MBs each) test the "
         "SSD regime (pass store=)",
         uncertainty=f"median of {reps} repeats, range {best['gbps_min']:.2f}-{best['gbps_max']:.2f} GB/s")

# %%
wb.show(charts.readpath_chart(table, subtitle=f"{m.expert_bytes / 1e6:.3f} MB blobs; "
                                              "grey: one sequential read of the same file, same mode"), "read_path")

# %% [markdown]
# ## Live: one mode, one thread count
#
# Each change re-reads every blob of the store (cold drops the page cache first).

# %%
def render(mode, n_threads, cold):
    seq = sequential_gbps(store_dir / EXPERTS, mode, cold=cold)
    rows = [dict(method="sequential", mode=mode, threads=1, cold=cold, gbps=seq)]
    for order in ("random", "file"):  # the orders the table measures, so the best here is the headline's method
        for t in sorted({1, n_threads}):
            rows.append(dict(method=f"store blobs, {order} order", mode=mode, threads=t, cold=cold,
                             gbps=blobs_gbps(store_dir, mode, t, cold=cold, order=order)))
    df = pd.DataFrame(rows)
    df["share_of_sequential"] = df["gbps"] / seq
    best = df[df.method != "sequential"]["share_of_sequential"].max()
    what = (f"{best:.0%} of the sequential read ({seq:.2f} GB/s)" if cold else
            f"{df[df.method != 'sequential'].gbps.max():.2f} GB/s from the page cache (warm: no device limit applies)")
    sub = f"{m.expert_bytes / 1e6:.3f} MB blobs, {len(m.blobs)} of them; grey: one sequential read of the same file"
    return [("read_path_live", charts.readpath_chart(df, title=f"Read path, live: {mode}, {n_threads} threads", subtitle=sub)),
            f"This live read (one repeat, `{mode}`, {n_threads} threads, {'cold' if cold else 'warm'}): best store "
            f"read {what}. One repeat moves a lot: the page's answer is the headline above (median of {reps})."]


panel(render, {
    "mode": ui.dropdown("read mode", MODES, value=MODES[0]),
    "n_threads": ui.slider("I/O threads", 1, 16, 1, value=max(THREADS)),
    "cold": ui.checkbox("cold (drop the page cache first)", True),
}, name="read_path_live", title="Read path")
