"""Live panels: a row of controls above an Output, re-running a measurement when a control changes.

``panel(render, controls)``: when a control changes, ``render`` is called with the current values
(keyword arguments named like the controls) and whatever it returns (charts, tables, markdown;
see ``display.bundles``) replaces the Output's content. The measurement is re-run by a package
function inside ``render``; the notebook is not re-run. In static mode (``workbench report``) the
panel renders once with the initial values straight into the cell output.

Stale runs are dropped. In a kernel with a front end (JupyterLab), a control change only records
a request: one worker thread runs each panel's latest request once its controls have been still
for ``debounce_s``. Three arrow presses while a run is in flight cost that run and one run at the
last value; the in-flight run, now stale, is not drawn. A render that calls ``stream`` or
``check`` (e.g. from a ``token.end`` hook) stops at its next call instead. The worker and the
notebook's cells take turns (a cell waits for the render in flight, no render starts while a cell
runs), so MLX is never driven from two threads at once.

Without a front end (tests, plain Python), with ``background=False``, and for the first render
when the panel is displayed, ``update`` runs synchronously in the caller.
"""

from __future__ import annotations

import html
import threading
import time
import traceback
from typing import Any, Callable, Mapping

from .display import bundles, is_static

_local = threading.local()  # .panel: the panel whose render function runs in this thread


class Stale(Exception):
    """Raised by ``check`` (and ``stream``) inside a render whose panel has a newer request."""


def check() -> None:
    """Stop the running render (raise ``Stale``) when its panel's values changed since it began.

    Call it from a long measurement, e.g. a ``token.end`` hook, to drop a stale run at the next
    token; it does nothing outside a panel or when nothing newer is waiting."""
    p = getattr(_local, "panel", None)
    if p is not None and p.stale():
        raise Stale(f"panel {p.name!r}: the controls changed; this run is dropped")


def stream(obj, name: str | None = None, every_s: float = 0.3) -> bool:
    """Show an intermediate result while a live panel's render function is still running.

    Call it from a long measurement (e.g. a ``token.end`` hook) to watch charts grow; it redraws
    at most every ``every_s`` seconds and does nothing in static runs or outside a panel. It also
    calls ``check``, so a stale run stops here. Returns True when it redrew.
    """
    p = getattr(_local, "panel", None)
    if p is None or is_static() or p._out is None:
        return False
    check()
    now = time.perf_counter()
    if now - p._last_stream < every_s:
        return False
    p._last_stream = now
    p._draw(bundles(obj, name or p.name))
    return True


def _has_front_end() -> bool:
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None and not is_static()


