"""CUDA interop: the runtime MLX loaded, called through ``ctypes``.

Used by the arena's slot memory (``arena.slots``: mapped memory, staged landing), the handshake
(``engine.handshake``) and ``bench/``. Every function takes the runtime handle ``lib``
(``runtime()``) and does nothing CUDA-specific unless this is a CUDA build running on the GPU
(``in_use()``); elsewhere the callers run their host fallbacks.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import weakref

import mlx.core as mx

from .arrays import address

MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the runtime tells the direction from the addresses
_ACCESS_ORDER_STREAM = 1  # cudaMemcpySrcAccessOrderStream: the source is read in stream order
_HOST = 2  # cudaMemLocationType
_DEVICE = 1  # cudaMemLocationType
_SET_PREFERRED_LOCATION = 3
SET_ACCESSED_BY, UNSET_ACCESSED_BY = 5, 6  # cudaMemoryAdvise


def available() -> bool:
    """This MLX build has a usable CUDA backend."""
    cuda = getattr(mx, "cuda", None)
    return bool(cuda is not None and cuda.is_available())


def in_use() -> bool:
    """A CUDA build, and the default device is the GPU."""
    return available() and mx.default_device() != mx.cpu


@functools.lru_cache(maxsize=1)
def runtime():
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


class Pinned:
    """Page-locked host memory (``buffer``; ``device``: its first byte as the GPU addresses it),
    freed when the last object that uses it is gone."""

    def __init__(self, lib, nbytes):
        ptr = ctypes.c_void_p()
        if lib.cudaHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes), 0) != 0:
            raise MemoryError(f"cudaHostAlloc of {nbytes} bytes failed")
        self.buffer = (ctypes.c_ubyte * nbytes).from_address(ptr.value)
        device = ctypes.c_void_p()  # the same memory as the GPU addresses it (the same address under UVA)
        ok = lib.cudaHostGetDevicePointer(ctypes.byref(device), ptr, 0) == 0 and device.value
        self.device = device.value if ok else ptr.value
        weakref.finalize(self, lib.cudaFreeHost, ptr).atexit = False  # at exit the process frees it (CUDA may be gone)


def new_stream(lib):
    """A new non-blocking CUDA stream (never ordered behind MLX's compute)."""
    stream = ctypes.c_void_p()
    if lib.cudaStreamCreateWithFlags(ctypes.byref(stream), 1) != 0:
        raise RuntimeError("cudaStreamCreateWithFlags failed")
    return stream


def copy_async(lib, dst: int, src: int, nbytes: int, stream) -> int:
    """``cudaMemcpyAsync`` of ``nbytes`` from ``src`` to ``dst`` in ``stream``; the CUDA error (0: queued)."""
    return lib.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(nbytes),
                               MEMCPY_DEFAULT, stream)


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _CopyAttributes(ctypes.Structure):  # cudaMemcpyAttributes
    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHint", _Location), ("dstLocHint", _Location),
                ("flags", ctypes.c_uint)]


@functools.lru_cache(maxsize=1)
def batch_copy(lib):
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


def on_gpu(lib, ptr: int, size: int) -> bool:
    """Advise [ptr, ptr + size) (managed memory) to live on GPU 0 and move it there now; False where
    the runtime refuses (then the caller copies on the host)."""
    return advise(lib, ptr, size, on_host=False, accessed=None)


def host_mapped(arrays, on_host=True) -> bool:
    """Advise the managed memory of ``arrays`` (evaluated MLX arrays) to live on the host, mapped by
    GPU 0, and move it there now: the host writes it in place and the GPU reads it over the bus, so no
    page migrates either way (``on_host=False``: back to the GPU, before MLX reuses the memory). False
    where this is no CUDA build or the runtime refuses."""
    lib = runtime() if in_use() else None
    if lib is None:
        return False
    views = [memoryview(a).cast("B") for a in arrays]
    accessed = SET_ACCESSED_BY if on_host else UNSET_ACCESSED_BY
    return all(advise(lib, address(v), v.nbytes, on_host, accessed) for v in views)


def advise(lib, ptr: int, size: int, on_host: bool, accessed) -> bool:
    """Preferred location host or GPU 0, ``accessed`` (an AccessedBy advice for GPU 0, or None), then
    move the pages there; False where the runtime refuses."""
    p, n, gpu, host = ctypes.c_void_p(ptr), ctypes.c_size_t(size), _Location(_DEVICE, 0), _Location(_HOST, 0)
    version = ctypes.c_int()
    new = lib.cudaRuntimeGetVersion(ctypes.byref(version)) == 0 and version.value >= 13000
    mem_advise = lib.cudaMemAdvise if new else getattr(lib, "cudaMemAdvise_v2", None)  # CUDA 13 / 12.2+: locations
    prefetch = lib.cudaMemPrefetchAsync if new else getattr(lib, "cudaMemPrefetchAsync_v2", None)
    if mem_advise is None or prefetch is None:  # older runtimes take a device id (-1: the host), and no flags
        where, gpu, mem_advise = ctypes.c_int(-1 if on_host else 0), ctypes.c_int(0), lib.cudaMemAdvise

        def prefetch(p, n, device, flags, stream):
            return lib.cudaMemPrefetchAsync(p, n, device, stream)
    else:
        where = host if on_host else gpu
    ok = mem_advise(p, n, _SET_PREFERRED_LOCATION, where) == 0
    ok = ok and (accessed is None or mem_advise(p, n, accessed, gpu) == 0)
    ok = ok and prefetch(p, n, where, ctypes.c_uint(0), None) == 0
    return ok and lib.cudaDeviceSynchronize() == 0
