"""Live panels drop stale runs: real engine runs on a tiny model, driven through the panel's worker.

A ``token.end`` hook holds the first run at its first token until the test has moved the control
twice more, so "a run is in flight while the value changes" is certain, not a matter of timing.
"""

import threading
import time

import pytest

from workbench.engine.engine import Engine
from workbench.hooks import run_with_hooks
from workbench.viz import controls as ui
from workbench.viz.counter_charts import token_counters_chart
from workbench.viz.display import CHART_MIME, STATIC_ENV
from workbench.viz.panel import WORKER, check, panel

PROMPT = [3, 17, 42, 5, 9, 77, 11, 2]
TOKENS = 6
A, B, C = 0.5, 0.75, 1.0


@pytest.fixture
def store(tiny, monkeypatch):
    monkeypatch.delenv(STATIC_ENV, raising=False)
    yield tiny("qwen3_moe")[1]
    assert WORKER.wait(60), "the panel worker did not go idle"


def until(cond, timeout=60):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.01)


class Runs:
    """A render function running the engine; the run at ``hold`` waits at its first token for ``go``."""

    def __init__(self, store, hold=None, cancel=False):
        self.store, self.hold, self.cancel = store, hold, cancel
        self.go = threading.Event()
        self.started, self.finished, self.tokens_seen = [], [], {}

    def __call__(self, arena):
        self.started.append(arena)
        self.tokens_seen[arena] = 0

        def on_token(token, **ctx):
            self.tokens_seen[arena] += 1
            if arena == self.hold:
                assert self.go.wait(60)
            if self.cancel:
                check()

        with Engine.open(self.store, arena=arena, progress=False) as eng:
            r = run_with_hooks(eng, PROMPT, [("token.end", on_token)], max_tokens=TOKENS, progress=False)
        self.finished.append((arena, r.tokens))
        return token_counters_chart(r.counters, title=f"arena {arena:.2f}")


def shown_title(p):
    (out,) = p.output.outputs
    return out["data"][CHART_MIME]["title"]


def reference_tokens(store, arena):
    with Engine.open(store, arena=arena, progress=False) as eng:
        return eng.generate(PROMPT, max_tokens=TOKENS, progress=False).tokens


def test_in_flight_run_finishes_middle_value_dropped_last_value_drawn(store):
    runs = Runs(store, hold=A)
    slider = ui.slider("arena", 0.25, 1.0, 0.25, value=0.25)
    p = panel(runs, {"arena": slider}, background=True, debounce_s=0.05)
    p.box  # built: the controls are observed
    slider.value = A
    until(lambda: runs.started == [A])  # A is in flight, held at its first token
    slider.value = B
    slider.value = C
    runs.go.set()
    assert p.wait(60)
    assert runs.started == [A, C]  # B never ran
    assert [a for a, _ in runs.finished] == [A, C] and all(len(t) == TOKENS for _, t in runs.finished)
    assert p.dropped == 1
    assert p.runs == [({"arena": A}, "stale"), ({"arena": C}, "drawn")]  # A finished but was not drawn
    assert shown_title(p) == "arena 1.00" and "arena=1" in p._status.value
    assert runs.finished[1][1] == reference_tokens(store, C)


def test_stale_run_stops_at_the_next_token_when_render_checks(store):
    runs = Runs(store, hold=A, cancel=True)
    slider = ui.slider("arena", 0.25, 1.0, 0.25, value=0.25)
    p = panel(runs, {"arena": slider}, background=True, debounce_s=0.05)
    p.box
    slider.value = A
    until(lambda: runs.started == [A])
    slider.value = B
    slider.value = C
    runs.go.set()
    assert p.wait(60)
    assert runs.started == [A, C] and runs.tokens_seen[A] == 1  # A stopped at its first token
    assert [a for a, _ in runs.finished] == [C]
    assert p.runs == [({"arena": A}, "cancelled"), ({"arena": C}, "drawn")] and p.renders == 1
    assert shown_title(p) == "arena 1.00"
    assert runs.finished[0][1] == reference_tokens(store, C)  # the engine after a cancelled run is exact


def test_quick_changes_while_idle_run_once_at_the_last_value(store):
    runs = Runs(store)
    slider = ui.slider("arena", 0.25, 1.0, 0.25, value=0.25)
    p = panel(runs, {"arena": slider}, background=True, debounce_s=0.5)
    p.box
    for v in (A, B, C):  # three arrow presses
        slider.value = v
    assert p.wait(60)
    assert runs.started == [C] and p.dropped == 2 and p.runs == [({"arena": C}, "drawn")]


def test_no_render_starts_while_a_cell_runs(store):
    runs = Runs(store)
    slider = ui.slider("arena", 0.25, 1.0, 0.25, value=0.25)
    p = panel(runs, {"arena": slider}, background=True, debounce_s=0.0)
    p.box
    WORKER._cell_starts()
    try:
        slider.value = A
        time.sleep(0.5)
        assert runs.started == []
    finally:
        WORKER._cell_ends()
    assert p.wait(60) and runs.started == [A]


def test_without_front_end_updates_run_in_the_caller(store):
    runs = Runs(store)
    slider = ui.slider("arena", 0.25, 1.0, 0.25, value=0.25)
    p = panel(runs, {"arena": slider})  # background=None and no kernel: synchronous
    p.box
    slider.value = A
    slider.value = C
    assert runs.started == [A, C] and [r[1] for r in p.runs] == ["drawn", "drawn"]
    assert shown_title(p) == "arena 1.00"
