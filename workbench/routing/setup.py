"""Turn the policy-layer options into the engine's planner (read-ahead) and router."""

from __future__ import annotations

from .ahead import Planner
from .cache_aware import CacheAwareRouter


def configure(engine, predictor=None, lookahead=1, unpert=1, route=False, moce_bonus=0.85, moce_protect=3,
              moce_r1=0.0, gate="none", width=None, oracle_trace=None):
    """unpert=1: exact router, ahead() reads the raw top-k of predicted logits (ranking "raw").
    unpert=0: cache-aware router with p=3, no r1 (APPROXIMATE); ahead() ranks the same way ("resident_bonus").
    route:    cache-aware router with p, b, r1 as given (APPROXIMATE); ahead() ranks the same way ("cache_aware").
    oracle_trace: the recorded Trace (``trace.schema.read_trace``) that --predictor oracle reads."""
    if unpert not in (0, 1):
        raise ValueError(f"--unpert must be 0 or 1, got {unpert}")
    if route and moce_bonus <= 0:
        raise ValueError(f"--route with --moce-bonus {moce_bonus} <= 0 is the plain router; give a bonus > 0 or drop --route")
    mode = "cache_aware" if route else ("resident_bonus" if unpert == 0 else "raw")
    engine.router = None
    if route:
        engine.router = CacheAwareRouter(engine, p=moce_protect, b=moce_bonus, r1=moce_r1)
    elif unpert == 0 and moce_bonus > 0:
        engine.router = CacheAwareRouter(engine, p=min(3, engine.top_k), b=moce_bonus, r1=0.0)
    engine.planner = None
    if predictor not in (None, "none"):
        engine.planner = Planner(engine, predictor, lookahead, mode, width, moce_protect, moce_bonus, moce_r1,
                                 gate, oracle=oracle_trace)
    elif gate != "none":
        raise ValueError(f"--gate {gate} filters read-ahead candidates: also give --predictor layer|prev|oracle")
    return engine
