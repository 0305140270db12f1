"""Notebook plumbing: offline chart display, chart recording, and live ipywidgets panels.

Two ideas keep notebooks thin and reports static:

``show(chart, name)``
    Renders an altair chart to SVG with vl-convert (no browser, no network) and displays
    it together with the chart's Vega-Lite spec under the ``CHART_MIME`` mimetype.
    JupyterLab and nbconvert show the SVG; ``workbench.report`` reads the spec back from
    the executed notebook and re-renders it to PNG and SVG files.

``panel(render, controls)``
    A row of ipywidgets controls above an ``Output``. When a control changes, ``render``
    is called with the current values (keyword arguments named like the controls) and
    whatever it returns (charts, tables, markdown) replaces the Output's content. The
    measurement is re-run by a package function inside ``render``; the notebook is not
    re-run. In *static* mode (``WORKBENCH_STATIC=1``, set by ``workbench report``) the
    panel renders once with the initial values straight into the cell output, so the
    executed notebook carries the charts without any widget state.

Expensive controls use ``continuous_update=False`` (see ``slider``): the measurement runs
when the slider is released, not on every pixel of the drag.
"""

from __future__ import annotations

import html
import os
import time
import traceback
from typing import Any, Callable, Mapping

CHART_MIME = "application/vnd.workbench.chart+json"
STATIC_ENV = "WORKBENCH_STATIC"

from .palette import PALETTE, apply_config, color_of, color_scale  # noqa: F401  (one palette for every chart)


def is_static() -> bool:
    """True when running headless for a report (``WORKBENCH_STATIC=1``): no live widgets."""
    return os.environ.get(STATIC_ENV, "") not in ("", "0", "false", "False")


# --------------------------------------------------------------------------- rendering

def setup() -> None:
    """Make plain ``display(chart)`` work offline too (svg renderer), once per kernel."""
    from workbench.viz.render import use_offline_renderer

    use_offline_renderer()


def _vl_version() -> str:
    import altair as alt

    v = alt.SCHEMA_VERSION.lstrip("v").split(".")
    return f"{v[0]}.{v[1]}"


def chart_spec(chart) -> dict:
    """The chart's Vega-Lite spec as a plain dict with all data inlined."""
    if isinstance(chart, Mapping):
        return dict(chart)
    import altair as alt

    try:
        import workbench.viz.render  # noqa: F401  registers the row-capping "workbench" transformer

        ctx = alt.data_transformers.enable("workbench")
    except ImportError:
        ctx = None
    try:
        if ctx is None:
            return apply_config(chart.to_dict())
        with ctx:
            return apply_config(chart.to_dict())
    except Exception as e:  # altair's MaxRowsError and schema errors
        if type(e).__name__ == "MaxRowsError":
            raise ValueError(
                "chart data has more than 5000 rows; aggregate or sample it before charting "
                "(e.g. df.sample(5000) or a groupby), or use a smaller parameter set") from None
        raise


def spec_to_svg(spec: dict) -> str:
    import vl_convert as vlc

    return vlc.vegalite_to_svg(spec, vl_version=_vl_version())


def spec_to_png(spec: dict, scale: float = 2.0) -> bytes:
    import vl_convert as vlc

    return vlc.vegalite_to_png(spec, vl_version=_vl_version(), scale=scale)


def spec_rows(spec: dict) -> int:
    """Number of data rows inlined in a spec (top-level ``datasets`` and any ``data.values``)."""
    n = 0
    for values in (spec.get("datasets") or {}).values():
        n += len(values)

    def walk(node):
        nonlocal n
        if isinstance(node, dict):
            data = node.get("data")
            if isinstance(data, dict) and isinstance(data.get("values"), list):
                n += len(data["values"])
            for k, v in node.items():
                if k != "datasets":
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)
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


def show_any(obj, name: str = "chart") -> None:
    """Display what a panel's render function returned: chart, DataFrame, markdown str, list/dict."""
    from IPython.display import Markdown, display

    if obj is None:
        return
    if isinstance(obj, Mapping) and "$schema" not in obj:
        for key, value in obj.items():
            show_any(value, str(key))
        return
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
                show_any(value[1], value[0])
            else:
                show_any(value, f"{name}_{i}" if len(obj) > 1 else name)
        return
    if isinstance(obj, str):
        display(Markdown(obj))
        return
    if _is_chart(obj):
        show(obj, name)
        return
    display(obj)


