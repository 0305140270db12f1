"""mlx-lm's generation interface over the streaming engine.

The glue between ``workbench run`` and the engine, each rule once: where a model name points
(a directory, a store, or a Hugging Face repo id already in the local cache), how a prompt
becomes ids (stdin, the tokenizer's chat template as ``mlx_lm generate`` applies it), which
sampler (mlx-lm's own ``make_sampler``), which ids stop generation, and mlx-lm's summary line.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import mlx.core as mx

from .checks import MAX_TEXT_BYTES, real, whole
from .model import ModelError

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DEFAULT_PROMPT = "hello"  # mlx_lm generate's defaults (tests/test_generate.py holds them equal)
DEFAULT_MAX_TOKENS = 100
NO_TEXT = "No text generated for this prompt"  # what mlx_lm generate prints instead of its summary


def resolve_model(name) -> Path:
    """A local path as is; otherwise a Hugging Face repo id found in the local cache (never downloaded)."""
    path = Path(name).expanduser()
    if path.exists():
        return path
    if not REPO_ID.match(str(name)):
        raise ModelError(f"{name} does not exist; give an mlx-lm model directory, a workbench store "
                         "or a Hugging Face repo id (org/name) that is in the local cache")
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE") or HF_HUB_CACHE
    try:
        return Path(snapshot_download(str(name), cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        raise ModelError(f"{name} is not a local directory and not in the Hugging Face cache ({cache}); "
                         f"workbench never downloads: fetch it first (huggingface-cli download {name}) "
                         "or give a local path") from None


def tokenizer_of(engine):
    """The engine's tokenizer, or None for a store packed without one."""
    try:
        return engine.tokenizer
    except ModelError:
        return None


def load_draft_model(name):
    """A resident mlx-lm model to draft with: (model, config)."""
    from mlx_lm.utils import load_model

    from .model import load_config

    path = resolve_model(name)
    load_config(path)  # one readable error when it is not a model directory
    try:
        return load_model(path)
    except (ValueError, FileNotFoundError) as e:
        raise ModelError(f"--draft-model {path} cannot be loaded by mlx-lm ({e}); "
                         "give an mlx-lm model directory") from None


def check_draft(draft, target_config: dict):
    vocab, target_vocab = draft[1].get("vocab_size"), target_config.get("vocab_size")
    if vocab != target_vocab:
        raise ModelError(f"--draft-model has a vocabulary of {vocab} tokens, the target {target_vocab}; "
                         "a draft model must share the target's tokenizer")


def read_prompt(text: str) -> str:
    """``-`` reads stdin (UTF-8, at most ``MAX_TEXT_BYTES``); ``\\n`` and ``\\t`` escapes are expanded,
    as in ``mlx_lm generate``."""
    if text == "-":
        raw = getattr(sys.stdin, "buffer", None)  # None for a text stream (a notebook's, a test's)
        data = raw.read(MAX_TEXT_BYTES + 1) if raw is not None else sys.stdin.read(MAX_TEXT_BYTES + 1).encode()
        if len(data) > MAX_TEXT_BYTES:
            raise ValueError(f"--prompt -: stdin holds more than {MAX_TEXT_BYTES} bytes; give a shorter prompt")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"--prompt -: stdin is not UTF-8 text (byte {e.start} of {len(data)}); pipe text, "
                             "or give token ids with --prompt-ids") from None
    return text.replace("\\n", "\n").replace("\\t", "\t")


def check_context(config: dict, prompt_tokens: int) -> None:
    """Refuse a prompt that does not fit the model's context (``max_position_embeddings``) before prefill."""
    limit = config.get("max_position_embeddings")
    if limit and prompt_tokens >= limit:
        raise ValueError(f"the prompt is {prompt_tokens} tokens; the model's context is {limit} "
                         f"(max_position_embeddings in its config.json): shorten the prompt to under {limit} tokens")


def uses_chat_template(tokenizer, ignore_chat_template=False) -> bool:
    return not ignore_chat_template and bool(getattr(tokenizer, "has_chat_template", False))


def chat_template_config(text) -> dict:
    """``--chat-template-config``: a JSON object of keyword arguments for ``apply_chat_template``
    (e.g. ``{"enable_thinking": false}`` turns Qwen3's thinking off), as ``mlx_lm generate`` takes it."""
    import json

    if text is None:
        return {}
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--chat-template-config is not JSON ({e.msg}); give an object such as "
                         "'{\"enable_thinking\": false}'") from None
    if not isinstance(config, dict):
        raise ValueError(f"--chat-template-config wants a JSON object of keyword arguments, got {text!r}")
    return config


def build_prompt(tokenizer, text: str, system_prompt=None, ignore_chat_template=False, template_kwargs=None) -> list[int]:
    """Prompt ids as ``mlx_lm generate`` builds them: the chat template when the tokenizer has
    one (system message first, generation prompt added, ``template_kwargs`` passed on), else the
    raw text with special tokens."""
    chat = uses_chat_template(tokenizer, ignore_chat_template)
    if chat:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
        messages.append({"role": "user", "content": text})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **(template_kwargs or {}))
    quiet = logging.getLogger("transformers.tokenization_utils_base")  # its too-long warning: check_context says it
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return list(tokenizer.encode(text, add_special_tokens=not chat))
    finally:
        quiet.setLevel(level)


def make_sampler(temp=0.0, top_p=1.0, min_p=0.0, top_k=0):
    """mlx-lm's sampler: log-probs [1, vocab] -> token [1]; None at temp 0, where mlx-lm's is an
    argmax too and the engine's own greedy path (optimistic decode included) picks the same token."""
    from mlx_lm.sample_utils import make_sampler as mlx_make_sampler

    temp = real("--temp", temp, 0)
    top_p, min_p = real("--top-p", top_p, 0, 1), real("--min-p", min_p, 0, 1)
    top_k = whole("--top-k", top_k, 0)
    if temp == 0:
        return None
    return mlx_make_sampler(temp, top_p, min_p, 1, top_k=top_k)


