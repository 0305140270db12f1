"""Corpus builder: Python source of installed packages, split by whole packages.

Pure Python. On the GPU machine the corpus is the site-packages of its python3 (transformers,
torch, sympy, scipy, pandas, ...). Whole packages are held out (never trained on) for evaluation
and for the held-out prompt sets; a small hash-chosen share of files of the training packages is
kept as an in-domain validation split. English prose for the shifted-domain prompts comes from
the packages' metadata descriptions and licence texts.
"""

from __future__ import annotations

import hashlib
import os
import re
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_HELDOUT = ("networkx", "xarray", "seaborn")
MAX_FILE_BYTES = 400_000  # skip generated tables and giant vendored files
PACKAGE_CAP_BYTES = 64_000_000  # no single package dominates (transformers, torch)
VAL_MODULUS = 64  # ~1.6% of training-package files go to the in-domain validation split


@dataclass
class SourceFile:
    package: str
    path: str  # relative to site-packages
    text: str


@dataclass
class Corpus:
    site_packages: str
    heldout_packages: tuple[str, ...]
    train: list[SourceFile] = field(default_factory=list)
    val: list[SourceFile] = field(default_factory=list)
    heldout: list[SourceFile] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    def stats(self) -> dict:
        def summarize(files: list[SourceFile]) -> dict:
            per: dict[str, dict[str, int]] = {}
            for f in files:
                d = per.setdefault(f.package, {"files": 0, "bytes": 0})
                d["files"] += 1
                d["bytes"] += len(f.text.encode("utf-8"))
            return {
                "files": len(files),
                "bytes": sum(d["bytes"] for d in per.values()),
                "packages": dict(sorted(per.items(), key=lambda kv: -kv[1]["bytes"])),
            }

        return {
            "site_packages": self.site_packages,
            "heldout_packages": list(self.heldout_packages),
            "train": summarize(self.train),
            "val": summarize(self.val),
            "heldout": summarize(self.heldout),
            "skipped": dict(self.skipped),
        }


def default_site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


def _stable_hash(s: str) -> int:
    return int.from_bytes(hashlib.sha1(s.encode("utf-8")).digest()[:8], "little")


def _read_text(path: Path) -> str | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) > MAX_FILE_BYTES or b"\x00" in raw:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text if text.strip() else None


def list_packages(site: str | Path) -> list[str]:
    """Top-level importable directories of a site-packages folder, sorted."""
    site = Path(site)
    out = []
    for p in sorted(site.iterdir()):
        if not p.is_dir() or p.name.startswith((".", "_")) or "." in p.name or p.name == "__pycache__":
            continue
        out.append(p.name)
    return out


def build_corpus(
    site: str | Path | None = None,
    heldout: tuple[str, ...] = DEFAULT_HELDOUT,
    package_cap_bytes: int = PACKAGE_CAP_BYTES,
    progress: bool = True,
) -> Corpus:
    """Walk site-packages deterministically and split into train / val / held-out files."""
    site = Path(site or default_site_packages())
    if not site.is_dir():
        raise ValueError(f"site-packages folder {site} does not exist: pass --site-packages PATH")
    packages = list_packages(site)
    missing = [h for h in heldout if h not in packages]
    if missing:
        raise ValueError(
            f"held-out packages {missing} are not installed in {site}: choose others with --heldout"
        )
    corpus = Corpus(site_packages=str(site), heldout_packages=tuple(heldout))
    seen: set[bytes] = set()
    skipped = {"unreadable_or_large": 0, "duplicate": 0, "over_package_cap": 0}
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    it = packages
    if progress and tqdm is not None:
        it = tqdm(packages, desc="corpus", unit="pkg", disable=None)
    for pkg in it:
        root = site / pkg
        files: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for fn in sorted(filenames):
                if fn.endswith(".py"):
                    files.append(Path(dirpath) / fn)
        # cap: keep a hash-ordered subset so the cap does not cut whole subtrees
        files.sort(key=lambda p: _stable_hash(str(p.relative_to(site))))
        used = 0
        kept: list[SourceFile] = []
        for p in files:
            text = _read_text(p)
            if text is None:
                skipped["unreadable_or_large"] += 1
                continue
            digest = hashlib.sha1(text.encode("utf-8")).digest()
            if digest in seen:
                skipped["duplicate"] += 1
                continue
            n = len(text.encode("utf-8"))
            if pkg not in heldout and used + n > package_cap_bytes:
                skipped["over_package_cap"] += 1
                continue
            seen.add(digest)
            used += n
            kept.append(SourceFile(pkg, str(p.relative_to(site)), text))
        kept.sort(key=lambda f: f.path)
        for f in kept:
            if pkg in heldout:
                corpus.heldout.append(f)
            elif _stable_hash(f.path) % VAL_MODULUS == 0:
                corpus.val.append(f)
            else:
                corpus.train.append(f)
    corpus.skipped = skipped
    return corpus


_PROSE_OK = re.compile(r"^[A-Za-z0-9 ,.;:'\"()\-!?/%&\n]+$")


def _prose_paragraphs(text: str, min_chars: int = 300) -> list[str]:
    """Paragraph runs of plain English (letters, spaces, simple punctuation)."""
    out = []
    paras = [p.strip() for p in re.split(r"\n\s*\n", text)]
    buf = ""
    for p in paras:
        words = p.split()
        if len(words) < 8:
            continue
        letters = sum(c.isalpha() or c.isspace() for c in p)
        if letters / max(1, len(p)) < 0.88 or not _PROSE_OK.match(p):
            if len(buf) >= min_chars:
                out.append(buf)
            buf = ""
            continue
        p = re.sub(r"[ \t]*\n[ \t]*", " ", p)
        buf = f"{buf}\n\n{p}" if buf else p
        if len(buf) >= 2 * min_chars:
            out.append(buf)
            buf = ""
    if len(buf) >= min_chars:
        out.append(buf)
    return out


def collect_prose(site: str | Path | None = None, extra_dirs: tuple[str, ...] = ("/usr/share/common-licenses",)) -> list[tuple[str, str]]:
    """(source, paragraph text) pairs of English prose: package descriptions and licences."""
    site = Path(site or default_site_packages())
    sources: list[Path] = []
    for d in sorted(site.glob("*.dist-info")):
        for p in sorted(d.rglob("*")):
            name = p.name.upper()
            if p.is_file() and (name == "METADATA" or name.startswith(("LICENSE", "LICENCE", "COPYING", "NOTICE"))):
                sources.append(p)
    for extra in extra_dirs:
        e = Path(extra)
        if e.is_dir():
            sources.extend(sorted(q for q in e.iterdir() if q.is_file()))
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for p in sources:
        try:
            text = p.read_text("utf-8", errors="strict")
        except (OSError, UnicodeDecodeError):
            continue
        if p.name == "METADATA":  # drop the RFC-822 header block
            parts = text.split("\n\n", 1)
            text = parts[1] if len(parts) == 2 else ""
        for para in _prose_paragraphs(text):
            key = para[:200]
            if key in seen:
                continue
            seen.add(key)
            try:
                name = str(p.relative_to(site))
            except ValueError:
                name = str(p)
            out.append((name, para))
    return out
