"""Replay simulator: trace -> request stream -> engine policies (same classes), bounds, virtual time.

Entry points:
  replay(trace, policy, arena)         hit/miss counts of one policy (ReplayResult)
  replay_grid(trace, policies, arenas) a tidy table over policies x arena sizes
  replay_keys(keys, policy, capacity)  the same on a raw key sequence
  simulate(trace, arena, ahead, timing) virtual-time model with prefetch and I/O (VTimeResult; workbench.config)
  SimCache                             step-by-step driving cache (the reference protocol)
  requests_from_trace(trace)           the flattened request stream
  ioreplay.replay_io(trace, store)     the same routing through the real arena and I/O against a store
"""

from .cache import NoVictimError, SimCache  # noqa: F401
from .replay import NotReplayableError, ReplayResult, replay, replay_grid, replay_keys  # noqa: F401
from .requests import Requests, parse_arena, requests_from_trace  # noqa: F401
from .vtime import OUTCOMES, Timing, VTimeResult, simulate  # noqa: F401
