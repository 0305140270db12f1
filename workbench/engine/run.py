"""One call's state: ``Engine.generate``, ``score``, ``verify`` and the speculative loop each make a
``Run`` (the step, the KV caches, the controller, the recorder, the token running ahead, the
claim sequence) and drive the model through passes (``passes.py``).

Read ``generate`` top to bottom: prefill the prompt (2048 tokens a pass, as mlx-lm), then one token per step. A
token is an optimistic pass when the controller says so (no cache-aware routing, caches that roll
back; greedy or sampled), else a per-layer pass: through the handshake where it works, else with
a sync per MoE layer. A sampled token computed again is drawn again with its first draw's key.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from ..arena.claims import Claims
from ..arena.counters import Counters, summarize
from .optimistic import Controller, can_rewind
from .passes import BatchPass, EngineError, HandshakePass, OptimisticPass, Pass, SyncPass, logit_sum


@dataclass
class Result:
    tokens: list  # generated ids
    prompt: list
    stats: dict
    counters: object = None  # pandas DataFrame, one row per (step, layer)
    logprobs: object = None  # last step's log-probabilities (np.ndarray)
    text: str | None = None
    step_times: list = field(default_factory=list)


def finite_flag(logits) -> mx.array:
    """[1] uint32: 1 when every logit is finite."""
    return mx.all(mx.isfinite(logits)).astype(mx.uint32).reshape(1)


class Run:
    """The state of one call on ``engine``. ``prompt``: the ids; ``max_step``: decode steps at most;
    ``recorder``: a trace recorder (attached until ``close``); ``sampler``: None for greedy."""

    def __init__(self, engine, prompt, max_step=0, recorder=None, sampler=None):
        from mlx_lm.models.cache import make_prompt_cache

        self.engine, self.arena = engine, engine.arena
        self.prompt, self.max_step, self.recorder, self.sampler = list(prompt), max_step, recorder, sampler
        self.router, self.planner = engine.router, engine.planner
        if recorder is not None:
            recorder.attach(engine)
        self.counters = self.arena.counters = Counters()
        hs = engine.handshake
        self.controller = Controller(engine.decode, len(engine.m.moe_layers), engine.sync_cost,
                                     expect_misses=engine.n_slots < engine.m.n_routed,
                                     through=hs is not None and hs.lut is not None and self.planner is None)
        self.claims = Claims(self.arena, engine.top_k, on_begin=self.selected)
        self.kv = engine.kv
        self.cache = make_prompt_cache(engine.model, max_kv_size=self.kv.max_size)
        self.step, self.pos0 = 0, 0
        self.last = Pass(self, 0)  # the pass whose layer values the hook points read
        self.ahead = None  # the next token's pass, launched before this one settles
        self.decided = (None, False)  # (decode step, whether it is an optimistic token)
        self.passed0 = hs.passed if hs is not None else 0  # layers the handshake passed through before this run

    # ---- the decode loop ---------------------------------------------------------------
    def generate(self, bar, eos, on_token=None) -> tuple:
        """Prefill, then decode up to ``max_step`` tokens (stopping after one in ``eos``), calling
        ``on_token(token)`` as each is out: (last logits, tokens, step times, residency hash)."""
        residency = hashlib.sha256()
        tokens, times = [], []
        if len(self.prompt) > 1:  # prefill: every prompt token but the last
            self.prefill(mx.array(self.prompt[:-1]))
        y, logits = mx.array(self.prompt[-1:]), None
        for step in range(1, self.max_step + 1):
            t0 = time.perf_counter()
            logits, y, token = self.token(step, y)
            self.kv.quantize(self.cache)  # where mlx-lm's generate_step quantizes: after each model call
            times.append(time.perf_counter() - t0)
            tokens.append(token)
            residency.update(self.arena.map.signature())
            self.arena.policy.tick()
            if self.engine.hooks.active:
                self.engine.hooks.fire("token.end", token, step=self.step, counters=self.counters.rows)
            bar.update(1)
            if on_token is not None:
                on_token(token)
            if token in eos:
                break
        return logits, tokens, times, residency.hexdigest()

    def token(self, step, y) -> tuple:
        """One decode step: (logits, the next input, the token)."""
        p, self.ahead = self.ahead, None  # this token's pass, if it was launched during the last one
        if p is None and self.optimistic_now(step):
            p = OptimisticPass(self, step).start(y)
        self.begin_step(step, "decode")
        if p is None:
            hs = self.engine.handshake if self.handshake_now() else None
            p = (SyncPass(self, step) if hs is None else HandshakePass(self, step, hs)).start(y)
        if step < self.max_step:
            try:
                self.ahead = self.launch_ahead(step + 1, p)  # its graph is built before this one's sync
            except BaseException:
                p.drop()
                raise
        return p.finish()

    def launch_ahead(self, step, p):
        """The next token's pass, built and launched while ``p`` is still on the device: optimistic
        after optimistic; through the handshake after the handshake (``p`` served meanwhile, the
        decision for the next step made now, once), where nothing on the host needs a layer's values
        while graphs are built (no forward hook, no planner) and the caches roll back (a given-up
        ``p`` drops it). None: the next token is made in its step."""
        if isinstance(p, OptimisticPass):
            return OptimisticPass(self, step).start(p.y) if self.optimistic_now(step) else None
        eng = self.engine
        if (isinstance(p, HandshakePass) and p.hs.LANES > 1 and self.planner is None
                and not (eng.hooks.active and eng.forward_hooked())
                and self.kv.rewinds and can_rewind(self.cache) and not self.optimistic_now(step)):
            return HandshakePass(self, step, p.hs, serving=p).start(p.next)
        return None

    def drop_ahead(self) -> None:
        """The token running ahead computed on an output that changed: let it finish, and roll its
        KV entries back."""
        if self.ahead is not None:
            self.ahead.drop()
            for c in self.cache:
                c.trim(1)
            self.ahead = None

    def prefill(self, x, protect=True) -> None:
        """Prompt tokens ``x`` (a 1-D array) in passes of ``--prefill-step-size`` tokens (2048 by
        default, as mlx-lm), step 0; ``protect``: keep the prompt's hottest experts hottest afterwards."""
        self.begin_step(0, "prefill")
        for i in range(0, len(x), self.kv.prefill_step):
            self.pos0 = i  # the pass's first position (the hook points' ``position``)
            self.run_batch(BatchPass(self, 0), x[i:i + self.kv.prefill_step][None])
            self.kv.quantize(self.cache)
            mx.eval([c.state for c in self.cache])
        if protect:
            self.claims.protect_prompt_hot()

    def batch(self, tokens, step, phase):
        """A batch of tokens in one per-layer pass, bookkept as ``step`` of ``phase``: its logits."""
        self.begin_step(step, phase)
        return self.run_batch(BatchPass(self, step), mx.array(tokens, mx.uint32)[None])

    def run_batch(self, p, x):
        """``p``'s pass over ``x``, closed; dropped if it fails (nothing it launched reads a slot after)."""
        try:
            out = self.call(p, x)
        except BaseException:
            p.drop()
            raise
        p.close()
        return out

    def close(self) -> None:
        """The end of the call: nothing reads a slot any more, open speculation is settled."""
        try:
            try:
                if self.ahead is not None:
                    self.ahead.drop()  # nothing may still read a slot when the arena is cleaned up
                    self.ahead = None
                self.arena.finish_speculation()
            finally:
                self.claims.drop_held()  # a pass that failed left them held
            self.arena.release()
            if self.planner is not None:
                self.planner.end()
        finally:
            if self.recorder is not None:
                self.recorder.detach(self.engine)  # a failed run writes no trace and leaves no hooks behind

    # ---- what the passes share -----------------------------------------------------------
    def begin_step(self, step, phase) -> None:
        self.step = self.arena.step = step
        self.counters.phase[step] = phase
        self.pos0 = 0 if phase == "prefill" else len(self.prompt) - 2 + step

    def call(self, p, x, model=None):
        """The model on ``x`` with ``p`` serving its expert calls."""
        self.last = p
        with self.engine.using(p):
            return (model or self.engine.model)(x, cache=self.cache)

    def forward(self, p, y, model=None):
        """One decode token through ``p``: the last position's logits."""
        return self.call(p, y[None], model)[:, -1, :]

    def draw(self, logits):
        """The next token on the device: argmax, or ``sampler`` on the log-probabilities as mlx-lm's
        generate_step calls it (one draw from MLX's global key)."""
        if self.sampler is None:
            return mx.argmax(logits, axis=-1)
        return self.sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))

    def token_out(self, logits):
        """The next input, and what the host reads of the token in one transfer: the token id and the
        bits of the logits' sum (finite?)."""
        nxt = self.draw(logits)
        return nxt, mx.concatenate([nxt.astype(mx.uint32), logit_sum(logits)])

    def selected(self, layer, ids) -> None:
        """A layer's experts are known (host ids), before the arena claims them (``Claims.begin``):
        the ``experts.selected`` hook point carries what recorders need, then the planner learns the
        route."""
        eng = self.engine
        name = eng.names[layer]["experts.selected"] if eng.hooks.active else None
        if name is not None and eng.hooks.subscribers(name):  # its context is built only for a listener
            eng.hooks.fire(name, ids, layer=layer, step=self.step, phase=self.counters.phase.get(self.step, "decode"),
                           position=self.pos0, logits=self.last.logits.get(layer),
                           moe_input=self.last.moe_in.get(layer), resident=self.arena.map.published_experts(layer),
                           predictions=self.planner.candidates(layer) if self.planner is not None else {})
        if self.planner is not None:
            self.planner.on_route(self, layer, ids)

    def predict(self, layer, p):
        """The planner's (target layer, lazy logits to rank there) at ``layer``, or (None, None)."""
        if self.planner is None:
            return None, None
        return self.planner.prediction(self, layer, p.moe_in.get(layer), p.logits.get(layer))

    def read_ahead(self, layer, target, z):
        """What a claim of ``layer`` runs while its slots are pinned: the planner's reads for
        ``target`` (None: nothing)."""
        if self.planner is None or target is None:
            return None
        return lambda: self.planner.after_layer(self, layer, target, z)

    def optimistic_now(self, step) -> bool:
        """Whether decode step ``step`` is an optimistic token, decided once per step: optimistic
        decode needs the exact router (no cache-aware routing) and caches that can roll back one
        position; the controller decides from the recent miss pattern."""
        if self.decided[0] != step:
            self.decided = step, (self.router is None and self.kv.rewinds and can_rewind(self.cache)
                                  and self.controller.optimistic())
        return self.decided[1]

    def handshake_now(self) -> bool:
        """The handshake serves a per-layer token when nothing needs the layers' values on the host
        while the token's graph is built (no forward hook, no cache-aware routing; the planner's
        prediction travels with the ids, and the other hook points, traces included, fire in the
        claim), from the second decode step on: the first loads the decode kernels a process has not
        used yet, which may wait for the device (it would then give the token up: ``handshake.py``).
        A token the device gives up is computed again, so the KV caches must roll back one position
        (a sliding-window cache that is full cannot: gpt-oss syncs per layer then). Staged slots need
        no read-ahead planner: its reads, landing with an answer, would not fit the answer's copy
        table (``Slots.handshake_copies``: two tokens' demand reads)."""
        eng = self.engine
        return (eng.handshake is not None and self.step > 1 and self.router is None
                and (self.planner is None or eng.arena.slots.in_place)
                and can_rewind(self.cache)
                and not (eng.hooks.active and eng.forward_hooked()))

    def layers_missed(self) -> int:
        """MoE layers of this step that an optimistic token would have missed: a demand read, or a
        claim of a speculative read (not published: the device table maps it to the placeholder).
        Whether that read was complete when claimed is timing, which the controller never sees."""
        rows = [self.counters.row(self.step, layer) for layer in self.engine.m.moe_layers]
        return sum(1 for r in rows if r["sync_misses"] or r["prefetch_useful_late"] or r["prefetch_useful_timely"])

    def count_recompute(self, layer) -> None:
        c = self.counters.row(self.step, layer)
        c["recomputes"] += 1
        c["recomputed_layers"] += len(self.engine.model.layers) - layer

    def check_finite(self, logits) -> None:
        if bool(finite_flag(logits).item()):
            return
        raise EngineError(f"non-finite logits at decode step {self.step}: {self._first_nonfinite()}; "
                          "the output would be wrong (token 0), so the run stops")

    def _first_nonfinite(self) -> str:
        for layer in self.engine.m.moe_layers:
            for what, d in (("MoE input", self.last.moe_in), ("router logits", self.last.logits)):
                v = d.get(layer)
                if v is not None and not bool(finite_flag(v).item()):
                    return f"first seen in layer {layer}'s {what}"
        if not self.last.moe_in:
            return "a frozen arena's fast path keeps no layer's values (decode='layer' names the layer)"
        return "every MoE layer's input and router logits were finite (the head or a dense layer produced them)"

    def stats(self, times, tokens, residency_hash) -> dict:
        eng = self.engine
        stats = summarize(self.counters.totals("decode"))
        stats["prefill"] = summarize(self.counters.totals("prefill"))
        med = float(np.median(times)) if times else 0.0
        stats.update(tokens=len(tokens), distinct_tokens=len(set(tokens)), decode_s=float(sum(times)),
                     tokens_per_s=len(times) / sum(times) if times and sum(times) > 0 else 0.0,
                     median_token_ms=med * 1e3, residency_hash=residency_hash[:16], arena_slots=eng.n_slots,
                     routed_experts=eng.m.n_routed, expert_bytes=eng.m.expert_bytes,
                     slot_writes=self.arena.writes, device=str(mx.default_device()))
        stats["bytes_per_token"] = stats["bytes_read"] / max(1, len(tokens))
        stats["handshake_layers_passed"] = eng.handshake.passed - self.passed0 if eng.handshake is not None else 0
        if not eng.reader.through_page_cache:  # reads bypass the page cache: its hits do not apply
            stats["page_cache_hits"] = stats["prefill"]["page_cache_hits"] = None
        return stats
