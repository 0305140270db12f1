"""A run's settings: one small frozen dataclass per concern, shared by every driver.

    ArenaConfig   how big the arena is and how it evicts (size, policy, slot writes, preload)
    IOConfig      how experts are read (I/O workers, urgent-only workers, read mode, checksums)
    AheadConfig   read-ahead and cache-aware routing (predictor, lookahead, ranking mode, gate)
    KVConfig      the KV cache and prefill as mlx_lm generate sizes them (max size, quantization, prefill step)

The engine (``Engine(store, arena=..., io=..., ahead=...)``), ``simulate``, ``ioreplay``, the
command line (``workbench.cli.engine_config``) and the notebooks build runs from these. Each
checks its values when it is made and refuses a bad one with one line naming the value by its
command-line flag (the same words for the API: ``lookahead`` is ``--lookahead``), the value and
the range. Names owned by the module that uses them (policy, gate and
slot-write names) are checked there, when the arena or gate is built.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .checks import io_workers, real, whole
from .sizes import check_arena

READ_MODES = ("buffered", "dontneed", "direct", "nocache")
# always: every read is checksummed. changed: a blob is checksummed on its first read and again
# whenever experts.bin's size or mtime differs from when it was last checked (one fstat per read).
# first: only the first read of each blob. never: no checksums.
VERIFY_MODES = ("always", "changed", "first", "never")
VERIFY_NEVER_RISK = ("verify: never: no expert read was checksummed, so a damaged or changed experts.bin gives wrong "
                     "output without an error; use --verify changed (the default) except to benchmark the raw read path")
# read-ahead ranking and routing: raw exact router, raw top-k of predicted logits; resident_bonus
# cache-aware router with p=3 and no r1 (approximate); cache_aware cache-aware router with p, b, r1.
# The seed's audit calls them UNPERT=1, UNPERT=0 and route; those spellings are accepted too.
AHEAD_MODES = ("raw", "resident_bonus", "cache_aware")
# the router, when given apart from the ranking (the seed's UNPERT experiment holds it fixed):
# exact, or cache_aware with --moce-* (approximate); None follows the mode as above.
ROUTERS = ("exact", "cache_aware")
SEED_MODE_NAMES = {"unpert1": "raw", "unpert0": "resident_bonus", "route": "cache_aware"}


def ahead_mode(mode) -> str:
    """The ranking mode ``mode`` names (one of ``AHEAD_MODES``, or the seed's name for it)."""
    name = SEED_MODE_NAMES.get(mode, mode) if isinstance(mode, str) else mode
    if name not in AHEAD_MODES:
        raise ValueError(f"unknown ahead mode {mode!r} (--mode); valid: {', '.join(AHEAD_MODES)} "
                         f"(the seed's {', '.join(SEED_MODE_NAMES)} also work)")
    return name


def _choice(what, flag, value, valid):
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r} ({flag}); valid: {', '.join(valid)}")


@dataclass(frozen=True)
class ArenaConfig:
    """``size``: a fraction (0.25), percentage (25%), slot count (64) or size (2GB, 2GiB); see
    ``workbench.sizes``. ``policy``: an eviction policy name (simulate also takes a Policy class
    or instance). ``policy_options``: e.g. ``{"hotlist": "hot.txt"}``. ``writes``: direct | mapped |
    staged (engine; default by backend and arena size, ``arena.slots.default_mode``). ``preload``: auto
    reads every expert at open when the arena holds them all, True / False force it; the policy's
    warm keys (a hotlist) are read in any case (the engine and the simulators: ``arena.claims.preload``)."""

    size: str | int | float = "0.25"
    policy: object = "lru"
    policy_options: dict | None = None
    writes: str | None = None
    preload: bool | str = "auto"

    def __post_init__(self):
        check_arena(self.size)
        if isinstance(self.policy, str) and not self.policy.strip():
            raise ValueError("--policy is empty; give a policy name such as lru")
        if self.policy_options is not None and not isinstance(self.policy_options, dict):
            raise ValueError(f"policy_options must be a dict such as {{'hotlist': 'hot.txt'}}, got {self.policy_options!r}")
        if self.preload not in ("auto", True, False):
            raise ValueError(f"preload must be 'auto', True or False, got {self.preload!r}")

    @property
    def options(self) -> dict:
        return dict(self.policy_options or {})


def as_arena(arena) -> ArenaConfig:
    """``arena`` as an ArenaConfig: one already, None (the defaults) or only its size ("25%", 64, 0.5)."""
    if isinstance(arena, ArenaConfig):
        return arena
    return ArenaConfig() if arena is None else ArenaConfig(arena)


@dataclass(frozen=True)
class IOConfig:
    """``workers`` I/O threads (virtual workers in simulate), of which ``reserved`` serve only
    urgent (sync-miss) reads; ``mode``: read mode (``store.reader``); ``verify``: checksums."""

    workers: int = 8
    reserved: int = 2
    mode: str = "buffered"
    verify: str = "first"

    def __post_init__(self):
        io_workers("--io-workers", self.workers, self.reserved, "--io-reserved")
        _choice("read mode", "--io-mode", self.mode, READ_MODES)
        _choice("verify mode", "--verify", self.verify, VERIFY_MODES)