def eos_ids(tokenizer, config: dict, extra=()) -> set[int]:
    """The ids that end generation: the tokenizer's (or the config's ``eos_token_id`` when there is
    no tokenizer) plus ``--extra-eos-token`` entries (a token string or an id in the vocabulary)."""
    added = [extra_eos_id(tokenizer, config.get("vocab_size"), token) for token in extra]
    if tokenizer is not None:
        for token_id in added:
            tokenizer.add_eos_token(str(token_id))
        return set(tokenizer.eos_token_ids)
    ids = config.get("eos_token_id")
    ids = set() if ids is None else {int(ids)} if isinstance(ids, int) else {int(i) for i in ids}
    return ids | set(added)


def extra_eos_id(tokenizer, vocab, token: str) -> int:
    """One ``--extra-eos-token`` entry as an id: a whole number in [0, vocab), or a token of the tokenizer."""
    try:
        token_id = int(token)
    except ValueError:
        if tokenizer is None:
            raise ValueError(f"--extra-eos-token {token!r}: this model has no tokenizer; give a token id") from None
        token_id = tokenizer.convert_tokens_to_ids(token)
        unk = getattr(tokenizer, "unk_token_id", None)
        if token_id is None or (token_id == unk and token != getattr(tokenizer, "unk_token", None)):
            raise ValueError(f"--extra-eos-token {token!r} is not a token of this tokenizer; give a token it has "
                             "(as the tokenizer spells it) or a token id") from None
    if token_id < 0 or (vocab and token_id >= vocab):
        raise ValueError(f"--extra-eos-token {token} is outside the vocabulary [0, {vocab}); give an id in range")
    return token_id


def decode(tokenizer, tokens, eos=()) -> str | None:
    """The generated text, without a final stop token (mlx-lm never prints it)."""
    if tokenizer is None:
        return None
    if tokens and tokens[-1] in eos:
        tokens = tokens[:-1]
    return tokenizer.decode(tokens)


class TextStream:
    """Prints a run's text as its tokens arrive, as ``mlx_lm generate`` does: mlx-lm's streaming
    detokenizer, stop tokens left out. Use as ``on_token``; ``finish()`` flushes and returns the text."""

    def __init__(self, tokenizer, eos, out=None):
        self.detokenizer, self.eos, self.out, self.text = tokenizer.detokenizer, set(eos), out or sys.stdout, ""
        self.detokenizer.reset()

    def __call__(self, token) -> None:
        if token not in self.eos:
            self.detokenizer.add_token(token)
            self._emit(self.detokenizer.last_segment)

    def finish(self) -> str:
        self.detokenizer.finalize()
        self._emit(self.detokenizer.last_segment)
        return self.text

    def _emit(self, segment: str) -> None:
        if segment:
            self.out.write(segment)
            self.out.flush()
            self.text += segment


def versions() -> dict:
    from . import __version__

    out = {"workbench": __version__}
    for pkg in ("mlx", "mlx-lm"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


@dataclass
class Timing:
    """mlx-lm's summary numbers: the prompt phase runs until the first token is out; generation
    counts every token over the time after it (as ``mlx_lm.stream_generate`` does)."""
    prompt_tokens: int
    prompt_s: float
    generation_tokens: int
    generation_s: float
    peak_memory_gb: float

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        return self.generation_tokens / self.generation_s if self.generation_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "prompt_tps": self.prompt_tps,
                "generation_tokens": self.generation_tokens, "generation_tps": self.generation_tps,
                "peak_memory_gb": self.peak_memory_gb}

    def summary(self) -> str:
        return (f"Prompt: {self.prompt_tokens} tokens, {self.prompt_tps:.3f} tokens-per-sec\n"
                f"Generation: {self.generation_tokens} tokens, {self.generation_tps:.3f} tokens-per-sec\n"
                f"Peak memory: {self.peak_memory_gb:.3f} GB")


def timed(run, prompt_tokens: int):
    """``run()`` -> (its Result, Timing). The Result's ``step_times`` are its passes after the
    prompt phase (one per token, or one per verify pass); the first pass yields the first token."""
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    res = run()
    wall = time.perf_counter() - t0
    after_first = float(sum(res.step_times[1:]))
    return res, Timing(prompt_tokens, max(wall - after_first, 0.0), len(res.tokens), after_first,
                       mx.get_peak_memory() / 1e9)


def run_config(engine, model, prompt_ids, args, chat_template: bool) -> dict:
    """What ``--json`` echoes: the run's configuration and the software versions."""
    return {
        "model": str(model), "store": str(engine.root),
        "arena": {"spec": str(args.arena), "slots": engine.n_slots, "bytes": engine.n_slots * engine.m.expert_bytes,
                  "routed_experts": engine.m.n_routed, "expert_bytes": engine.m.expert_bytes},
        "policy": args.policy, "predictor": engine.ahead_config.predictor, "io_mode": args.io_mode,
        "device": str(mx.default_device()), "decode": args.decode,
        "prompt_tokens": len(prompt_ids), "max_tokens": args.max_tokens,
        "sampler": {"temp": args.temp, "top_p": args.top_p, "min_p": args.min_p, "top_k": args.top_k,
                    "seed": args.seed},
        "chat_template": chat_template, "draft_model": args.draft_model,
        "num_draft_tokens": args.num_draft_tokens if args.draft_model else None,
        "versions": versions(),
    }