def _is_chart(obj) -> bool:
    import altair as alt

    return isinstance(obj, alt.TopLevelMixin)


def table(df, caption: str | None = None, precision: int = 3, index: bool = False):
    """A compact HTML table for counters (numbers rounded; the index shown only if ``index``).

    Whole numbers print without decimals, other floats with ``precision`` significant decimals,
    so mixed columns (a transposed counters table) read cleanly.
    """
    import numbers

    def fmt(v):
        if isinstance(v, bool) or not isinstance(v, numbers.Number):
            return str(v)
        if v != v:  # NaN
            return "–"
        if float(v).is_integer() and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:,.{precision}f}" if abs(v) >= 10 ** -precision else f"{v:.{precision}g}"

    styler = df.style.format(fmt)
    import pandas as pd

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


# --------------------------------------------------------------------------- controls

def slider(description: str, min, max, step=None, value=None, *, expensive: bool = True,
           readout_format: str | None = None, width: str = "340px"):
    """IntSlider or FloatSlider (by the type of the bounds); expensive => update on release."""
    import ipywidgets as w

    is_int = all(isinstance(x, int) and not isinstance(x, bool) for x in (min, max, step or 1))
    value = min if value is None else value
    common = dict(description=description, min=min, max=max, value=value,
                  continuous_update=not expensive, style={"description_width": "initial"},
                  layout=w.Layout(width=width))
    if is_int:
        return w.IntSlider(step=step or 1, **common)
    kw = dict(step=step or (max - min) / 100, **common)
    if readout_format:
        kw["readout_format"] = readout_format
    return w.FloatSlider(**kw)


def dropdown(description: str, options, value=None, width: str = "260px"):
    import ipywidgets as w

    options = list(options)
    return w.Dropdown(description=description, options=options,
                      value=options[0] if value is None else value,
                      style={"description_width": "initial"}, layout=w.Layout(width=width))


def checkbox(description: str, value: bool = False):
    import ipywidgets as w

    return w.Checkbox(description=description, value=value, indent=False)


def select_many(description: str, options, value=None, rows: int | None = None):
    """A multiple-choice list (value: a tuple of the chosen options; default all)."""
    import ipywidgets as w

    options = list(options)
    return w.SelectMultiple(description=description, options=options,
                            value=tuple(options if value is None else value),
                            rows=rows or min(8, len(options)), style={"description_width": "initial"})


def text(description: str, value: str = "", width: str = "520px", placeholder: str = ""):
    import ipywidgets as w

    return w.Text(description=description, value=value, continuous_update=False,
                  placeholder=placeholder, style={"description_width": "initial"},
                  layout=w.Layout(width=width))


# --------------------------------------------------------------------------- panels

_ACTIVE: "Panel | None" = None  # the live panel whose render function is running


def stream(obj, name: str | None = None, every_s: float = 0.3) -> bool:
    """Show an intermediate result while a live panel's render function is still running.

    Call it from a long measurement (e.g. a ``token.end`` hook) to watch charts grow; it
    redraws at most every ``every_s`` seconds and does nothing in static runs or outside a
    panel. Returns True when it redrew.
    """
    p = _ACTIVE
    if p is None or is_static() or p._out is None:
        return False
    now = time.perf_counter()
    if now - p._last_stream < every_s:
        return False
    p._last_stream = now
    with p._out:
        p._out.clear_output(wait=True)
        show_any(obj, name or p.name)
    return True

