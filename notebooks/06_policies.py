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
# # 06 · Cache policies: replay, offline bounds, hit curves
#
# A recorded routing trace is enough to replay any eviction policy CPU-side (the simulator
# uses the same policy classes as the engine). Two offline bounds frame the results:
#
# * **Belady MIN**: the best any policy can do with uniform expert sizes (it knows the future);
# * **static knapsack**: the best *static* pinning (a fixed resident set chosen from the trace's
#   access counts) at a byte budget. Reference: 45.0 % at 9 GB vs LRU 53.0 %.
#
# When libCacheSim's Python package is installed, the same request stream (exported in its
# oracleGeneral format) is replayed there as a cross-check.

# %% tags=["parameters"]
model = None            # mlx-lm model dir; None: the shipped reference model
prompt = None           # text or token ids; None: the first held-out workload prompt
max_tokens = 96         # decoded tokens in the recorded trace
policies = "lru,slru,twohit,s3fifo,lfu,ds4,fifo"  # policies to compare
arena = 0.25            # arena for the live panel, share of all routed experts
per_domain = 4      # workload: prompts from each of in-domain, held-out and shifted-domain text
workload_prompt_tokens = 128  # workload: teacher-forced tokens of each prompt's text
workload_max_tokens = 32      # workload: greedy tokens decoded after them
slru_arenas = "0.1,0.25,0.5"  # SLRU-cold table: arena sizes (shares of routed experts)
slru_tokens = 32        # SLRU-cold table: decode tokens per run
small = False           # CI preset (fewer tokens, one prompt per domain)

# %%
import numpy as np
import pandas as pd

from workbench.analysis import bounds
from workbench.arena.policies import POLICIES as REGISTRY
from workbench.arena.policies import load_all
from workbench.sim.replay import replay_grid
from workbench.viz import charts
from workbench.viz import controls as ui
from workbench.viz import counter_charts
from workbench.viz import display as wb
from workbench.viz.headline import headline
from workbench.viz.panel import panel
from workbench.viz.session import record

wb.setup()
run = record(model, prompt, max_tokens=max_tokens)
trace = run.trace
keys = np.concatenate([np.asarray(s, dtype=np.int64) + int(layer) * trace.n_experts
                       for layer, s in zip(trace.decode()["layer"], trace.decode()["selected"])])
n_routed = trace.n_experts * len(trace.moe_layers)
POLICIES = [s.strip() for s in policies.split(",") if s.strip()]
load_all()
ARENAS = [0.05, 0.1, 0.15, 0.2, 0.25, 0.35, 0.5, 0.75, 1.0]
print(f"model: {run.model}; {len(keys)} decode requests over {n_routed} routed experts")

# %% [markdown]
# ## Hit rate vs arena size, every policy and Belady MIN
#
# Every replay starts empty, Belady's included; so the knapsack line is charged one cold miss per
# pinned expert (the line without that charge, which assumes the set was loaded before the run,
# is in the table at the end). A static set may still pass Belady: it declines to admit the
# experts it does not pin, which demand-paging MIN (every miss admitted) cannot. The x axis is
# the arena in GB of expert weights.

# %%
grid = replay_grid(trace, policies=POLICIES, arenas=[str(a) for a in ARENAS], phase="decode", progress=True)
grid["arena_share"] = grid["capacity"] / n_routed
belady = pd.DataFrame([{"policy": "belady", "capacity": c, "arena_share": c / n_routed,
                        "hit_rate": 1 - bounds.belady_misses(keys, int(c)) / len(keys)}
                       for c in sorted(grid["capacity"].unique())])
eb = int(trace.meta.get("expert_bytes") or 1)
kb = bounds.knapsack_bound(trace, [int(c) * eb for c in sorted(grid["capacity"].unique())], phase="decode")
kb["policy"], kb["capacity"] = "knapsack", kb["budget_bytes"] // eb
kb["arena_share"] = kb["capacity"] / n_routed
cold = kb.assign(hit_rate=kb["hit_rate_cold"])
curves = pd.concat([grid[["policy", "capacity", "arena_share", "hit_rate"]], belady,
                    cold[["policy", "capacity", "arena_share", "hit_rate"]]], ignore_index=True)
curves["arena_GB"] = curves["capacity"] * eb / 1e9
wb.show(charts.hit_curve_chart(curves, x="arena_GB", y="hit_rate", color="policy").properties(
    title=charts._title("Hit rate vs arena size", ["decode requests replayed per policy; belady: offline optimum",
                                                   "knapsack: best static pinning, charged its cold misses"])),
    "hit_curves_policies")
wb.show_table(pd.DataFrame([{"policy": name, "what it does": (cls.__doc__ or "").strip().splitlines()[0]}
                            for name, cls in sorted(REGISTRY.items()) if name in POLICIES]),
              caption="the policies compared (one line each, from their classes)")

# %% [markdown]
# ## Hit rate per policy and arena over the workload (replay, 95% intervals)

# %%
from workbench.analysis.workload import notebook_workload, replay_ci

w = notebook_workload(model, per_domain, workload_prompt_tokens, workload_max_tokens, small, progress=not wb.is_static())
rep = replay_ci(w.traces(), policies=POLICIES[:3] if small else POLICIES, arenas=(0.1, 0.176, 0.25, 0.5))
wb.show(charts.interval_chart(rep, "arena", "hit_rate", color="policy", y_format="%",
                              x_title="arena, share of routed experts (share)",
                              title="Replay hit rate over the workload (decode rows)"), "replay_workload")
