"""Showing results in a notebook: charts offline (SVG) with their spec recorded for the report,
tables, markdown.

``show(chart, name)`` renders an altair chart to SVG with vl-convert (no browser, no network)
and displays it together with the chart's Vega-Lite spec under ``CHART_MIME``. JupyterLab and
nbconvert show the SVG; ``workbench.report`` reads the spec back from the executed notebook and
re-renders it to PNG and SVG files.

In *static* mode (``WORKBENCH_STATIC=1``, set by ``workbench report``) notebooks run headless:
live panels render once into the cell output and progress bars stay off.
"""

from __future__ import annotations

import os
from typing import Mapping

from .render import chart_spec, chart_title, spec_to_svg

CHART_MIME = "application/vnd.workbench.chart+json"
STATIC_ENV = "WORKBENCH_STATIC"


def is_static() -> bool:
    """True when running headless for a report (``WORKBENCH_STATIC=1``): no live widgets."""
    return os.environ.get(STATIC_ENV, "") not in ("", "0", "false", "False")


def setup() -> None:
    """Make plain ``display(chart)`` work offline too (svg renderer), once per kernel."""
    from .render import use_offline_renderer

    use_offline_renderer()


def chart_bundle(chart, name: str) -> dict:
    """Display bundle: SVG for people, the Vega-Lite spec (``CHART_MIME``) for the report."""
    if not name or any(c in name for c in "/\\ "):
        raise ValueError(f"chart name {name!r} must be a non-empty file-safe word like 'hit_rate'")
    spec = chart_spec(chart)
    return {
        "image/svg+xml": spec_to_svg(spec),
        "text/plain": f"<chart {name}: {chart_title(spec) or 'untitled'}>",
        CHART_MIME: {"name": name, "title": chart_title(spec), "spec": spec},
    }


def show(chart, name: str) -> None:
    """Display ``chart`` offline (SVG) and record its spec under ``name`` for the report."""
    from IPython.display import display

    display(chart_bundle(chart, name), raw=True)


def bundles(obj, name: str = "chart") -> list[dict]:
    """What ``show_any`` displays, as Jupyter ``display_data`` outputs (a live panel's Output
    takes them as they are). ``obj``: a chart, DataFrame or table, a markdown str, or a list /
    dict of them (a dict's keys and ``(name, obj)`` pairs name the charts)."""
    if obj is None:
        return []
    if isinstance(obj, Mapping) and "$schema" not in obj:
        return [b for key, value in obj.items() for b in bundles(value, str(key))]
    if isinstance(obj, (list, tuple)):
        out = []
        for i, value in enumerate(obj):
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
                out += bundles(value[1], value[0])
            else:
                out += bundles(value, f"{name}_{i}" if len(obj) > 1 else name)
        return out
    if _is_chart(obj):
        data, metadata = chart_bundle(obj, name), {}
    else:
        from IPython import get_ipython
        from IPython.core.formatters import DisplayFormatter
        from IPython.display import Markdown

        ip = get_ipython()  # the kernel's formatters (with their registrations), or plain ones
        formatter = ip.display_formatter if ip is not None else DisplayFormatter()
        data, metadata = formatter.format(Markdown(obj) if isinstance(obj, str) else obj)
    return [{"output_type": "display_data", "data": data, "metadata": metadata}]


def show_any(obj, name: str = "chart") -> None:
    """Display what a panel's render function returned (see ``bundles``)."""
    from IPython.display import display

    for b in bundles(obj, name):
        display(b["data"], raw=True, metadata=b["metadata"])


def _is_chart(obj) -> bool:
    import altair as alt

    return isinstance(obj, alt.TopLevelMixin)


def show_table(df, caption: str | None = None, precision: int = 3, index: bool = False) -> None:
    """Display ``table(...)`` wherever it stands in a cell (Jupyter shows only a cell's *last*
    value by itself): every table a notebook promises is on its page."""
    from IPython.display import display

    display(table(df, caption, precision, index))


def table(df, caption: str | None = None, precision: int = 3, index: bool = False):
    """A compact HTML table for counters (numbers rounded; the index shown only if ``index``).

    Whole numbers print without decimals, other floats with ``precision`` significant decimals,
    so mixed columns (a transposed counters table) read cleanly.
    """
    import numbers

    import pandas as pd

    def fmt(v):
        if isinstance(v, bool) or not isinstance(v, numbers.Number):
            return str(v)
        if v != v:  # NaN
            return "–"
        if float(v).is_integer() and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:,.{precision}f}" if abs(v) >= 10 ** -precision else f"{v:.{precision}g}"

    styler = df.style.format(fmt)
    text_cols = [c for c in df.columns if df[c].dtype == object or pd.api.types.is_string_dtype(df[c])]
    if text_cols:  # words read left-aligned; numbers stay right-aligned
        styler = styler.set_properties(subset=text_cols, **{"text-align": "left", "max-width": "36em"})
        idx = [list(df.columns).index(c) for c in text_cols]
        styler = styler.set_table_styles([{"selector": f"th.col_heading.col{i}", "props": "text-align: left;"}
                                          for i in idx], overwrite=False)
    if not index:
        styler = styler.hide(axis="index")
    if caption:
        styler = styler.set_caption(caption)
    return styler
