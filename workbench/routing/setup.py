"""Turn an AheadConfig into the engine's planner (read-ahead) and router."""

from __future__ import annotations

from ..config import AheadConfig
from .ahead import Planner
from .cache_aware import CacheAwareRouter


def configure(engine, ahead: AheadConfig | None = None):
    """(config, router, planner) for ``engine`` from ``ahead`` (None: exact, no read-ahead): the router
    is None for the exact one, the planner None for no read-ahead.

    The ranking modes are described once, in ``config`` (``AHEAD_MODES``): raw keeps the exact
    router; resident_bonus and cache_aware also route with the resident bonus (APPROXIMATE).
    ``ahead.router`` (exact | cache_aware), when given, fixes the router whatever the ranking."""
    a = AheadConfig() if ahead is None else ahead
    if not isinstance(a, AheadConfig):
        raise TypeError(f"configure: ahead must be an AheadConfig (workbench.config), got {type(a).__name__}")
    router = planner = None
    if a.router == "cache_aware" or (a.router is None and a.mode == "cache_aware"):
        router = CacheAwareRouter(engine, p=a.moce_protect, b=a.moce_bonus, r1=a.moce_r1)
    elif a.router is None and a.mode == "resident_bonus" and a.moce_bonus > 0:
        router = CacheAwareRouter(engine, p=min(3, engine.top_k), b=a.moce_bonus, r1=0.0)
    if a.reads_ahead:
        planner = Planner(engine, a.predictor, a.distance, a.mode, a.width, a.moce_protect, a.moce_bonus,
                          a.moce_r1, a.gate, gate_options=a.gate_options, oracle=a.oracle_trace)
    return a, router, planner
