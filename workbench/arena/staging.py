"""Staging rows for staged slot writes: reads land in host-written rows of MLX arrays shaped like
the slot tensors, and a flush copies them into their slots on the device (per tensor: a gather
from the rows, then a scatter).

A row is reusable once the gather that read it has run: ``gather`` records its lazy output, and
``take`` evaluates pending gathers only when no row is free (in steady state they ran long ago).

On CUDA, MLX memory is managed memory, whose pages migrate to whichever side touched them last:
a host write after a device read faults every page back. The rows are advised to live on the
host and to be mapped for the GPU (``cudaMemAdvise``), so host writes never fault and the device
reads them over the interconnect. Where that advice is unavailable the rows work unadvised.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os

import mlx.core as mx
import numpy as np


class Row:
    __slots__ = ("chunk", "index", "views")

    def __init__(self, chunk, index, views):
        self.chunk, self.index, self.views = chunk, index, views


class Staging:
    """Rows shaped like one expert's tensors: ``specs`` is [(shape, mx dtype)] in the slot's order;
    a row's ``views`` are one writable byte view per tensor (what a read fills)."""

    def __init__(self, specs, rows_per_chunk=32):
        self.specs = [(tuple(shape), dtype) for shape, dtype in specs]
        self.rows_per_chunk = rows_per_chunk
        self.chunks: list[tuple] = []  # per chunk: one MLX array per tensor, [rows, *shape]
        self.free: list[Row] = []
        self.pending: list[tuple[list, list[Row]]] = []  # (lazy gathers, the rows they read)
        self.advised = None  # True / False once the first chunk exists (CUDA only; None elsewhere)

    def take(self) -> Row:
        if not self.free and self.pending:
            mx.eval([g for gathers, _ in self.pending for g in gathers])
            for _, rows in self.pending:
                self.free.extend(rows)
            self.pending.clear()
        if not self.free:
            self._grow()
        return self.free.pop()

    def give(self, row: Row) -> None:
        """A row that will never be copied in is free at once."""
        self.free.append(row)

    def gather(self, rows) -> list:
        """The rows' values as one lazy device array per tensor, [len(rows), *shape]."""
        parts, i = [], 0
        while i < len(rows):  # consecutive rows of one chunk in one gather
            j = i
            while j < len(rows) and rows[j].chunk is rows[i].chunk:
                j += 1
            idx = mx.array([r.index for r in rows[i:j]], dtype=mx.uint32)
            parts.append([a[idx] for a in rows[i].chunk])
            i = j
        out = parts[0] if len(parts) == 1 else [mx.concatenate(p) for p in zip(*parts)]
        self.pending.append((out, list(rows)))
        return out

    def _grow(self):
        n = self.rows_per_chunk
        chunk = tuple(mx.zeros((n, *shape), dtype=dtype) for shape, dtype in self.specs)
        mx.eval(list(chunk))
        raw = [memoryview(a).cast("B") for a in chunk]
        if cuda_available() and mx.default_device() != mx.cpu:
            for r in raw:
                ok = _advise_host(np.frombuffer(r, dtype=np.uint8).ctypes.data, r.nbytes)
                self.advised = ok if self.advised is None else (self.advised and ok)
        self.chunks.append(chunk)
        sizes = [r.nbytes // n for r in raw]
        for i in range(n):
            self.free.append(Row(chunk, i, [r[i * b:(i + 1) * b] for r, b in zip(raw, sizes)]))
        self.rows_per_chunk *= 2  # few chunks: a flush gathers from few arrays


def cuda_available() -> bool:
    """This MLX build has a usable CUDA backend."""
    cuda = getattr(mx, "cuda", None)
    return bool(cuda is not None and cuda.is_available())


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


_SET_PREFERRED_LOCATION, _SET_ACCESSED_BY = 3, 5
_HOST, _DEVICE = 2, 1  # cudaMemLocationType
_CPU_DEVICE_ID = -1


def _advise_host(ptr: int, size: int) -> bool:
    """Prefer host residency for [ptr, ptr + size) and map it for GPU 0; False where unavailable."""
    lib = _cudart()
    if lib is None:
        return False
    p, n = ctypes.c_void_p(ptr), ctypes.c_size_t(size)
    advise = getattr(lib, "cudaMemAdvise_v2", None)  # CUDA 12.2+; CUDA 13's cudaMemAdvise takes the same locations
    version = ctypes.c_int()
    if advise is None and lib.cudaRuntimeGetVersion(ctypes.byref(version)) == 0 and version.value >= 13000:
        advise = lib.cudaMemAdvise
    if advise is not None:
        host, device = _Location(_HOST, 0), _Location(_DEVICE, 0)
    else:  # older runtimes take a device id
        advise, host, device = lib.cudaMemAdvise, ctypes.c_int(_CPU_DEVICE_ID), ctypes.c_int(0)
    return advise(p, n, _SET_PREFERRED_LOCATION, host) == 0 and advise(p, n, _SET_ACCESSED_BY, device) == 0


@functools.lru_cache(maxsize=1)
def _cudart():
    """The CUDA runtime MLX loaded (same soname, so the same library and context), or None."""
    here = os.path.dirname(mx.__file__)
    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    names += sorted(glob.glob(os.path.join(here, "..", "nvidia", "cu*", "lib", "libcudart.so*")))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None