class _Worker:
    """One thread that runs the panels' latest requests in request order, between cells."""

    def __init__(self):
        self.cv = threading.Condition()
        self.queue: list[Panel] = []  # panels with a request not yet started
        self.busy: Panel | None = None
        self.cell_running = False
        self.thread: threading.Thread | None = None
        self.hooked = False

    def submit(self, panel: "Panel") -> None:
        with self.cv:
            if panel._pending is not None:
                panel.dropped += 1  # the waiting request never runs: the newer one replaces it
            panel._pending = time.monotonic()
            if panel not in self.queue:
                self.queue.append(panel)
            self._hook_cells()
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="workbench-panels", daemon=True)
                self.thread.start()
            self.cv.notify_all()

    def _next(self) -> "Panel":
        with self.cv:
            while True:
                if self.queue and not self.cell_running:
                    p = self.queue[0]
                    wait = p._pending + p.debounce_s - time.monotonic()
                    if wait <= 0:  # its controls have been still for debounce_s
                        self.queue.pop(0)
                        p._pending = None
                        self.busy = p
                        return p
                    self.cv.wait(wait)
                else:
                    self.cv.wait()

    def _loop(self) -> None:
        while True:
            p = self._next()
            try:
                p.update()
            finally:
                with self.cv:
                    self.busy = None
                    self.cv.notify_all()

    def idle(self) -> bool:
        return not self.queue and self.busy is None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no request is queued or running (True), or ``timeout`` passed (False)."""
        with self.cv:
            return self.cv.wait_for(self.idle, timeout)

    # A cell waits for the render in flight, and no render starts while a cell runs.
    def _hook_cells(self) -> None:
        from IPython import get_ipython

        ip = get_ipython()
        if ip is not None and not self.hooked:
            ip.events.register("pre_run_cell", self._cell_starts)
            ip.events.register("post_run_cell", self._cell_ends)
            self.hooked = True

    def _cell_starts(self, *_):
        with self.cv:
            self.cv.wait_for(lambda: self.busy is None)
            self.cell_running = True

    def _cell_ends(self, *_):
        with self.cv:
            self.cell_running = False
            self.cv.notify_all()


WORKER = _Worker()


class Panel:
    """Controls + Output; re-runs ``render(**values)`` whenever a control changes."""

    def __init__(self, render: Callable[..., Any], controls: Mapping[str, Any], *, name: str = "chart",
                 title: str | None = None, static: bool = True, background: bool | None = None,
                 debounce_s: float = 0.25):
        if not callable(render):
            raise ValueError("panel(render, controls): render must be a function of the control values")
        self.render_fn = render
        self.controls = dict(controls)
        self.name = name
        self.title = title
        self.static = static          # render once in static runs (False: the cells above already show it)
        self.background = background  # None: in the worker when a front end is there
        self.debounce_s = debounce_s
        self.renders = 0              # how many times render ran to its end
        self.runs: list[tuple[dict, str]] = []  # (values, "drawn" | "stale" | "cancelled" | "error") per run
        self.dropped = 0              # requests replaced by a newer one before they started
        self.last = None              # what the last finished render returned
        self.last_error: str | None = None
        self.seconds = 0.0
        self._pending: float | None = None  # when the newest request not yet started came
        self._box = None
        self._out = None
        self._status = None
        self._last_stream = 0.0

    def values(self) -> dict:
        """The controls' values as keyword arguments (plain values pass through)."""
        return {k: getattr(c, "value", c) for k, c in self.controls.items()}

    def stale(self) -> bool:
        """True when a newer request waits: what runs now will not be drawn."""
        return self._pending is not None

    def compute(self, values: dict | None = None):
        values = self.values() if values is None else values
        t0 = time.perf_counter()
        prev, _local.panel = getattr(_local, "panel", None), self
        try:
            result = self.render_fn(**values)
        finally:
            _local.panel = prev
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
        if self.background if self.background is not None else _has_front_end():
            WORKER.submit(self)
        else:
            self.update()

    def _draw(self, outputs) -> None:
        self._out.outputs = tuple(outputs)  # one trait write: safe from the worker thread

    def update(self) -> None:
        """Re-run the measurement with the current control values and redraw the Output."""
        if self._out is None:
            self._build()
        self._status.value = "<i>computing…</i>"
        values = self.values()
        try:
            outputs = bundles(self.compute(values), self.name)
        except Stale:
            self.runs.append((values, "cancelled"))
            return
        except Exception as e:  # show the problem where the user is looking
            self.last_error = f"{type(e).__name__}: {e}"
            self.runs.append((values, "error"))
            self._draw([{"output_type": "stream", "name": "stderr", "text": traceback.format_exc()}])
            self._status.value = f"<span style='color:#b00'>error: {html.escape(self.last_error)}</span>"
            return
        if self.stale():  # a newer request follows at once: drawing this one would only flash
            self.runs.append((values, "stale"))
            return
        self._draw(outputs)
        self.last_error = None
        self.runs.append((values, "drawn"))
        self._status.value = (f"<span style='color:#666'>updated in {self.seconds:.2f} s "
                              f"({self._describe(values)})</span>")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the worker has nothing queued or running (for scripts and tests; a cell in a
        live kernel holds the worker back, so there it only times out)."""
        return WORKER.wait(timeout)

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
          title: str | None = None, static: bool = True, background: bool | None = None,
          debounce_s: float = 0.25) -> Panel:
    """Build a live panel; display it (last expression of a cell) to show controls + charts.

    ``controls`` maps keyword names of ``render`` to widgets (``controls.slider``, ``dropdown``...)
    or to plain values (passed through unchanged, not shown). ``static=False``: in static (report)
    runs show only a note, for panels that repeat what the cells above show. ``background``: run
    control changes in the worker (None: when a front end is there; False: always synchronously).
    """
    return Panel(render, controls or {}, name=name, title=title, static=static, background=background,
                 debounce_s=debounce_s)
