"""The residency map: which key (``layer * n_experts + expert``) each slot holds, whether that
entry is *published* (router-visible: claimed by a real routing decision) or speculative, and the
expert->slot table ``lut`` (every expert that is not published maps to the placeholder slot, so a
decode pass can run without asking the host which experts are resident, verified afterwards).

The queries that a decode step makes many times (the table on the device, the published set, the
residency signature) are made again only when ``lut`` changed (``version``)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .. import cuda


def _table(n_rows, n_experts, fill):
    """The int32 table, and the pinned memory it lives in on CUDA (the handshake's hit-through reads
    it while a token runs: ``engine.handshake``), else None."""
    memory = cuda.Pinned(cuda.runtime(), n_rows * n_experts * 4) if cuda.in_use() else None
    table = np.empty((n_rows, n_experts), dtype=np.int32) if memory is None else \
        np.frombuffer(memory.buffer, dtype=np.int32).reshape(n_rows, n_experts)
    table[:] = fill
    return table, memory


class Residency:
    def __init__(self, n_rows: int, n_experts: int, n_slots: int, n_routed: int):
        self.E, self.placeholder, self.n_routed = n_experts, n_slots, n_routed
        self.lut, self.lut_memory = _table(n_rows, n_experts, n_slots)  # published -> slot
        self.mapped = np.zeros(self.lut.shape, dtype=bool)  # (layer, expert) has a slot: published or in flight
        self._lut_of, self._mapped_of = self.lut.reshape(-1), self.mapped.reshape(-1)  # the same memory, by key
        self.key_of = [-1] * n_slots
        self.smap: dict[int, int] = {}  # key -> slot
        self.published = [False] * n_slots
        self.n_published = 0
        self.version = 0  # bumped whenever ``lut`` changes
        self._device_lut = (None, {}, None)  # (version, layer -> lut row on the device, host copy)
        self._signature = (None, b"")  # (version, signature())
        self._published = (None, {})  # (version, layer -> published_experts(layer))

    # ---- changes -----------------------------------------------------------------------
    def assign(self, s: int, key: int) -> None:
        """Slot ``s`` now holds ``key``, not published yet."""
        self.key_of[s] = key
        self.smap[key] = s
        self._mapped_of[key] = True
        self.published[s] = False

    def publish(self, s: int) -> None:
        self.published[s] = True
        self.n_published += 1
        self._lut_of[self.key_of[s]] = s
        self.version += 1

    def drop(self, s: int) -> int:
        """Forget slot ``s``'s key (returned; -1 if it held none): map and table."""
        key = self.key_of[s]
        if key >= 0:
            del self.smap[key]
            self._mapped_of[key] = False
            if self._lut_of[key] == s:
                self._lut_of[key] = self.placeholder
                self.version += 1
        self.n_published -= self.published[s]
        self.key_of[s] = -1
        self.published[s] = False
        return key

    def show(self, s: int) -> None:
        """Map slot ``s``'s unpublished key in ``lut`` (a recompute computes on it) until ``hide``."""
        self._lut_of[self.key_of[s]] = s
        self.version += 1

    def hide(self, s: int) -> None:
        key = self.key_of[s]
        if key >= 0 and not self.published[s] and self._lut_of[key] == s:
            self._lut_of[key] = self.placeholder
            self.version += 1

    # ---- queries -----------------------------------------------------------------------
    @property
    def frozen(self) -> bool:
        """Every routed expert is published: nothing can miss, so nothing is ever evicted again, and
        the policy, never asked for a victim again, is no longer touched."""
        return self.n_published == self.n_routed

    def published_experts(self, layer: int) -> list[int]:
        """A fresh list (callers may keep it)."""
        if self._published[0] != self.version:
            self._published = (self.version, {})
        ids = self._published[1].get(layer)
        if ids is None:
            ids = self._published[1][layer] = np.flatnonzero(self.lut[layer] != self.placeholder).tolist()
        return list(ids)

    def resident_mask(self, layer: int) -> np.ndarray:
        return self.lut[layer] != self.placeholder

    def is_mapped(self, layer: int, expert: int) -> bool:
        return bool(self.mapped[layer, expert])

    def device_lut(self, layers):
        """(layer -> ``lut`` row as a device array, a host copy of ``lut``)."""
        if self._device_lut[0] != self.version:
            table = mx.array(self.lut[layers].astype(np.uint32))
            rows = {layer: table[i] for i, layer in enumerate(layers)}
            self._device_lut = (self.version, rows, self.lut.copy())
        return self._device_lut[1:]

    def signature(self) -> bytes:
        """The published residency set, as a bit mask over (layer, expert)."""
        if self._signature[0] != self.version:
            self._signature = (self.version, np.packbits(self.lut != self.placeholder).tobytes())
        return self._signature[1]
