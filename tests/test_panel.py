"""Live panels drop stale runs: real engine runs on a tiny model, driven the way ipykernel drives them.

In a kernel, control changes arrive as messages handled one at a time on the kernel's event loop,
and messages that arrive while a run blocks the loop wait until it returns. The tests run the
panel on an asyncio loop and model "the user moved the slider while a run was in flight" with a
``token.end`` hook of that run that queues the next value changes on the loop (``call_soon``):
they are handled right after the run, as the kernel would handle them.
"""

import asyncio
import time

import pytest

from workbench.engine.engine import Engine
from workbench.hooks import run_with_hooks
from workbench.viz import controls as ui
from workbench.viz.counter_charts import token_counters_chart
from workbench.viz.display import CHART_MIME, STATIC_ENV
from workbench.viz.panel import panel

PROMPT = [3, 17, 42, 5, 9, 77, 11, 2]
TOKENS = 6
A, B, C = 0.5, 0.75, 1.0


@pytest.fixture
def store(tiny, monkeypatch):
    monkeypatch.delenv(STATIC_ENV, raising=False)
    return tiny("qwen3_moe")[1]


class Runs:
    """A render function running the engine; ``during`` values are set while the run at ``at`` is in flight."""

    def __init__(self, store, slider=None, at=None, during=()):
        self.store, self.slider, self.at, self.during = store, slider, at, during
        self.started, self.finished = [], []

    def __call__(self, arena):
        self.started.append(arena)

        def on_token(token, step, **ctx):
            if arena == self.at and step == 1:  # messages that arrive during this run
                loop = asyncio.get_running_loop()
                for v in self.during:
                    loop.call_soon(setattr, self.slider, "value", v)

        with Engine.open(self.store, arena=arena, progress=False) as eng:
            r = run_with_hooks(eng, PROMPT, [("token.end", on_token)], max_tokens=TOKENS, progress=False)
        self.finished.append((arena, r.tokens))
        return token_counters_chart(r.counters, title=f"arena {arena:.2f}")


async def settle(p, runs, n, timeout=60):
    t0 = time.monotonic()
    while p.pending or len(runs.finished) < n:
        assert time.monotonic() - t0 < timeout, "the panel did not settle"
        await asyncio.sleep(0.02)
    await asyncio.sleep(3 * p.debounce_s)  # nothing else follows
    assert not p.pending


def shown_title(p):
    (out,) = p.output.outputs
    return out["data"][CHART_MIME]["title"]


def reference_tokens(store, arena):
    with Engine.open(store, arena=arena, progress=False) as eng:
        return eng.generate(PROMPT, max_tokens=TOKENS, progress=False).tokens


def test_changes_during_a_run_lead_to_one_run_at_the_last_value(store):
    slider = ui.slider("arena", 0.25, 1.0, 0.25, value=0.25)
    runs = Runs(store, slider, at=A, during=(B, C))
    p = panel(runs, {"arena": slider}, debounce_s=0.05)
    p.box  # built: the controls are observed

    async def scenario():
        slider.value = A
        assert p.pending and runs.started == []  # scheduled, not run in the change handler
        await settle(p, runs, 2)

    asyncio.run(scenario())
    assert runs.started == [A, C]  # B never ran
    assert [a for a, _ in runs.finished] == [A, C] and all(len(t) == TOKENS for _, t in runs.finished)
    assert p.dropped == 1 and [r[0]["arena"] for r in p.runs] == [A, C]
    assert shown_title(p) == "arena 1.00" and "arena=1" in p._status.value and "1 stale" in p._status.value
    assert runs.finished[1][1] == reference_tokens(store, C)


def test_quick_changes_run_once_at_the_last_value(store):
    slider = ui.slider("arena", 0.25, 1.0, 0.25, value=0.25)
    runs = Runs(store)
    p = panel(runs, {"arena": slider}, debounce_s=0.2)
    p.box

    async def scenario():
        for v in (A, B, C):  # three arrow presses, handled one after another
            slider.value = v
            await asyncio.sleep(0)
        await settle(p, runs, 1)

    asyncio.run(scenario())
    assert runs.started == [C] and p.dropped == 2 and p.runs == [({"arena": C}, "drawn")]
    assert shown_title(p) == "arena 1.00"


def test_without_an_event_loop_or_with_sync_updates_run_in_the_caller(store):
    slider = ui.slider("arena", 0.25, 1.0, 0.25, value=0.25)
    runs = Runs(store)
    p = panel(runs, {"arena": slider})  # no running loop: synchronous
    p.box
    slider.value = A
    slider.value = C
    assert runs.started == [A, C] and [r[1] for r in p.runs] == ["drawn", "drawn"] and p.dropped == 0
    assert shown_title(p) == "arena 1.00"

    slider2 = ui.slider("arena", 0.25, 1.0, 0.25, value=0.25)
    runs2 = Runs(store)
    p2 = panel(runs2, {"arena": slider2}, sync=True)
    p2.box

    async def scenario():
        slider2.value = A
        slider2.value = B

    asyncio.run(scenario())
    assert runs2.started == [A, B] and not p2.pending  # the explicit flag: every change, at once


def test_tables_and_markdown_are_drawn_beside_charts(store):
    import pandas as pd

    from workbench.viz.display import table

    def render(arena):
        with Engine.open(store, arena=arena, progress=False) as eng:
            r = eng.generate(PROMPT, max_tokens=2, progress=False)
        return [("counters", token_counters_chart(r.counters)), f"hit rate **{r.stats['hit_rate']:.0%}**",
                ("stats", table(pd.DataFrame([{"tokens": r.stats["tokens"]}]), "run"))]

    p = panel(render, {"arena": ui.slider("arena", 0.25, 1.0, 0.25, value=1.0)})
    p.update()
    kinds = [sorted(o["data"]) for o in p.output.outputs]
    assert CHART_MIME in kinds[0] and "text/markdown" in kinds[1] and "text/html" in kinds[2]
    assert "hit rate" in p.output.outputs[1]["data"]["text/markdown"]
