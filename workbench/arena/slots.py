"""Slot memory, and how a read lands there: one class per slot-write mode (``MODES``).

  direct   reads land in the slot's memory (``os.preadv`` into the MLX buffer); unified
           memory (CPU, Metal)
  mapped   direct, with CUDA's managed slot memory advised to live on the host and be mapped by
           the GPU (``cuda.host_mapped``): no page migrates, the experts' compute reads the
           slots over the bus (elsewhere it is direct, and ``name`` says so)
  staged   reads land in a bounce row of host memory, copied into the slot by the decode thread
           with the next claim's compute (``landed``) or in ``flush`` (``staging``: pinned rows and
           a landing kernel on CUDA, whose managed slot pages would otherwise migrate to the host
           on every read and fault back)
  none     no slot memory: reads land nowhere; the simulators
           drive the same rules with an I/O backend of their own (``sim.vio``)

The slot tensors have one extra row, the arena's placeholder (zeros, never written).
``make_slots`` picks the mode by backend, arena size and expert size where none is named (``default_mode``).
The arena makes every read through ``request`` and calls ``recycle``, ``landed``, ``flush``,
``drain`` and ``close``; nothing else in it depends on the mode. The handshake (``engine.handshake``)
lands staged reads in the device's stream itself: ``hand_over``, ``copies``, ``retire``, ``reland``.
"""

from __future__ import annotations

import weakref

import mlx.core as mx
import numpy as np

from .. import cuda
from ..io.scheduler import ReadRequest
from .staging import Staging

MODES = ("direct", "mapped", "staged", "none")
_DTYPES = {"uint32": mx.uint32, "uint8": mx.uint8, "float16": mx.float16, "bfloat16": mx.bfloat16,
           "float32": mx.float32, "int8": mx.int8, "int32": mx.int32, "uint16": mx.uint16}


def unified_memory() -> bool:
    """Host and device share memory (CPU, Metal)."""
    return mx.default_device() == mx.cpu or mx.metal.is_available()


MAPPED_BELOW = 256 * 1024  # expert bytes below which a partial CUDA arena's slots are host memory mapped


def default_mode(full: bool = False, expert_bytes: int = 0) -> str:
    """direct where host and device share memory (CPU, Metal). On CUDA, by the bytes that cross the
    bus: ``mapped`` moves every expert use (lookups x expert size per token), ``staged`` every miss
    once, plus a landing per claim. So: staged for a full arena, and for experts of
    ``MAPPED_BELOW`` or more (0.44 MB, 2.6 MB); mapped for a partial arena of small experts (31 KB),
    where the landing's fixed cost per claim is what counts (bench/RESULTS.md, "slot memory by
    expert size")."""
    if unified_memory():
        return "direct"
    return "staged" if full or expert_bytes >= MAPPED_BELOW else "mapped"


def make_slots(mode, manifest, n_slots: int) -> "Slots":
    """Slot memory for ``n_slots`` slots of ``manifest``'s tensors. ``mode`` None: ``default_mode``
    (full: the arena holds every routed expert); "mapped" on unified memory is direct."""
    mode = mode or default_mode(full=n_slots >= manifest.n_routed, expert_bytes=manifest.expert_bytes)
    if mode not in MODES:
        raise ValueError(f"unknown slot write mode {mode!r}; valid: {', '.join(MODES)}")
    if mode == "mapped" and unified_memory():
        mode = "direct"  # host and device share memory already: mapped is direct here
    cls = {"direct": DirectSlots, "mapped": MappedSlots, "staged": StagedSlots, "none": NoSlots}[mode]
    return cls(manifest, n_slots)


def _zeros(manifest, n_slots) -> dict:
    """name -> [n_slots + 1, ...] zeros (the last row: the placeholder), evaluated."""
    tensors = {t.name: mx.zeros((n_slots + 1, *t.shape), dtype=_DTYPES[t.dtype]) for t in manifest.tensors}
    mx.eval(list(tensors.values()))
    return tensors


