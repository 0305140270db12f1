"""The streaming engine: an mlx-lm model whose routed experts live in a bounded arena.

Read ``generate`` top to bottom: prefill the prompt, then one token per step. Inside the
model, every MoE layer calls ``run_experts``: evaluate the router, claim the wanted experts
in the arena (hits, misses read synchronously, speculation promoted), run the family's own
expert math on slot ids, schedule read-ahead for later layers, and release. On CUDA the
handshake learns the ids without a sync (``handshake.py``, ``_layer_token``); optimistic
decode checks a whole token's ids with one sync (``optimistic.py``). A full arena is
frozen: optimistic tokens then run mlx-lm's own model on views of the slots (``_fast_model``).
"""

from __future__ import annotations

import copy
import hashlib
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from tqdm.auto import tqdm

from ..arena.arena import Arena
from ..arena.counters import Counters, summarize
from ..arena.staging import cuda_available
from ..arrays import to_numpy
from ..config import AheadConfig, ArenaConfig, IOConfig, as_arena
from ..families import family_of, gate_weights, router_logits
from ..hooks import Hooks
from ..io.scheduler import IOScheduler
from ..model import ModelError, build_model, config_hash, expert_modules
from ..routing.setup import configure
from ..sizes import arena_slots
from ..store.cache import resolve_store
from ..store.manifest import RESIDENT, Manifest, StoreError
from ..store.reader import BlobReader
from .handshake import Handshake
from .optimistic import Controller, OptimisticPass, Rewind, can_rewind, first_miss
from .speculative import SpeculativeMixin
from .streamed import GateProbe, LayerProbe, MoEProbe, StreamedExperts, get_path, set_path


PREFILL_TOKENS = 8  # batches longer than this use the prefill policy
DECODE_MODES = ("auto", "optimistic", "layer")
SYNC_COST = {"cpu": 0.3, "gpu": 1.0}  # one host sync, in units of one layer's compute (controller)


class EngineError(RuntimeError):
    """The engine cannot go on (for example: non-finite logits)."""


def parse_device(device):
    """``cpu`` / ``gpu`` (or an mx.Device) -> mx.Device; the GPU must exist in this MLX build."""
    if device is None or isinstance(device, mx.Device):
        return device
    name = str(device).lower()
    if name not in ("cpu", "gpu"):
        raise ValueError(f"unknown device {device!r}; use cpu or gpu")
    if name == "gpu" and not (mx.metal.is_available() or cuda_available()):
        raise ValueError("--device gpu: this MLX build has no GPU backend (Metal or CUDA); use --device cpu "
                         "or install MLX's GPU build (mlx on macOS, mlx-cuda on Linux)")
    return mx.gpu if name == "gpu" else mx.cpu


def _finite_flag(logits) -> mx.array:
    """[1] uint32: 1 when every logit is finite."""
    return mx.all(mx.isfinite(logits)).astype(mx.uint32).reshape(1)


def _logit_sum(logits) -> mx.array:
    """[1] uint32: the bits of the logits' float32 sum, finite when every logit is (one reduction;
    a sum that is not finite is checked again exactly by ``_check_finite``, so an overflow never stops a run)."""
    return mx.view(mx.sum(logits.astype(mx.float32)).reshape(1), mx.uint32)


def _sum_finite(bits) -> bool:
    """Whether the float32 whose bits are ``bits`` (from ``_logit_sum``) is finite: its exponent is not all ones."""
    return (int(bits) & 0x7F800000) != 0x7F800000


def reseed(key) -> None:
    """Put MLX's global random key back to ``key`` (an earlier ``mx.random.state[0]``): a token drawn
    again is drawn with the key of its first draw, as resident mlx-lm draws it once.
    ``mx.random.seed(n)`` makes the key [n >> 32, n & 0xffffffff]."""
    hi, lo = (int(w) for w in np.array(key).reshape(-1))
    mx.random.seed(hi << 32 | lo)
    if np.array(mx.random.state[0]).reshape(-1).tolist() != [hi, lo]:
        raise EngineError("this MLX's random.seed does not make the key [seed >> 32, seed & 0xffffffff]: a sampled "
                          "token given up by the device cannot be drawn again with its key; set Engine.handshake = None")


def prefill_cap(layer: int) -> int:
    """Most experts one prefill wave of ``layer`` may stream (256, 128 from layer 40)."""
    return 128 if layer >= 40 else 256


@dataclass
class Result:
    tokens: list  # generated ids
    prompt: list
    stats: dict
    counters: object = None  # pandas DataFrame, one row per (step, layer)
    logprobs: object = None  # last step's log-probabilities (np.ndarray)
    text: str | None = None
    step_times: list = field(default_factory=list)