@dataclass(frozen=True)
class AheadConfig:
    """Read-ahead and cache-aware routing.

    ``predictor``: none | layer | prev | oracle in the engine; in ``simulate`` and ``ioreplay`` oracle
    or a recorded source (the trace's ``pred_SRC`` column, e.g. layer). Left unset, a ``lookahead``
    implies the layer predictor. ``lookahead``: distance in MoE layers (rows) ahead; default 1 (in
    simulate: from the predictor's name). ``width``: candidates ranked per target layer (default
    top-k). ``mode``: one of ``AHEAD_MODES``; ``moce_bonus`` / ``moce_protect`` / ``moce_r1``: the
    cache-aware ranking's b, p and r1. ``router``: exact | cache_aware (b, p, r1 above) to fix
    the router apart from the ranking (None: as the mode says, ``AHEAD_MODES``). ``gate``:
    admission gate (none | confidence | cost) with ``gate_options``. ``oracle_trace``: the
    recorded Trace of the same prompt for the engine's oracle
    (``trace.schema.read_trace(path)``; the command line reads ``--oracle-trace``)."""

    predictor: str | None = None
    lookahead: int | None = None
    width: int | None = None
    mode: str = "raw"
    moce_bonus: float = 0.85
    moce_protect: int = 3
    moce_r1: float = 0.0
    router: str | None = None
    gate: str = "none"
    gate_options: dict | None = None
    oracle_trace: object = None

    def __post_init__(self):
        if self.predictor is not None and (not isinstance(self.predictor, str) or not self.predictor.strip()):
            raise ValueError(f"--predictor must be a name such as layer or oracle, got {self.predictor!r}")
        whole("--lookahead", self.lookahead, 1, none_ok=True)
        if self.predictor is None:
            object.__setattr__(self, "predictor", "layer" if self.lookahead is not None else "none")
        elif self.predictor == "none" and self.lookahead is not None:
            raise ValueError(f"--lookahead {self.lookahead} reads ahead but --predictor is none; "
                             "drop --predictor none (a lookahead implies --predictor layer)")
        whole("--ahead-width", self.width, 1, none_ok=True)
        object.__setattr__(self, "mode", ahead_mode(self.mode))
        real("--moce-bonus", self.moce_bonus, 0)
        whole("--moce-protect", self.moce_protect, 0)
        real("--moce-r1", self.moce_r1, 0)
        if self.mode == "cache_aware" and not self.moce_bonus > 0:
            raise ValueError(f"--mode cache_aware with --moce-bonus {self.moce_bonus} <= 0 is the plain router; "
                             "give a bonus > 0 or use --mode raw")
        if self.router is not None:
            _choice("router", "--routing", self.router, ROUTERS)
            if self.router == "cache_aware" and not self.moce_bonus > 0:
                raise ValueError(f"--routing cache_aware with --moce-bonus {self.moce_bonus} <= 0 is the plain router; "
                                 "give a bonus > 0 or use --routing exact")
        if not isinstance(self.gate, str):
            raise ValueError(f"--gate must be a name (none, confidence, cost), got {self.gate!r}")
        if self.gate != "none" and not self.reads_ahead:
            raise ValueError(f"--gate {self.gate} filters read-ahead candidates: also give --predictor "
                             "(layer, prev or oracle) or --lookahead")
        if isinstance(self.oracle_trace, (str, os.PathLike)):
            raise ValueError(f"oracle_trace must be the recorded Trace, not the path {str(self.oracle_trace)!r}: "
                             "pass workbench.trace.schema.read_trace(path)")
        if self.gate_options is not None and not isinstance(self.gate_options, dict):
            raise ValueError(f"gate_options must be a dict, got {self.gate_options!r}")

    @property
    def reads_ahead(self) -> bool:
        return self.predictor != "none"

    @property
    def distance(self) -> int:
        """The lookahead, 1 when it was left unset."""
        return 1 if self.lookahead is None else self.lookahead


@dataclass(frozen=True)
class KVConfig:
    """The KV cache and the prefill, with ``mlx_lm generate``'s flags, meanings and defaults, through
    mlx-lm's own cache classes: ``max_size`` (``--max-kv-size``: a rotating cache that keeps the first
    4 entries and the latest), ``bits`` / ``group_size`` / ``quantized_start`` (``--kv-bits``,
    ``--kv-group-size``, ``--quantized-kv-start``: once a cache holds ``quantized_start`` entries it is
    quantized, as ``maybe_quantize_kv_cache`` does after every model call), ``prefill_step``
    (``--prefill-step-size``: prompt tokens per prefill pass). Optimistic decode rolls a token's KV
    entries back when it missed, and runs the next token's pass before this one settles; a rotating
    or quantized cache takes neither, so with ``max_size`` or ``bits`` every token runs layer by layer."""

    max_size: int | None = None
    bits: int | None = None
    group_size: int = 64
    quantized_start: int = 5000
    prefill_step: int = 2048

    def __post_init__(self):
        whole("--max-kv-size", self.max_size, 5, none_ok=True)  # a rotating cache keeps 4 entries, and more
        if self.bits is not None and self.bits not in (2, 3, 4, 5, 6, 8):
            raise ValueError(f"--kv-bits {self.bits} is not a quantization MLX has; give 2, 3, 4, 5, 6 or 8")
        if self.group_size not in (32, 64, 128):
            raise ValueError(f"--kv-group-size {self.group_size} is not one MLX has; give 32, 64 or 128")
        whole("--quantized-kv-start", self.quantized_start, 0)
        whole("--prefill-step-size", self.prefill_step, 1)

    @property
    def rewinds(self) -> bool:
        """Whether optimistic decode may run on this cache (see the class)."""
        return self.max_size is None and self.bits is None

    def quantize(self, cache) -> None:
        """mlx-lm's ``maybe_quantize_kv_cache`` on ``cache`` (a list, changed in place)."""
        from mlx_lm.generate import maybe_quantize_kv_cache

        maybe_quantize_kv_cache(cache, self.quantized_start, self.group_size, self.bits)