class Panel:
    """Controls + Output; re-runs ``render(**values)`` whenever a control changes."""

    def __init__(self, render: Callable[..., Any], controls: Mapping[str, Any], *,
                 name: str = "chart", title: str | None = None, static: bool = True):
        if not callable(render):
            raise ValueError("panel(render, controls): render must be a function of the control values")
        self.render_fn = render
        self.controls = dict(controls)
        self.name = name
        self.title = title
        self.static = static      # render once in static runs (False: the cells above already show it)
        self.renders = 0          # how many times render ran (tests use it)
        self.last = None          # what the last render returned
        self.last_error: str | None = None
        self.seconds = 0.0
        self._box = None
        self._out = None
        self._status = None
        self._last_stream = 0.0

    # values of the controls as keyword arguments
    def values(self) -> dict:
        return {k: getattr(c, "value", c) for k, c in self.controls.items()}

    def compute(self):
        global _ACTIVE
        t0 = time.perf_counter()
        _ACTIVE, prev = self, _ACTIVE
        try:
            result = self.render_fn(**self.values())
        finally:
            _ACTIVE = prev
        self.seconds = time.perf_counter() - t0
        self.renders += 1
        self.last = result
        return result

    # ---- live
    def _build(self):
        import ipywidgets as w

        self._out = w.Output(layout=w.Layout(min_height="120px"))
        self._status = w.HTML(value="")
        widgets_ = [c for c in self.controls.values() if isinstance(c, w.DOMWidget)]
        rows = [w.HBox(widgets_[i:i + 3]) for i in range(0, len(widgets_), 3)]
        head = [w.HTML(f"<b>{html.escape(self.title)}</b>")] if self.title else []
        self._box = w.VBox(head + rows + [self._status, self._out],
                           layout=w.Layout(border="1px solid #ddd", padding="6px"))
        self._box.add_class("workbench-panel")
        for c in self.controls.values():
            if hasattr(c, "observe"):
                c.observe(lambda change: self.update(), names="value")

    def update(self) -> None:
        """Re-run the measurement with the current control values and redraw the Output."""
        if self._out is None:
            self._build()
        self._status.value = "<i>computing…</i>"
        with self._out:
            try:
                result = self.compute()
                self._out.clear_output(wait=True)
                show_any(result, self.name)
                self.last_error = None
                self._status.value = (f"<span style='color:#666'>updated in {self.seconds:.2f} s "
                                      f"({self._describe()})</span>")
            except Exception as e:  # show the problem where the user is looking
                self.last_error = f"{type(e).__name__}: {e}"
                self._out.clear_output(wait=True)
                self._status.value = (f"<span style='color:#b00'>error: {html.escape(self.last_error)}"
                                      "</span>")
                print(traceback.format_exc())

    def _describe(self) -> str:
        parts = []
        for k, v in self.values().items():
            parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
        return ", ".join(parts)

    # ---- display
    def _ipython_display_(self):
        from IPython.display import Markdown, display

        if is_static():
            if not self.static:
                display(Markdown(f"*Live panel ({html.escape(self.title or self.name)}): open the notebook in "
                                 "JupyterLab to use its controls.*"))
                return
            if self.controls:
                display(Markdown(f"*Live controls in JupyterLab ({html.escape(self.title or self.name)}); "
                                 f"this static run used:* `{self._describe()}`"))
            show_any(self.compute(), self.name)
            return
        if self._box is None:
            self._build()
        display(self._box)
        self.update()

    @property
    def box(self):
        if self._box is None:
            self._build()
        return self._box

    @property
    def output(self):
        if self._out is None:
            self._build()
        return self._out


def panel(render: Callable[..., Any], controls: Mapping[str, Any] | None = None, *,
          name: str = "chart", title: str | None = None, static: bool = True) -> Panel:
    """Build a live panel; display it (last expression of a cell) to show controls + charts.

    ``controls`` maps keyword names of ``render`` to widgets (``slider``, ``dropdown``...)
    or to plain values (passed through unchanged, not shown). ``static=False``: in static
    (report) runs show only a note, for panels that repeat what the cells above show.
    """
    return Panel(render, controls or {}, name=name, title=title, static=static)


# --------------------------------------------------------------------------- notebook sessions
# Thin glue the notebooks share (open the default model, pick a prompt, record a trace once per
# kernel). The measurements themselves are package functions; these only wire them up.

_RUNS: dict = {}


def model_path(model=None):
    """``model`` as a Path, or the shipped reference model (``workbench.data.default_model``)."""
    from pathlib import Path

    if model:
        p = Path(model).expanduser()
        if not p.exists():
            raise ValueError(f"model {p} does not exist; give an mlx-lm model directory or a workbench store, "
                             "or None for the shipped reference model")
        return p
    from workbench.data import default_model

    return default_model()


def default_prompt(engine=None, workload: str = "code_heldout", index: int = 0, n_ids: int = 16,
                   max_tokens: int = 24):
    """The first held-out workload prompt, as its last ``max_tokens`` token ids when the model has a
    tokenizer (so notebook runs cost the same whatever the prompt's length), else ``n_ids`` fixed ids."""
    text = None
    try:
        from workbench.data import workload as load_workload

        text = load_workload(workload)[index]["text"]
    except (ValueError, IndexError, KeyError, OSError):
        text = None
    if engine is not None and text is not None:
        try:
            ids = list(engine.tokenizer.encode(text))
        except Exception:  # the store ships no tokenizer
            ids = []
        if ids:
            return ids[-max_tokens:]  # the prompt's end: where generation continues
    vocab = int((engine.config.get("vocab_size") if engine is not None else 0) or 128)
    return [(7 * i + 3) % vocab for i in range(1, n_ids + 1)]


