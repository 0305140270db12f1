"""Staged slot writes (``slots.StagedSlots``): a read lands in a bounce row of host memory, and the
decode thread copies the row into its slot before it computes on it.

On CUDA the rows are pinned (``cudaHostAlloc``), and the slot tensors' managed pages are advised to
live on the GPU: the host never touches slot memory, so no page migrates back and forth
(``os.preadv`` straight into managed memory moves its pages to the host, and the GPU then faults
every one of them back). Elsewhere the rows are plain host memory, so the CPU runs the same rules.

A read is done once its row is full, whichever thread read it (an I/O worker, or the decode thread
reading a demand miss itself): it joins ``pending``. The decode thread lands every pending row in
its next ``landed`` (which gives the claim's compute its slot ids) or ``flush`` (a host wait):
on CUDA through one landing kernel that reads the rows from pinned memory, in the device's stream
order, whose output is the ids, so the compute waits for it with no host sync and no runtime call
per read (or, where that kernel cannot be built, a DMA per row and one wait); elsewhere a host
copy. Either way a slot's data is in place before the engine computes on it, as with direct writes.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import threading
from collections import deque

import mlx.core as mx
import numpy as np

from .. import cuda
from ..arrays import address

_HOST_ONLY = threading.local()


def host_only() -> None:
    """This thread makes no MLX call (the handshake's server, ``engine.server``): a row it cannot
    take free is made, never waited for."""
    _HOST_ONLY.on = True


class Row:
    __slots__ = ("chunk", "views", "ptrs", "srcs", "device")

    def __init__(self, chunk, views, ptrs, device):
        self.chunk, self.views, self.ptrs = chunk, views, ptrs  # chunk: keeps the memory alive
        self.srcs = (ctypes.c_void_p * len(ptrs))(*ptrs)  # the same addresses, as a batch copy takes them
        self.device = device  # the row's first byte as the GPU addresses it (pinned rows), else 0


class Staging:
    """Bounce rows for the slot tensors ``tensors`` ([n_slots + 1, ...] MLX arrays, in the slot's
    order); a row's ``views`` are one writable byte view per tensor (what a read fills). Rows are
    taken and given back on the decode thread (or the thread serving for it: ``host_only``); any
    reading thread may ``land`` one. ``rows``: how
    many are made at once, up front (pinning host memory takes about 0.5 ms per MB on CUDA: a prompt
    that grew the rows as it went paid it in its time to first token); more are made as needed."""

    def __init__(self, tensors, rows=16):
        raw = [memoryview(a).cast("B") for a in tensors]
        self.sizes = [r.nbytes // a.shape[0] for r, a in zip(raw, tensors)]
        self.offsets = np.cumsum([0] + [-(-n // _ALIGN) * _ALIGN for n in self.sizes])  # in a row
        self.rows_per_chunk = 16
        self.free: deque[Row] = deque()
        self.pending: list = []  # (row, slot) of complete reads not landed yet, in the order they completed
        self._lock = threading.Lock()  # for ``pending``
        self._inflight: deque = deque()  # (landing kernel's output, its rows) that it may still read
        self.divert = None  # a list: pending rows go there instead of landing (``hand_over``)
        self._local = threading.local()
        self._cuda = cuda.runtime() if cuda.in_use() else None
        self.device_copy = self._cuda is not None and all(cuda.on_gpu(self._cuda, address(r), r.nbytes) for r in raw)
        self.kernel = False  # pending rows land through the landing kernel
        self._grow(max(1, rows))
        if self.device_copy:
            self.bases = [address(r) for r in raw]
            self._sizes = (ctypes.c_size_t * len(self.sizes))(*self.sizes)
            self._dsts = {}  # slot -> its tensors' addresses, as a batch copy takes them
            self.batched = cuda.batch_copy(self._cuda) is not None  # False: one copy per tensor
            self._plan = _chunks(self.sizes, self.offsets, self.bases)
            self.chunks_per_row = len(self._plan[0])
            self.kernel = self._kernel_works(tensors)
        else:
            self.slot_views = raw

    def take(self) -> Row:
        if not self.free:
            if self._inflight and not getattr(_HOST_ONLY, "on", False):  # its oldest kernel has run by now
                out, rows = self._inflight.popleft()
                mx.eval(out)
                self.free.extend(rows)
            else:
                self._grow()
        return self.free.pop()

    def give(self, row: Row) -> None:
        self.free.append(row)

    def land(self, row: Row, slot: int) -> None:
        """The read into ``row`` for ``slot`` is complete (on the thread that read it): the decode
        thread's next ``landed`` or ``flush`` copies it into the slot."""
        with self._lock:
            self.pending.append((row, slot))

    def landed(self, ids: np.ndarray) -> mx.array:
        """Slot ids ``ids`` (numpy) as a uint32 device array computed only once every pending row is
        in its slot: compute on the slots with it. Through the landing kernel the ids travel in its
        table (one upload per claim) and are its output."""
        out = self._land_pending(ids)
        return mx.array(ids.astype(np.uint32)) if out is None else out

    def flush(self) -> None:
        """Every pending row is in its slot (waits for it), and given back."""
        if self._land_pending(np.zeros(1, dtype=np.uint32)) is not None:
            self.reclaim()

    def drain(self) -> None:
        """Every landing has run (waits for them) and every row is back: the end of a request."""
        self.flush()
        self.reclaim()

    def reclaim(self) -> None:
        """Wait for every landing kernel launched so far and give their rows back."""
        if not self._inflight:
            return
        mx.eval([out for out, _ in self._inflight])
        while self._inflight:
            self.free.extend(self._inflight.popleft()[1])

    def hand_over(self, claim):
        """``claim()`` with the rows it lands handed over, not landed: (its result, [(row, slot)]).
        Whoever takes them copies them into their slots in the device's stream (the handshake's
        kernel: ``copies``) and gives them back with ``retire``."""
        self.divert = []
        try:
            return claim(), self.divert
        finally:
            self.divert = None

    def copies(self, pairs) -> np.ndarray:
        """[(row, slot)] as [n, 3] uint64 copies (source, destination, bytes) of at most ``_CHUNK``
        bytes each, row by row."""
        src_off, dst0, stride, nbytes = self._plan
        rows = np.array([row.device for row, _ in pairs], dtype=np.uint64)[:, None]
        slots = np.array([slot for _, slot in pairs], dtype=np.uint64)[:, None]
        copies = np.empty((len(pairs), src_off.size, 3), dtype=np.uint64)
        copies[..., 0] = rows + src_off
        copies[..., 1] = dst0 + slots * stride
        copies[..., 2] = nbytes
        return copies.reshape(-1, 3)

    def retire(self, out, pairs) -> None:
        """Handed-over rows ``pairs`` are being copied by the kernel whose output is ``out``: given
        back once it has run."""
        self._inflight.append((out, [row for row, _ in pairs]))

    def reland(self, out, pairs) -> None:
        """The kernel ``out`` may not have copied ``pairs`` (the device gave up): they land again with
        the next ``landed`` or ``flush``."""
        for i, (o, _) in enumerate(self._inflight):
            if o is out:
                del self._inflight[i]
                break
        with self._lock:
            self.pending[:0] = pairs

    def _land_pending(self, ids):
        """Land every pending row: the landing kernel's output (``ids``), or None where they are in
        their slots already (no kernel: copied, and the rows given back; or handed over). Rows leave
        ``pending`` only once launched or copied: an error or an interrupt before that leaves them to
        land later."""
        with self._lock:
            pending = list(self.pending)
        if not pending:
            return None
        last = _last_per_slot(pending)
        if self.divert is not None:
            self.divert.extend(last)
            with self._lock:
                del self.pending[:len(pending)]
            kept = {id(row) for row, _ in last}
            self.free.extend(row for row, _ in pending if id(row) not in kept)  # a previous owner's: never copied
            return None
        out = self._launch(last, ids) if self.kernel else self._copy(last)
        with self._lock:
            del self.pending[:len(pending)]  # readers only append
        rows = [row for row, _ in pending]
        if out is None:
            self.free.extend(rows)
        else:
            self._inflight.append((out, rows))  # given back once the kernel has run
        return out

    def _copy(self, pending) -> None:
        """Land ``pending`` rows without the kernel: a DMA each and one wait on CUDA, else a host copy."""
        if not self.device_copy:
            for row, slot in pending:
                for view, n, src in zip(self.slot_views, self.sizes, row.views):
                    view[slot * n:(slot + 1) * n] = src
            return
        for row, slot in pending:
            self._copy_to_device(row, slot)
        rc = self._cuda.cudaStreamSynchronize(self._stream())
        if rc != 0:
            raise RuntimeError(f"copy into a slot failed (CUDA error {rc})")

    def _launch(self, pending, ids):
        """The landing kernel for ``pending`` [(row, slot)]: its output is ``ids`` (numpy slot ids),
        which travel at the end of its table."""
        copies = self.copies(pending)
        n = len(copies)
        table = np.empty(3 * (1 + n) + ids.size, dtype=np.uint64)
        table[:3] = (ids.size, n, 0)
        table[3:3 * (1 + n)] = copies.reshape(-1)
        table[3 * (1 + n):] = ids.reshape(-1)
        return _landing_kernel()(inputs=[mx.array(table)], grid=(n * _THREADS, 1, 1), threadgroup=(_THREADS, 1, 1),
                                 output_shapes=[ids.shape], output_dtypes=[mx.uint32])[0]

    def _kernel_works(self, tensors) -> bool:
        """Whether the landing kernel copies a row into slot 0 exactly here (it is free: the slots
        are new). False where MLX cannot build it; then every read lands by DMA."""
        try:
            row = self.take()
            for i, view in enumerate(row.views):
                np.frombuffer(view, dtype=np.uint8)[:] = (np.arange(len(view)) + i) % 251
            ids = np.array([[3, 1, 4]], dtype=np.uint32)
            out = self._launch([(row, 0)], ids)
            mx.eval(out)
            ok = all(np.array(t[0].view(mx.uint8)).tobytes() == bytes(v) for t, v in zip(tensors, row.views))
            ok = ok and np.array_equal(np.array(out), ids)
            self.give(row)
            return ok
        except Exception:
            return False

    def _copy_to_device(self, row, slot):
        lib, stream = self._cuda, self._stream()
        if self.batched:
            dsts = self._dsts.get(slot)
            if dsts is None:
                dsts = self._dsts[slot] = (ctypes.c_void_p * len(self.bases))(*[b + slot * n for b, n in
                                                                                zip(self.bases, self.sizes)])
            rc = cuda.batch_copy(lib)(dsts, row.srcs, self._sizes, len(self.sizes), stream)
            if rc == 0:
                return
            self.batched = False  # refused (an older driver): copy tensor by tensor from now on
        for base, n, src in zip(self.bases, self.sizes, row.ptrs):
            rc = cuda.copy_async(lib, base + slot * n, src, n, stream)
            if rc != 0:
                raise RuntimeError(f"cudaMemcpyAsync into slot {slot} failed (CUDA error {rc})")

    def _stream(self):
        """This thread's own non-blocking CUDA stream (never ordered behind MLX's compute)."""
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = cuda.new_stream(self._cuda)
        return stream

    def _grow(self, n=None):
        """``n`` more free rows in one chunk (by default ``rows_per_chunk``, which then doubles)."""
        if n is None:
            n, self.rows_per_chunk = self.rows_per_chunk, 2 * self.rows_per_chunk
        row_bytes = int(self.offsets[-1])
        if self.device_copy:  # cudaHostAlloc does not promise page alignment (O_DIRECT reads into rows need it)
            chunk = cuda.Pinned(self._cuda, n * row_bytes + _PAGE)
            raw = memoryview(chunk.buffer).cast("B")
            skip = -address(raw) % _PAGE
            raw, device = raw[skip:skip + n * row_bytes], chunk.device + skip
        else:
            chunk = mmap.mmap(-1, n * row_bytes)  # page-aligned
            raw, device = memoryview(chunk).cast("B"), 0
        base = address(raw)
        for i in range(n):
            off = i * row_bytes
            views = [raw[off + o:off + o + size] for o, size in zip(self.offsets, self.sizes)]
            ptrs = [base + off + int(o) for o in self.offsets[:-1]]
            self.free.append(Row(chunk, views, ptrs, device + off if device else 0))


_ALIGN = 64  # a row's tensors start at multiples of this (the landing kernel copies 16 bytes at a time)
_PAGE = 4096  # a chunk of rows starts on a page
_CHUNK = 32 * 1024  # bytes per block of the landing kernel
_THREADS = 256


def _last_per_slot(pending) -> list:
    """``pending`` [(row, slot)] in the order the reads completed, with each slot's last read only:
    an earlier one is a previous owner's, and landing it too (in the same kernel, in any order)
    could leave its bytes in the slot."""
    seen, last = set(), []
    for row, slot in reversed(pending):
        if slot not in seen:
            seen.add(slot)
            last.append((row, slot))
    return last[::-1]


def _chunks(sizes, offsets, bases):
    """The landing kernel's copies of one row, as uint64 arrays of at most ``_CHUNK`` bytes each: the
    offset in the row, the destination in slot 0 (a slot ``s`` is ``stride * s`` further), the
    stride (its tensor's bytes per slot), the bytes."""
    plan = [(int(o) + c, base + c, n, min(_CHUNK, n - c)) for o, n, base in zip(offsets, sizes, bases)
            for c in range(0, n, _CHUNK)]
    return tuple(np.array(col, dtype=np.uint64) for col in zip(*plan))


COPY_HEADER = """
struct alignas(16) Words16 { unsigned long long a, b; };
// Copies n bytes from s to d: this thread's share of every step-th unit from at (16 bytes where all
// three allow, else single bytes), four loads in flight before their stores (reads from pinned host
// memory wait about a microsecond each: one load at a time left a block at about 3 GB/s).
__device__ __forceinline__ void wb_copy_part(unsigned long long s, unsigned long long d, unsigned long long n,
                                             unsigned long long at, unsigned long long step) {
    if (((s | d | n) & 15ull) == 0) {
        const Words16* src = (const Words16*)s;
        Words16* dst = (Words16*)d;
        unsigned long long i = at, units = n / 16;
        for (; i + 3 * step < units; i += 4 * step) {
            Words16 w0 = src[i], w1 = src[i + step], w2 = src[i + 2 * step], w3 = src[i + 3 * step];
            dst[i] = w0; dst[i + step] = w1; dst[i + 2 * step] = w2; dst[i + 3 * step] = w3;
        }
        for (; i < units; i += step) dst[i] = src[i];
    } else {
        const unsigned char* src = (const unsigned char*)s;
        unsigned char* dst = (unsigned char*)d;
        for (unsigned long long i = at; i < n; i += step) dst[i] = src[i];
    }
}
__device__ __forceinline__ void wb_copy(unsigned long long s, unsigned long long d, unsigned long long n) {
    wb_copy_part(s, d, n, threadIdx.x, blockDim.x);
}
"""  # the landing kernels' body: wb_copy, one block a copy; wb_copy_part, a whole grid on each copy

_LANDING_SOURCE = """
    const unsigned long long* t = (const unsigned long long*)copies;
    unsigned long long c = blockIdx.x;
    wb_copy(t[3 * (c + 1)], t[3 * (c + 1) + 1], t[3 * (c + 1) + 2]);
    if (c == 0) {
        const unsigned long long* ids = t + 3 * (t[1] + 1);
        for (unsigned long long i = threadIdx.x; i < t[0]; i += blockDim.x) out[i] = (unsigned int)ids[i];
    }
"""


@functools.lru_cache(maxsize=1)
def _landing_kernel():
    """Copies (source, destination, bytes) rows of a uint64 table, one block each, from pinned host
    memory into slot memory. The table: a header (the number of ids, the number of copies, 0), the
    copies, then the ids; the output is the ids, so whatever computes with them runs after every copy."""
    return mx.fast.cuda_kernel(name="workbench_land_rows", input_names=["copies"], output_names=["out"],
                               source=_LANDING_SOURCE, header=COPY_HEADER)


