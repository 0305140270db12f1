"""Offline-first altair setup and figure export.

Measured (DESIGN section 7): with no network, altair's default html renderer fails (it loads
vega from a CDN), ``mimetype`` shows a placeholder in JupyterLab 4, ``jupyter`` shows nothing;
the ``svg`` renderer (vl-convert, in-process) renders, also inside an ipywidgets ``Output``.

    from workbench.viz.render import use_offline_renderer, save_chart
    use_offline_renderer()                 # svg renderer + row-capping data transformer
    save_chart(chart, "out/lookahead")     # -> [out/lookahead.png, out/lookahead.svg]
    chart_spec(chart)                      # the Vega-Lite dict every export renders from

``use_interactive_renderer()`` opts into an interactive renderer when vega is reachable.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Iterable, Mapping

import altair as alt
import pandas as pd

from workbench.fsutil import atomic_write

TRANSFORMER = "workbench"
DEFAULT_MAX_ROWS = 5000


def capped_values(data, max_rows: int | None = DEFAULT_MAX_ROWS, random_state: int = 0):
    """Data transformer: inline the data as values, sampling it down to ``max_rows`` (with a
    warning) instead of raising MaxRowsError. Charts in charts.py aggregate first, so this is a
    fallback for ad-hoc charts on raw tables."""
    if max_rows is not None and isinstance(data, pd.DataFrame) and len(data) > max_rows:
        warnings.warn(f"chart data has {len(data)} rows; sampling {max_rows} of them "
                      f"(aggregate first, or use_offline_renderer(max_rows=None) to inline all)", stacklevel=2)
        data = data.sample(n=max_rows, random_state=random_state).sort_index()
    return alt.to_values(data)


if TRANSFORMER not in alt.data_transformers.names():
    alt.data_transformers.register(TRANSFORMER, capped_values)


def use_offline_renderer(renderer: str = "svg", max_rows: int | None = DEFAULT_MAX_ROWS) -> None:
    """Render charts offline (vl-convert ``svg`` by default, or ``png``) and cap inlined rows."""
    if renderer not in ("svg", "png"):
        raise ValueError(f"offline renderers are 'svg' and 'png', got {renderer!r}; "
                         "use use_interactive_renderer() for html/jupyter")
    try:
        import vl_convert  # noqa: F401
    except ImportError:
        raise ImportError("the offline renderer needs vl-convert-python: pip install vl-convert-python") from None
    alt.renderers.enable(renderer)
    alt.data_transformers.enable(TRANSFORMER, max_rows=max_rows)


def use_interactive_renderer(renderer: str = "jupyter", max_rows: int | None = DEFAULT_MAX_ROWS) -> None:
    """Opt in to an interactive renderer (needs the vega libraries: network or a local install)."""
    alt.renderers.enable(renderer)
    alt.data_transformers.enable(TRANSFORMER, max_rows=max_rows)


def vl_version() -> str:
    """The Vega-Lite version altair writes ("5.20"), passed to vl-convert."""
    v = alt.SCHEMA_VERSION.lstrip("v").split(".")
    return f"{v[0]}.{v[1]}"


def chart_spec(chart, max_rows: int | None = DEFAULT_MAX_ROWS) -> dict:
    """The chart's Vega-Lite spec as a plain dict: data inlined (capped at ``max_rows``) and the
    palette's no-truncation config merged in. A dict passes through unchanged."""
    if isinstance(chart, Mapping):
        return dict(chart)
    from .palette import apply_config

    with alt.data_transformers.enable(TRANSFORMER, max_rows=max_rows):
        return apply_config(chart.to_dict())


def spec_to_svg(spec: dict) -> str:
    import vl_convert as vlc

    return vlc.vegalite_to_svg(spec, vl_version=vl_version())


def spec_to_png(spec: dict, scale: float = 2.0) -> bytes:
    import vl_convert as vlc

    return vlc.vegalite_to_png(spec, vl_version=vl_version(), scale=scale)


def spec_nodes(node, skip=()):
    """Every dict in a Vega-Lite spec, depth first (keys in ``skip`` are not entered)."""
    if isinstance(node, dict):
        yield node
        for k, v in node.items():
            if k not in skip:
                yield from spec_nodes(v, skip)
    elif isinstance(node, list):
        for v in node:
            yield from spec_nodes(v, skip)


def spec_rows(spec: dict) -> int:
    """Number of data rows inlined in a spec (top-level ``datasets`` and any ``data.values``)."""
    n = sum(len(values) for values in (spec.get("datasets") or {}).values())
    for node in spec_nodes(spec, skip=("datasets",)):
        data = node.get("data")
        if isinstance(data, dict) and isinstance(data.get("values"), list):
            n += len(data["values"])
    return n


def chart_title(spec: dict) -> str:
    """The chart's title; for untitled concatenations, the sub-charts' titles joined by " · "."""
    t = spec.get("title")
    if isinstance(t, dict):
        t = t.get("text")
    if isinstance(t, list):
        t = " ".join(str(x) for x in t)
    if t:
        return str(t)
    for key in ("hconcat", "vconcat", "concat", "layer"):
        parts = [chart_title(sub) for sub in spec.get(key) or [] if isinstance(sub, dict)]
        parts = [x for x in parts if x]
        if parts:
            return " · ".join(parts)
    if isinstance(spec.get("spec"), dict):  # facet / repeat
        return chart_title(spec["spec"])
    return ""


def save_chart(chart: alt.TopLevelMixin, path_stem, formats: Iterable[str] = ("png", "svg"), scale: float = 2.0,
               max_rows: int | None = DEFAULT_MAX_ROWS) -> list[Path]:
    """Write ``chart`` as PATH_STEM.png / .svg (/ .json / .html) offline via vl-convert; returns the paths."""
    import json

    import vl_convert as vlc

    stem = Path(path_stem)
    if stem.suffix in (".png", ".svg"):
        stem = stem.with_suffix("")
    spec = chart_spec(chart, max_rows=max_rows)
    out = []
    for fmt in formats:
        p = stem.with_name(stem.name + "." + fmt)
        if fmt == "png":
            data = spec_to_png(spec, scale=scale)
        elif fmt == "svg":
            data = spec_to_svg(spec).encode()
        elif fmt == "json":
            data = json.dumps(spec, indent=1).encode()
        elif fmt == "html":
            data = vlc.vegalite_to_html(spec, bundle=True, vl_version=vl_version()).encode()
        else:
            raise ValueError(f"unknown chart format {fmt!r}; use png, svg, json or html")
        atomic_write(p, lambda tmp: Path(tmp).write_bytes(data))
        out.append(p)
    return out