class Run:
    """One recorded generation: ``result`` (engine Result), ``trace`` (Trace), ``path``, ``model``."""

    def __init__(self, result, trace, path, model):
        self.result, self.trace, self.path, self.model = result, trace, path, model

    @property
    def stats(self) -> dict:
        return self.result.stats


def record(model=None, prompt=None, max_tokens: int = 32, arena="1.0", moe_input: bool = False,
           io_events: bool = False, progress: bool | None = None, **engine_kw) -> Run:
    """Generate once with a trace recorder (cached per kernel for the same arguments). ``arena``
    and ``engine_kw`` (``io=``, ``ahead=``, ``decode=``...) are the Engine's (workbench.config).

    ``progress`` (default: on in live notebooks, off in static report runs) shows tqdm bars.
    """
    if progress is None:
        progress = not is_static()
    import tempfile
    from pathlib import Path

    from workbench.engine.engine import Engine
    from workbench.trace.recorder import TraceRecorder
    from workbench.trace.schema import read_trace

    mp = model_path(model)
    key = (str(mp), repr(prompt), max_tokens, repr(arena), moe_input, io_events, repr(sorted(engine_kw.items())))
    if key in _RUNS:
        return _RUNS[key]
    path = Path(tempfile.mkdtemp(prefix="wb-trace-")) / "run.parquet"
    with Engine.open(mp, arena=arena, progress=progress, **engine_kw) as eng:
        ids = prompt if prompt is not None else default_prompt(eng)
        res = eng.generate(ids, max_tokens=max_tokens, trace=TraceRecorder(path, moe_input=moe_input,
                                                                          io_events=io_events))
    run = _RUNS[key] = Run(res, read_trace(path), path, mp)
    return run


# --------------------------------------------------------------------------- small charts
# Charts of engine counters and side-by-side comparisons used by the notebook panels.

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
    """One bar panel per metric, one bar per configuration (colour = configuration)."""
    import altair as alt

    labels = labels or {}
    long = df.melt(id_vars=[config], value_vars=metrics, var_name="metric", value_name="value")
    long["metric"] = long["metric"].map(lambda m: labels.get(m, m))
    order = list(dict.fromkeys(df[config]))
    return alt.Chart(long).mark_bar().encode(
        x=alt.X(f"{config}:N", sort=order, title=None, axis=alt.Axis(labels=False, ticks=False)),
        y=alt.Y("value:Q", title=None),
        color=alt.Color(f"{config}:N", sort=order, title=config.replace("_", " "),
                        scale=color_scale(order)),
        column=alt.Column("metric:N", title=None, sort=[labels.get(m, m) for m in metrics],
                          header=alt.Header(labelFontWeight="bold", labelFontSize=12)),
        tooltip=[config, "metric", alt.Tooltip("value:Q", format=fmt)],
    ).properties(width=110, height=180, title=alt.TitleParams(title, subtitle=subtitle or [], anchor="start")
                 ).resolve_scale(y="independent")


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


def readpath_chart(table, title: str = "Read path: GB/s vs the sequential limit", subtitle: str | None = None):
    """Bars of GB/s per method (threads on the axis), faceted by read mode and cache state."""
    import altair as alt

    t = table.copy()
    t["cache"] = t["cold"].map({True: "cold", False: "warm"})
    t["what"] = [f"{m} ×{th}" if m.startswith("store") else m for m, th in zip(t["method"], t["threads"])]
    t["what"] = t["what"].str.replace("store blobs (preadv into slots)", "store → slots", regex=False)
    t["panel"] = t["mode"] + ", " + t["cache"]
    t["kind"] = ["sequential limit" if m == "sequential" else ("store → slots" if m.startswith("store") else "single copy")
                 for m in t["method"]]
    order = list(dict.fromkeys(t["what"]))
    scale = color_scale(["sequential limit", "store → slots", "single copy"])
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
    return bars.facet(facet=alt.Facet("panel:N", title=None, header=alt.Header(labelFontWeight="bold")), columns=2).properties(
        title=alt.TitleParams(title, subtitle=subtitle or [], anchor="start"))
