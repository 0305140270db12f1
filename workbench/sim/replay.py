"""Replay a trace through an engine eviction policy with a uniform-size cache of N slots.

The policy is the engine's own class (``workbench.arena.policies``), driven by its
``replay`` method (a fast loop checked against step-by-step driving by the conformance
tests). One request per routed expert in trace order, key = layer * n_experts + expert;
``tick()`` after the last request of every decode step.

Cache-aware routing is closed-loop: the router's choices depend on what is resident, so a
trace recorded with one arena and policy does not say what another would have routed.
``replay`` refuses a routing bonus (``NotReplayableError``) and warns when the trace itself
was recorded with cache-aware routing on.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..arena.policies.base import Policy, make_policy
from .requests import Requests, load, parse_arena, requests_from_trace

__all__ = ["ReplayResult", "NotReplayableError", "replay", "replay_keys", "replay_grid", "build_policy", "check_replayable"]


class NotReplayableError(ValueError):
    """The requested configuration changes routing, which fixed routes cannot replay."""


CLOSED_LOOP_MESSAGE = (
    "cache-aware routing (moce bonus b > 0) is closed-loop: which experts the router picks depends on "
    "what is resident, so it cannot be replayed from fixed routes. Run it live (`workbench run --mode cache_aware`) "
    "and record a trace; the simulator can replay prefetch ranking (ahead mode 'cache_aware'), not routing."
)


def check_replayable(meta: dict | None = None, moce_bonus: float | None = None) -> str | None:
    """Raise for a routing bonus; return a warning text when the trace was recorded with one."""
    if moce_bonus is not None and float(moce_bonus) > 0:
        raise NotReplayableError(CLOSED_LOOP_MESSAGE)
    meta = meta or {}
    b = meta.get("moce_bonus", meta.get("route_bonus"))
    if meta.get("route") or (b is not None and float(b) > 0):
        return (
            "this trace was recorded with cache-aware routing on: its routes depend on the recorded arena "
            f"and policy ({meta.get('policy', '?')}, arena {meta.get('arena', '?')}); replaying other settings "
            "is an open-loop approximation"
        )
    return None


def build_policy(policy, capacity: int, **options) -> Policy:
    """A fresh policy from a name, a Policy subclass, or (checked fresh) an instance."""
    if isinstance(policy, str):
        return make_policy(policy, capacity, **options)
    if isinstance(policy, type) and issubclass(policy, Policy):
        return policy(capacity, **options)
    if isinstance(policy, Policy):
        if options:
            raise ValueError("pass options to the policy's constructor, not with an instance")
        if policy.capacity != capacity:
            raise ValueError(f"policy instance has capacity {policy.capacity} but the arena is {capacity} slots")
        if next(iter(policy.order()), None) is not None:
            raise ValueError("policy instance is not empty; pass a fresh one (or the class or name)")
        return policy
    raise ValueError(f"policy must be a name, a Policy class or instance, got {policy!r}")


@dataclass
class ReplayResult:
    """Counts of one replay; ``hit`` is the per-request hit mask."""

    policy: str
    capacity: int
    lookups: int
    hits: int
    preloaded: int = 0
    hit: np.ndarray | None = field(default=None, repr=False)
    requests: Requests | None = field(default=None, repr=False)
    warning: str | None = None

    @property
    def misses(self) -> int:
        return self.lookups - self.hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def to_dict(self) -> dict:
        d = {
            "policy": self.policy,
            "capacity": self.capacity,
            "lookups": self.lookups,
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hit_rate,
            "preloaded": self.preloaded,
        }
        if self.warning:
            d["warning"] = self.warning
        return d

    def per_layer(self) -> pd.DataFrame:
        """Lookups, hits and hit rate per layer (needs a trace replay)."""
        if self.requests is None or self.hit is None:
            raise ValueError("per_layer needs a replay of a trace (replay_keys has no layers)")
        df = pd.DataFrame({"layer": self.requests.layer, "hit": self.hit})
        out = df.groupby("layer")["hit"].agg(lookups="size", hits="sum").reset_index()
        out["hit_rate"] = out["hits"] / out["lookups"]
        out.insert(0, "policy", self.policy)
        return out


def replay_keys(keys, /, policy="lru", capacity: int = 1, token_end=None, preload=True, **options) -> ReplayResult:
    """Replay a raw key sequence (ints) through ``policy`` with ``capacity`` slots."""
    keys = np.asarray(keys, dtype=np.int64)
    pol = build_policy(policy, int(capacity), **options)
    n_pre = 0
    if preload:
        for k in pol.warm_keys()[: pol.capacity]:
            pol.admit(int(k), speculative=True)
            n_pre += 1
    hit = pol.replay(keys, token_end=token_end)
    return ReplayResult(policy=pol.name, capacity=pol.capacity, lookups=len(keys), hits=int(hit.sum()), preloaded=n_pre, hit=hit)


def replay(trace, policy="lru", arena="0.25", phase=None, preload=True, moce_bonus=None, **options) -> ReplayResult:
    """Replay ``trace`` (a Trace or a path) through ``policy`` with an arena of ``arena`` slots.

    ``arena``: slots, a fraction or percentage of all routed experts, or a size (with the
    trace's expert_bytes); see ``workbench.sizes``. ``phase``: None/'all', 'prefill' or
    'decode'. ``preload``: load the policy's warm keys (hotlist) first. Extra ``options``
    go to the policy (n_keys and n_experts are filled in from the trace).
    """
    from ..arena.policies.static import require_hotlist

    if isinstance(policy, str):
        require_hotlist(policy, options)
    tr = load(trace)
    warning = check_replayable(tr.meta, moce_bonus)
    req = requests_from_trace(tr, phase=phase)
    capacity = parse_arena(arena, req.n_routed, tr.meta.get("expert_bytes"))
    if isinstance(policy, (str, type)):
        options.setdefault("n_keys", req.n_keys)
        options.setdefault("n_experts", req.n_experts)
    if warning:
        warnings.warn(warning, stacklevel=2)
    res = replay_keys(req.keys, policy, capacity, token_end=req.token_end, preload=preload, **options)
    res.requests = req
    res.warning = warning
    return res


def replay_grid(trace, policies=("lru",), arenas=("0.25",), phase=None, preload=True, progress=False) -> pd.DataFrame:
    """Replay every (policy, arena) pair; one row each: policy, arena, capacity, lookups, hits, misses, hit_rate."""
    tr = load(trace)
    check_replayable(tr.meta)
    req = requests_from_trace(tr, phase=phase)
    pairs = [(p, a) for p in policies for a in arenas]
    if progress:
        from tqdm.auto import tqdm

        pairs = tqdm(pairs, desc="replay")
    rows = []
    for pol, arena in pairs:
        cap = parse_arena(arena, req.n_routed, tr.meta.get("expert_bytes"))
        opts = {"n_keys": req.n_keys, "n_experts": req.n_experts} if isinstance(pol, (str, type)) else {}
        r = replay_keys(req.keys, pol, cap, token_end=req.token_end, preload=preload, **opts)
        d = r.to_dict()
        d["arena"] = str(arena)
        rows.append(d)
    cols = ["policy", "arena", "capacity", "lookups", "hits", "misses", "hit_rate", "preloaded"]
    return pd.DataFrame(rows)[cols]
