"""Turn an AheadConfig into the engine's planner (read-ahead) and router."""

from __future__ import annotations

from ..config import AheadConfig
from .ahead import Planner
from .cache_aware import CacheAwareRouter


def configure(engine, ahead: AheadConfig | None = None):
    """Set ``engine``'s router and read-ahead planner from ``ahead`` (None: exact, no read-ahead).

    mode unpert1: exact router, ahead() reads the raw top-k of predicted logits.
    mode unpert0: cache-aware router with p=3, no r1 (APPROXIMATE); ahead() ranks the same way.
    mode route:   cache-aware router with p, b, r1 as given (APPROXIMATE); ahead() ranks the same way."""
    a = AheadConfig() if ahead is None else ahead
    if not isinstance(a, AheadConfig):
        raise TypeError(f"configure: ahead must be an AheadConfig (workbench.config), got {type(a).__name__}")
    engine.ahead_config = a
    engine.router = None
    if a.mode == "cache_aware":
        engine.router = CacheAwareRouter(engine, p=a.moce_protect, b=a.moce_bonus, r1=a.moce_r1)
    elif a.mode == "resident_bonus" and a.moce_bonus > 0:
        engine.router = CacheAwareRouter(engine, p=min(3, engine.top_k), b=a.moce_bonus, r1=0.0)
    engine.planner = None
    if a.reads_ahead:
        engine.planner = Planner(engine, a.predictor, a.distance, a.mode, a.width, a.moce_protect, a.moce_bonus,
                                 a.moce_r1, a.gate, gate_options=a.gate_options, oracle=a.oracle_trace)
    return engine
