"""Workload runs: the reference model over a set of prompts, teacher-forced and greedy.

A workload is prompts drawn from ``data/workloads`` in three domains (in-domain code, held-out
packages, shifted-domain prose). ``record_workload`` runs each prompt once through the engine
with every expert resident (exact) and a trace recorder with MoE inputs on:

* the prefill pass over the first ``prompt_tokens`` tokens of the workload text gives the
  **teacher-forced** rows (phase "prefill": every position routed on the real text);
* the ``max_tokens`` greedy tokens after it give the **decode** rows (phase "decode").

Traces are cached on disk (``cache_dir()/workload-traces``, keyed by store, prompt ids and token
counts), so notebooks and tests re-read instead of re-running. Every analysis then runs per prompt
and reports a bootstrap interval over prompts (``workbench.analysis.uncertainty``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..data import workload as load_workload

DOMAINS = {"in-domain": "code_in_domain", "held-out": "code_heldout", "shifted": "prose_shifted"}
METHODS = {"teacher-forced": "prefill", "decode": "decode"}  # method name -> trace phase
CACHE_VERSION = "1"
FULL = dict(per_domain=4, prompt_tokens=128, max_tokens=32)  # the notebooks' and `workbench ledger`'s default
SMALL = dict(per_domain=1, prompt_tokens=32, max_tokens=8)  # the CI preset


@dataclass(frozen=True)
class Prompt:
    id: str  # "<domain>:<index in its workload file>"
    domain: str
    text: str


def workload_set(per_domain: int = 4, start: int = 0, domains=DOMAINS) -> list[Prompt]:
    """``per_domain`` prompts from each domain's workload file, from index ``start`` on."""
    if per_domain < 1:
        raise ValueError(f"per_domain must be >= 1, got {per_domain}")
    out = []
    for domain, name in domains.items():
        recs = load_workload(name)
        if len(recs) < start + per_domain:
            raise ValueError(f"workload {name} has {len(recs)} prompts; cannot take {per_domain} from index {start}")
        out += [Prompt(f"{domain}:{i}", domain, recs[i]["text"]) for i in range(start, start + per_domain)]
    return out


@dataclass
class PromptRun:
    prompt: Prompt
    prompt_ids: list
    tokens: list  # greedy continuation
    path: Path
    trace: object = field(repr=False, default=None)


@dataclass
class Workload:
    model: Path
    store: Path
    runs: list
    prompt_tokens: int
    max_tokens: int

    def traces(self) -> dict:
        """{prompt id: Trace} (both phases; pass ``phase=phase(method)`` to the analyses)."""
        return {r.prompt.id: r.trace for r in self.runs}

    def sequences(self) -> dict:
        """{prompt id: (prompt ids, greedy tokens)} for drafter acceptance."""
        return {r.prompt.id: (r.prompt_ids, r.tokens) for r in self.runs}

    def by_domain(self, domain: str) -> dict:
        return {r.prompt.id: r.trace for r in self.runs if r.prompt.domain == domain}


