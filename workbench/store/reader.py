"""Blob reads into slot memory, in four read modes.

buffered   os.preadv through the page cache
dontneed   buffered, then POSIX_FADV_DONTNEED on the blob (cold reads on Linux)
direct     O_DIRECT (Linux): straight into the slot where its buffers are page-aligned, else into
           an aligned bounce buffer and copied from there
nocache    F_NOCACHE on the descriptor (macOS)
"""

from __future__ import annotations

import functools
import mmap
import os
import sys
import threading

from ..arrays import address
from ..config import READ_MODES, VERIFY_MODES
from .manifest import EXPERTS, Blob, StoreError, crc32

PIECE_BYTES = 1 << 20
DIRECT_ALIGN = 4096  # O_DIRECT: file offsets, buffer addresses and lengths in pages
NOWAIT_REFUSALS = 8


def available_modes() -> list[str]:
    modes = ["buffered"]
    if hasattr(os, "posix_fadvise"):
        modes.append("dontneed")
    if hasattr(os, "O_DIRECT"):
        modes.append("direct")
    if sys.platform == "darwin":
        modes.append("nocache")
    return modes


class BlobReader:
    """Reads one (layer, expert) blob into a list of writable buffers (the slot's tensors)."""

    def __init__(self, root, manifest, mode: str = "buffered", verify: str = "first", piece_bytes: int = PIECE_BYTES):
        if mode not in READ_MODES:
            raise ValueError(f"unknown read mode {mode!r}; valid: {', '.join(READ_MODES)}")
        if mode not in available_modes():
            raise ValueError(f"read mode {mode!r} is not available on {sys.platform}; available: {', '.join(available_modes())}")
        if verify not in VERIFY_MODES:
            raise ValueError(f"unknown verify {verify!r}; valid: {', '.join(VERIFY_MODES)}")
        self.manifest, self.mode, self.verify = manifest, mode, verify
        self.piece_bytes = max(DIRECT_ALIGN, piece_bytes // DIRECT_ALIGN * DIRECT_ALIGN)
        self.path = os.path.join(root, EXPERTS)
        self.fd = os.open(self.path, os.O_RDONLY)
        self.dfd = os.open(self.path, os.O_RDONLY | os.O_DIRECT) if mode == "direct" else None
        if mode == "nocache":
            import fcntl

            fcntl.fcntl(self.fd, fcntl.F_NOCACHE, 1)
        self._verified: dict = {}  # (layer, expert) -> file stamp (size, mtime_ns) when checked
        self._pieces: dict = {}
        self.page_cache = PageCacheProbe(self.fd, os.fstat(self.fd).st_size)
        self.through_page_cache = mode in ("buffered", "dontneed")  # direct / nocache bypass it
        self._nowait = self.through_page_cache and _takes_nowait(self.fd)
        self._refusals = 0  # RWF_NOWAIT reads refused in a row although mincore said cached
        self._local = threading.local()
        self.inject = None  # tests: fn(blob) that may sleep or raise, called before each piece

    def close(self):
        self.page_cache.close()
        for fd in (self.fd, self.dfd):
            if fd is not None:
                os.close(fd)
        self.fd = self.dfd = None

    def pieces(self, views):
        """Split the slot's buffers into pieces of at most piece_bytes (cancellable units), each
        as (buffers, bytes, aligned: every buffer starts and ends on a page, so O_DIRECT can read
        into them). A slot's buffers never change, so the split is computed once per slot."""
        key = id(views)
        hit = self._pieces.get(key)
        if hit is not None and hit[0] is views:
            return hit[1]
        out = [(piece, n, all(_page_aligned(p) for p in piece)) for piece, n in self._split(views)]
        self._pieces[key] = (views, out)
        return out

    def _split(self, views):
        out, cur, size = [], [], 0
        for v in views:
            pos = 0
            while pos < len(v):
                take = min(len(v) - pos, self.piece_bytes - size)
                cur.append(v[pos:pos + take])
                pos += take
                size += take
                if size == self.piece_bytes:
                    out.append((cur, size))
                    cur, size = [], 0
        if cur:
            out.append((cur, size))
        return out

    def read(self, blob: Blob, views, cancelled=lambda: False) -> int:
        """Read ``blob`` into ``views``; returns bytes read (less than blob.size if cancelled)."""
        return self.read_probed(blob, views, cancelled, probe=False)[0]

    def read_probed(self, blob: Blob, views, cancelled=lambda: False, probe=True, share=None) -> tuple[int, bool | None]:
        """``read``, and whether the whole blob was in the page cache before it (None where the OS
        cannot say). Buffered reads on Linux ask first with ``RWF_NOWAIT`` (the answer costs
        nothing: a piece that would wait is read again normally); elsewhere ``mincore`` answers.
        ``share(jobs)``: runs the pieces' reads at once, this thread taking part, and returns when
        all are done (``IOScheduler``: a demand read split over idle workers); None: one after
        another here, stopping between pieces once ``cancelled()``."""
        nowait = probe and self._nowait
        cached = (True if nowait else self.page_cache.cached(blob.offset, blob.size)) if probe else None
        stamp = self._stamp() if self.verify == "changed" else None  # before the read: a later change re-checks
        pieces = self.pieces(views)
        done = 0
        if share is not None and len(pieces) > 1:
            refusals, jobs = [], []
            for piece, n, aligned in pieces:
                jobs.append(functools.partial(lambda *a: refusals.append(self._piece(*a)), blob, done, piece, n,
                                              aligned, nowait and cached))
                done += n
            share(jobs)
            cached = next((r for r in refusals if r is not None), cached)
        else:
            for piece, n, aligned in pieces:
                if cancelled():
                    return done, cached
                refused = self._piece(blob, done, piece, n, aligned, nowait and cached)
                if refused is not None:
                    cached, nowait = refused, False
                done += n
        if self.mode == "dontneed":
            os.posix_fadvise(self.fd, blob.offset, blob.size, os.POSIX_FADV_DONTNEED)
        self._check(blob, views, stamp)
        return done, cached

    def _piece(self, blob, at, piece, n, aligned, asked):
        """Read the blob's piece at ``at`` bytes in; ``asked``: with ``RWF_NOWAIT`` first. Returns
        mincore's answer for the whole blob where the kernel refused that (else None)."""
        if self.inject is not None:
            self.inject(blob)
        got = self._try_cached(blob.offset + at, piece, n) if asked else 0
        refused = None
        if got != n:
            if asked:
                refused = self._refused(blob)
            got = self._read_piece(blob.offset + at, piece, n, aligned)
        elif asked:  # honoured
            self._refusals = 0
        if got != n:
            raise StoreError(
                f"short read of layer {blob.layer} expert {blob.expert}: got {at + got} of {blob.size} bytes "
                f"at offset {blob.offset} in {self.path}; the store is truncated, pack the model again"
            )
        return refused

    def _refused(self, blob) -> bool | None:
        """A read that would wait: mincore says whether the blob was cached all the same. A kernel
        may refuse a cached page now and then (one locked, or marked for read-ahead); one that
        refuses ``NOWAIT_REFUSALS`` cached reads in a row does not honour RWF_NOWAIT here, and
        mincore answers from then on."""
        cached = self.page_cache.cached(blob.offset, blob.size)
        if cached:
            self._refusals += 1
            self._nowait = self._refusals < NOWAIT_REFUSALS
        return False if cached is None else cached

    def _try_cached(self, offset, piece, n) -> int:
        """Bytes read without waiting for the disk (short or 0: not all in the page cache)."""
        try:
            return os.preadv(self.fd, piece, offset, os.RWF_NOWAIT)
        except BlockingIOError:
            return 0

    def _read_piece(self, offset, piece, n, aligned):
        if self.mode != "direct":
            return os.preadv(self.fd, piece, offset)
        if aligned and offset % DIRECT_ALIGN == 0:  # no bounce copy (held under the GIL)
            return os.preadv(self.dfd, piece, offset)
        start = offset - offset % DIRECT_ALIGN
        length = -(-(offset + n - start) // DIRECT_ALIGN) * DIRECT_ALIGN
        buf = self._bounce(length)
        got = os.preadv(self.dfd, [memoryview(buf)[:length]], start)
        got = min(max(0, got - (offset - start)), n)
        pos = offset - start
        for p in piece:
            p[:] = buf[pos:pos + len(p)]
            pos += len(p)
        return got

    def _bounce(self, length):
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < length:
            buf = self._local.buf = mmap.mmap(-1, max(length, self.piece_bytes + 8192))
        return buf

    def _stamp(self):
        st = os.fstat(self.fd)
        return st.st_size, st.st_mtime_ns

    def _check(self, blob, views, stamp=None):
        key = (blob.layer, blob.expert)
        if self.verify == "never" or (self.verify == "first" and key in self._verified):
            return
        if self.verify == "changed" and self._verified.get(key) == stamp:
            return
        crc = 0
        for v in views:
            crc = crc32(v, crc)
        if crc != blob.crc32:
            raise StoreError(
                f"checksum mismatch in layer {blob.layer} expert {blob.expert} "
                f"(crc32 {crc:08x}, manifest {blob.crc32:08x}) in {self.path}; the store is corrupt, pack the model again"
            )
        self._verified[key] = stamp


def _page_aligned(view) -> bool:
    """Whether a writable byte buffer starts and ends on a ``DIRECT_ALIGN`` boundary."""
    return len(view) > 0 and len(view) % DIRECT_ALIGN == 0 and address(view) % DIRECT_ALIGN == 0


def _takes_nowait(fd) -> bool:
    """Whether this kernel and file system take ``RWF_NOWAIT`` reads of ``fd`` (Linux 4.14+)."""
    if not hasattr(os, "RWF_NOWAIT"):
        return False
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return True


class PageCacheProbe:
    """Tells whether a blob is already in the OS page cache (Linux ``mincore`` on one
    read-only mapping of the experts file), so page-cache hits are counted apart from
    arena hits. ``cached`` returns None where the OS cannot say."""

    def __init__(self, fd: int, size: int):
        self.addr = None
        self._local = threading.local()  # each thread's own vector
        if not sys.platform.startswith("linux") or size == 0:
            return
        import ctypes

        libc = _libc()
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr not in (None, ctypes.c_void_p(-1).value):
            self.addr, self.size, self.libc = addr, size, libc

    def cached(self, offset: int, length: int) -> bool | None:
        """Safe from several threads at once (each thread has its own vector)."""
        if self.addr is None or offset < 0 or length < 1 or offset + length > self.size:
            return None  # outside the mapping
        page = mmap.PAGESIZE
        start = offset - offset % page
        n = -(-(offset + length - start) // page)
        vec = getattr(self._local, "vec", None)
        if vec is None or len(vec[0]) < n:
            import ctypes

            bits = (ctypes.c_ubyte * max(n, 1024))()
            vec = self._local.vec = (memoryview(bits).cast("B"), ctypes.addressof(bits), bits)
        if self.libc.mincore(self.addr + start, n * page, vec[1]) != 0:
            return None
        return not vec[0][:n].tobytes().translate(None, _RESIDENT)  # every page's low bit set

    def close(self):
        if self.addr is not None:
            import ctypes

            self.libc.munmap(ctypes.c_void_p(self.addr), self.size)
            self.addr = None


_RESIDENT = bytes(range(1, 256, 2))  # mincore's bytes of a resident page (its low bit)
_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _LIBC = libc
    return _LIBC
