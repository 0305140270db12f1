"""Decode passes: what the model's expert call does during one forward pass, one class per mode.

Every MoE layer of the model calls ``Engine.run_experts``, which hands the call to the pass that
is running (``Engine.using``) and to nothing else. A token's pass is made and started by the
``Run`` (``run.py``), then finished:

  SyncPass        per-layer decode: a host sync per MoE layer learns the ids, the arena claims
                  them (long batches in waves), the experts compute on their slots
  BatchPass       a batch (prefill, verify, score): ``SyncPass``, or layers claimed whole with no
                  sync on their ids
  HandshakePass   per-layer decode with no sync, on CUDA: each layer's ids reach the host through
                  a mailbox and the slot ids go back in the device's stream (``handshake.py``)
  ResumePass      a token the handshake gave up, computed again from the layer it gave up at
  OptimisticPass  verified optimistic decode: the whole token with no host sync, then one sync
                  verifies the ids, settles the hit layers and recomputes from the first miss
                  (``optimistic.py``)

Each pass claims through the run's one claim sequence (``arena.claims.Claims``).
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from .handshake import check_used
from .optimistic import Rewind, can_rewind, first_miss


class EngineError(RuntimeError):
    """The engine cannot go on (for example: non-finite logits)."""


def reseed(key) -> None:
    """Put MLX's global random key back to ``key`` (an earlier ``mx.random.state[0]``): a token drawn
    again is drawn with the key of its first draw, as resident mlx-lm draws it once.
    ``mx.random.seed(n)`` makes the key [n >> 32, n & 0xffffffff]."""
    hi, lo = (int(w) for w in np.asarray(key).reshape(-1))
    mx.random.seed(hi << 32 | lo)
    if np.array(mx.random.state[0]).reshape(-1).tolist() != [hi, lo]:
        raise EngineError("this MLX's random.seed does not make the key [seed >> 32, seed & 0xffffffff]: a sampled "
                          "token given up by the device cannot be drawn again with its key; set Engine.handshake = None")


def logit_sum(logits) -> mx.array:
    """[1] uint32: the bits of the logits' float32 sum, finite when every logit is (one reduction;
    a sum that is not finite is checked again exactly by ``Run.check_finite``, so an overflow never
    stops a run)."""
    return mx.view(mx.sum(logits.astype(mx.float32)).reshape(1), mx.uint32)


def sum_finite(bits) -> bool:
    """Whether the float32 whose bits are ``bits`` (from ``logit_sum``) is finite: its exponent is not all ones."""
    return (int(bits) & 0x7F800000) != 0x7F800000


class Pass:
    """One forward pass of the model. ``first``: the first decoder layer it computes (``LayerProbe``
    returns the ``saved`` outputs of earlier ones, for a pass that may compute a token again)."""

    first = 0
    saved = None  # decoder layer -> its output in this pass, or None: nothing saved
    attempt = 0  # recomputes so far

    def __init__(self, run, step):
        self.run, self.step = run, step
        self.logits: dict = {}  # MoE layer -> router logits (lazy), for hooks, traces and the planner
        self.moe_in: dict = {}  # MoE layer -> MoE block input

    def experts(self, layer, inner, x, indices):
        raise NotImplementedError

    def drop(self) -> None:
        """A launched pass that will not be finished: nothing it launched reads a slot afterwards."""


class SyncPass(Pass):
    """Per-layer decode: sync on the ids, claim, compute (in waves where the batch needs them)."""

    def experts(self, layer, inner, x, indices):
        run = self.run
        c = run.counters.row(run.step, layer)
        target, z = run.predict(layer, self)
        t0 = time.perf_counter_ns()
        mx.eval(indices, *([z] if isinstance(z, mx.array) else []))  # one sync: the route and the prediction
        c["compute_ns"] += time.perf_counter_ns() - t0
        ids = np.array(indices)
        waves = run.claims.begin(layer, ids)
        y = self._compute(layer, inner, x, ids, waves, c)
        run.claims.end(run.read_ahead(layer, target, z))  # read ahead while the slots are pinned
        return y

    def _compute(self, layer, inner, x, ids, waves, c):
        """Run the layer's experts, wave by wave; the last wave's slots stay pinned."""
        run, y = self.run, None
        for i, wave in enumerate(waves):
            table = run.claims.claim(layer, wave)
            t0 = time.perf_counter_ns()
            mask = None if len(waves) == 1 else np.isin(ids, wave)  # waves: other waves' ids take a slot of this one
            slots = table[ids] if mask is None else np.where(mask, table[ids], table[wave[0]])
            part = inner(x, run.arena.slots.landed(slots))
            if mask is not None:
                part = mx.where(mx.array(mask)[..., None], part, mx.zeros_like(part))
            y = part if y is None else y + part
            if i < len(waves) - 1:
                mx.eval(y)  # the next wave may overwrite this one's slots: compute first
                run.claims.next_wave()
            elif run.engine.pipeline:  # start the experts now; the next layer's router sync waits for them
                mx.async_eval(y)  # before any slot changes owner (without it, that sync runs them)
            c["compute_ns"] += time.perf_counter_ns() - t0
        return y

    def start(self, y):
        """Build the token's graph (claiming layer by layer) and read the token: one transfer."""
        run = self.run
        self.out = run.forward(self, y)
        self.next, token = run.token_out(self.out)
        self.host = np.array(token)
        return self

    def finish(self):
        """(logits, the next input, the token)."""
        run = self.run
        if not sum_finite(self.host[1]):
            run.check_finite(self.out)
        run.controller.observe(run.layers_missed())
        return self.out, self.next, int(self.host[0])


