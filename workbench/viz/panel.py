"""Live panels: a row of controls above an Output, re-running a measurement when a control changes.

``panel(render, controls)``: when a control changes, ``render`` is called with the current values
(keyword arguments named like the controls) and whatever it returns (charts, tables, markdown;
see ``display.bundles``) replaces the Output's content. The measurement is re-run by a package
function inside ``render``; the notebook is not re-run. In static mode (``workbench report``) the
panel renders once with the initial values straight into the cell output.

Stale runs are dropped, latest value wins. In a live kernel a control change does not run the
measurement in the change handler: it (re)schedules one run on the kernel's event loop,
``debounce_s`` later. The kernel handles the next control messages first, so quick changes
(each arrow press is one) replace the scheduled run instead of queueing one each, and changes
that arrive while a run is in flight (the kernel holds them until it returns) lead to one more
run, at the last value. Runs stay on the kernel's main thread: MLX evaluates a lazy array only
on the thread that built it, and cells and panels never run at once.

Without an event loop (tests, plain Python), with ``sync=True``, and for the first render when
the panel is displayed, ``update`` runs synchronously in the caller.
"""

from __future__ import annotations

import html
import time
import traceback
from typing import Any, Callable, Mapping

from .display import bundles, is_static

_active: "Panel | None" = None  # the panel whose render function is running


def stream(obj, name: str | None = None, every_s: float = 0.3) -> bool:
    """Show an intermediate result while a live panel's render function is still running.

    Call it from a long measurement (e.g. a ``token.end`` hook) to watch charts grow; it redraws
    at most every ``every_s`` seconds and does nothing in static runs or outside a panel. Returns
    True when it redrew.
    """
    p = _active
    if p is None or is_static() or p._out is None:
        return False
    now = time.perf_counter()
    if now - p._last_stream < every_s:
        return False
    p._last_stream = now
    p._draw(bundles(obj, name or p.name))
    return True


def _kernel_loop():
    """The event loop running in this thread (ipykernel's, in a live kernel), else None."""
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Panel:
    """Controls + Output; re-runs ``render(**values)`` whenever a control changes."""

    def __init__(self, render: Callable[..., Any], controls: Mapping[str, Any], *, name: str = "chart",
                 title: str | None = None, static: bool = True, sync: bool = False, debounce_s: float = 0.25):
        if not callable(render):
            raise ValueError("panel(render, controls): render must be a function of the control values")
        self.render_fn = render
        self.controls = dict(controls)
        self.name = name
        self.title = title
        self.static = static          # render once in static runs (False: the cells above already show it)
        self.sync = sync              # True: run in the change handler, never deferred
        self.debounce_s = debounce_s
        self.renders = 0              # how many times render ran to its end
        self.runs: list[tuple[dict, str]] = []  # (values, "drawn" | "error"), one per run
        self.dropped = 0              # scheduled runs replaced by a newer change before they started
        self.last = None              # what the last finished render returned
        self.last_error: str | None = None
        self.seconds = 0.0
        self._scheduled = None        # the pending run (an asyncio TimerHandle)
        self._box = None
        self._out = None
        self._status = None
        self._last_stream = 0.0

    def values(self) -> dict:
        """The controls' values as keyword arguments (plain values pass through)."""
        return {k: getattr(c, "value", c) for k, c in self.controls.items()}

    @property
    def pending(self) -> bool:
        """True while a run is scheduled and not yet started."""
        return self._scheduled is not None

    def compute(self, values: dict | None = None):
        global _active
        values = self.values() if values is None else values
        t0 = time.perf_counter()
        prev, _active = _active, self
        try:
            result = self.render_fn(**values)
        finally:
            _active = prev
        self.seconds = time.perf_counter() - t0
        self.renders += 1
        self.last = result
        return result

    # ---- live
    def _build(self):
        import ipywidgets as w

        self._out = w.Output(layout=w.Layout(min_height="120px"))
        self._status = w.HTML(value="")
        controls = [c for c in self.controls.values() if isinstance(c, w.DOMWidget)]
        rows = [w.HBox(controls[i:i + 3]) for i in range(0, len(controls), 3)]
        head = [w.HTML(f"<b>{html.escape(self.title)}</b>")] if self.title else []
        self._box = w.VBox(head + rows + [self._status, self._out],
                           layout=w.Layout(border="1px solid #ddd", padding="6px"))
        self._box.add_class("workbench-panel")
        for c in self.controls.values():
            if hasattr(c, "observe"):
                c.observe(self._changed, names="value")

    def _changed(self, change=None) -> None:
        loop = None if self.sync else _kernel_loop()
        if loop is None:
            self.update()
            return
        if self._scheduled is not None:  # a newer value replaces the run not yet started
            self._scheduled.cancel()
            self.dropped += 1
        self._scheduled = loop.call_later(self.debounce_s, self._run_scheduled)
        self._status.value = "<i>waiting for the controls to settle…</i>"

    def _run_scheduled(self) -> None:
        self._scheduled = None
        self.update()

    def _draw(self, outputs) -> None:
        self._out.outputs = tuple(outputs)  # one trait write replaces the Output's content

    def update(self) -> None:
        """Re-run the measurement with the current control values and redraw the Output."""
        if self._out is None:
            self._build()
        self._status.value = "<i>computing…</i>"
        values = self.values()
        try:
            outputs = bundles(self.compute(values), self.name)
        except Exception as e:  # show the problem where the user is looking
            self.last_error = f"{type(e).__name__}: {e}"
            self.runs.append((values, "error"))
            self._draw([{"output_type": "stream", "name": "stderr", "text": traceback.format_exc()}])
            self._status.value = f"<span style='color:#b00'>error: {html.escape(self.last_error)}</span>"
            return
        self._draw(outputs)
        self.last_error = None
        self.runs.append((values, "drawn"))
        skipped = f" · {self.dropped} stale request(s) skipped" if self.dropped else ""
        self._status.value = (f"<span style='color:#666'>updated in {self.seconds:.2f} s "
                              f"({self._describe(values)}){skipped}</span>")

    def _describe(self, values: dict | None = None) -> str:
        values = self.values() if values is None else values
        return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())

    # ---- display
    def _ipython_display_(self):
        from IPython.display import Markdown, display

        from .display import show_any

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


def panel(render: Callable[..., Any], controls: Mapping[str, Any] | None = None, *, name: str = "chart",
          title: str | None = None, static: bool = True, sync: bool = False, debounce_s: float = 0.25) -> Panel:
    """Build a live panel; display it (last expression of a cell) to show controls + charts.

    ``controls`` maps keyword names of ``render`` to widgets (``controls.slider``, ``dropdown``...)
    or to plain values (passed through unchanged, not shown). ``static=False``: in static (report)
    runs show only a note, for panels that repeat what the cells above show. ``sync=True``: run
    every change at once in its handler (no debouncing, no dropping).
    """
    return Panel(render, controls or {}, name=name, title=title, static=static, sync=sync, debounce_s=debounce_s)
