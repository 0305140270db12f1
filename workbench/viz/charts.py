"""One altair chart per analysis table (workbench.analysis.*).

Every chart takes the tidy DataFrame its analysis returns, aggregates before plotting (so the
inlined data stays small), and uses one colour scheme (``workbench.viz.palette``): a predictor source, policy or drafter
keeps its colour across charts.
Save with ``workbench.viz.render.save_chart``.
"""

from __future__ import annotations

import textwrap

import altair as alt
import numpy as np
import pandas as pd

from .palette import PALETTE, color_of, color_scale, natural_key, natural_sorted


# Axis titles, with their units, of the columns charts pick by name.
AXIS_TITLES = {
    "slots": "arena slots (count)", "capacity": "arena slots (count)", "slots_per_layer": "slots per layer (count)",
    "budget_bytes": "arena (bytes)", "arena_GB": "arena (GB)", "arena_gb": "arena (GB)",
    "hit_rate": "hit rate (%)", "hit_ratio": "hit rate (%)", "hits": "hits (count)",
}


def _title(text, subtitle=None):
    return alt.TitleParams(text, subtitle=subtitle or [], anchor="start")


# --------------------------------------------------------------------------- lookahead
def lookahead_chart(table: pd.DataFrame) -> alt.HConcatChart:
    """Left: recovery by layer per source (k' = k). Right: mean recovery vs candidates k' per source."""
    t = table.copy()
    t["source"] = t["source"].astype(str)
    order = sorted(t["source"].unique(), key=lambda s: (s == "prev_token", natural_key(s)))
    sc = color_scale(order)
    base = t[t["k_pred"] == t["k"]]
    k = int(base["k"].iloc[0]) if len(base) else int(t["k"].iloc[0])
    by_layer = alt.Chart(base, title=_title("Lookahead recovery by layer", f"top-{k}, |pred ∩ actual| / k")).mark_line(point=True).encode(
        x=alt.X("layer:O", title="layer", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("recovery:Q", title="recovery of actual top-k (%)", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("source:N", scale=sc, sort=order, title="predictor source"),
        tooltip=["source", "layer", alt.Tooltip("recovery:Q", format=".1%"), "n"],
    ).properties(width=360, height=240)
    summ = t.groupby(["source", "k_pred"], as_index=False)["recovery"].mean()
    by_k = alt.Chart(summ, title=_title("Recovery vs candidates read", "mean over layers")).mark_line(point=True).encode(
        x=alt.X("k_pred:Q", title="candidates read per layer k' (count)", scale=alt.Scale(zero=False), axis=alt.Axis(values=sorted(int(v) for v in summ["k_pred"].unique()), format="d")),
        y=alt.Y("recovery:Q", title="coverage of actual top-k (%)", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("source:N", scale=sc, sort=order, title="predictor source"),
        tooltip=["source", "k_pred", alt.Tooltip("recovery:Q", format=".1%")],
    ).properties(width=260, height=240)
    return alt.hconcat(by_layer, by_k)


# --------------------------------------------------------------------------- cosine
def cosine_chart(pairs_or_hist: pd.DataFrame, summary: pd.DataFrame | None = None, bins: int = 40) -> alt.Chart:
    """Histogram of pairwise expert cosine (all layers pooled), with the mean marked."""
    from workbench.analysis.cosine import cosine_histogram

    h = pairs_or_hist if "bin_lo" in pairs_or_hist.columns else cosine_histogram(pairs_or_hist, bins)
    pooled = h.groupby(["bin_lo", "bin_hi"], as_index=False)["count"].sum()
    pooled["share"] = pooled["count"] / max(1, pooled["count"].sum())
    mean = None
    if summary is not None:
        mean = float(summary["mean_cosine"].mean())
    elif "cosine" in pairs_or_hist.columns:
        mean = float(pairs_or_hist["cosine"].mean())
    sub = f"mean {mean:+.3f} over {h['layer'].nunique()} layer(s)" if mean is not None else None
    bars = alt.Chart(pooled, title=_title("Pairwise cosine of flattened experts", sub)).mark_bar(color=PALETTE[0]).encode(
        x=alt.X("bin_lo:Q", bin="binned", title="cosine similarity (unitless)"), x2="bin_hi:Q",
        y=alt.Y("share:Q", title="expert pairs (%)", axis=alt.Axis(format="%")),
        tooltip=[alt.Tooltip("bin_lo:Q", format=".3f"), alt.Tooltip("bin_hi:Q", format=".3f"), "count:Q"],
    )
    layers = [bars]
    if mean is not None:
        layers.append(alt.Chart(pd.DataFrame({"mean": [mean]})).mark_rule(color=PALETTE[2], strokeDash=[4, 3]).encode(x="mean:Q"))
    return alt.layer(*layers).properties(width=420, height=240)


def energy_chart(energy: pd.DataFrame, share: float | None = 0.9, max_layers: int = 12) -> alt.Chart:
    """Cumulative singular-value energy share vs rank, one line per layer (at most ``max_layers``)."""
    e = energy.copy()
    layers = sorted(e["layer"].unique())
    if len(layers) > max_layers:
        keep = [layers[i] for i in np.linspace(0, len(layers) - 1, max_layers).round().astype(int)]
        e = e[e["layer"].isin(keep)]
    n = int(e["rank"].max())
    lines = alt.Chart(e, title=_title("Singular-value energy of stacked experts",
                                      f"E x P matrix per layer, {n} experts{' (mean removed)' if e['centered'].any() else ''}")).mark_line().encode(
        x=alt.X("rank:Q", title="rank: singular vectors kept (count)"),
        y=alt.Y("energy_share:Q", title="cumulative energy share (%)", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("layer:O", title="layer", scale=alt.Scale(scheme="viridis")),
        tooltip=["layer", "rank", alt.Tooltip("energy_share:Q", format=".1%")],
    )
    parts = [lines]
    if share is not None:
        parts.append(alt.Chart(pd.DataFrame({"share": [share]})).mark_rule(color="#888", strokeDash=[4, 3]).encode(y="share:Q"))
    return alt.layer(*parts).properties(width=420, height=240)


# --------------------------------------------------------------------------- gates
def gate_slot_chart(table: pd.DataFrame) -> alt.Chart:
    """Mean normalized gate weight by slot: thin line per layer, mean over layers bold."""
    mean = table.groupby("slot", as_index=False)["mean_weight"].mean()
    k = int(table["slot"].max())
    per_layer = alt.Chart(table).mark_line(opacity=0.25, color=PALETTE[0]).encode(
        x=alt.X("slot:O", title="slot (1 = strongest)", axis=alt.Axis(labelAngle=0)), y=alt.Y("mean_weight:Q"), detail="layer:N")
    avg = alt.Chart(mean).mark_line(point=True, color=PALETTE[2], strokeWidth=3).encode(
        x="slot:O", y=alt.Y("mean_weight:Q", title="mean normalized gate weight (share)"),
        tooltip=["slot", alt.Tooltip("mean_weight:Q", format=".3f")])
    even = alt.Chart(pd.DataFrame({"even": [1 / k]})).mark_rule(color="#888", strokeDash=[4, 3]).encode(y="even:Q")
    return alt.layer(per_layer, avg, even).properties(
        width=380, height=240, title=_title("Gate weight by slot", f"thin: each layer, bold: mean; dashed: 1/k = {1 / k:.3f}"))


def drop_weakest_chart(table: pd.DataFrame) -> alt.Chart:
    """Relative L2 error of the MoE output vs number of weakest experts dropped (mean over layers, band = min..max)."""
    t = table.copy()
    t["renorm"] = t["renorm"].map({True: "renormalized", False: "not renormalized"})
    agg = t.groupby(["dropped", "renorm"], as_index=False).agg(rel_error=("rel_error", "mean"), lo=("rel_error", "min"),
                                                               hi=("rel_error", "max"))
    sc = alt.Scale(domain=["not renormalized", "renormalized"], range=[PALETTE[0], PALETTE[1]])
    line = alt.Chart(agg).mark_line(point=True).encode(
        x=alt.X("dropped:O", title="weakest experts dropped", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("rel_error:Q", title="relative L2 error of block output (%)", axis=alt.Axis(format="%")),
        color=alt.Color("renorm:N", scale=sc, title="kept weights"),
        tooltip=["dropped", "renorm", alt.Tooltip("rel_error:Q", format=".1%")])
    band = alt.Chart(agg).mark_area(opacity=0.15).encode(x="dropped:O", y="lo:Q", y2="hi:Q",
                                                         color=alt.Color("renorm:N", scale=sc))
    return alt.layer(band, line).properties(width=380, height=240,
                                            title=_title("Drop-weakest block error", "mean over layers; band: layer min..max"))


# --------------------------------------------------------------------------- union and speedup
def union_chart(table: pd.DataFrame, slope: float | None = None) -> alt.Chart:
    """Distinct experts per window of g tokens: thin line per layer, mean bold, linear fit and no-overlap k·g dashed."""
    k = table.attrs.get("k")
    layer_rows = table[table["scope"] == "layer"] if "scope" in table.columns else table
    mean = table[table["scope"] == "mean"] if "scope" in table.columns else table.groupby("g", as_index=False)["union"].mean()
    k = k or float(mean.loc[mean["g"] == mean["g"].min(), "union"].iloc[0])
    gs = np.arange(1, int(mean["g"].max()) + 1)
    ref = [pd.DataFrame({"g": gs, "union": k * gs, "curve": "no overlap (k·g)"})]
    if slope is not None:
        ref.append(pd.DataFrame({"g": gs, "union": k * (1 + slope * (gs - 1)), "curve": f"fit k(1+{slope:.2f}(g-1))"}))
    ref = pd.concat(ref)
    parts = []
    if len(layer_rows):
        parts.append(alt.Chart(layer_rows.astype({"layer": "int64"})).mark_line(opacity=0.2, color=PALETTE[0]).encode(
            x="g:Q", y="union:Q", detail="layer:N"))
    parts.append(alt.Chart(ref).mark_line(strokeDash=[4, 3]).encode(
        x="g:Q", y="union:Q", color=alt.Color("curve:N", title="", scale=alt.Scale(range=["#888", PALETTE[1]]))))
    parts.append(alt.Chart(mean[["g", "union"]]).mark_line(point=alt.OverlayMarkDef(color=PALETTE[2]), color=PALETTE[2],
                                                           strokeWidth=3).encode(
        x=alt.X("g:Q", title="window g, consecutive tokens (count)", axis=alt.Axis(values=[int(g) for g in gs], format="d")), y=alt.Y("union:Q", title="distinct experts per layer (count)"),
        tooltip=["g", alt.Tooltip("union:Q", format=".2f")]))
    return alt.layer(*parts).properties(width=380, height=260,
                                        title=_title("Experts to read for a window of g tokens", f"top-{int(k)}; bold: mean over layers"))


def speedup_chart(grid: pd.DataFrame, title: str = "MTP speedup bound, streaming-bound decode") -> alt.Chart:
    """Streaming-bound speedup vs acceptance: one line per window g, best-over-g bold, 1x dashed."""
    g = grid.copy()
    best = g.loc[g.groupby("acceptance")["speedup"].idxmax()]
    lines = alt.Chart(g).mark_line(opacity=0.7).encode(
        x=alt.X("acceptance:Q", title="per-token acceptance a (%)", axis=alt.Axis(format="%")),
        y=alt.Y("speedup:Q", title="speedup bound (x plain decode)"),
        color=alt.Color("g:O", title="window g", scale=alt.Scale(scheme="tableau10")),
        tooltip=["g", alt.Tooltip("acceptance:Q", format=".0%"), alt.Tooltip("speedup:Q", format=".3f")])
    env = alt.Chart(best).mark_line(color="black", strokeWidth=2.5).encode(
        x="acceptance:Q", y="speedup:Q", tooltip=[alt.Tooltip("acceptance:Q", format=".0%"), "g", alt.Tooltip("speedup:Q", format=".3f")])
    one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="#888", strokeDash=[4, 3]).encode(y="y:Q")
    return alt.layer(lines, env, one).properties(width=420, height=260, title=_title(
        title, "E[tokens](g)/(union(g)/k); black: best g"))


def acceptance_chart(table: pd.DataFrame) -> alt.Chart:
    """Drafter acceptance by window g, one colour per drafter."""
    order = list(dict.fromkeys(table["drafter"]))
    return alt.Chart(table, title=_title("Drafter acceptance", "accepted / tested drafts, greedy target")).mark_bar().encode(
        x=alt.X("g:O", title="window g", axis=alt.Axis(labelAngle=0)), xOffset=alt.XOffset("drafter:N", sort=order),
        y=alt.Y("acceptance:Q", title="per-token acceptance (%)", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("drafter:N", scale=color_scale(order), sort=order, title="drafter"),
        tooltip=["drafter", "g", alt.Tooltip("acceptance:Q", format=".1%"), alt.Tooltip("tokens_per_pass:Q", format=".2f")],
    ).properties(width=380, height=240)


# --------------------------------------------------------------------------- calibration
def precision_chart(table: pd.DataFrame) -> alt.Chart:
    """Precision of predicted candidates by rank, per source, with Wilson 95% intervals."""
    t = table.groupby(["source", "rank"], as_index=False)[["n", "claimed"]].sum() if "layer" in table.columns else table.copy()
    if "ci_lo" not in t.columns or "layer" in table.columns:
        from workbench.analysis.calibration import _wilson

        t["precision"] = t["claimed"] / t["n"]
        t["ci_lo"], t["ci_hi"] = _wilson(t["claimed"], t["n"])
    order = natural_sorted(t["source"].astype(str).unique())
    sc = color_scale(order)
    pts = alt.Chart(t).mark_line(point=True).encode(
        x=alt.X("rank:O", title="candidate rank (1 = best)", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("precision:Q", title="precision: candidates claimed (%)", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("source:N", scale=sc, title="predictor source"),
        tooltip=["source", "rank", alt.Tooltip("precision:Q", format=".1%"), "n"])
    err = alt.Chart(t).mark_errorbar().encode(x=alt.X("rank:O", title="candidate rank (1 = best)"),
                                              y=alt.Y("ci_lo:Q", title="precision: candidates claimed (%)"), y2="ci_hi:Q",
                                              color=alt.Color("source:N", scale=sc))
    return alt.layer(err, pts).properties(width=380, height=240, title=_title("Predictor precision by rank", "bars: Wilson 95%"))


def reliability_chart(table: pd.DataFrame) -> alt.Chart:
    """Reliability diagram: mean predicted q vs observed claim frequency per bin (size = count)."""
    color = alt.Color("source:N", scale=color_scale(table["source"].unique(), sort=True), title="predictor source") \
        if "source" in table.columns else alt.value(PALETTE[0])
    diag = alt.Chart(pd.DataFrame({"q": [0.0, 1.0]})).mark_line(color="#888", strokeDash=[4, 3]).encode(x="q:Q", y="q:Q")
    pts = alt.Chart(table).mark_line(point=True).encode(
        x=alt.X("mean_q:Q", title="predicted probability q (share)", scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("observed:Q", title="observed claim frequency (share)", scale=alt.Scale(domain=[0, 1])),
        color=color, tooltip=[alt.Tooltip("mean_q:Q", format=".3f"), alt.Tooltip("observed:Q", format=".3f"), "n"])
    size = alt.Chart(table).mark_point(filled=True).encode(x="mean_q:Q", y="observed:Q", size=alt.Size("n:Q", title="candidates"), color=color)
    return alt.layer(diag, pts, size).properties(width=300, height=300, title=_title(
        "Reliability of claim probability q", "held-out trace; dashed: perfect calibration"))


# --------------------------------------------------------------------------- bounds
def hit_curve_chart(table: pd.DataFrame, x: str | None = None, y: str | None = None, color: str | None = None) -> alt.Chart:
    """Hit rate vs capacity. Column names are guessed (slots/capacity, hit_rate/hits, policy/layer) unless given."""
    cols = list(table.columns)
    x = x or next((c for c in ("slots", "capacity", "slots_per_layer", "budget_bytes") if c in cols), cols[0])
    y = y or next((c for c in ("hit_rate", "hits", "hit_ratio") if c in cols), cols[1])
    color = color or next((c for c in ("policy", "layer", "source") if c in cols), None)
    share = "rate" in y or "ratio" in y
    enc = dict(x=alt.X(f"{x}:Q", title=AXIS_TITLES.get(x, x.replace("_", " "))),
               y=alt.Y(f"{y}:Q", title=AXIS_TITLES.get(y, y.replace("_", " ")), axis=alt.Axis(format="%") if share else alt.Axis()),
               tooltip=[x, y] + ([color] if color else []))
    if color:
        enc["color"] = alt.Color(f"{color}:N", scale=color_scale(table[color].astype(str).unique(), sort=True), title=color)
    return alt.Chart(table.astype({color: str}) if color else table, title=_title("Hit rate vs capacity")).mark_line(point=True).encode(
        **enc).properties(width=400, height=250)


# --------------------------------------------------------------------------- ledger
def ledger_chart(ledger: pd.DataFrame) -> alt.Chart:
    """Ours / seed per measured level row with the 95% interval (also / seed), coloured by verdict;
    unmeasured rows and paired differences (``paired_difference_chart``) omitted. 1 = the seed's value."""
    t = ledger.dropna(subset=["ours"]).copy()
    t = t[(t["seed"] != 0) & (t.get("quantity", "") != "paired difference")]
    t["row"] = t["id"] + " · " + t["method"].map(lambda m: textwrap.shorten(str(m), 44, placeholder=" …"))
    for c in ("ours", "low", "high"):
        t[f"{c}_ratio"] = t[c] / t["seed"]
    sc = color_scale(["reproduced", "differs", "not comparable", "not measurable here"])
    y = alt.Y("row:N", title=None, sort=list(t["row"]))  # rows read "claim · method" (whole method in the tooltip)
    bars = alt.Chart(t).mark_rule().encode(y=y, x="low_ratio:Q", x2="high_ratio:Q",
                                           color=alt.Color("verdict:N", scale=sc, title="verdict"))
    dots = alt.Chart(t).mark_point(filled=True, size=60).encode(
        y=y, x=alt.X("ours_ratio:Q", title="ours / seed (ratio; bar: 95% interval)"),
        color=alt.Color("verdict:N", scale=sc, title="verdict"),
        tooltip=["id", "method", "seed", alt.Tooltip("ours:Q", format=".4f"), alt.Tooltip("low:Q", format=".4f"),
                 alt.Tooltip("high:Q", format=".4f"), "rule", "verdict"])
    one = alt.Chart(pd.DataFrame({"x": [1.0]})).mark_rule(color="#888", strokeDash=[4, 3]).encode(x="x:Q")
    return alt.layer(one, bars, dots).properties(width=360, height=max(120, 14 * len(t)),
                                                 title=_title("Claims ledger", "1 = the seed's value; verdict by each row's rule"))


def paired_difference_chart(row) -> alt.LayerChart:
    """One contrast row of the ledger (quantity "paired difference"): one dot per prompt (or
    repeat), the mean with its 95% interval, and 0 (no difference)."""
    pts = pd.DataFrame({"unit": range(1, len(row["per_prompt"]) + 1), "difference": row["per_prompt"]})
    iv = pd.DataFrame({"mean": [row["ours"]], "low": [row["low"]], "high": [row["high"]]})
    unit = {"share": "share", "GB/s": "GB/s", "MB": "MB", "count": "count"}.get(row["unit"], "unitless")
    x = alt.X("difference:Q", title=f"{row['id']}: paired difference ({unit}; 0 = none)")
    dots = alt.Chart(pts).mark_point(filled=True, size=50, color=color_of("prompt")).encode(
        x=x, y=alt.Y("unit:O", title="prompt"), tooltip=["unit", alt.Tooltip("difference:Q", format=".4f")])
    band = alt.Chart(iv).mark_rule(size=3, color=color_of(row["verdict"])).encode(x="low:Q", x2="high:Q")
    mean = alt.Chart(iv).mark_tick(thickness=3, size=24, color=color_of(row["verdict"])).encode(x="mean:Q")
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(color="#888", strokeDash=[4, 3]).encode(x="x:Q")
    return alt.layer(zero, band, mean, dots).properties(width=320, height=max(60, 16 * len(pts)), title=_title(
        f"{row['id']}: {row['method'][:80]}",
        [row["claim"][:100], row["verdict"] + (f" ({row['reason']})" if row["reason"] else "")]))


# --------------------------------------------------------------------------- intervals over a workload
def interval_chart(table: pd.DataFrame, x: str, y: str, color: str | None = None, title: str = "",
                   subtitle: str | None = None, y_title: str | None = None, seed=None,
                   y_format: str | None = None, x_title: str | None = None) -> alt.Chart:
    """Estimate ``y`` with its 95% interval (columns low, high) per ``x`` (ordinal), one colour per
    ``color``, side by side; ``seed`` (a column, or a list: a range's ends) is drawn as black ticks."""
    t = table.copy()
    t[x] = t[x].astype(str)
    enc_x = alt.X(f"{x}:N", title=x_title or x.replace("_", " "), sort=list(dict.fromkeys(t[x])), axis=alt.Axis(labelAngle=0))
    axis = alt.Axis(format=y_format) if y_format else alt.Axis()
    enc = dict(x=enc_x)
    if color:
        t[color] = t[color].astype(str)
        dom = list(dict.fromkeys(t[color]))
        enc["color"] = alt.Color(f"{color}:N", scale=color_scale(dom), sort=dom, title=color.replace("_", " "))
        enc["xOffset"] = alt.XOffset(f"{color}:N", sort=dom)
    n_col = next((c for c in t.columns if c.startswith("n_") and c.endswith("s")), None)
    tip = [x] + ([color] if color else []) + [alt.Tooltip(f"{y}:Q", format=".4f"), alt.Tooltip("low:Q", format=".4f"),
                                              alt.Tooltip("high:Q", format=".4f")] + ([n_col] if n_col else [])
    if y_title is None:
        y_title = y.replace("_", " ") + (" (%)" if y_format == "%" else "")
    err = alt.Chart(t).mark_errorbar(ticks=True).encode(y=alt.Y("low:Q", title=y_title), y2="high:Q", **enc)
    pts = alt.Chart(t).mark_point(filled=True, size=50).encode(y=alt.Y(f"{y}:Q", axis=axis), tooltip=tip, **enc)
    parts = [err, pts]
    for col in ([seed] if isinstance(seed, str) else list(seed or [])):
        parts.append(alt.Chart(t.dropna(subset=[col])).mark_tick(color="black", thickness=2, size=18).encode(
            x=enc_x, y=f"{col}:Q", tooltip=[x, alt.Tooltip(f"{col}:Q", title="seed")]))
    sub = subtitle or ("points: estimate; bars: 95% bootstrap interval over prompts"
                       + ("; black: the seed" if seed else ""))
    return alt.layer(*parts).properties(width=max(240, 60 * t[x].nunique()), height=240, title=_title(title, sub))


def union_ci_chart(by_method: dict) -> alt.Chart:
    """union(g) with its 95% band over prompts, one colour per method; the seed's table dashed."""
    from workbench.analysis.union import REFERENCE_UNION

    t = pd.concat([df.assign(method=m) for m, df in by_method.items()], ignore_index=True)
    seed = pd.DataFrame({"g": list(REFERENCE_UNION), "union": list(REFERENCE_UNION.values()), "method": "seed"})
    dom = list(by_method) + ["seed"]
    sc = color_scale(dom)
    x = alt.X("g:Q", title="window g, consecutive tokens (count)", axis=alt.Axis(values=sorted(set(t["g"])), format="d"))
    band = alt.Chart(t).mark_area(opacity=0.2).encode(x=x, y="low:Q", y2="high:Q", color=alt.Color("method:N", scale=sc))
    line = alt.Chart(t).mark_line(point=True).encode(
        x=x, y=alt.Y("union:Q", title="distinct experts per layer (count)"), color=alt.Color("method:N", scale=sc, sort=dom),
        tooltip=["method", "g", alt.Tooltip("union:Q", format=".2f"), alt.Tooltip("low:Q", format=".2f"),
                 alt.Tooltip("high:Q", format=".2f"), "n_prompts"])
    ref = alt.Chart(seed).mark_line(point=True, strokeDash=[4, 3]).encode(x=x, y="union:Q", color=alt.Color("method:N", scale=sc))
    return alt.layer(band, line, ref).properties(width=380, height=260, title=_title(
        "Experts to read for a window of g tokens, over the workload",
        "band: 95% bootstrap interval over prompts; dashed: the seed's table"))


def policy_ci_chart(table: pd.DataFrame, metric: str, title: str, y_title: str) -> alt.Chart:
    """One metric of ``policy_table`` vs arena size, a line per policy with 95% interval bars."""
    t = table[(table["metric"] == metric) & ~table["policy"].str.contains(" - ")].copy()
    dom = list(dict.fromkeys(t["policy"]))
    sc = color_scale(dom)
    x = alt.X("arena:Q", title="arena, share of routed experts (%)", axis=alt.Axis(format="%"),
              scale=alt.Scale(domain=[0, float(t["arena"].max()) * 1.15], nice=False))  # no point on the edge
    line = alt.Chart(t).mark_line(point=True).encode(
        x=x, y=alt.Y("value:Q", title=y_title), color=alt.Color("policy:N", scale=sc, sort=dom),
        tooltip=["policy", alt.Tooltip("arena:Q", format=".0%"), alt.Tooltip("value:Q", format=".3f"),
                 alt.Tooltip("low:Q", format=".3f"), alt.Tooltip("high:Q", format=".3f"), "n_prompts"])
    err = alt.Chart(t).mark_errorbar(ticks=True).encode(x=x, y=alt.Y("low:Q", title=y_title), y2="high:Q",
                                                        color=alt.Color("policy:N", scale=sc))
    return alt.layer(err, line).properties(width=340, height=220, title=_title(title, "bars: 95% bootstrap interval over prompts"))


def fit_chart(table: pd.DataFrame) -> alt.HConcatChart:
    """Tokens/s, hit rate and peak memory against the arena's size in GB (one point per run)."""
    x = alt.X("arena_gb:Q", title="arena (GB)", scale=alt.Scale(padding=12))  # no run on the axis' edge
    tip = ["arena", "arena_slots", alt.Tooltip("arena_gb:Q", format=".3f"), alt.Tooltip("tokens_per_s:Q", format=".1f"),
           alt.Tooltip("hit_rate:Q", format=".1%"), alt.Tooltip("peak_memory_gb:Q", format=".3f")]
    few = len(table) < 3  # two sizes draw a straight line between two runs: show the runs only
    mark = alt.Chart(table).mark_point(filled=True, size=60, color=PALETTE[0]) if few else \
        alt.Chart(table).mark_line(point=True, color=PALETTE[0])
    base = mark.encode(x=x, tooltip=tip)
    return alt.hconcat(
        base.encode(y=alt.Y("tokens_per_s:Q", title="decode speed (tokens/s)")).properties(width=200, height=160,
                                                                                  title="Speed"),
        base.encode(y=alt.Y("hit_rate:Q", title="hit rate (%)", axis=alt.Axis(format="%"))).properties(
            width=200, height=160, title="Hit rate"),
        base.encode(y=alt.Y("peak_memory_gb:Q", title="peak MLX memory (GB)")).properties(
            width=200, height=160, title="Peak memory"),
    ).properties(title=_title("Fit my machine: what an arena of each size costs and buys",
                              ["one run per size; the model's non-expert weights stay resident as well"]
                              + ([f"only {len(table)} sizes and {int(table['tokens'].max())} tokens each (a reduced "
                                  "run): this checks the code runs, it measures no trend"] if few else [])))


# --------------------------------------------------------------------------- read path
def readpath_chart(table, title: str = "Read path: GB/s beside a sequential read", subtitle: str | None = None):
    """Bars of GB/s per method (threads on the axis), faceted by read mode and cache state."""
    t = table.copy()
    t["cache"] = t["cold"].map({True: "cold", False: "warm"})
    t["what"] = [f"{m} ×{th}" if m.startswith("store") else m for m, th in zip(t["method"], t["threads"])]
    t["what"] = t["what"].str.replace("store blobs (preadv into slots)", "store → slots", regex=False)
    t["panel"] = t["mode"] + ", " + t["cache"]
    t["kind"] = ["sequential read" if m == "sequential" else ("store → slots" if m.startswith("store") else "single copy")
                 for m in t["method"]]
    order = list(dict.fromkeys(t["what"]))
    scale = color_scale(["sequential read", "store → slots", "single copy"])
    bars = alt.Chart(t).mark_bar().encode(
        y=alt.Y("what:N", sort=order, title=None),
        x=alt.X("gbps:Q", title="throughput (GB/s)"),
        color=alt.Color("kind:N", scale=scale, title="method"),
        tooltip=["method", "mode", "threads", "cache", alt.Tooltip("gbps:Q", format=".3f"),
                 alt.Tooltip("share_of_sequential:Q", format=".0%")],
    ).properties(width=300, height=alt.Step(16))
    if "gbps_min" in t and (t["gbps_max"] > t["gbps_min"]).any():  # the spread of the repeats
        bars = bars + alt.Chart(t).mark_rule(color="black").encode(
            y=alt.Y("what:N", sort=order), x="gbps_min:Q", x2="gbps_max:Q")
    return bars.facet(facet=alt.Facet("panel:N", title=None, header=alt.Header(labelFontWeight="bold")), columns=2).resolve_scale(
        x="independent").properties(  # warm reads (page cache) run 10x cold ones: each panel its own axis
        title=alt.TitleParams(title, subtitle=subtitle or [], anchor="start"))
