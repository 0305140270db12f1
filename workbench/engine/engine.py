"""The streaming engine: an mlx-lm model whose routed experts live in a bounded arena.

``Engine`` opens a store and assembles the model: mlx-lm's own model code, with every routed
expert module computing on the arena's slots and probes at the router, the MoE block and each
decoder layer (``streamed.py``). One call's state lives in a ``Run`` (``run.py``: read its
``generate`` for the decode loop); inside the model every MoE layer calls ``run_experts``, which
hands the call to the pass that is running (``passes.py``) and to nothing else. A full arena is
frozen: optimistic tokens then run mlx-lm's own model on views of the slots (``frozen.py``).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from tqdm.auto import tqdm

from ..arena.arena import Arena
from ..arena.claims import preload
from ..arena.counters import Counters
from .. import cuda
from ..arrays import to_numpy
from ..config import AheadConfig, ArenaConfig, IOConfig, KVConfig, as_arena
from ..families import family_of, gate_weights, router_logits
from ..hooks import Hooks
from ..io.scheduler import IOScheduler
from ..model import ModelError, build_model, config_hash, expert_modules
from ..routing.setup import configure
from ..sizes import arena_slots
from ..store.cache import resolve_store
from ..store.manifest import RESIDENT, Manifest, StoreError
from ..store.reader import BlobReader
from .frozen import DeviceCopies, fast_model, frozen_views
from .handshake import Handshake
from .passes import EngineError, reseed  # noqa: F401  (their home is passes.py; imported from here too)
from .run import Result, Run
from .speculative import SpeculativeMixin
from .streamed import GateProbe, LayerProbe, MoEProbe, StreamedExperts, get_path, set_path


DECODE_MODES = ("auto", "optimistic", "layer")
SYNC_COST = {"cpu": 0.3, "gpu": 1.0}  # one host sync, in units of one layer's compute (controller)


def parse_device(device):
    """``cpu`` / ``gpu`` (or an mx.Device) -> mx.Device; the GPU must exist in this MLX build."""
    if device is None or isinstance(device, mx.Device):
        return device
    name = str(device).lower()
    if name not in ("cpu", "gpu"):
        raise ValueError(f"unknown device {device!r}; use cpu or gpu")
    if name == "gpu" and not (mx.metal.is_available() or cuda.available()):
        raise ValueError("--device gpu: this MLX build has no GPU backend (Metal or CUDA); use --device cpu "
                         "or install MLX's GPU build (mlx on macOS, mlx-cuda on Linux)")
    return mx.gpu if name == "gpu" else mx.cpu


class Engine(SpeculativeMixin):
    def __init__(self, store, arena: ArenaConfig | str | int | float = ArenaConfig(), io: IOConfig = IOConfig(),
                 ahead: AheadConfig | None = None, decode="auto", device=None, sync_cost=None, seed=None, progress=True,
                 kv: KVConfig = KVConfig()):
        """``arena``: an ArenaConfig (a bare size such as "25%" means ``ArenaConfig(size)``); ``io``: an
        IOConfig; ``ahead``: read-ahead and cache-aware routing (``routing.setup.configure``; None: exact,
        no read-ahead). ``decode``: auto (a controller picks per token), optimistic or layer
        (docs/engine.md). ``device``: cpu or gpu (default: MLX's default device). ``seed``: seed
        MLX's generator right before the model is built, where mlx-lm's generate seeds (building a
        model draws from it), so sampling at a seed matches ``mlx_lm generate --seed``. ``kv``: the KV
        cache and prefill step (a KVConfig: ``--max-kv-size``, ``--kv-bits``, ``--prefill-step-size``)."""
        arena = as_arena(arena)
        if not isinstance(io, IOConfig) or not (ahead is None or isinstance(ahead, AheadConfig)):
            raise TypeError("Engine: io must be an IOConfig and ahead an AheadConfig (workbench.config)")
        self.reader = self.io = self.arena = self.handshake = None
        if not isinstance(kv, KVConfig):
            raise TypeError("Engine: kv must be a KVConfig (workbench.config)")
        self.kv = kv
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
        self.top_k = self.m.top_k
        self.family = family_of(self.m.data["model_type"])
        self.n_slots = arena_slots(arena.size, self.m.n_routed, self.m.expert_bytes, self.top_k)
        self.reader = BlobReader(self.root, self.m, mode=io.mode, verify=io.verify)
        self.io = IOScheduler(self.reader, workers=io.workers, reserved=io.reserved)
        self.arena = Arena(self.m, self.n_slots, self.io, Counters(), self.hooks, arena.policy, arena.options,
                           arena.writes)
        if seed is not None:
            mx.random.seed(seed)
        self.model = self._build_model()
        backend = "cpu" if mx.default_device() == mx.cpu else "gpu"
        self.decode = decode
        self.sync_cost = SYNC_COST[backend] if sync_cost is None else float(sync_cost)
        self.pipeline = True  # per-layer decode starts each layer's experts at once (faster on both backends:
        # bench_engine.py --pipeline on,off)
        self.current = None  # the pass the model's expert calls go to (``using``)
        # per-layer decode on CUDA: ids to the host and slot ids back in the device's stream, layers whose
        # experts are all published passing through on the arena's table (handshake.py); the device waits
        # for the host at most 50 ms, or 4x reading a layer's experts at 1 GB/s
        self.handshake = None
        copies = self.arena.slots.handshake_copies(self.top_k)
        if copies is not None:
            wait = max(0.05, 4 * self.top_k * self.m.expert_bytes / 1e9)
            self.handshake = Handshake.create(self.m.moe_layers, self.top_k, self.arena.placeholder, wait,
                                              extra=self.m.n_experts,  # the planner's prediction: a router's logits
                                              lut=self.arena.map, copies=copies)
        preload(self.arena, arena.preload)  # the policy's warm keys; every expert for a full arena
        self.views = frozen_views(self)  # a full arena: each layer's experts on views of its slots
        self.fast = fast_model(self) if self.views else None  # and mlx-lm's own model computing on them
        self.copies = DeviceCopies(self)  # long batches on slots the device reads over the bus
        self._tokenizer = None
        # the cache-aware router (None: exact) and the read-ahead planner (None: no read-ahead)
        self.ahead_config, self.router, self.planner = configure(self, ahead)

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
        self.resident = list(resident.items())  # the same arrays: a second model can share them (frozen.py)
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

            from ..checks import input_file
            from ..store.pack import TOKENIZER_FILES

            fix = "copy the model's tokenizer files into the store again, or pack the model again"
            for name in ("config.json",) + TOKENIZER_FILES:  # mlx-lm reads these
                if (self.root / name).exists():
                    try:
                        input_file(f"store {self.root}:", self.root / name, fix=fix)  # a FIFO would block
                    except ValueError as e:
                        raise StoreError(str(e)) from None
            try:
                self._tokenizer = load_tokenizer(self.root)
            except Exception as e:  # transformers raises many types for a damaged file
                msg = " ".join(str(e).split())[:200]
                raise StoreError(f"the tokenizer of store {self.root} cannot be loaded ({type(e).__name__}: {msg}); "
                                 f"{fix}") from None
        return self._tokenizer

    def encode(self, prompt) -> list[int]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        vocab = self.config.get("vocab_size")
        bad = [t for t in ids if t < 0 or (vocab and t >= vocab)]
        if not ids or bad:
            raise ValueError(f"prompt ids {bad[:5] or '(empty)'} are outside the vocabulary [0, {vocab}); "
                             "give at least one id in range")
        return ids

    @property
    def counters(self):
        """The counters of the latest run (one row per (step, layer))."""
        return self.arena.counters

    @property
    def step(self) -> int:
        """The step the latest run is at."""
        return self.arena.step

    # ---- calls: each makes a Run ---------------------------------------------------------
    def generate(self, prompt, max_tokens=32, trace=None, progress=None, stop_at_eos=False, sampler=None,
                 eos_token_ids=None, on_token=None) -> Result:
        """Generate after ``prompt`` (text or ids), ordered as mlx-lm's generate_step: greedy, or
        ``sampler(logprobs)`` once per token (e.g. mlx-lm's make_sampler). Stops at
        ``eos_token_ids`` (or the tokenizer's EOS ids with ``stop_at_eos``). ``on_token(token)`` is
        called as each token is out (``workbench run`` streams the text through it)."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        ids = self.encode(prompt)
        eos = set(eos_token_ids or [])
        if stop_at_eos and eos_token_ids is None:
            eos = set(getattr(self.tokenizer, "eos_token_ids", None) or [])
        run = Run(self, ids, max_tokens, trace, sampler)
        bar = tqdm(total=max_tokens, desc="decode", unit="tok", disable=not (self.progress if progress is None else progress))
        try:
            logits, tokens, times, residency = run.generate(bar, eos, on_token)
        finally:
            bar.close()
            run.close()
        logprobs = np.array((logits - mx.logsumexp(logits, axis=-1, keepdims=True)).astype(mx.float32))[0]
        stats = run.stats(times, tokens, residency)
        if trace is not None:
            trace.close(self, stats)
        text = None
        if self._tokenizer is not None or isinstance(prompt, str):
            text = self.tokenizer.decode(tokens)
        return Result(tokens, ids, stats, self.counters.frame(), logprobs, text, times)

    def score(self, tokens) -> np.ndarray:
        """Log-probabilities of every next token for ``tokens`` (one pass, current routing)."""
        ids = self.encode(tokens)
        run = Run(self, ids)
        try:
            logits = run.batch(ids, 0, "score")[0].astype(mx.float32)
            return np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        finally:
            run.close()

    # ---- per-layer work (called from inside the model) ---------------------------------
    @contextmanager
    def using(self, p):
        """The model's expert calls go to pass ``p`` (``passes.py``) while inside."""
        outer, self.current = self.current, p
        try:
            yield p
        finally:
            self.current = outer

    def run_experts(self, layer, inner, x, indices):
        return self.current.experts(layer, inner, x, indices)

    def run_gate(self, layer, gate, x):
        out = gate(x)
        p = self.current
        if self.family.rule == "sigmoid_group":  # its gate returns picks: the logits are computed apart
            run = p.run
            if run.recorder is not None or run.planner is not None or run.router is not None or self.hooks.active:
                self.routed_logits(layer, x)
            return out
        if self.hooks.active:
            out = self._fire_forward(layer, "router.logits", out)
        p.logits[layer] = out
        return out

    def routed_logits(self, layer, x):
        """The family's router logits for ``x`` at ``layer``, through the ``router.logits`` hook point,
        kept for traces and the planner (the cache-aware router routes on them)."""
        logits = router_logits(self.family, self.gates[layer], x)
        if self.hooks.active:
            logits = self._fire_forward(layer, "router.logits", logits)
        self.current.logits[layer] = logits
        return logits

    def run_block(self, layer, block, x, *args, **kwargs):
        if self.hooks.active:
            x = self._fire_forward(layer, "moe.input", x)
        p = self.current
        p.moe_in[layer] = x
        if p.run.router is not None:
            return p.run.router.forward(self, layer, block, x)
        return block(x, *args, **kwargs)

    def _fire_forward(self, layer, point, value):
        name = self.names[layer][point]
        if not self.hooks.subscribers(name):  # hooks.active, but nothing listens here (e.g. a trace)
            return value
        p = self.current
        return self.hooks.fire(name, value, layer=layer, step=p.step, attempt=p.attempt)

    def forward_hooked(self) -> bool:
        """Whether a hook listens at a forward point (a layer's MoE input or router logits): it gets
        the value while the graph is built, and reading it there would wait for the device, which
        waits for the host."""
        points = ("moe.input", "router.logits")
        return any(self.hooks.subscribers(names[k]) for names in self.names.values() for k in points)

    def gate_weights(self, layer, ids, logits) -> np.ndarray | None:
        """Gate weights the family applied to ``ids`` at ``layer``, given its router ``logits``
        (None if unknown)."""
        if self.family is None or logits is None:
            return None
        z = to_numpy(logits).reshape(-1, logits.shape[-1])
        return gate_weights(self.family, self.blocks[layer], z, ids.reshape(-1, ids.shape[-1]))

    def close(self):
        if self.handshake is not None:
            self.handshake.close()
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
