"""Staged slot writes: a read lands in a bounce row of host memory, and the thread that read it
copies the row into its slot before the read counts as done.

On CUDA the rows are pinned (``cudaHostAlloc``) and the copy is a DMA (``cudaMemcpyAsync`` on the
reading thread's own stream, then a wait for it) into the slot tensors, whose managed pages are
advised to live on the GPU: the host never touches slot memory, so no page migrates back and
forth (``os.preadv`` straight into managed memory moves its pages to the host, and the GPU then
faults every one of them back). Elsewhere the rows are plain host memory and the copy is a host
copy, so the CPU runs the same rules.

A slot's data is in place when its read is done, as with direct writes: the engine orders slot
reuse against the device's compute the same way for both.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import threading
import weakref
from collections import deque

import mlx.core as mx
import numpy as np


class Row:
    __slots__ = ("chunk", "views", "ptrs")

    def __init__(self, chunk, views, ptrs):
        self.chunk, self.views, self.ptrs = chunk, views, ptrs  # chunk: keeps the memory alive


class Staging:
    """Bounce rows for the slot tensors ``tensors`` ([n_slots + 1, ...] MLX arrays, in the slot's
    order); a row's ``views`` are one writable byte view per tensor (what a read fills)."""

    def __init__(self, tensors, rows_per_chunk=16):
        raw = [memoryview(a).cast("B") for a in tensors]
        self.sizes = [r.nbytes // a.shape[0] for r, a in zip(raw, tensors)]
        self.rows_per_chunk = rows_per_chunk
        self.free: deque[Row] = deque()  # taken on the decode thread, given back by readers
        self._cuda = _cudart() if cuda_available() and mx.default_device() != mx.cpu else None
        self.device_copy = self._cuda is not None and all(_on_gpu(self._cuda, _address(r), r.nbytes) for r in raw)
        if self.device_copy:
            self.bases = [_address(r) for r in raw]
        else:
            self.slot_views = raw
        self._local = threading.local()

    def take(self) -> Row:
        try:
            return self.free.pop()
        except IndexError:
            self._grow()
            return self.free.pop()

    def give(self, row: Row) -> None:
        self.free.append(row)

    def land(self, row: Row, slot: int) -> None:
        """Copy ``row`` into ``slot`` (on the calling thread), then give the row back."""
        try:
            if self.device_copy:
                self._copy_to_device(row, slot)
            else:
                for view, n, src in zip(self.slot_views, self.sizes, row.views):
                    view[slot * n:(slot + 1) * n] = src
        finally:
            self.give(row)

    def _copy_to_device(self, row, slot):
        lib, stream = self._cuda, self._stream()
        for base, n, src in zip(self.bases, self.sizes, row.ptrs):
            rc = lib.cudaMemcpyAsync(ctypes.c_void_p(base + slot * n), ctypes.c_void_p(src), ctypes.c_size_t(n),
                                     _MEMCPY_DEFAULT, stream)
            if rc != 0:
                raise RuntimeError(f"cudaMemcpyAsync into slot {slot} failed (CUDA error {rc})")
        rc = lib.cudaStreamSynchronize(stream)
        if rc != 0:
            raise RuntimeError(f"copy into slot {slot} failed (CUDA error {rc})")

    def _stream(self):
        """This thread's own non-blocking CUDA stream (never ordered behind MLX's compute)."""
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = ctypes.c_void_p()
            if self._cuda.cudaStreamCreateWithFlags(ctypes.byref(stream), 1) != 0:
                raise RuntimeError("cudaStreamCreateWithFlags failed")
            self._local.stream = stream
        return stream

    def _grow(self):
        n, row_bytes = self.rows_per_chunk, sum(self.sizes)
        chunk = _Pinned(self._cuda, n * row_bytes) if self.device_copy else bytearray(n * row_bytes)
        raw = memoryview(chunk.buffer if self.device_copy else chunk).cast("B")
        base = _address(raw)
        for i in range(n):
            off, views, ptrs = i * row_bytes, [], []
            for size in self.sizes:
                views.append(raw[off:off + size])
                ptrs.append(base + off)
                off += size
            self.free.append(Row(chunk, views, ptrs))
        self.rows_per_chunk *= 2


class _Pinned:
    """Page-locked host memory, freed when the last row that uses it is gone."""

    def __init__(self, lib, nbytes):
        ptr = ctypes.c_void_p()
        if lib.cudaHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes), 0) != 0:
            raise MemoryError(f"cudaHostAlloc of {nbytes} bytes failed")
        self.buffer = (ctypes.c_ubyte * nbytes).from_address(ptr.value)
        weakref.finalize(self, lib.cudaFreeHost, ptr).atexit = False  # at exit the process frees it (CUDA may be gone)


def _address(view) -> int:
    return np.frombuffer(view, dtype=np.uint8).ctypes.data


def cuda_available() -> bool:
    """This MLX build has a usable CUDA backend."""
    cuda = getattr(mx, "cuda", None)
    return bool(cuda is not None and cuda.is_available())


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


_MEMCPY_DEFAULT = 4
_SET_PREFERRED_LOCATION = 3
_DEVICE = 1  # cudaMemLocationType


def _on_gpu(lib, ptr: int, size: int) -> bool:
    """Advise [ptr, ptr + size) (managed memory) to live on GPU 0 and move it there now; False where
    the runtime refuses (then the caller copies on the host)."""
    p, n, gpu = ctypes.c_void_p(ptr), ctypes.c_size_t(size), _Location(_DEVICE, 0)
    version = ctypes.c_int()
    new = lib.cudaRuntimeGetVersion(ctypes.byref(version)) == 0 and version.value >= 13000
    advise = lib.cudaMemAdvise if new else getattr(lib, "cudaMemAdvise_v2", None)  # CUDA 13 / 12.2+: locations
    prefetch = lib.cudaMemPrefetchAsync if new else getattr(lib, "cudaMemPrefetchAsync_v2", None)
    if advise is None or prefetch is None:  # older runtimes take a device id
        ok = lib.cudaMemAdvise(p, n, _SET_PREFERRED_LOCATION, ctypes.c_int(0)) == 0
        ok = ok and lib.cudaMemPrefetchAsync(p, n, ctypes.c_int(0), None) == 0
    else:
        ok = advise(p, n, _SET_PREFERRED_LOCATION, gpu) == 0 and prefetch(p, n, gpu, ctypes.c_uint(0), None) == 0
    return ok and lib.cudaDeviceSynchronize() == 0


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
