"""One colour per identity in every chart, numeric legends in numeric order, no cut labels."""

import altair as alt
import pandas as pd

from workbench.viz import charts
from workbench.viz.counter_charts import compare_chart
from workbench.viz.render import chart_spec, spec_nodes, spec_to_svg
from workbench.viz.palette import NAMED, color_of, color_scale, natural_sorted


def colours(spec, field):
    """{name: colour} of every colour scale on ``field`` anywhere in a spec."""
    found = {}
    for node in spec_nodes(spec):
        enc = node.get("encoding", {}).get("color", {})
        if enc.get("field") == field and "scale" in enc:
            found.update(zip(enc["scale"]["domain"], enc["scale"]["range"]))
    return found


def test_colour_follows_the_name_not_the_position():
    everyone = color_scale(["lru", "slru", "twohit", "s3fifo", "mystery", "other"])
    fewer = color_scale(["s3fifo", "other"])  # deselect some: the rest keep their colours
    full = dict(zip(everyone.domain, everyone.range))
    # a series keeps its own colour unless an earlier series of the same chart is too alike (then it moves)
    assert all(dict(zip(fewer.domain, fewer.range))[n] == color_of(n) for n in fewer.domain)
    assert full["s3fifo"] == color_of("s3fifo")
    assert color_of("mystery") == color_of("mystery") and color_of("lru") == NAMED["lru"]
    assert color_of("two-hit") == color_of("twohit")  # the same policy under its two spellings


def test_same_policy_same_colour_in_two_charts():
    curves = pd.DataFrame({"policy": ["lru", "lru", "twohit", "twohit", "belady", "belady"],
                           "capacity": [1, 2] * 3, "hit_rate": [0.1, 0.2, 0.15, 0.25, 0.3, 0.4]})
    a = colours(chart_spec(charts.hit_curve_chart(curves, x="capacity", y="hit_rate", color="policy")), "policy")
    bars = pd.DataFrame({"policy": ["twohit", "lru"], "hit rate": [0.2, 0.3]})
    b = colours(chart_spec(compare_chart(bars, "policy", ["hit rate"], "t")), "policy")
    assert a["lru"] == b["lru"] and a["twohit"] == b["twohit"] and a["lru"] != a["twohit"]


def test_numeric_legends_sort_as_numbers():
    assert natural_sorted(["0", "1", "10", "11", "2"]) == ["0", "1", "2", "10", "11"]
    assert natural_sorted(["d=10", "d=2", "prev"]) == ["d=2", "d=10", "prev"]
    t = pd.DataFrame({"layer": list(range(12)) * 2, "slots": [1] * 12 + [2] * 12, "hit_rate": [0.5] * 24})
    spec = chart_spec(charts.hit_curve_chart(t.astype({"layer": str}), x="slots", y="hit_rate", color="layer"))
    assert list(colours(spec, "layer")) == [str(i) for i in range(12)]


def test_labels_are_not_truncated():
    long = "cancelled before read, a long outcome name"
    df = pd.DataFrame({"configuration": ["a configuration with a long name", "b"], "outcome": [long, "x"], "n": [1, 2]})
    chart = alt.Chart(df).mark_bar().encode(y=alt.Y("configuration:N", title="configuration of the arena lookups"),
                                            x="n:Q", color=alt.Color("outcome:N", title="a legend title that is long"))
    spec = chart_spec(chart)
    assert spec["config"]["legend"]["labelLimit"] == 0 and spec["config"]["axis"]["labelLimit"] == 0
    svg = spec_to_svg(spec)
    for text in (long, "a configuration with a long name", "configuration of the arena lookups",
                 "a legend title that is long"):
        assert text in svg
    assert "…" not in svg


def test_read_path_facets_wrap():
    table = pd.DataFrame({"method": ["sequential", "store blobs (preadv into slots)"] * 4, "threads": [1] * 8,
                          "mode": ["buffered", "buffered", "direct", "direct"] * 2, "cold": [True] * 4 + [False] * 4,
                          "gbps": [1.0] * 8, "share_of_sequential": [1.0] * 8})
    spec = chart_spec(charts.readpath_chart(table))
    assert spec["columns"] == 2 and "facet" in spec


def test_svg_text_names_the_font_it_was_measured_with():
    """A browser draws the SVG's text in the font the SVG names; "sans-serif" alone may resolve
    wider there than in vl-convert, which sized the chart, and clip the longest labels."""
    import re

    from workbench.viz.palette import CONFIG

    df = pd.DataFrame({"configuration": ["a", "b"], "useful_timely": [3, 4], "cancelled_before_read": [1, 2]})
    from workbench.viz.counter_charts import outcome_chart

    svg = spec_to_svg(chart_spec(outcome_chart(df, "configuration", ["useful_timely", "cancelled_before_read"])))
    assert set(re.findall(r'font-family="([^"]*)"', svg)) == {CONFIG["font"]}


def test_series_of_one_chart_are_far_apart_in_colour():
    """Any two series of one chart differ by at least MIN_CONTRAST (CIE76), even when their own
    colours collide (the names of issue 31: teacher-forced / decode, d1 / d2 / d3, and names hashed
    to one colour)."""
    import itertools

    from workbench.viz.palette import MIN_CONTRAST, PALETTE, contrast, distinct_colours

    assert contrast("#ffffff", "#000000") > 99 and contrast("#4e79a7", "#4e79a7") == 0
    assert min(contrast(a, b) for a, b in itertools.combinations(PALETTE, 2)) >= MIN_CONTRAST
    hashed = [n for n in (f"series {i}" for i in range(200)) if color_of(n) == color_of("series 0")][:3]
    for names in (["teacher-forced", "decode"], ["d1", "d2", "d3"], ["none", "next layer"], hashed,
                  ["lru", "UNPERT=1", "d=1", "draft_model"], [str(i) for i in range(10)]):
        got = distinct_colours(names)
        assert min(contrast(a, b) for a, b in itertools.combinations(got, 2)) >= MIN_CONTRAST, names
    assert distinct_colours(["lru", "twohit"]) == [color_of("lru"), color_of("twohit")]  # far apart: own colours
    scale = color_scale(["lru", "UNPERT=1"])
    assert scale.range[0] == color_of("lru") and contrast(*scale.range) >= MIN_CONTRAST
