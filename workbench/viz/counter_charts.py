"""Charts of engine counters and side-by-side comparisons, used by the notebooks' live panels.
Colours come from ``workbench.viz.palette`` like every other chart's."""

from __future__ import annotations

from .palette import PALETTE, color_scale

def per_token_counters(counters) -> "object":
    """Decode rows of an engine counters frame summed per token: step, hits, misses, MB read."""
    df = counters[counters["phase"] == "decode"]
    g = df.groupby("step", as_index=False)[["hits", "misses", "sync_misses", "bytes_read",
                                            "prefetch_useful_timely", "prefetch_useful_late"]].sum()
    g["mb_read"] = g["bytes_read"] / 1e6
    g = g.rename(columns={"step": "token"})
    return g


def token_counters_chart(counters, title: str = "Arena per decoded token", subtitle: str | None = None):
    """Stacked hits/misses per token above MB read per token (decode steps)."""
    import altair as alt

    g = per_token_counters(counters)
    long = g.melt(id_vars=["token"], value_vars=["hits", "misses"], var_name="lookup", value_name="experts")
    scale = color_scale(["hits", "misses"])
    bars = alt.Chart(long).mark_bar().encode(
        x=alt.X("token:O", title="decoded token (step)", axis=alt.Axis(labelAngle=0, labelOverlap=True)),
        y=alt.Y("experts:Q", title="expert lookups (count)", stack="zero"),
        color=alt.Color("lookup:N", scale=scale, title="arena lookup"),
        order=alt.Order("lookup:N", sort="ascending"),
        tooltip=["token", "lookup", "experts"],
    ).properties(width=520, height=180)
    mb = alt.Chart(g).mark_line(point=True, color=PALETTE[0]).encode(
        x=alt.X("token:O", title="decoded token (step)", axis=alt.Axis(labelAngle=0, labelOverlap=True)),
        y=alt.Y("mb_read:Q", title="read from SSD (MB)"),
        tooltip=["token", alt.Tooltip("mb_read:Q", format=".3f")],
    ).properties(width=520, height=120)
    return alt.vconcat(bars, mb).properties(
        title=alt.TitleParams(title, subtitle=subtitle or [], anchor="start"))


def compare_chart(df, config: str, metrics: list[str], title: str, subtitle: str | None = None,
                  labels: dict | None = None, fmt: str = ",.0f"):
    """One bar panel per metric, one bar per configuration (colour = configuration). Each panel's
    y axis is titled with the metric's label (``labels``, else its name), unit included."""
    import altair as alt

    labels = labels or {}
    order = list(dict.fromkeys(df[config]))
    color = alt.Color(f"{config}:N", sort=order, title=config.replace("_", " "), scale=color_scale(order))
    panels = [alt.Chart(df).mark_bar().encode(
        x=alt.X(f"{config}:N", sort=order, title=None, axis=alt.Axis(labels=False, ticks=False)),
        y=alt.Y(field=m, type="quantitative", title=labels.get(m, m)),
        color=color,
        tooltip=[config, alt.Tooltip(field=m, type="quantitative", format=fmt)],
    ).properties(width=110, height=180) for m in metrics]
    return alt.hconcat(*panels).properties(title=alt.TitleParams(title, subtitle=subtitle or [], anchor="start"))


def outcome_chart(df, config: str, outcomes: list[str], title: str = "Prefetch outcome classes",
                  subtitle: str | None = None, value: str = "reads"):
    """Stacked bars: each configuration's prefetches split into outcome classes."""
    import altair as alt

    long = df.melt(id_vars=[config], value_vars=outcomes, var_name="outcome", value_name=value)
    long["outcome"] = long["outcome"].str.replace("_", " ")
    names = [o.replace("_", " ") for o in outcomes]
    order = list(dict.fromkeys(df[config]))
    return alt.Chart(long).mark_bar().encode(
        y=alt.Y(f"{config}:N", sort=order, title=None),
        x=alt.X(f"{value}:Q", title=f"prefetch {value} (count)", stack="zero"),
        color=alt.Color("outcome:N", sort=names, title="outcome",
                        scale=color_scale(names)),
        order=alt.Order("outcome_order:Q"),
        tooltip=[config, "outcome", f"{value}:Q"],
    ).transform_calculate(outcome_order=f"indexof({names!r}, datum.outcome)").properties(
        width=420, height=max(60, 28 * len(order)),
        title=alt.TitleParams(title, subtitle=subtitle or [], anchor="start"))
