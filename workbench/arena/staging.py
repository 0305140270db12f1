"""Staged slot writes: a read lands in a bounce row of host memory, and the thread that read it
copies the row into its slot.

On CUDA the rows are pinned (``cudaHostAlloc``) and the copy is a DMA on the reading thread's own
stream into the slot tensors (one ``cudaMemcpyBatchAsync`` for the row's tensors where the runtime
has it, else one ``cudaMemcpyAsync`` per tensor), whose managed pages are advised to live on the
GPU: the host never touches slot memory, so no page migrates back and forth (``os.preadv`` straight
into managed memory moves its pages to the host, and the GPU then faults every one of them back).
Elsewhere the rows are plain host memory and the copy is a host copy, so the CPU runs the same rules.

A read by an I/O worker waits for its copy before it counts as done. A read by the thread that
will wait for it (``IOScheduler.help``: the decode thread reading a demand miss itself) only
queues its copy (``defer``); that thread calls ``flush`` once, after the layer's last read and
before anything computes on the slots, and the rows come back then. Either way a slot's data is in
place before the engine computes on it, as with direct writes.
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
    __slots__ = ("chunk", "views", "ptrs", "srcs")

    def __init__(self, chunk, views, ptrs):
        self.chunk, self.views, self.ptrs = chunk, views, ptrs  # chunk: keeps the memory alive
        self.srcs = (ctypes.c_void_p * len(ptrs))(*ptrs)  # the same addresses, as a batch copy takes them


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
            self._sizes = (ctypes.c_size_t * len(self.sizes))(*self.sizes)
            self._dsts = {}  # slot -> its tensors' addresses, as a batch copy takes them
            self.batched = _batch_copy(self._cuda) is not None  # False: one copy per tensor
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

    def land(self, row: Row, slot: int, defer: bool = False) -> None:
        """Copy ``row`` into ``slot`` on the calling thread. The copy is complete and the row given
        back when this returns, or, with ``defer``, when this thread next calls ``flush``."""
        try:
            if self.device_copy:
                self._copy_to_device(row, slot)
            else:
                for view, n, src in zip(self.slot_views, self.sizes, row.views):
                    view[slot * n:(slot + 1) * n] = src
        except BaseException:
            self._pending().append(row)
            self.flush()
            raise
        self._pending().append(row)
        if not defer:
            self.flush()

    def flush(self) -> None:
        """Wait for this thread's queued copies, then give their rows back."""
        pending = self._pending()
        if not pending:
            return
        try:
            if self.device_copy:
                rc = self._cuda.cudaStreamSynchronize(self._stream())
                if rc != 0:
                    raise RuntimeError(f"copy into a slot failed (CUDA error {rc})")
        finally:
            for row in pending:
                self.give(row)
            pending.clear()

    def _pending(self) -> list:
        pending = getattr(self._local, "pending", None)
        if pending is None:
            pending = self._local.pending = []
        return pending

    def _copy_to_device(self, row, slot):
        lib, stream = self._cuda, self._stream()
        if self.batched:
            dsts = self._dsts.get(slot)
            if dsts is None:
                dsts = self._dsts[slot] = (ctypes.c_void_p * len(self.bases))(*[b + slot * n for b, n in
                                                                                zip(self.bases, self.sizes)])
            rc = _batch_copy(lib)(dsts, row.srcs, self._sizes, len(self.sizes), stream)
            if rc == 0:
                return
            self.batched = False  # refused (an older driver): copy tensor by tensor from now on
        for base, n, src in zip(self.bases, self.sizes, row.ptrs):
            rc = lib.cudaMemcpyAsync(ctypes.c_void_p(base + slot * n), ctypes.c_void_p(src), ctypes.c_size_t(n),
                                     _MEMCPY_DEFAULT, stream)
            if rc != 0:
                raise RuntimeError(f"cudaMemcpyAsync into slot {slot} failed (CUDA error {rc})")

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


class _CopyAttributes(ctypes.Structure):  # cudaMemcpyAttributes
    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHint", _Location), ("dstLocHint", _Location),
                ("flags", ctypes.c_uint)]


_MEMCPY_DEFAULT = 4
_ACCESS_ORDER_STREAM = 1  # cudaMemcpySrcAccessOrderStream: the source is read in stream order
_HOST = 2  # cudaMemLocationType
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
def _batch_copy(lib):
    """``f(dsts, srcs, sizes, count, stream) -> CUDA error`` through ``cudaMemcpyBatchAsync`` (CUDA
    12.8+: host to GPU copies in stream order, one call for many), or None where the runtime lacks it."""
    version = ctypes.c_int()
    fn = getattr(lib, "cudaMemcpyBatchAsync", None)
    if fn is None or lib.cudaRuntimeGetVersion(ctypes.byref(version)) != 0 or version.value < 12080:
        return None
    attrs = _CopyAttributes(_ACCESS_ORDER_STREAM, _Location(_HOST, 0), _Location(_DEVICE, 0), 0)
    index, failed = ctypes.c_size_t(0), ctypes.c_size_t(0)
    if version.value >= 13000:  # CUDA 13 dropped the failIdx argument
        return lambda dsts, srcs, sizes, n, stream: fn(dsts, srcs, sizes, ctypes.c_size_t(n), ctypes.byref(attrs),
                                                       ctypes.byref(index), ctypes.c_size_t(1), stream)
    return lambda dsts, srcs, sizes, n, stream: fn(dsts, srcs, sizes, ctypes.c_size_t(n), ctypes.byref(attrs),
                                                   ctypes.byref(index), ctypes.c_size_t(1), ctypes.byref(failed), stream)


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
