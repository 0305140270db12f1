"""The claim sequence: how one routing decision drives the arena, for every driver.

Every decode pass of the engine and every simulator (``sim.replay``, ``sim.vtime``,
``sim.ioreplay``) claims experts through one ``Claims`` object, so they cannot drift:

    waves = claims.begin(layer, ids)      # the route is known: hooks, planner, the wave plan
    for wave in waves:
        table = claims.claim(layer, wave) # hits, misses read and waited for, speculation claimed
        ...compute on table's slots...
        claims.next_wave()                # (between waves, once the wave's compute is evaluated)
    claims.end(read_ahead)                # read ahead while the slots are pinned; release; limbo

``route`` is that sequence with no compute in between (the simulators, the handshake's answer,
an optimistic token's settle); ``settle`` is its vectorised form for many all-hit layers.

A batch of more than ``PREFILL_TOKENS`` tokens (prefill, a long verify pass) is streamed
layer-ranked: its experts hottest first, at most ``prefill_cap(layer)`` at a time, and the
prompt's hottest experts are kept hottest in the policy after it (``protect_prompt_hot``). A
batch that wants more experts than the arena has room for runs in waves, resident experts first.
A batch long enough to route to most of a layer's experts (``reads_next_layer``) reads the next
MoE layer's experts speculatively at ``end``, while this layer computes: each read at most once,
claimed (or dropped to limbo) at that layer; and where the arena has room for the whole layer it
claims every expert of it (``whole_layer``), so the engine can claim it before the route is known
(no sync per layer: ``passes.BatchPass``); where the arena has room for three layers it keeps each
such layer pinned through the next layer's claim and read-ahead (``held``), so that claim need
not wait for the layer's compute.
``preload`` fills the arena before a run's first claim.
"""

from __future__ import annotations

import numpy as np

PREFILL_TOKENS = 8  # batches longer than this use the prefill rule
WHOLE_PICKS = 8  # a batch with this many picks per expert of a layer claims the layer whole (``whole_layer``)


def prefill_cap(layer: int) -> int:
    """Most experts one prefill wave of ``layer`` may stream (256, 128 from layer 40)."""
    return 128 if layer >= 40 else 256


def reads_next_layer(n_tokens: int, top_k: int, n_experts: int, n_slots: int) -> bool:
    """Whether a batch of ``n_tokens`` reads the next layer's experts ahead: it routes at least
    twice as many picks as a layer has experts (uniform routing would then touch 86% of them), and
    the arena holds two layers' experts besides a decode token's (both in flight at once)."""
    return n_tokens * top_k >= 2 * n_experts and n_slots >= 2 * n_experts + 2 * top_k