class Slots:
    """The interface; on its own, no memory (``NoSlots``). ``tensors``: name -> [n_slots + 1, ...]
    MLX arrays (empty without memory). ``in_place``: a read lands in the slot's memory itself, so a
    slot is ready once its read is done (no landing after the claim). ``on_device``: the device
    reads the slots from its own memory (False: over the bus, so a long batch computes on a copy)."""

    name = "none"
    in_place = False
    on_device = True

    def __init__(self, manifest, n_slots: int):
        self.tensors: dict = {}

    def request(self, blob, slot: int, speculative: bool = False) -> ReadRequest:
        """A read of ``blob`` into ``slot``, with its destination (no views: it lands nowhere)."""
        return ReadRequest(blob, None, slot, speculative=speculative)

    def recycle(self, req) -> None:
        """``req`` never landed (cancelled, failed, never submitted): give back what it held."""

    def landed(self, ids: np.ndarray) -> mx.array:
        """Slot ids ``ids`` (numpy) as the device array to compute with after a claim: reads complete
        by now are in their slots before that compute."""
        return mx.array(ids.astype(np.uint32))

    def handshake_copies(self, top_k: int):
        """How many copies one handshake answer may land in the device's stream (0: reads land in
        place), or None where the handshake cannot serve these slots."""
        return 0 if self.in_place else None

    def hand_over(self, claim):
        """``claim()`` with the reads it completes handed over to the caller, who lands them in the
        device's stream (the handshake's kernel): (its result, [(row, slot)]: none where reads
        land in place)."""
        return claim(), []

    def copies(self, pairs) -> np.ndarray:
        """Handed-over reads as [n, 3] uint64 device copies (source, destination, bytes)."""
        return np.zeros((0, 3), dtype=np.uint64)

    def retire(self, out, pairs) -> None:
        """Handed-over reads are copied by the kernel whose output is ``out``."""

    def reland(self, out, pairs) -> None:
        """That kernel may not have copied them: they land with the next ``landed`` or ``flush``."""

    def reclaim(self) -> None:
        """Kernels given rows so far have run (the caller synced after them): the rows come back."""

    def flush(self) -> None:
        """Reads complete by now are in their slots (a host wait)."""

    def drain(self) -> None:
        """The end of a request: every landing has run."""

    def close(self) -> None:
        """Give back what outlives the arena (the tensors stay valid)."""


class NoSlots(Slots):
    """No slot memory: the simulators."""


class DirectSlots(Slots):
    """Reads land in the slot's memory through writable byte views (``views[slot]``: one per tensor)."""

    name = "direct"
    in_place = True

    def __init__(self, manifest, n_slots: int, tensors=None):
        self.tensors = _zeros(manifest, n_slots) if tensors is None else tensors
        raw = [memoryview(self.tensors[t.name]).cast("B") for t in manifest.tensors]
        sizes = [t.nbytes for t in manifest.tensors]
        self.views = [[r[s * n:(s + 1) * n] for r, n in zip(raw, sizes)] for s in range(n_slots)]

    def request(self, blob, slot: int, speculative: bool = False) -> ReadRequest:
        return ReadRequest(blob, self.views[slot], slot, speculative=speculative)


class MappedSlots(DirectSlots):
    """Direct, in CUDA managed memory advised to live on the host and be mapped by the GPU; back on
    the GPU once closed or gone, before MLX reuses the memory."""

    name = "mapped"
    on_device = False

    def __init__(self, manifest, n_slots: int):
        tensors = _zeros(manifest, n_slots)
        arrays = list(tensors.values())
        if not cuda.host_mapped(arrays):
            raise ValueError("slot writes 'mapped': this CUDA runtime refused to keep slot memory on the host; "
                             "use staged or direct")
        self._unmap = weakref.finalize(self, cuda.host_mapped, arrays, False)
        self._unmap.atexit = False
        super().__init__(manifest, n_slots, tensors)

    def close(self) -> None:
        self._unmap()


class StagedSlots(Slots):
    """Reads land in a bounce row (``staging``), copied into the slot on the decode thread by the
    next ``landed`` or ``flush``."""

    name = "staged"

    def __init__(self, manifest, n_slots: int):
        self.tensors = _zeros(manifest, n_slots)
        rows = min(n_slots, 2 * manifest.n_experts + 2 * manifest.top_k)  # what a long batch holds at once
        self.staging = Staging([self.tensors[t.name] for t in manifest.tensors], rows=rows)

    def request(self, blob, slot: int, speculative: bool = False) -> ReadRequest:
        """A bounce row split like the slot's tensors, landed by the reading thread (``ReadRequest.land``)."""
        row = self.staging.take()
        req = ReadRequest(blob, row.views, slot, speculative=speculative)
        req.buffer, req.land = row, self._land
        return req

    def _land(self, req) -> None:
        """On the reading thread, once the read is complete."""
        row, req.buffer = req.buffer, None
        self.staging.land(row, req.slot)

    def recycle(self, req) -> None:
        if req.buffer is not None:
            self.staging.give(req.buffer)
            req.buffer = None

    def landed(self, ids: np.ndarray) -> mx.array:
        return self.staging.landed(ids)

    def handshake_copies(self, top_k: int):
        """Two tokens' worth of rows (pending reads of earlier claims land with the next one), in
        the landing kernel's chunks; None where that kernel cannot be built here."""
        return 2 * top_k * self.staging.chunks_per_row if self.staging.kernel else None

    def hand_over(self, claim):
        return self.staging.hand_over(claim)

    def copies(self, pairs) -> np.ndarray:
        return self.staging.copies(pairs)

    def retire(self, out, pairs) -> None:
        self.staging.retire(out, pairs)

    def reland(self, out, pairs) -> None:
        self.staging.reland(out, pairs)

    def reclaim(self) -> None:
        self.staging.reclaim()

    def flush(self) -> None:
        self.staging.flush()

    def drain(self) -> None:
        self.staging.drain()