class BatchPass(SyncPass):
    """A batch of tokens (prefill, a verify or score pass) in one per-layer pass. A layer claimed
    whole (``Claims.whole_layer``) does not wait for its ids where nothing on the host needs them
    while the pass runs (no planner, no cache-aware routing, no hook listening): the host claims
    layer after layer while the device computes, and reads the route once, at the end (``close``).
    It waits for the layer before to be computed before that layer's slots may change owner: before
    the claim, or, where the claims hold them through it (``Claims.held``), after the read-ahead."""

    def __init__(self, run, step):
        super().__init__(run, step)
        self.quiet = run.planner is None and run.router is None and not run.engine.hooks.active
        self.unsynced = None  # the last layer claimed without a sync: its experts' output
        self.routes = []  # (MoE layer, ids on the device) of the layers claimed without a sync

    def experts(self, layer, inner, x, indices):
        waves = self.run.claims.whole_layer(layer, indices.size // self.run.engine.top_k) if self.quiet else None
        if waves is None:
            return super().experts(layer, inner, x, indices)
        return self._unsynced(layer, inner, x, indices, waves[0])

    def _unsynced(self, layer, inner, x, indices, wave):
        """A layer claimed whole before its route is known: its attention and router start behind the
        layer before, whose experts are waited for before this claim (their slots may change owner in
        it), or, where the claims hold them through it, once this layer is started and the next read
        ahead (``Claims.end``'s ``computed``)."""
        run = self.run
        c = run.counters.row(run.step, layer)
        prev = self.unsynced

        def computed():  # the layer before is computed: its slots may change owner
            t0 = time.perf_counter_ns()
            mx.eval(prev)
            c["compute_ns"] += time.perf_counter_ns() - t0

        mx.async_eval(indices)
        if prev is not None and not run.claims.held:  # not held through this claim: wait for it first
            computed()
        self.routes.append((layer, indices))
        ids = run.arena.slots.landed(run.claims.claim(layer, wave))  # every expert's slot
        if run.arena.slots.on_device:
            y = inner(x, mx.take(ids, indices))
        else:  # slots read over the bus: one copy of the layer, not the host's memory once per use
            y = run.engine.copies(layer, ids)(x, indices)
            run.engine.copies.after(layer)
        mx.async_eval(y)
        self.unsynced = y
        run.claims.end(computed=computed)  # the next layer read ahead while these slots are pinned
        return y

    def drop(self) -> None:
        """Its layers claimed without a sync are computed (nothing it launched reads a slot after)."""
        if self.unsynced is not None:
            y, self.unsynced = self.unsynced, None
            mx.eval(y)

    def close(self) -> None:
        """After the pass: ``drop``, and the route of its layers claimed without a sync is read (one
        transfer) for ``Claims.protect_prompt_hot``."""
        if self.unsynced is None:
            return
        self.drop()
        for (layer, _), ids in zip(self.routes, np.array(mx.stack([i for _, i in self.routes]))):
            self.run.claims.note_route(layer, ids)
        self.routes = []


class HandshakePass(SyncPass):
    """Per-layer decode through the handshake: the device sends each layer's ids (and the planner's
    prediction) and waits in its stream for the slot ids, or passes through on the arena's table
    where every expert is published; the host answers as ``SyncPass`` claims. ``start`` builds and
    launches the token; ``finish`` serves it and reads it. ``serving``: the token before, still on
    the device, served while this one is built (this one runs ahead)."""

    def __init__(self, run, step, hs, serving=None):
        super().__init__(run, step)
        self.hs, self.plans, self.serving = hs, {}, serving  # plans: MoE layer -> the planner's (target, prediction)

    def experts(self, layer, inner, x, indices):
        target, z = self.run.predict(layer, self)
        if target is not None:
            self.plans[layer] = target, z
        y = inner(x, self.hs.slots(self.flight, layer, indices, z if isinstance(z, mx.array) else None))
        every = self.hs.launch_every
        if every and len(self.flight.tickets) % every == 0:  # this part of the token: launched now
            self.launch(y)
        self.serve_launched()
        return y

    def serve_launched(self):
        """Answer what has arrived, in claim order: the token before (still on the device while this
        one is built), then this one's launched layers, once the token before is answered to its end
        and this token's step has begun (its claims count in its step, and the residency after each
        step must not depend on timing)."""
        if self.serving is not None:
            self.serving.serve(wait=False)
            if self.serving.flight.queue:
                return
        if self.flight.last is not None and self.step == self.run.step:  # never ahead of its step: claims count there
            self.serve(wait=False)

    def launch(self, y):
        """``mx.async_eval(y)``, served meanwhile from the server's thread (``serve_launched``) where
        answers make no MLX call: every hook is host-only (a trace recorder's are) and no planner
        reads ahead (their callbacks may)."""
        run = self.run
        self.flight.last = y  # launched (an abort waits for it)
        aside = run.engine.hooks.host_only and run.planner is None
        with self.hs.serving(self.serve_launched if aside else None):
            mx.async_eval(y)

    def start(self, y):
        """Build the token's graph and launch it."""
        run, hs = self.run, self.hs
        self.input = y
        self.key = mx.random.state[0] if run.sampler is not None else None  # a redraw's key
        self.rewinds = can_rewind(run.cache)  # before the token writes: a full window after it is still one back
        self.flight = hs.begin(through=run.planner is None)
        self.saved = self.flight.saved
        try:
            self.out = run.forward(self, y)
            self.next, self.token = run.token_out(self.out)
            self.launch(self.token)
        except BaseException:
            hs.abort(self.flight)  # the device finishes on the placeholder: nothing reads a slot after this
            raise
        finally:
            self.serving = None
        return self

    def finish(self):
        """Serve the token to its end and read it (one transfer); a token the device gave up is
        computed again from that layer, after the token running ahead of it is dropped."""
        run, hs = self.run, self.hs
        run.last = self
        run.counters.row(self.step, run.engine.m.moe_layers[0])["handshake"] += 1
        try:
            self.serve(wait=True)
            self.host = np.array(self.token)
        except BaseException:
            hs.abort(self.flight)
            raise
        gave_up = hs.gave_up(self.flight)
        if gave_up is not None:
            run.drop_ahead()  # it ran on this token's output from the placeholder
            self.out = ResumePass(run, self.step, self, gave_up).compute()
            if self.key is not None:
                reseed(self.key)
            self.next, token = run.token_out(self.out)
            self.host = np.array(token)
        run.arena.slots.reclaim()  # the token synced: the rows its answers landed come back
        return super().finish()

    def drop(self) -> None:
        self.hs.abort(self.flight)

    def serve(self, wait):
        if not wait and not self.hs.arrived(self.flight):  # most calls while a token is built: nothing new
            return
        run = self.run
        run.last = self  # the pass whose values the claims' hook points read (one may be building ahead)
        settle = self.settle if run.claims.can_settle(run.planner) else None
        waited = self.hs.serve(self.flight, self.answer, wait, settle)
        run.counters.row(self.step, run.engine.m.moe_layers[0])["compute_ns"] += int(waited * 1e9)

    def settle(self, layers, ids, used) -> None:
        """Layers that passed through on the table (all hits), claimed in one go: they computed on
        the slots the table gives now (nothing changed it since: only a miss's answer does)."""
        check_used(layers, used, self.run.arena.lut[np.asarray(layers)[:, None], ids])
        self.run.claims.settle(layers, ids)

    def answer(self, layer, ids, z) -> list:
        """The claim of one token's ``ids`` at ``layer``, with the planner's read-ahead (``z``: its
        prediction's values, sent with the ids): their slot ids. The slots are released at once: the
        next claim waits for the next layer's ids, which the device sends only once this layer's
        experts have run."""
        run = self.run
        read_ahead = None
        if run.planner is not None:
            target, host_z = self.plans.pop(layer, (None, None))
            read_ahead = run.read_ahead(layer, target, host_z if z is None else z.reshape(1, -1))
        slots = run.arena.slots
        table, pairs = slots.hand_over(lambda: run.claims.route(layer, np.array(ids).reshape(1, 1, -1), read_ahead))
        if pairs:  # staged reads: the layer's handshake kernel lands them before its experts run
            self.hs.land(self.flight, layer, slots.copies(pairs), pairs)
            slots.retire(self.flight.copied[layer][0], pairs)
        return [int(table[e]) for e in ids]


class ResumePass(SyncPass):
    """The token the handshake gave up at MoE layer ``first``, computed again from that layer with a
    sync per layer: that layer computes on the slots the host answered (its claim was made once, in
    order), later layers claim as ``SyncPass`` does: one result."""

    def __init__(self, run, step, given_up: HandshakePass, layer):
        super().__init__(run, step)
        f = given_up.flight
        self.answers, self.saved, self.copied, self.first = f.answers, f.saved, f.copied, layer
        self.input, self.rewinds = given_up.input, given_up.rewinds
        self.logits, self.moe_in = given_up.logits, given_up.moe_in  # the token's values, layer by layer

    def experts(self, layer, inner, x, indices):
        if layer == self.first:  # claimed once already; its staged reads, if any, land now
            slots = self.run.arena.slots
            out, pairs = self.copied.get(layer, (None, []))
            if pairs:
                slots.reland(out, pairs)
            return inner(x, slots.landed(np.array(self.answers[layer], dtype=np.uint32).reshape(indices.shape)))
        return super().experts(layer, inner, x, indices)

    def compute(self):
        """The token's logits, computed again from ``first``."""
        run, layer = self.run, self.first
        if not self.rewinds:
            raise EngineError(f"the device gave up waiting for the host at MoE layer {layer} and this model's KV "
                              "cache cannot roll back to compute the token again; set Engine.handshake = None")
        run.count_recompute(layer)
        with Rewind(run.cache, layer):
            return run.forward(self, self.input)


class OptimisticPass(Pass):
    """One token with no host sync per MoE layer: each layer maps its ids through the device table
    (``Arena.device_lut``: experts not published point at the placeholder slot) and records them;
    ``finish`` verifies them with one sync, settles the layers before the first miss and recomputes
    from it (module docstring of ``optimistic.py``)."""

    def __init__(self, run, step):
        super().__init__(run, step)
        self.probe = run.controller.probed  # the controller chose this token to probe optimistic decode
        self.saved: dict = {}
        self.ids: dict = {}  # MoE layer -> expert ids recorded in this pass
        self.views: dict = {}  # MoE layer -> its experts on views of its slots, when the arena is frozen

    def experts(self, layer, inner, x, indices):
        self.ids[layer] = indices
        view = self.views.get(layer)  # a frozen arena: the layer's slots in id order (frozen.frozen_views)
        if view is not None:
            return view(x, indices)
        return inner(x, self.lut[layer][indices])

    def start(self, y):
        """Build the token's graph with no host sync and start it on the device."""
        self.input = y
        run = self.run  # a redraw's key (a frozen arena never draws a token again: nothing can miss)
        self.key = mx.random.state[0] if run.sampler is not None and not run.engine.views else None
        self._build(y)
        mx.async_eval(self.host)
        return self

    def _build(self, y):
        run, eng = self.run, self.run.engine
        self.lut, self.table = run.arena.map.device_lut(eng.m.moe_layers)
        self.views = eng.views
        # a frozen arena has no miss to verify: ids come back only for whoever reads them
        self.with_ids = not self.views or eng.hooks.active or run.recorder is not None or run.planner is not None
        self.out = run.forward(self, y, eng.model if self.with_ids else eng.fast)
        self.y = run.draw(self.out)
        self.computed = [layer for layer in eng.m.moe_layers if layer >= self.first]
        # what the planner reads on the host (router logits), as float32; a trace keeps its values on
        # the device and converts them all when the run ends
        keep = (self.logits,) if run.planner is not None else ()
        self.record = [d for d in keep if all(layer in d for layer in self.computed)]
        # one array, one transfer: every layer's ids, the planner's values (their float32 bits), the
        # draw's key (sampled), the logits' sum (finite?), the token
        ids = [mx.concatenate([self.ids[layer] for layer in self.computed], -1).reshape(-1).astype(mx.uint32)] if self.with_ids else []
        values = [mx.view(d[layer].reshape(-1).astype(mx.float32), mx.uint32) for d in self.record
                  for layer in self.computed]
        key = [] if self.key is None else [self.key.reshape(-1).astype(mx.uint32)]
        self.host = mx.concatenate(ids + values + key + [logit_sum(self.out), self.y.astype(mx.uint32)])

    def drop(self) -> None:
        mx.eval(self.y)

    def finish(self):
        """Verify (one sync), settle the layers that hit, recompute from a miss; (logits, y, token).
        The next token, if already running (``Run.ahead``), is dropped when this one recomputes."""
        run = self.run
        n_moe = len(run.engine.m.moe_layers)
        run.counters.row(self.step, run.engine.m.moe_layers[0])["optimistic"] += 1
        settled, t0 = 0, time.perf_counter_ns()
        while True:
            ids = self.verify()
            skip = settled - (n_moe - len(self.computed))  # layers of this pass settled already
            stop = self.first_missed(ids, skip)
            self.settle(ids, skip, stop)
            settled += stop - skip
            if stop == len(self.computed):
                break
            self.recompute(ids, stop)
            settled += 1
        run.counters.row(self.step, run.engine.m.moe_layers[0])["compute_ns"] += time.perf_counter_ns() - t0
        run.arena.unexpose()
        if not self.finite_ok:
            run.check_finite(self.out)
        if run.planner is not None and self.step < run.max_step:  # the next token's likely experts; the
            # next token may be running already and may read any published slot: then free slots only
            run.planner.next_token(run, self.logits, evict=run.ahead is None)
        run.controller.observe(self.attempt, self.probe)
        return self.out, self.y, self.token

    def verify(self):
        """The one sync: the token, its finiteness, the computed layers' ids (None when frozen views
        ran without them) and the planner's values, as numpy."""
        host = np.array(self.host)
        self.finite_ok, self.token = sum_finite(host[-2]), int(host[-1])
        k = self.run.engine.top_k
        n_ids = len(self.computed) * k if self.with_ids else 0
        end = -2 if self.key is None else -4
        self.host_key = None if self.key is None else host[-4:-2]
        flat, pos = host[n_ids:end].view(np.float32), 0
        for d in self.record:
            for layer in self.computed:
                n = int(np.prod(d[layer].shape))
                d[layer] = flat[pos:pos + n].reshape(d[layer].shape)
                pos += n
        self.run.last = self
        return host[:n_ids].reshape(-1, k) if self.with_ids else None

    def first_missed(self, ids, skip) -> int:
        """Index into ``computed`` of the first layer from ``skip`` whose ids were not all published
        in this pass's table (len(computed): none)."""
        if ids is None or self.views:  # frozen views: nothing can miss
            return len(self.computed)
        arena = self.run.arena
        miss = first_miss(arena.lut, self.table, arena.placeholder, self.computed[skip:], ids[skip:])
        return len(self.computed) if miss is None else skip + miss

    def settle(self, ids, skip, stop) -> None:
        """Claim layers ``computed[skip:stop]`` (all hits) as per-layer decode would."""
        claims = self.run.claims
        if claims.can_settle(self.run.planner):
            claims.settle(self.computed[skip:stop], None if ids is None else ids[skip:stop])
            return
        for j in range(skip, stop):  # claims that can start reads or fire arena hooks: one by one
            claims.route(self.computed[j], ids[j].reshape(1, 1, -1))

    def recompute(self, ids, stop) -> None:
        """``computed[stop]`` missed: claim it (reading its misses), read the perturbed pass's picks
        for later layers, and compute the token again from it."""
        run = self.run
        run.drop_ahead()  # the next token ran on this token's unverified output
        layer = self.computed[stop]
        run.claims.claim(layer, run.claims.begin(layer, ids[stop].reshape(1, 1, -1))[0])
        run.claims.hold()  # the recompute from this layer reads its slots through the device table
        self.read_successors(self.computed[stop + 1:], ids[stop + 1:])
        run.count_recompute(layer)
        self.first, self.attempt = layer, self.attempt + 1
        if self.key is not None:
            reseed(self.host_key)  # drawn again with the first draw's key, as resident mlx-lm draws it once
        with Rewind(run.cache, layer):
            self._build(self.input)
        mx.eval(self.host)
        run.claims.end()

    def read_successors(self, layers, ids) -> None:
        """After a miss: the perturbed pass's picks for the later layers are good guesses. With a
        planner, read the unpublished ones speculatively and wait, so the recompute can use them
        (``Arena.lut`` includes waited-for speculative slots only while recomputing)."""
        run = self.run
        if run.planner is None or not layers:
            return
        arena, io, k = run.arena, run.engine.io, run.engine.top_k
        reqs = []
        for layer, row in zip(layers, ids):
            for e in row:
                req = arena.speculative(layer, int(e)) or arena.prefetch(layer, int(e), k)
                if req is not None:
                    reqs.append(req)
        for req in reqs:  # waited for now: urgent, and the decode thread reads too
            io.promote(req)
        for req in reversed(reqs):
            io.help(req)
        for req in reqs:
            req.event.wait()
        arena.expose(reqs)