def phase(method: str) -> str:
    """Trace phase of a method name ("teacher-forced" -> "prefill", "decode" -> "decode")."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    return METHODS[method]


def _key(store: Path, ids: list, max_tokens: int) -> str:
    from ..store.manifest import Manifest

    h = hashlib.sha256(json.dumps([CACHE_VERSION, Manifest.load(store).data["config_hash"], ids, max_tokens]).encode())
    return h.hexdigest()[:20]


def _cached(path: Path):
    """(trace, sidecar) of a cached run, or None when absent or unreadable (then it is re-recorded)."""
    from ..trace.schema import TraceError, read_trace

    side = path.with_suffix(".json")
    if not (path.exists() and side.exists()):
        return None
    try:
        meta = json.loads(side.read_text())
        tr = read_trace(path)
    except (TraceError, ValueError, OSError):
        return None
    if not isinstance(meta.get("tokens"), list) or "moe_input" not in tr.routes.columns:
        return None
    return tr, meta


def record_workload(prompts: list[Prompt], model=None, prompt_tokens: int = 128, max_tokens: int = 32,
                    cache: bool = True, progress: bool = False) -> Workload:
    """Run every prompt (its first ``prompt_tokens`` tokens) then ``max_tokens`` greedy tokens,
    exact, all experts resident, MoE inputs recorded; cached traces are reused."""
    from ..data import default_model
    from ..engine.engine import Engine
    from ..store.cache import resolve_store
    from ..trace.recorder import TraceRecorder
    from ..fsutil import atomic_write, cache_dir
    from ..trace.schema import read_trace

    if prompt_tokens < 2 or max_tokens < 1:
        raise ValueError(f"need prompt_tokens >= 2 and max_tokens >= 1, got {prompt_tokens}, {max_tokens}")
    model = Path(model) if model is not None else default_model()
    store = resolve_store(model, progress=progress)
    root = cache_dir() / "workload-traces"
    root.mkdir(parents=True, exist_ok=True)
    runs, eng = [], None
    items = prompts
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(prompts, desc="workload", unit="prompt")
    try:
        for p in items:
            if eng is None:
                eng = Engine(store, arena="1.0", progress=False)
            ids = eng.encode(p.text)[:prompt_tokens]
            if len(ids) < 2:
                raise ValueError(f"workload prompt {p.id} has fewer than 2 tokens")
            path = root / f"{_key(store, ids, max_tokens)}.parquet"
            hit = _cached(path) if cache else None
            if hit is None:
                res = eng.generate(ids, max_tokens=max_tokens, trace=TraceRecorder(path, moe_input=True))
                side = json.dumps({"prompt": p.id, "prompt_ids": ids, "tokens": res.tokens})
                atomic_write(path.with_suffix(".json"), lambda tmp: Path(tmp).write_text(side))
                hit = read_trace(path), {"tokens": res.tokens}
            runs.append(PromptRun(p, ids, list(hit[1]["tokens"]), path, hit[0]))
    finally:
        if eng is not None:
            eng.close()
    return Workload(model, store, runs, prompt_tokens, max_tokens)


# A constructed model in the first seed's regime (its model: 512 experts, top-10; working set at
# 17.6% residency = 0.176 * E / k = 9 tokens): a seeded random qwen3_moe of 4 layers x 256 experts,
# top-5 (k/E 5/256 ~ 10/512), tokens kept moving (``randmodel``). Labelled as such wherever it is used.
CONSTRUCTED = dict(layers=4, experts=256, top_k=5, hidden=64, expert_width=16, vocab=512)


def constructed_workload(n_prompts: int = 3, prompt_tokens: int = 16, max_tokens: int = 16, seed: int = 0):
    """A ``Workload`` over the constructed model (built and packed once into the cache): random
    prompt ids, no recorded traces (live runs only)."""
    import os
    import shutil

    import numpy as np

    from ..fsutil import cache_dir, marked_temp_dir, unmark
    from ..randmodel import make_random_model
    from ..store.pack import pack

    key = "-".join(f"{k}{v}" for k, v in CONSTRUCTED.items()) + f"-seed{seed}"
    root = cache_dir() / "constructed" / key
    model, store = root / "model", root / "store"
    if not (model / "config.json").exists():  # built aside, then renamed: a racing reader never sees half a model
        with marked_temp_dir(model) as tmp:  # a killed builder's folder is removed by the next build
            make_random_model(tmp, "qwen3_moe", seed=seed, moving=True, **CONSTRUCTED)
            unmark(tmp)
            try:
                os.rename(tmp, model)
            except OSError:  # another process got there first
                shutil.rmtree(tmp, ignore_errors=True)
    if not (store / "manifest.json").exists():
        pack(model, store, progress=False, reuse=True)
    rng = np.random.default_rng(seed)
    runs = [PromptRun(Prompt(f"constructed:{i}", "constructed", ""),
                      rng.integers(0, CONSTRUCTED["vocab"], prompt_tokens).tolist(), [], None)
            for i in range(n_prompts)]
    return Workload(model, store, runs, prompt_tokens, max_tokens)


def notebook_workload(model=None, per_domain: int = FULL["per_domain"], prompt_tokens: int = FULL["prompt_tokens"],
                      max_tokens: int = FULL["max_tokens"], small: bool = False, progress: bool = False) -> Workload:
    """The workload a notebook measures over; ``small`` (the CI preset) takes ``SMALL`` instead."""
    kw = dict(SMALL) if small else dict(per_domain=per_domain, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
    return record_workload(workload_set(kw.pop("per_domain")), model, progress=progress, **kw)


def replay_ci(traces, policies=("lru", "slru"), arenas=(0.1, 0.176, 0.25, 0.5), phase: str | None = "decode",
              **ci):
    """Replay hit rate per (policy, arena) over a workload: policy, arena, hit_rate, low, high, n_prompts."""
    import pandas as pd

    from ..sim import replay
    from .uncertainty import interval_table

    rows = [dict(policy=p, arena=float(a), prompt=name, hit_rate=replay(tr, p, arena=float(a), phase=phase).to_dict()["hit_rate"])
            for name, tr in traces.items() for p in policies for a in arenas]
    return interval_table(pd.DataFrame(rows), ["policy", "arena"], "hit_rate", **ci)


def analyze_workload(w: Workload, methods=tuple(METHODS), drop_rows: int = 64, cosine_layers: int = 0,
                     strata: bool = True, strata_tokens: int | None = None, drafters: bool = True,
                     progress: bool = False, **ci) -> dict:
    """Every headline measurement over the workload, per method, with intervals:
    {"methods": {method: {lookahead, gates, drop_weakest, union, mtp, replay[, acceptance]}},
    "cosine", "cosine_layers"[, "strata", "strata_per_prompt"]}. ``cosine_layers``: only the first
    N MoE layers (0: all); ``strata``: also the live strata runs at 17.6% residency."""
    from ._common import load_mlx_model
    from .cosine import cosine_ci, cosine_summary, expert_grams, experts_from_model
    from .gates import drop_weakest_ci, gate_slots_ci, mlx_expert_outputs
    from .lookahead import lookahead_ci, routers_from_model
    from .union import SEED_G, mtp_ci, union_ci

    model = load_mlx_model(w.model)
    routers, outputs = routers_from_model(model), mlx_expert_outputs(model)
    traces = w.traces()
    out = {"methods": {}}
    items = list(methods)
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc="analyses", unit="method")
    for m in items:
        ph = phase(m)
        u = union_ci(traces, SEED_G, ph, **ci)
        out["methods"][m] = dict(
            lookahead=lookahead_ci(traces, routers, (1, 2, 3), phase=ph, **ci), gates=gate_slots_ci(traces, ph, **ci),
            drop_weakest=drop_weakest_ci(traces, outputs, ph, max_rows_per_layer=drop_rows, **ci),
            union=u, mtp=mtp_ci(u, **ci))
    out["methods"].setdefault("decode", {})["replay"] = replay_ci(traces, **ci)
    experts = experts_from_model(model)
    if cosine_layers:
        experts = {layer: experts[layer] for layer in sorted(experts)[:cosine_layers]}
    out["cosine_layers"] = cosine_summary(expert_grams(experts))
    out["cosine"] = cosine_ci(out["cosine_layers"], **ci)
    if drafters:
        from ..data import DRAFT
        from .drafters import ModelDrafter, NGramDrafter, acceptance_ci

        ds = {"ngram": NGramDrafter()}
        if (DRAFT / "config.json").exists():
            ds = {"draft_model": ModelDrafter(load_mlx_model(DRAFT)), **ds}
        out["methods"]["decode"]["acceptance"] = acceptance_ci(w.sequences(), ds, **ci)
    if strata:
        from .live import strata_runs, strata_table

        out["strata_per_prompt"] = strata_runs(w, max_tokens=strata_tokens, progress=progress)
        out["strata"] = strata_table(out["strata_per_prompt"], **ci)
    return out