class Engine(SpeculativeMixin):
    def __init__(self, store, arena: ArenaConfig | str | int | float = ArenaConfig(), io: IOConfig = IOConfig(),
                 ahead: AheadConfig | None = None, decode="auto", device=None, sync_cost=None, seed=None, progress=True):
        """``arena``: an ArenaConfig (a bare size such as "25%" means ``ArenaConfig(size)``); ``io``: an
        IOConfig; ``ahead``: read-ahead and cache-aware routing (``routing.setup.configure``; None: exact,
        no read-ahead). ``decode``: auto (a controller picks per token), optimistic or layer (README,
        "How the engine works"). ``device``: cpu or gpu (default: MLX's default device). ``seed``: seed
        MLX's generator right before the model is built, where mlx-lm's generate seeds (building a
        model draws from it), so sampling at a seed matches ``mlx_lm generate --seed``."""
        arena = as_arena(arena)
        if not isinstance(io, IOConfig) or not (ahead is None or isinstance(ahead, AheadConfig)):
            raise TypeError("Engine: io must be an IOConfig and ahead an AheadConfig (workbench.config)")
        self.reader = self.io = self.arena = None
        try:
            self._open(store, arena, io, ahead, decode, device, sync_cost, seed, progress)
        except BaseException:
            self.close()  # a failed open leaves no thread or file behind
            raise

    def _open(self, store, arena, io, ahead, decode, device, sync_cost, seed, progress):
        self.device = parse_device(device)
        if self.device is not None:
            mx.set_default_device(self.device)
        if decode not in DECODE_MODES:
            raise ValueError(f"unknown decode mode {decode!r}; valid: {', '.join(DECODE_MODES)}")
        self.root = Path(store)
        self.m = Manifest.load(self.root)
        if self.m.data.get("synthetic"):
            raise StoreError(f"{self.root} is a synthetic store (workbench synth-store): random experts and no real "
                             "resident.safetensors, for ioreplay and sweep only; to generate, pack a real model "
                             "(workbench pack MODEL_DIR STORE_DIR)")
        self.config = self.m.config
        if config_hash(self.config) != self.m.data["config_hash"]:
            raise StoreError(f"store {self.root} config does not match its manifest hash; pack the model again")
        self.progress = progress
        self.hooks = Hooks()
        self.counters = Counters()
        self.top_k = self.m.top_k
        self.family = family_of(self.m.data["model_type"])
        self.n_slots = arena_slots(arena.size, self.m.n_routed, self.m.expert_bytes, self.top_k)
        self.reader = BlobReader(self.root, self.m, mode=io.mode, verify=io.verify)
        self.io = IOScheduler(self.reader, workers=io.workers, reserved=io.reserved)
        self.arena = Arena(self.m, self.n_slots, self.io, self.counters, self.hooks, arena.policy, arena.options,
                           arena.writes)
        if seed is not None:
            mx.random.seed(seed)
        self.model = self._build_model()
        backend = "cpu" if mx.default_device() == mx.cpu else "gpu"
        self.decode = decode
        self.sync_cost = SYNC_COST[backend] if sync_cost is None else float(sync_cost)
        self.pipeline = True  # per-layer decode starts each layer's experts at once (faster on both backends:
        # bench_engine.py --pipeline on,off)
        self._opt = self._hs = self._resume = None
        self._plans = {}  # handshake tokens: MoE layer -> the planner's (target layer, prediction), for its claim
        # per-layer decode on CUDA: ids to the host and slot ids back in the device's stream (handshake.py);
        # the device waits for the host at most 50 ms, or 4x reading a layer's experts at 1 GB/s
        self.handshake = None
        if self.arena.writes in ("direct", "mapped"):  # staged reads land by a kernel after the claim: a sync
            wait = max(0.05, 4 * self.top_k * self.m.expert_bytes / 1e9)
            self.handshake = Handshake.create(self.m.moe_layers, self.top_k, self.arena.placeholder, wait,
                                              extra=self.m.n_experts)  # the planner's prediction: a router's logits
        warm = self.arena.policy.warm_keys()
        if arena.preload is True or (arena.preload == "auto" and self.n_slots >= self.m.n_routed):
            warm = warm + [layer * self.m.n_experts + e for layer in self.m.moe_layers for e in range(self.m.n_experts)]
        self.arena.preload(list(dict.fromkeys(warm)))
        self.views = self._frozen_views()
        self.fast = self._fast_model() if self.views else None
        self.recorder = None
        self.planner = None  # read-ahead planner (routing.ahead), optional; set by configure
        self.router = None  # cache-aware router (routing.cache_aware), optional; None = exact
        self._moe_in, self._logits = {}, {}
        self._tokenizer = None
        self._prompt_hot = []
        self.step = 0
        configure(self, ahead)  # the planner and router (None: exact, no read-ahead)

    def _frozen_views(self) -> dict:
        """Once every routed expert is published nothing is ever evicted, so residency is frozen.
        Each layer's experts then sit in consecutive slots in id order (``Arena.preload``): layer ->
        a copy of its expert module computing on views of those slots with the router's own ids,
        for optimistic decode (no table lookup, no miss to verify). {} otherwise."""
        if not self.arena.frozen:
            return {}
        views = {}
        for layer, inner in self.inners.items():
            row = self.arena.lut[layer]
            first = int(row[0])
            if not np.array_equal(row, first + np.arange(self.m.n_experts)):
                return {}
            shared = {id(a): a for _, a in tree_flatten(inner.parameters())}  # the copy shares every array...
            view = copy.deepcopy(inner, shared)
            view.update(tree_unflatten([(t.name, self.arena.tensors[t.name][first:first + self.m.n_experts])
                                        for t in self.m.tensors]))  # ...but computes on its layer's slots
            views[layer] = view
        mx.eval([a for v in views.values() for _, a in tree_flatten(v.parameters())])
        return views

    def _fast_model(self):
        """mlx-lm's own model, sharing every array, with the frozen views as its experts: a frozen
        arena decodes with it while nothing listens (no probe, no hook point, no table)."""
        model = build_model(self.config, self.m.data.get("quantized") or None)
        for layer, (path, _) in expert_modules(model).items():
            set_path(model, path, self.views[layer])
        model.load_weights(self._resident, strict=False)
        return model

    @contextmanager
    def routing(self, router=None, planner=None):
        """Run with ``router`` and ``planner`` in place of the configured ones (default: the exact
        router and no read-ahead); the configured ones are back afterwards."""
        saved = self.router, self.planner
        self.router, self.planner = router, planner
        try:
            yield self
        finally:
            self.router, self.planner = saved

    @classmethod
    def open(cls, path, **kw) -> "Engine":
        """Open a store, or an mlx-lm model directory (packed into the cache on first use)."""
        return cls(resolve_store(path, progress=kw.get("progress", True)), **kw)

    # ---- model assembly ----------------------------------------------------------------
    def _build_model(self):
        model = build_model(self.config, self.m.data.get("quantized") or None)
        experts = expert_modules(model)
        if sorted(experts) != self.m.moe_layers:
            raise StoreError(f"store {self.root} has MoE layers {self.m.moe_layers}, the model {sorted(experts)}; "
                             "the manifest belongs to another model: pack this model again")
        expert_keys = set()
        for layer, (path, module) in experts.items():
            for name, a in tree_flatten(module.parameters()):
                spec = next((t for t in self.m.tensors if t.name == name), None)
                if spec is None or tuple(a.shape[1:]) != spec.shape or a.shape[0] != self.m.n_experts:
                    raise StoreError(f"expert tensor {path}.{name} {a.shape} does not match the store "
                                     f"({spec}); the manifest belongs to another model: pack this model again")
                expert_keys.add(f"{path}.{name}")
            module.update(tree_unflatten([(t.name, self.arena.tensors[t.name]) for t in self.m.tensors]))
        resident = mx.load(str(self.root / RESIDENT))
        want = {k: a.shape for k, a in tree_flatten(model.parameters()) if k not in expert_keys}
        have = {k: a.shape for k, a in resident.items()}
        if want != have:
            diff = sorted(set(want) ^ set(have))[:3] or [k for k in want if want[k] != have.get(k)][:3]
            raise StoreError(f"{RESIDENT} in {self.root} does not match the model (e.g. {diff}); pack the model again")
        model.load_weights(list(resident.items()), strict=False)
        self._resident = list(resident.items())  # the same arrays: a second model can share them
        mx.eval(model.parameters())
        self.blocks, self.gates = {}, {}
        self.inners = {layer: module for layer, (_, module) in experts.items()}
        for layer, (path, module) in experts.items():
            block_path = path.rpartition(".")[0]
            block = get_path(model, block_path)
            set_path(model, path, StreamedExperts(self, layer, module))
            set_path(model, block_path, MoEProbe(self, layer, block))
            self.blocks[layer] = block
            if self.family is not None and hasattr(block, self.family.gate):
                self.gates[layer] = getattr(block, self.family.gate)
                setattr(block, self.family.gate, GateProbe(self, layer, self.gates[layer]))
        layers_path = experts[min(experts)][0].split(".layers.")[0] + ".layers"
        decoder = get_path(model, layers_path)
        for i in range(len(decoder)):
            decoder[i] = LayerProbe(self, i, decoder[i])
        self.names = {layer: {k: f"layer.{layer}.{k}" for k in ("moe.input", "router.logits", "experts.selected")}
                      for layer in experts}
        return model

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            if not (self.root / "tokenizer.json").exists() and not (self.root / "tokenizer_config.json").exists():
                raise ModelError(f"{self.root} has no tokenizer; pass token ids (--prompt-ids) instead of text")
            from mlx_lm.utils import load_tokenizer

            self._tokenizer = load_tokenizer(self.root)
        return self._tokenizer

    def encode(self, prompt) -> list[int]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        vocab = self.config.get("vocab_size")
        bad = [t for t in ids if t < 0 or (vocab and t >= vocab)]
        if not ids or bad:
            raise ValueError(f"prompt ids {bad[:5] or '(empty)'} are outside the vocabulary [0, {vocab}); "
                             "give at least one id in range")
        return ids

    # ---- the decode loop ---------------------------------------------------------------
    def generate(self, prompt, max_tokens=32, trace=None, progress=None, stop_at_eos=False, sampler=None,
                 eos_token_ids=None) -> Result:
        """Generate after ``prompt`` (text or ids), ordered as mlx-lm's generate_step: greedy, or
        ``sampler(logprobs)`` once per token (e.g. mlx-lm's make_sampler). Stops at
        ``eos_token_ids`` (or the tokenizer's EOS ids with ``stop_at_eos``)."""
        from mlx_lm.models.cache import make_prompt_cache

        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        ids = self.encode(prompt)
        self._prompt, self._max_step = ids, max_tokens
        self.recorder = trace
        if trace is not None:
            trace.attach(self)
        self.counters = self.arena.counters = Counters()
        self.controller = Controller(self.decode, len(self.m.moe_layers), self.sync_cost,
                                     expect_misses=self.n_slots < self.m.n_routed)
        cache = make_prompt_cache(self.model)
        residency = hashlib.sha256()
        self.step = 0
        tokens, times = [], []
        eos = set(eos_token_ids or [])
        if stop_at_eos and eos_token_ids is None:
            eos = set(getattr(self.tokenizer, "eos_token_ids", None) or [])
        bar = tqdm(total=max_tokens, desc="decode", unit="tok", disable=not (self.progress if progress is None else progress))
        ahead = None  # greedy optimistic decode runs one token ahead (its graph built before the sync)
        try:
            if len(ids) > 1:  # prefill: every prompt token but the last, in one pass
                self._begin_step(0, "prefill", ids[:-1])
                self._prompt_hot = []
                self.model(mx.array(ids[:-1])[None], cache=cache)
                mx.eval([c.state for c in cache])
                self._protect_prompt_hot()
            y = mx.array(ids[-1:])
            for i in range(max_tokens):
                step = i + 1
                t0 = time.perf_counter()
                if ahead is not None:  # this token's optimistic pass was launched during the last one
                    p, ahead = ahead, None
                elif sampler is None and self._optimistic_now(cache):
                    p = self._launch(y, step, cache)
                else:
                    p = None
                if p is not None:
                    if sampler is None and step < max_tokens and self._optimistic_now(cache):
                        ahead = self._launch(p.y, step + 1, cache)
                    self._begin_step(step, "decode", None)
                    logits, ahead = self._finish(p, cache, ahead)
                    y, token = p.y, p.token
                else:
                    self._begin_step(step, "decode", None)
                    logits, y, token = self._layer_token(y, cache, sampler)
                times.append(time.perf_counter() - t0)
                tokens.append(token)
                residency.update(self.arena.residency_signature())
                self.arena.policy.tick()
                if self.hooks.active:
                    self.hooks.fire("token.end", tokens[-1], step=self.step, counters=self.counters.rows)
                bar.update(1)
                if tokens[-1] in eos:
                    break
        finally:
            bar.close()
            if ahead is not None:
                mx.eval(ahead.y)  # nothing may still read a slot when the arena is cleaned up
            self._opt = None
            self.arena.finish_speculation()
            self.arena.release()
            if self.planner is not None:
                self.planner.end()
            if trace is not None:
                trace.detach(self)  # a failed run writes no trace and leaves no hooks behind
        logprobs = np.array((logits - mx.logsumexp(logits, axis=-1, keepdims=True)).astype(mx.float32))[0]
        stats = self._stats(times, tokens, residency.hexdigest())
        if trace is not None:
            trace.close(self, stats)
            self.recorder = None
        text = None
        if self._tokenizer is not None or isinstance(prompt, str):
            text = self.tokenizer.decode(tokens)
        return Result(tokens, ids, stats, self.counters.frame(), logprobs, text, times)

    def _layer_token(self, y, cache, sampler):
        """One token of per-layer decode: (logits, the next input, the token). Each MoE layer's ids
        reach the host through the handshake where it works (``handshake.py``), else through a sync."""
        self._moe_in, self._logits, self._plans = {}, {}, {}
        hs = self.handshake if self._handshake_now() else None
        key = mx.random.state[0] if hs is not None and sampler is not None else None  # a redraw's key
        if hs is not None:
            hs.begin()
            self._hs = self._resume = hs
            self.counters.row(self.step, self.m.moe_layers[0])["handshake"] += 1
        try:
            logits = self.model(y[None], cache=cache)[:, -1, :]
            nxt, out = self._token_out(logits, sampler)
            if hs is not None:
                self._hs = None
                mx.async_eval(out)
                hs.launched(out)
                self._serve(hs, wait=True)
            host = np.array(out)
        except BaseException:
            if hs is not None:
                hs.abort()  # the device finishes on the placeholder: nothing reads a slot after this
            raise
        finally:
            self._hs = self._resume = None
        gave_up = None if hs is None else hs.gave_up()
        if gave_up is not None:
            logits = self._recover(hs, gave_up, y, cache)
            if key is not None:
                reseed(key)
            nxt, out = self._token_out(logits, sampler)
            host = np.array(out)
        if not _sum_finite(host[1]):
            self._check_finite(logits)
        self.controller.observe(self._layers_missed())
        return logits, nxt, int(host[0])

    def _token_out(self, logits, sampler):
        """The next input, and what the host reads of the token in one transfer: the token id and the
        bits of the logits' sum (finite?)."""
        nxt = self._sample(logits, sampler)
        return nxt, mx.concatenate([nxt.astype(mx.uint32), _logit_sum(logits)])

    def _handshake_now(self) -> bool:
        """The handshake serves a per-layer token when nothing needs the layers' values on the host
        while the token's graph is built (no forward hook, no cache-aware routing; the read-ahead
        planner's prediction travels with the ids, and the other hook points, traces included, fire
        in the claim, where the layer's values are computed already), from the second decode step
        on: the first loads the decode kernels a process has not used yet, which may wait for the
        device (it would then give the token up: ``handshake.py``)."""
        return (self.handshake is not None and self.step > 1 and self.router is None
                and not (self.hooks.active and self._forward_hooked()))

    def _forward_hooked(self) -> bool:
        """Whether a hook listens at a forward point (a layer's MoE input or router logits): it gets
        the value while the graph is built, and reading it there would wait for the device, which
        waits for the host."""
        points = ("moe.input", "router.logits")
        return any(self.hooks.subscribers(names[k]) for names in self.names.values() for k in points)

    def _serve(self, hs, wait):
        waited = hs.serve(self._answer, wait)
        self.counters.row(self.step, self.m.moe_layers[0])["compute_ns"] += int(waited * 1e9)

    def _answer(self, layer, ids, z) -> list:
        """Per-layer decode's claim of one token's ``ids`` at ``layer``, from the handshake, with the
        planner's read-ahead (``z``: its prediction's values, sent with the ids): their slot ids. The
        slots are released at once: the next claim waits for the next layer's ids, which the device
        sends only once this layer's experts have run."""
        if self.planner is not None or self.hooks.active:
            self._selected(layer, np.array(ids).reshape(1, 1, -1))
        table = self.arena.at_layer(layer, sorted(ids))
        slots = [int(table[e]) for e in ids]
        if self.planner is not None:
            target, host_z = self._plans.pop(layer, (None, None))
            self.planner.after_layer(self, layer, target, host_z if z is None else z.reshape(1, -1))
        self.arena.release()
        self.arena.after_layer()
        return slots

    def _recover(self, hs, layer, y, cache):
        """The device gave up waiting at ``layer`` (``handshake.py``): compute the token again from that
        layer with a sync per layer; its logits. The layer computes on the slots the host answered (its
        claim was made once, in order), later layers claim as per-layer decode does: one result."""
        if not can_rewind(cache):
            raise EngineError(f"the device gave up waiting for the host at MoE layer {layer} and this model's KV "
                              "cache cannot roll back to compute the token again; set Engine.handshake = None")
        c = self.counters.row(self.step, layer)
        c["recomputes"] += 1
        c["recomputed_layers"] += len(self.model.layers) - layer
        hs.start = layer
        self._resume = hs
        try:
            with Rewind(cache, layer):
                return self.model(y[None], cache=cache)[:, -1, :]
        finally:
            self._resume = None

    @staticmethod
    def _sample(logits, sampler):
        if sampler is None:
            return mx.argmax(logits, axis=-1)
        return sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))

    # ---- verified optimistic decode (optimistic.py) -------------------------------------
    def _optimistic_now(self, cache) -> bool:
        """Optimistic decode needs the exact router (no cache-aware routing) and caches that can
        roll back one position; the controller decides from the recent miss pattern."""
        return self.router is None and can_rewind(cache) and self.controller.optimistic()

    def _launch(self, y, step, cache) -> OptimisticPass:
        """Build one token's graph with no host sync and start it on the device."""
        p = OptimisticPass(step, self.controller.probed)
        self._run_pass(p, y, cache)
        mx.async_eval(p.host)
        return p

    def _run_pass(self, p, y, cache):
        p.lut, p.table = self.arena.device_lut(self.m.moe_layers)
        p.views = self.views
        # a frozen arena has no miss to verify: ids come back only for whoever reads them
        p.with_ids = not self.views or self.hooks.active or self.recorder is not None or self.planner is not None
        model = self.model if p.with_ids else self.fast
        p.input = y
        self._opt, self._logits, self._moe_in = p, p.logits, p.moe_in
        try:
            logits = model(y[None], cache=cache)[:, -1, :]
        finally:
            self._opt = None
        p.out = logits
        p.y = mx.argmax(logits, axis=-1)
        computed = [layer for layer in self.m.moe_layers if layer >= p.start]
        p.computed = computed
        # what the planner reads on the host (router logits), as float32; a trace keeps its values on
        # the device and converts them all when the run ends
        keep = (p.logits,) if self.planner is not None else ()
        p.record = [d for d in keep if all(layer in d for layer in computed)]
        # one array, one transfer: every layer's ids, the planner's values (their float32 bits), the
        # logits' sum (finite?), the token
        ids = [p.ids[layer].reshape(-1).astype(mx.uint32) for layer in computed] if p.with_ids else []
        values = [mx.view(d[layer].reshape(-1).astype(mx.float32), mx.uint32) for d in p.record for layer in computed]
        p.host = mx.concatenate(ids + values + [_logit_sum(logits), p.y.astype(mx.uint32)])

    def _finish(self, p, cache, ahead):
        """Verify ``p`` (one sync), settle its layers, recover from misses; returns (logits, ahead).
        ``ahead`` (the next token, already running) is discarded if this token has to recompute."""
        k = self.top_k
        self.counters.row(self.step, self.m.moe_layers[0])["optimistic"] += 1
        settled, t0 = 0, time.perf_counter_ns()
        while True:
            host = np.array(p.host)
            p.finite_ok, p.token = _sum_finite(host[-2]), int(host[-1])
            layers = p.computed
            n_ids = len(layers) * k if p.with_ids else 0
            ids = host[:n_ids].reshape(-1, k) if p.with_ids else None
            self._host_values(p, layers, host[n_ids:-2].view(np.float32))
            skip = settled - (len(self.m.moe_layers) - len(layers))  # layers of this pass already settled
            miss = None if ids is None or p.views else first_miss(  # frozen views: nothing can miss
                self.arena.lut, p.table, self.arena.placeholder, layers[skip:], ids[skip:])
            stop = len(layers) if miss is None else skip + miss
            if self.planner is not None or self.arena.spec or self.hooks.subscribers("cache.hit"):
                for j in range(skip, stop):  # claims that can start reads or fire arena hooks: one by one
                    self._settle(layers[j], ids[j])
            else:
                if self.hooks.active:
                    for j in range(skip, stop):
                        self._selected(layers[j], ids[j].reshape(1, 1, -1))
                self.arena.settle_hits(layers[skip:stop], None if ids is None else ids[skip:stop])
            settled += stop - skip
            if miss is None:
                break
            if ahead is not None:  # the next token ran on this token's unverified output: drop it
                mx.eval(ahead.y)
                for c in cache:
                    c.trim(1)
                ahead = None
            layer = layers[stop]
            self._settle(layer, ids[stop], keep_pins=True)  # claims layer's experts: reads its misses
            settled += 1
            self._read_successors(layers[stop + 1:], ids[stop + 1:])
            c = self.counters.row(self.step, layer)
            c["recomputes"] += 1
            c["recomputed_layers"] += len(self.model.layers) - layer
            p.start, p.attempt = layer, p.attempt + 1
            with Rewind(cache, layer):
                self._run_pass(p, p.input, cache)
            mx.eval(p.host)
            self.arena.release()
            self.arena.after_layer()
        self.counters.row(self.step, self.m.moe_layers[0])["compute_ns"] += time.perf_counter_ns() - t0
        self.arena.unexpose()
        if not p.finite_ok:
            self._check_finite(p.out)
        self._read_next(p, ahead)
        self.controller.observe(p.attempt, p.probe)
        return p.out, ahead

    def _host_values(self, p, layers, flat):
        """The planner's values of this pass, as numpy, from their part of the token's one transfer."""
        self._logits, self._moe_in = p.logits, p.moe_in
        pos = 0
        for d in p.record:
            for layer in layers:
                n = int(np.prod(d[layer].shape))
                d[layer] = flat[pos:pos + n].reshape(d[layer].shape)
                pos += n

    def _selected(self, layer, ids):
        """A layer's experts are known (host ids), before the arena claims them: the
        ``experts.selected`` hook point carries what recorders need (the trace subscribes here),
        then the planner learns the route."""
        name = self.names[layer]["experts.selected"]
        if self.hooks.active and self.hooks.subscribers(name):  # its context is built only for a listener
            self.hooks.fire(name, ids, layer=layer, step=self.step,
                            phase=self.counters.phase.get(self.step, "decode"), position=self._pos0,
                            logits=self._logits.get(layer), moe_input=self._moe_in.get(layer),
                            resident=self.arena.published_experts(layer),
                            predictions=self.planner.candidates(layer) if self.planner is not None else {})
        if self.planner is not None:
            self.planner.on_route(self, layer, ids)

    def _settle(self, layer, ids, keep_pins=False):
        """What per-layer decode does at ``layer`` once its ids are known, in the same order."""
        self._selected(layer, ids.reshape(1, 1, -1))
        self.arena.at_layer(layer, np.sort(ids))
        if keep_pins:
            self.arena.flush()  # the recompute from this layer reads its slots through the device table
        else:
            self.arena.release()  # (which lands them first)
            self.arena.after_layer()

    def _read_next(self, p, ahead):
        """With a planner: read the next token's likely experts now. The next token may already be
        running on the device and may read any published slot, and a read lands in its slot at
        once: these reads then take free slots only."""
        if self.planner is None or p.step >= self._max_step:
            return
        self.planner.next_token(self, p.logits, evict=ahead is None)

    def _read_successors(self, layers, ids):
        """After a miss: the perturbed pass's picks for the later layers are good guesses. With a
        planner, read the unpublished ones speculatively and wait, so the recompute can use them
        (``Arena.lut`` includes waited-for speculative slots only while recomputing)."""
        if self.planner is None or not layers:
            return
        reqs = []
        for layer, row in zip(layers, ids):
            for e in row:
                req = self.arena.speculative(layer, int(e)) or self.arena.prefetch(layer, int(e), self.top_k)
                if req is not None:
                    reqs.append(req)
        for req in reqs:  # waited for now: urgent, and the decode thread reads too
            self.io.promote(req)
        for req in reversed(reqs):
            self.io.help(req)
        for req in reqs:
            req.event.wait()
        self.arena.expose(reqs)

    def _layers_missed(self) -> int:
        rows = [self.counters.row(self.step, layer) for layer in self.m.moe_layers]
        return sum(1 for r in rows if r["sync_misses"] or r["prefetch_useful_late"])

    def _check_finite(self, logits):
        if bool(_finite_flag(logits).item()):
            return
        raise EngineError(f"non-finite logits at decode step {self.step}: {self._first_nonfinite()}; "
                          "the output would be wrong (token 0), so the run stops")

    def _first_nonfinite(self) -> str:
        for layer in self.m.moe_layers:
            for what, d in (("MoE input", self._moe_in), ("router logits", self._logits)):
                v = d.get(layer)
                if v is not None and not bool(_finite_flag(v).item()):
                    return f"first seen in layer {layer}'s {what}"
        if not self._moe_in:
            return "a frozen arena's fast path keeps no layer's values (decode='layer' names the layer)"
        return "every MoE layer's input and router logits were finite (the head or a dense layer produced them)"

    def score(self, tokens) -> np.ndarray:
        """Log-probabilities of every next token for ``tokens`` (one pass, current routing)."""
        from mlx_lm.models.cache import make_prompt_cache

        ids = self.encode(tokens)
        self.counters = self.arena.counters = Counters()
        self._begin_step(0, "score", ids)
        self._prompt_hot = []
        try:
            logits = self.model(mx.array(ids)[None], cache=make_prompt_cache(self.model))[0].astype(mx.float32)
            out = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        finally:
            self.arena.finish_speculation()
            self.arena.release()
        return out

    def _protect_prompt_hot(self):
        """After prefill, keep the experts most used by the prompt hottest in the policy order,
        leaving about 2*k+32 slots to churn in decode."""
        budget = self.n_slots - (2 * self.top_k + 32)
        hot = sorted(self._prompt_hot, reverse=True)[:max(0, budget)]
        for _, layer, e in reversed(hot):  # coldest first, so the hottest ends most recent
            key = layer * self.m.n_experts + e
            if key in self.arena.smap and self.arena.published[self.arena.smap[key]]:
                self.arena.policy.access(key)
        self._prompt_hot = []

    def _begin_step(self, step, phase, token_ids):
        self.step = self.arena.step = step
        self.counters.phase[step] = phase
        self._pos0 = 0 if phase == "prefill" else len(self._prompt) - 2 + step
        if phase != "decode":
            self._moe_in, self._logits = {}, {}

    def _stats(self, times, tokens, residency_hash) -> dict:
        stats = summarize(self.counters.totals("decode"))
        stats["prefill"] = summarize(self.counters.totals("prefill"))
        med = float(np.median(times)) if times else 0.0
        stats.update(tokens=len(tokens), distinct_tokens=len(set(tokens)), decode_s=float(sum(times)),
                     tokens_per_s=len(times) / sum(times) if times and sum(times) > 0 else 0.0,
                     median_token_ms=med * 1e3, residency_hash=residency_hash[:16], arena_slots=self.n_slots,
                     routed_experts=self.m.n_routed, expert_bytes=self.m.expert_bytes,
                     slot_writes=self.arena.writes, device=str(mx.default_device()))
        stats["bytes_per_token"] = stats["bytes_read"] / max(1, len(tokens))
        if not self.reader.through_page_cache:  # reads bypass the page cache: its hits do not apply
            stats["page_cache_hits"] = stats["prefill"]["page_cache_hits"] = None
        return stats

    # ---- per-layer work (called from inside the model) ---------------------------------
    def run_gate(self, layer, gate, x):
        out = gate(x)
        if self.family.rule == "sigmoid_group":  # its gate returns picks: the logits are computed apart
            if self.recorder is not None or self.planner is not None or self.router is not None or self.hooks.active:
                self.routed_logits(layer, x)
            return out
        if self.hooks.active:
            out = self._fire_forward(layer, "router.logits", out)
        self._logits[layer] = out
        return out

    def routed_logits(self, layer, x):
        """The family's router logits for ``x`` at ``layer``, through the ``router.logits`` hook point,
        kept for traces and the planner (the cache-aware router routes on them)."""
        logits = router_logits(self.family, self.gates[layer], x)
        if self.hooks.active:
            logits = self._fire_forward(layer, "router.logits", logits)
        self._logits[layer] = logits
        return logits

    def _fire_forward(self, layer, point, value):
        name = self.names[layer][point]
        if not self.hooks.subscribers(name):  # hooks.active, but nothing listens here (e.g. a trace)
            return value
        p = self._opt
        step, attempt = (self.step, 0) if p is None else (p.step, p.attempt)
        return self.hooks.fire(name, value, layer=layer, step=step, attempt=attempt)

    def run_block(self, layer, block, x, *args, **kwargs):
        if self.hooks.active:
            x = self._fire_forward(layer, "moe.input", x)
        self._moe_in[layer] = x
        if self.router is not None:
            return self.router.forward(self, layer, block, x)
        return block(x, *args, **kwargs)

    def run_experts(self, layer, inner, x, indices):
        if self._opt is not None:  # optimistic: no sync, ids recorded, misses on the placeholder slot
            return self._opt.experts(layer, inner, x, indices)
        if self._hs is not None:  # the handshake: the device sends the ids (and the prediction), waits for the slots
            target, z = self._predict(layer)
            if target is not None:
                self._plans[layer] = target, z
            y = inner(x, self._hs.slots(layer, indices, z if isinstance(z, mx.array) else None))
            if self._hs.per_layer:
                mx.async_eval(y)
                self._hs.launched(y)
                self._serve(self._hs, wait=False)  # earlier layers whose ids have arrived
            return y
        if self._resume is not None and layer == self._resume.start:  # recovering: claimed once already
            return inner(x, mx.array(np.array(self._resume.answers[layer], dtype=np.uint32).reshape(indices.shape)))
        c = self.counters.row(self.step, layer)
        target, z = self._predict(layer)
        t0 = time.perf_counter_ns()
        mx.eval(indices, *([z] if isinstance(z, mx.array) else []))  # one sync: the route and the prediction
        c["compute_ns"] += time.perf_counter_ns() - t0
        ids = np.array(indices)
        self._selected(layer, ids)
        if ids.size == self.top_k:  # one token: its top-k ids are distinct already
            wanted, counts = sorted(ids.reshape(-1).tolist()), None  # a list: numpy's first call after a sync is slow
        else:
            wanted, counts = np.unique(ids, return_counts=True)
        room = self.n_slots - len(self.arena.spec) - len(self.arena.limbo)
        if ids.size // self.top_k > PREFILL_TOKENS:  # prefill: layer-ranked streaming, hottest first
            room = min(room, prefill_cap(layer))
            order = [int(e) for _, e in sorted(zip(-counts, wanted))]
            self._prompt_hot.extend((int(n), layer, int(e)) for n, e in zip(counts, wanted))
        elif len(wanted) > room:  # resident experts first, then the misses
            order = sorted(wanted, key=lambda e: (not self.arena.is_mapped(layer, e), e))
        else:
            order = None
        if order is None:
            y = self._compute(layer, inner, x, ids, [wanted], c)
        else:  # a batch may want more experts than the arena holds: run the layer in waves
            y = self._compute(layer, inner, x, ids, [np.array(order[i:i + room]) for i in range(0, len(order), room)], c)
        if self.planner is not None:  # read ahead while this layer's slots are pinned: no read can take them
            self.planner.after_layer(self, layer, target, z)
        self.arena.release()
        self.arena.after_layer()
        return y

    def _predict(self, layer):
        """The planner's (target layer, lazy logits to rank there) at ``layer``, or (None, None)."""
        if self.planner is None:
            return None, None
        return self.planner.prediction(self, layer, self._moe_in.get(layer), self._logits.get(layer))

    def _compute(self, layer, inner, x, ids, waves, c):
        """Run the layer's experts, wave by wave; the last wave's slots stay pinned (the caller
        releases them)."""
        y = None
        for i, wave in enumerate(waves):
            table = self.arena.at_layer(layer, wave)
            t0 = time.perf_counter_ns()
            mask = None if len(waves) == 1 else np.isin(ids, wave)  # waves: other waves' ids take a slot of this one
            slots = table[ids] if mask is None else np.where(mask, table[ids], table[wave[0]])
            part = inner(x, self.arena.landed(slots))
            if mask is not None:
                part = mx.where(mx.array(mask)[..., None], part, mx.zeros_like(part))
            y = part if y is None else y + part
            if i < len(waves) - 1:
                mx.eval(y)  # the next wave may overwrite this one's slots: compute first
                self.arena.release()
            elif self.pipeline:  # start the experts now; the next layer's router sync waits for them before any
                mx.async_eval(y)  # slot changes owner (without it, that sync runs them)
            c["compute_ns"] += time.perf_counter_ns() - t0
        return y

    def gate_weights(self, layer, ids, logits) -> np.ndarray | None:
        """Gate weights the family applied to ``ids`` at ``layer``, given its router ``logits``
        (None if unknown)."""
        if self.family is None or logits is None:
            return None
        z = to_numpy(logits).reshape(-1, logits.shape[-1])
        return gate_weights(self.family, self.blocks[layer], z, ids.reshape(-1, ids.shape[-1]))

    def close(self):
        if self.io is not None:
            self.io.close()
        if self.arena is not None:
            self.arena.close()
        if self.reader is not None:
            self.reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
