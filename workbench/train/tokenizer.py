"""Byte-level BPE tokenizer (Hugging Face ``tokenizers``): training, saving, corpus encoding."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np

from .configs import EOS_TOKEN

TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "eos_token": EOS_TOKEN,
    "pad_token": EOS_TOKEN,
    "bos_token": None,
    "unk_token": None,
    "add_bos_token": False,
    "add_eos_token": False,
    "clean_up_tokenization_spaces": False,
    "model_max_length": 2048,
}


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096):
    """Train a byte-level BPE with one special token, ``<|endoftext|>`` (id 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size}: use more text")
    return tok


def save_tokenizer(tok, out_dir: str | Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "tokenizer.json.tmp"
    tok.save(str(tmp))
    os.replace(tmp, out_dir / "tokenizer.json")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")


def load_tokenizer(path: str | Path):
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"no tokenizer at {path}: train one first (python -m workbench.train device-run)")
    return Tokenizer.from_file(str(path))


def encode_texts(tok, texts: list[str], eos_id: int, chunk: int = 1024, progress: bool = True) -> np.ndarray:
    """Encode documents to one uint16 stream, each document followed by ``eos_id``."""
    if tok.get_vocab_size() > 65535:
        raise ValueError("vocab too large for uint16 token streams")
    fast = getattr(tok, "encode_batch_fast", tok.encode_batch)
    parts: list[np.ndarray] = []
    rng = range(0, len(texts), chunk)
    if progress:
        from tqdm.auto import tqdm

        rng = tqdm(rng, desc="encode", unit="chunk", disable=None)
    eos = np.array([eos_id], dtype=np.uint16)
    for i in rng:
        for enc in fast(texts[i : i + chunk], add_special_tokens=False):
            parts.append(np.asarray(enc.ids, dtype=np.uint16))
            parts.append(eos)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def cut_to_tokens(tok, text: str, n_tokens: int) -> str:
    """Longest prefix of ``text`` that ends on a token boundary within ``n_tokens`` tokens."""
    enc = tok.encode(text, add_special_tokens=False)
    if len(enc.ids) <= n_tokens:
        return text
    end = enc.offsets[n_tokens][0]
    return text[:end]