class Claims:
    """One run's claim sequence over ``arena``. ``on_begin(layer, ids)`` is called first for every
    routing decision (the engine fires ``experts.selected`` and teaches its planner there)."""

    def __init__(self, arena, top_k: int, on_begin=None):
        self.arena, self.top_k, self.on_begin = arena, top_k, on_begin
        self.prompt_hot: list = []  # (count, layer, expert) of the batches streamed layer-ranked
        layers = list(arena.m.moe_layers)
        self.next_layer = dict(zip(layers, layers[1:]))  # MoE layer -> the next one
        self.ahead = None  # the MoE layer whose experts ``end`` reads ahead (a long batch), or None
        self.settle_at_end = False  # a long batch's last layer: ``end`` settles its reads not claimed
        self.holds = False  # ``end`` keeps this layer's slots pinned, as ``held``, through the next layer's
        self.held: list = []  # claim and read-ahead: the slots of a whole layer claimed before this one

    def begin(self, layer: int, ids: np.ndarray) -> list:
        """``ids`` ([..., top_k] host ids, one row per token) were routed at ``layer``: the waves
        (sorted unique expert ids each) to claim in turn."""
        if self.on_begin is not None:
            self.on_begin(layer, ids)
        self.ahead, self.settle_at_end = None, False
        if ids.size == self.top_k:  # one token: its top-k ids are distinct already
            return [sorted(ids.reshape(-1).tolist())]  # a list: numpy's first call after a sync is slow
        whole = self.whole_layer(layer, ids.size // self.top_k)  # also: whether it reads the next layer ahead
        if whole is not None:
            self.note_route(layer, ids)
            return whole
        wanted, counts = np.unique(ids, return_counts=True)
        arena = self.arena
        room = arena.n_slots - len(arena.spec) - len(arena.limbo)
        if ids.size // self.top_k > PREFILL_TOKENS:  # layer-ranked streaming, hottest first
            room = min(room, prefill_cap(layer))
            order = [int(e) for _, e in sorted(zip(-counts, wanted))]
            self.note_route(layer, ids, (wanted, counts))
        elif len(wanted) > room:  # resident experts first, then the misses
            order = sorted(wanted.tolist(), key=lambda e: (not arena.map.is_mapped(layer, e), e))
        else:
            return [wanted]
        return [np.array(order[i:i + room]) for i in range(0, len(order), room)]

    def whole_layer(self, layer: int, n_tokens: int):
        """The long-batch rule: a batch of ``n_tokens`` with ``WHOLE_PICKS`` picks per expert of a layer
        (uniform routing would leave 0.03% of them unrouted; a 2048-token prompt has 128-256) claims
        every expert of ``layer`` in one wave, whatever its route (which then need not be known
        first), where the arena has room for it and the next layer read ahead: that wave, else None.
        Shorter batches claim what they route to: a 64-token prompt's whole layers would evict the
        experts decode uses (wide model, 25%: 94.9% decode hits against 97.7%; bench/RESULTS.md).
        Sets which layer ``end`` reads ahead (``reads_next_layer``), for any batch."""
        arena = self.arena
        reads = reads_next_layer(n_tokens, self.top_k, arena.E, arena.n_slots)
        self.ahead = self.next_layer.get(layer) if reads else None
        self.settle_at_end = reads and self.ahead is None
        if (not reads or n_tokens <= PREFILL_TOKENS or n_tokens * self.top_k < WHOLE_PICKS * arena.E
                or min(arena.n_slots - len(arena.spec) - len(arena.limbo), prefill_cap(layer)) < arena.E):
            return None
        self.holds = self.ahead is not None and arena.n_slots >= 3 * arena.E  # this one, the next, the one read ahead
        return [np.arange(arena.E)]

    def note_route(self, layer: int, ids: np.ndarray, unique=None) -> None:
        """A long batch's route at ``layer`` (known at its claim, or read after a whole-layer claim):
        how often it used each expert, for ``protect_prompt_hot``; ``unique``: ``np.unique(ids,
        return_counts=True)`` where the caller has it."""
        wanted, counts = np.unique(ids, return_counts=True) if unique is None else unique
        self.prompt_hot.extend((int(n), layer, int(e)) for n, e in zip(counts, wanted))

    def claim(self, layer: int, wanted) -> np.ndarray:
        """Make ``wanted`` resident and published, pinned until ``next_wave`` or ``end``: the layer's
        expert->slot table."""
        return self.arena.at_layer(layer, wanted)

    def next_wave(self) -> None:
        """The wave's compute is evaluated: its slots may change owner."""
        self.arena.release()

    def hold(self) -> None:
        """Keep the claim's pins past its layer (a recompute computes on them), its reads landed."""
        self.arena.slots.flush()

    def end(self, read_ahead=None, computed=None) -> None:
        """The layer is done: ``read_ahead()`` runs while its slots are still pinned (no read can take
        them), then they are released (or held, ``holds``) and the limbo generation turns. The slots
        held from the layer before are let go too, once ``computed()`` says its compute is evaluated
        (a caller that synced on this layer's route knows it is)."""
        if read_ahead is not None:
            read_ahead()
        if self.ahead is not None:  # speculative reads of the next layer's experts not mapped, as far
            batch = []  # as the arena lets (never a pinned slot, never that layer's), submitted together:
            try:  # small blobs are read by this thread now, while the device computes (``submit_many``)
                for e in range(self.arena.E):
                    self.arena.prefetch(self.ahead, e, self.top_k, batch=batch)
            finally:
                self.arena.io.submit_many(batch)
        if self.held and computed is not None:
            computed()  # if it fails they stay held: ``drop_held`` lets them go
        self.held = self.arena.release(hold=self.holds, held=self.held)
        self.arena.after_layer()
        if self.settle_at_end:  # the batch's last layer: its reads not claimed are settled in its step
            self.arena.clear_limbo()
        self.ahead, self.settle_at_end, self.holds = None, False, False

    def drop_held(self) -> None:
        """After a pass that ended in an error (and was dropped: nothing it launched still computes)."""
        self.arena.release(held=self.held)
        self.held = []

    def route(self, layer: int, ids: np.ndarray, read_ahead=None) -> np.ndarray:
        """The whole sequence for a decision with no compute in between; the last wave's table."""
        waves = self.begin(layer, ids)
        for i, wave in enumerate(waves):
            if i:
                self.next_wave()
            table = self.claim(layer, wave)
        self.end(read_ahead)
        return table

    def settle(self, layers, ids) -> None:
        """``route`` for many layers of one token whose experts are all published (``ids``: one row
        per layer, or None when the arena is frozen), with no speculation open, no read-ahead and
        no listener at the arena's hook points: counters and policy touches in one go."""
        if self.on_begin is not None and ids is not None:
            for layer, row in zip(layers, ids):
                self.on_begin(layer, row.reshape(1, 1, -1))
        self.arena.settle_hits(layers, ids)

    def can_settle(self, planner=None) -> bool:
        """Whether ``settle`` may stand in for ``route`` (no read-ahead, no open speculation, nobody
        listening at ``cache.hit``)."""
        return planner is None and not self.arena.spec and not self.arena.hooks.subscribers("cache.hit")

    def protect_prompt_hot(self) -> None:
        """After a layer-ranked batch: the experts it used most stay hottest in the policy order,
        leaving about 2*k+32 slots to churn in decode."""
        arena = self.arena
        budget = arena.n_slots - (2 * self.top_k + 32)
        hot = sorted(self.prompt_hot, reverse=True)[:max(0, budget)]
        for _, layer, e in reversed(hot):  # coldest first, so the hottest ends most recent
            key = layer * arena.E + e
            if key in arena.smap and arena.published[arena.smap[key]]:
                arena.policy.access(key)
        self.prompt_hot = []


def preload(arena, how="auto") -> None:
    """What a run's arena starts with (``ArenaConfig.preload`` is ``how``): the policy's warm keys (a
    hotlist), and every routed expert when ``how`` is True, or "auto" and the arena holds them all."""
    keys = [int(key) for key in arena.policy.warm_keys()]
    if how is True or (how == "auto" and arena.n_slots >= arena.map.n_routed):
        keys += [layer * arena.E + e for layer in arena.m.moe_layers for e in range(arena.E)]
    arena.preload(list(dict.fromkeys(keys)))
