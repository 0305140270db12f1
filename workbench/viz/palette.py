"""One colour per identity, shared by every chart, and no two series of one chart alike.

A policy, configuration, predictor source, drafter or layer keeps its colour in every chart and
whatever else is plotted beside it: colours come from the name, never from its position in a
legend, so deselecting one series recolours nothing. Within one chart (``color_scale``) a name
whose colour is too close to an earlier series' (CIE76 colour difference below ``MIN_CONTRAST``)
takes the first palette colour far enough from all of them. Numeric names sort as numbers (layer
2 before layer 10). ``CONFIG`` lifts Vega-Lite's label and title length limits so no label is cut.
"""

from __future__ import annotations

import re
import zlib

# Tableau 10, then the lighter Tableau 20 half for names without a fixed colour.
PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"]
SPARE = ["#a0cbe8", "#ffbe7d", "#ff9d9a", "#86bcb6", "#8cd17d", "#f1ce63", "#d4a6c8", "#fabfd2", "#d7b5a6", "#79706e"]
GREY = "#888888"

NAMED = {
    # policies (engine and simulator names) and offline bounds
    "lru": "#4e79a7", "slru": "#76b7b2", "twohit": "#f28e2b", "two-hit": "#f28e2b", "two_hit": "#f28e2b",
    "ds4": "#e15759", "static": "#59a14f", "hotlist": "#59a14f", "s3fifo": "#b07aa1", "lfu": "#edc948",
    "fifo": "#ff9da7", "belady": "#000000", "knapsack": "#9c755f",
    # read-ahead configurations (notebook 01, `workbench compare`)
    "UNPERT=1": "#4e79a7", "unpert1": "#4e79a7", "UNPERT1": "#4e79a7",
    "UNPERT=0": "#e15759", "unpert0": "#e15759", "UNPERT0": "#e15759",
    "route": "#b07aa1",
    # predictor sources
    "d=0": "#bab0ac", "d=1": "#4e79a7", "d=2": "#76b7b2", "d=3": "#59a14f", "d=4": "#edc948",
    "d1": "#4e79a7", "d2": "#76b7b2", "d3": "#59a14f", "d4": "#edc948",
    "prev_token": "#e15759", "oracle": "#9c755f", "none": "#bab0ac",
    # read-ahead in the demo; teacher-forced vs free-running decode
    "next layer": "#4e79a7", "teacher-forced": "#4e79a7", "decode": "#f28e2b",
    # drafters
    "draft_model": "#4e79a7", "ngram": "#f28e2b", "self_draft": "#e15759",
    # arena lookups, read-path methods, verdicts, booleans
    "hits": "#59a14f", "misses": "#e15759",
    "sequential read": "#bab0ac", "store → slots": "#4e79a7", "single copy": "#f28e2b",
    "matches": "#59a14f", "differs": "#e15759",
    "False": "#4e79a7", "True": "#f28e2b",
    # prefetch outcome classes
    "useful timely": "#59a14f", "useful late": "#8cd17d", "completed unused": "#e15759",
    "partially read": "#f28e2b", "cancelled before read": "#bab0ac",
}

# Vega-Lite config merged into every spec: no truncated labels or titles anywhere. The font is
# named, not "sans-serif": vl-convert sizes the SVG with the font it resolves, and a browser that
# resolves "sans-serif" to a wider one (DejaVu Sans on Linux) would clip the longest labels.
CONFIG = {
    "font": "DejaVu Sans, Arial, Helvetica, sans-serif",
    "axis": {"labelLimit": 0, "titleLimit": 0},
    "legend": {"labelLimit": 0, "titleLimit": 0},
    "header": {"labelLimit": 0, "titleLimit": 0},
    "title": {"limit": 0},
}


def color_of(name) -> str:
    """The colour of one identity: a fixed one if named, ``layer``-like integers by value, else
    a colour derived from the name itself (so it never depends on what else is plotted)."""
    name = str(name)
    if name in NAMED:
        return NAMED[name]
    m = re.fullmatch(r"(?:layer\s*)?(\d+)", name)
    if m:
        return (PALETTE + SPARE)[int(m.group(1)) % (len(PALETTE) + len(SPARE))]
    return PALETTE[zlib.crc32(name.encode()) % len(PALETTE)]


MIN_CONTRAST = 20.0  # CIE76 difference (Lab units) between any two series of one chart


def _lab(colour: str) -> tuple[float, float, float]:
    """sRGB ``#rrggbb`` -> CIE Lab (D65)."""
    rgb = [int(colour.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    r, g, b = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    xyz = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b, \
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
    f = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def contrast(a: str, b: str) -> float:
    """CIE76 colour difference of two ``#rrggbb`` colours (about 2.3: just noticeable)."""
    return sum((x - y) ** 2 for x, y in zip(_lab(a), _lab(b))) ** 0.5


def distinct_colours(names) -> list[str]:
    """Each name's own colour (``color_of``), unless it is closer than ``MIN_CONTRAST`` to an earlier
    name's here: then the first palette colour far enough from every earlier one."""
    chosen = []
    for name in names:
        colour = color_of(name)
        if any(contrast(colour, c) < MIN_CONTRAST for c in chosen):
            colour = next((p for p in PALETTE + SPARE + ["#000000"]
                           if all(contrast(p, c) >= MIN_CONTRAST for c in chosen)), colour)
        chosen.append(colour)
    return chosen


def natural_key(value):
    """Sort key that orders embedded numbers numerically: 0, 1, 2, 10, 11 and d=2 before d=10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", str(value)) if part != ""]


def natural_sorted(values) -> list[str]:
    return sorted({str(v) for v in values}, key=natural_key)


def color_scale(domain, sort: bool = False):
    """An altair Scale giving each name in ``domain`` its own colour (``sort``: natural order)."""
    import altair as alt

    domain = natural_sorted(domain) if sort else list(dict.fromkeys(str(d) for d in domain))
    return alt.Scale(domain=domain, range=distinct_colours(domain))


def apply_config(spec: dict) -> dict:
    """Merge ``CONFIG`` under the spec's own config (the chart's explicit settings win)."""
    config = spec.setdefault("config", {})
    for key, values in CONFIG.items():
        config[key] = {**values, **config.get(key, {})} if isinstance(values, dict) else config.get(key, values)
    return spec