at = rep[np.isclose(rep["arena"].astype(float), 0.25)]
top = at.loc[at["hit_rate"].idxmax()]
headline("Which eviction policy keeps the right experts resident?",
         f"{top['policy']}: hit rate {top['hit_rate']:.1%} at a 25% arena (best of {len(at)} policies replayed)",
         "replay of recorded decode routes (no read-ahead); the bounds above frame what any policy could do",
         uncertainty=f"95% interval over prompts: {top['low']:.1%}-{top['high']:.1%}")

# %% [markdown]
# ## SLRU-cold vs LRU on the live engine
#
# The second seed: SLRU-cold read 48.56 → 47.84 GB at an 8 GB arena and 40.53 → 39.58 GB at
# 10 GB over 32 decode tokens ("small, but free"). Here each workload prompt runs on a fresh
# engine per policy and arena size, plain streaming (no read-ahead), its bytes read and
# tokens/s measured; the last rows are the paired per-prompt differences, absolute and
# relative, beside the seed's relative saving.

# %%
from workbench.analysis.live import policy_runs, policy_table, seed_slru_saving, with_interval_text

arenas_slru = [float(a) for a in slru_arenas.split(",") if a.strip()]
pol = policy_table(policy_runs(w, ("lru", "slru"), arenas_slru[1:2] if small else arenas_slru,
                               max_tokens=4 if small else slru_tokens, progress=not wb.is_static()))
wb.show(charts.policy_ci_chart(pol, "mb_read", "Decode bytes read, LRU vs SLRU-cold", "decode bytes read (MB)"), "slru_bytes")

# %%
wb.show(charts.policy_ci_chart(pol, "tokens_per_s", "Decode speed, LRU vs SLRU-cold", "decode speed (tokens/s)"), "slru_speed")

# %%
pol["value [95% interval]"] = with_interval_text(pol)
print("seed's relative saving of SLRU-cold in bytes read: "
      + ", ".join(f"{gb} GB arena: {v:+.2%}" for gb, v in seed_slru_saving().items()))
wb.show_table(pol.pivot(index=["metric", "arena"], columns="policy", values="value [95% interval]").reset_index(),
              "LRU vs SLRU-cold over the workload (value [95% interval over prompts])")

# %% [markdown]
# ## Static pinning bound vs recency
#
# At each arena size: LRU's hit rate beside the best static pinning's upper bound. Where the
# bound is below LRU, no fixed resident set can beat recency on this trace.

# %%
lru = grid[grid["policy"] == "lru"].set_index("capacity")["hit_rate"]
side = kb.set_index("capacity")[["budget_bytes", "hit_rate", "keys_pinned"]].rename(
    columns={"hit_rate": "static bound hit rate", "budget_bytes": "budget (bytes)"})
side["LRU hit rate"] = lru
side["arena share"] = side.index / n_routed
wb.show_table(side.reset_index()[["arena share", "capacity", "budget (bytes)", "static bound hit rate", "LRU hit rate",
                                  "keys_pinned"]], "Static pinning bound vs LRU")

# %% [markdown]
# ## Per-layer hit curves (LRU stack distances)

# %%
hc = bounds.hit_curves(trace, range(1, trace.n_experts + 1, max(1, trace.n_experts // 16)), phase="decode")
wb.show(charts.hit_curve_chart(hc.astype({"layer": str}), x="slots", y="hit_rate", color="layer").properties(
    title=charts._title("LRU hit rate vs slots per layer", "each layer its own cache")), "hit_curves_layers")

# %% [markdown]
# ## libCacheSim cross-check

# %%
import tempfile
from pathlib import Path

from workbench.sim.export import export_oraclegeneral
from workbench.sim.replay import replay_keys

try:
    import libcachesim as lcs
except ImportError:
    lcs = None
if lcs is None:
    print("libCacheSim is not installed (pip install libcachesim): cross-check skipped")
else:
    path = Path(tempfile.mkdtemp()) / "trace.oracleGeneral.bin"
    n = export_oraclegeneral(trace, path, size=1, phase="decode")
    rows = []
    for share in (0.1, 0.25, 0.5):
        cap = max(1, int(share * n_routed))
        ours = replay_keys(keys, policy="lru", capacity=cap, preload=False)
        reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
        theirs = lcs.LRU(cache_size=cap).process_trace(reader)
        rows.append({"arena share": share, "capacity (slots)": cap, "requests": n,
                     "workbench LRU miss ratio": ours.misses / len(keys),
                     "libCacheSim LRU miss ratio": float(theirs[0] if isinstance(theirs, tuple) else theirs)})
    wb.show_table(pd.DataFrame(rows), "LRU miss ratio: workbench replay vs libCacheSim (same request stream)")

# %% [markdown]
# ## Live: one arena, all policies

# %%
def render(arena_share, chosen):
    g = replay_grid(trace, policies=list(chosen), arenas=[f"{arena_share:.4f}"], phase="decode")
    cap = int(g["capacity"].iloc[0])
    b = 1 - bounds.belady_misses(keys, cap) / len(keys)
    g = pd.concat([g, pd.DataFrame([{"policy": "belady", "hit_rate": b, "misses": int(round((1 - b) * len(keys)))}])])
    g["miss rate"] = 1 - g["hit_rate"]
    return counter_charts.compare_chart(g.rename(columns={"policy": "policy", "hit_rate": "hit rate"}), "policy",
                                        ["hit rate", "misses"], f"Policies at {arena_share:.0%} of experts ({cap} slots)",
                                        "decode requests; belady: offline optimum", fmt=",.3f",
                                        labels={"hit rate": "hit rate (share)", "misses": "misses (count)"})


panel(render, {
    "arena_share": ui.slider("arena (share of experts)", 0.05, 1.0, 0.05, value=float(arena), readout_format=".0%"),
    "chosen": ui.select_many("policies", POLICIES),
}, name="policies_live", title="Policies side by side")
