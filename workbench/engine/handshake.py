"""Per-layer decode with no host sync per MoE layer, on CUDA: the handshake.

Per-layer decode must learn each MoE layer's expert ids before it can claim them. Elsewhere it
syncs: ``mx.eval`` of the ids, the claim, then the rest of the layer is launched. On CUDA the
engine instead puts one small kernel before each layer's experts, in the device's stream. The
kernel writes the layer's ids to the layer's *mailbox* in pinned host memory, waits until the
host has claimed them and written their slot ids back, and outputs those slot ids, which the
experts compute with. The host builds and launches the whole token (``launch_every``: a few
layers at a time, each part launched as it is built) and answers each mailbox as its ids arrive, in layer order:
the claims of per-layer decode, in its order (one result: the same counters and residency), with
no sync and no launch between a layer's ids and its experts.

A layer's ids reach the host only once every earlier layer's experts have run (the ids depend on
their output, and the kernels run in the order of one stream), so a slot never changes owner
while a computation that reads it is pending, as with a sync.

The device waits at most ``timeout`` for an answer. The host can be late: a stall, or a CUDA call
that waits for the device (loading a kernel the process has not used yet may synchronize the
context, and the device is waiting for the host). Then the device *gives up*: that layer computes
on the placeholder slot, and every later layer of the token skips its mailbox (*void*: no ids, no
wait). The host still claims the given-up layer (its ids were right) and nothing after it, and
once the token has synced the engine computes it again from that layer with a sync per layer,
using the slots it answered for that layer (``passes.ResumePass``): the same claims, once each, in
order. A give-up costs time, never a wrong token or a different residency.

*Hit-through* (``lut``: the arena's expert->slot table kept in pinned memory, which the device
reads as it runs): a layer whose experts are all published posts its ids and computes at once on
the slots the table gives, with no wait; the host claims it later, in order, as a hit (the claim
must give the same slots, or the engine stops). Only a layer with a miss waits for its answer. A
claim changes the table only while the device waits at a layer, and a later layer reads it only
after that answer, so every layer reads the table per-layer decode would have. A read-ahead
planner turns it off (``HandshakePass.start``), and a cache-aware router never uses the handshake
(``Run.handshake_now``): nothing else changes the table while a token runs.

*Two lanes*: the mailboxes and the control block come twice, and tokens alternate between them,
so a token can be built and launched while the one before it is still served (``Flight``: one
token's state; ``Run.launch_ahead``).

*Served aside*: launching a token (``mx.async_eval``) is milliseconds of MLX's C++ during which the
decoding thread answers nothing; a second thread serves the tokens in flight meanwhile
(``server.py``, ``serve_thread``), in claim order, never a token ahead of its step.

*Staged slots* land in the device's stream too: the answer's reads were made into pinned bounce
rows (``slots.hand_over``), and the layer's handshake kernel copies them into their slots once
the answer is in (the copies travel in the mailbox, tagged with the ticket), before the experts
run: one block makes the handshake, then every block copies its share, a group of threads a copy
(one kernel a layer: a second kernel cost about 7 us of host time a layer to call,
bench/RESULTS.md, bench_host). A layer that passes through costs far less with one block than with
128, and a megabyte miss lands faster with 128: the grid follows the layer's recent landings
(``Handshake._grid``).

Memory, per lane: a control block (the host's token number; the token the device gave up on, or
the host dropped), then one mailbox of ``stride`` uint64 words per MoE layer: the device's ticket (how many times the kernel
ran for this layer), the host's answer (the ticket it answered), the ticket the device gave up on,
the placeholder slot, the wait in ns, the control block's address, the ticket it skipped (void),
the ticket it passed through (hit-through), the ticket the copies are for, their number and
address, then the ids, the slot ids and the layer's *extra* values (float32 bits: the read-ahead
planner's prediction, so read-ahead needs no sync either). With staged slots each mailbox also has
two words in device memory (``go``), where the handshake's block tells the copying blocks that the
token's answer is in and how many copies it lands.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections import deque

import mlx.core as mx
import numpy as np

from .. import cuda
from ..arena.staging import COPY_HEADER
from ..arrays import address
from .server import Server

HOST_TIMEOUT_S = 60.0  # how long the host waits for the device to reach a layer
COPY_WAIT_S = 20  # how long the copying blocks wait for the handshake's block (``_SOURCE``), then trap
_READY, _DONE, _GAVE_UP, _PLACEHOLDER, _LIMIT, _CONTROL, _VOID, _PASSED, _COPY_TICKET, _COPY_N, _COPY_AT = range(11)
_HEAD = 12  # words before the ids
_COPY_BLOCKS, _COPY_THREADS = 128, 256  # the kernel's wide grid where it lands staged copies
_ONE_BLOCK = 1024  # threads of the one-block grid
_WIDE_AFTER = 2  # adaptive grid: a layer's launches that run wide after one whose answer landed copies
GRIDS = ("adaptive", "wide", "one")  # ``Handshake.grid``
_TOKEN, _POISON = 0, 1  # the control block's words

_HEADER = """
__device__ __forceinline__ unsigned long long wb_load(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void wb_store(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned int wb_load32(const int* p) {
    unsigned int v;
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long wb_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define WB_HEAD 12
"""

_HANDSHAKE = """
__device__ __forceinline__ unsigned long long wb_load_gpu(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long wb_peek(const unsigned long long* p) {  // after an acquire
    unsigned long long v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void wb_store_gpu(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
// One block's handshake for a layer: post the ids, pass through on the table or wait for the answer
// (or give up), write the slot ids to out; returns the ticket.
template <int K, int X, int H>
__device__ unsigned long long wb_handshake(const uint32_t* ids, unsigned long long* box, const float* extra,
                                           const uint64_t* lut_at, uint32_t* out) {
    unsigned long long* ctl = (unsigned long long*)box[5];
    __shared__ unsigned long long ticket;
    __shared__ int answered, hit;
    unsigned int t = threadIdx.x;
    if (t == 0) {
        ticket = wb_load(box) + 1;
        answered = wb_load(ctl + 1) != wb_load(ctl);  // 0: an earlier layer of this token was given up
        hit = H;
    }
    __syncthreads();
    if (!answered) {
        if (t == 0) { wb_store(box + 6, ticket); wb_store(box + 2, ticket); wb_store(box, ticket); }
        if (t < K) out[t] = (unsigned int)box[3];
        return ticket;
    }
    unsigned int slot = 0;
    if (H) {  // hit-through: the live table's slots; one miss and the layer waits for the host
        const int* lut = (const int*)lut_at[0];
        if (t < K) {
            slot = wb_load32(lut + ids[t]);
            if (slot == (unsigned int)box[3]) hit = 0;
        }
        __syncthreads();
    }
    if (t < K) box[WB_HEAD + t] = (unsigned long long)ids[t];
    if (hit && t < K) box[WB_HEAD + K + t] = slot;  // what it computes on: the host's claim must agree
    for (int i = t; i < X; i += blockDim.x) box[WB_HEAD + 2 * K + i] = (unsigned long long)__float_as_uint(extra[i]);
    __threadfence_system();
    __syncthreads();
    if (hit) {
        if (t == 0) { wb_store(box + 7, ticket); wb_store(box, ticket); }
        if (t < K) out[t] = slot;
        return ticket;
    }
    if (t == 0) {
        wb_store(box, ticket);
        unsigned long long start = wb_now(), limit = box[4];
        while (wb_load(box + 1) != ticket) {
            if (wb_now() - start > limit) {
                answered = 0;
                wb_store(box + 2, ticket);
                wb_store(ctl + 1, wb_load(ctl));
                break;
            }
            __nanosleep(64);
        }
    }
    __syncthreads();
    if (t < K) out[t] = answered ? (unsigned int)wb_load(box + WB_HEAD + K + t) : (unsigned int)box[3];
    return ticket;
}
"""

# Block 0 makes the handshake. With C (staged slots) every block then copies its share of the copies
# the answer landed (tagged with its ticket), before any expert runs: the other blocks wait for block
# 0's word in device memory (``go``: the token, once the copies' number is beside it).
_SOURCE = """
    unsigned long long* box = (unsigned long long*)box_at[0];
    unsigned long long ticket = 0;
    if (blockIdx.x == 0) ticket = wb_handshake<K, X, H>(ids, box, extra, lut_at, out);
    if (C) {
        __shared__ unsigned long long n;
        unsigned long long* g = (unsigned long long*)go;
        if (threadIdx.x == 0) {
            unsigned long long token = wb_load((unsigned long long*)box[5]);
            if (blockIdx.x == 0) {
                n = wb_load(box + 8) == ticket ? wb_load(box + 9) : 0;
                g[1] = n;
                wb_store_gpu(g, token);
            } else {
                unsigned long long start = wb_now();
                while (wb_load_gpu(g) != token) {  // block 0 sets it on every path, after its wait at most
                    if (wb_now() - start > 20000000000ull) __trap();  // COPY_WAIT_S; never: a hang would be worse
                    __nanosleep(64);
                }
                n = wb_load_gpu(g + 1);
            }
        }
        __syncthreads();
        // each copy gets a group of threads: the most (a warp up to the block) that lets all run at once
        const unsigned long long* table = (const unsigned long long*)box[10];
        unsigned int w = 32;  // threads a copy
        while (2 * w <= blockDim.x) w *= 2;
        unsigned int per_block = blockDim.x / w;
        while (w > 32 && (unsigned long long)per_block * gridDim.x < n) { w /= 2; per_block = blockDim.x / w; }
        if (threadIdx.x < per_block * w) {
            unsigned long long groups = (unsigned long long)per_block * gridDim.x;
            for (unsigned long long c = (threadIdx.x / w) * gridDim.x + blockIdx.x; c < n; c += groups)
                wb_copy_part(wb_peek(table + 3 * c), wb_peek(table + 3 * c + 1), wb_peek(table + 3 * c + 2),
                             threadIdx.x % w, w);
        }
    }
"""


class HandshakeError(RuntimeError):
    """The device did not reach a layer's handshake in time, or computed on other slots than its claim."""


def check_used(layers, used, slots) -> None:
    """MoE ``layers`` passed through on the table, computing on ``used`` (one row each); their claims
    give ``slots``: the same, or the engine stops."""
    used, slots = np.asarray(used), np.asarray(slots)
    if not np.array_equal(used, slots):
        raise HandshakeError(f"MoE layers {list(layers)} computed on slots {used.tolist()} through the table, and "
                             f"their claims give {slots.tolist()}: the table changed while the token ran")


class Flight:
    """One token in the handshake: its lane (mailboxes and control block), its token number, and
    what the host learns as it serves it."""

    def __init__(self, lane, token, through):
        self.lane, self.token, self.through = lane, token, through
        self.queue: deque = deque()  # launched layers not answered yet, in order: (layer, ticket)
        self.tickets: dict = {}  # layer -> the ticket its kernel takes in this token
        self.answers: dict = {}  # layer -> the slot ids the host answered (or the layer computed on)
        self.extras: dict = {}  # layer -> how many extra values its kernel sends
        self.saved: dict = {}  # decoder layer -> its output in this token (LayerProbe; a recovery starts from one)
        self.copied: dict = {}  # layer -> (its kernel's output, the (row, slot) it copies)
        self.passed: list = []  # (layer, ids, slots used) that passed through, not settled yet (``Handshake.serve``)
        self.void = False  # the device gave this token up: later layers have no ids
        self.last = None  # the latest output launched (abort waits for it)


class Handshake:
    """The mailboxes of one engine in two lanes (one mailbox per MoE layer, plus one for the
    self-test, and a control block each), the kernel, and the pinned table. Tokens alternate
    lanes, so a token can be built and launched while the one before it is still served (the
    token running ahead, ``Run.token``)."""

    lut = None  # the pinned expert->slot table (hit-through), or None
    copies = 0  # staged copies one answer may land
    passed = 0  # layers that passed through on the table, over this handshake's life
    LANES = 2
    serve_thread = True  # answer from a second thread while a launch runs (``serving``)
    server = None

    def __init__(self, layers, top_k, placeholder, timeout_s=0.05, extra=0, lut=None, copies=0):
        """``lut``: the arena's residency map (``Arena.map``), whose expert->slot table in
        pinned memory the kernel reads for hit-through (None, or no pinned table: every layer
        waits). ``copies``: at most this many staged copies per answer (0: slots are written in
        place)."""
        self.k, self.n_extra = top_k, extra  # extra: at most this many float32 values travel with a layer's ids
        self.host_timeout = HOST_TIMEOUT_S
        self.stride = -(-(_HEAD + 2 * top_k + extra) // 16) * 16  # words; a mailbox starts on 128 bytes
        names = list(layers) + ["probe"]
        lib = cuda.runtime()
        per_lane = (len(names) + 1) * self.stride
        self.memory = cuda.Pinned(lib, self.LANES * per_lane * 8)
        self.words = np.frombuffer(self.memory.buffer, dtype=np.uint64)
        self.words[:] = 0
        self.control = [lane * per_lane for lane in range(self.LANES)]  # each lane's control block, then its boxes
        self.box = {(lane, name): self.control[lane] + (i + 1) * self.stride
                    for lane in range(self.LANES) for i, name in enumerate(names)}
        self.index = {key: i for i, key in enumerate(self.box)}
        self.where = {key: mx.array(np.array([self.memory.device + off * 8], dtype=np.uint64))
                      for key, off in self.box.items()}
        for (lane, _), off in self.box.items():
            self.words[off + _PLACEHOLDER] = placeholder
            self.words[off + _CONTROL] = self.memory.device + self.control[lane] * 8
        self.lut_at = {}
        if lut is not None and lut.lut_memory is not None:  # the table's rows by MoE layer, and the self-test's
            self.lut, row = lut.lut, lut.lut.shape[1] * 4
            self._probe_memory = cuda.Pinned(lib, row)
            self._probe_lut = np.frombuffer(self._probe_memory.buffer, dtype=np.int32)
            self._probe_lut[:] = placeholder
            self.lut_at = {layer: lut.lut_memory.device + layer * row for layer in layers}
            self.lut_at["probe"] = self._probe_memory.device
            self.lut_at = {name: mx.array(np.array([at], dtype=np.uint64)) for name, at in self.lut_at.items()}
            mx.eval(list(self.lut_at.values()))
        self.copies = copies
        if copies:  # each mailbox's copy table: (source, destination, bytes) per copy
            self._copy_memory = cuda.Pinned(lib, len(self.box) * copies * 3 * 8)
            self.copy_words = np.frombuffer(self._copy_memory.buffer, dtype=np.uint64).reshape(len(self.box), copies, 3)
            for key, off in self.box.items():
                self.words[off + _COPY_AT] = self._copy_memory.device + self.index[key] * copies * 3 * 8
        self.set_timeout(timeout_s)
        mx.eval(list(self.where.values()))
        self.threads = max(32, -(-top_k // 32) * 32)
        self.copy_threads = max(_COPY_THREADS, self.threads)
        self.one_threads = max(_ONE_BLOCK, self.threads)
        self.grid = "adaptive"  # staged slots: the kernel's grid (``_grid``)
        self._since = {}  # layer -> its launches since one whose answer landed copies
        self.no_extra = mx.zeros((1,), dtype=mx.float32)
        self.no_lut = mx.zeros((1,), dtype=mx.uint64)
        # each mailbox's word in device memory that block 0 sets for the copying blocks (``_SOURCE``)
        self.go = {key: mx.zeros((2,), dtype=mx.uint64) for key in self.box} if copies else {}
        mx.eval(list(self.go.values()))
        self.kernel = mx.fast.cuda_kernel(name="workbench_handshake", input_names=["ids", "box_at", "extra", "lut_at", "go"],
                                          output_names=["out"], source=_SOURCE, header=_HEADER + COPY_HEADER + _HANDSHAKE)
        self.launch_every = 0  # launch the token every this many MoE layers as it is built (serving between), or
        # 0: the whole token at once (faster where launches cost more than the serving they allow: bench/RESULTS.md,
        # bench_engine, "Whole-token handshake")
        self.token = 0

    @classmethod
    def create(cls, layers, top_k, placeholder, timeout_s=0.05, extra=0, lut=None, copies=0) -> "Handshake | None":
        """A working handshake on this backend, or None (not CUDA, or the self-test failed)."""
        if not cuda.in_use():
            return None
        try:
            hs = cls(layers, top_k, placeholder, timeout_s, extra, lut, copies)
            why = hs._self_test()
            if why is None:
                return hs
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
        warnings.warn(f"the handshake does not work on this device ({why}); per-layer decode syncs per layer",
                      RuntimeWarning, stacklevel=3)
        return None

    def set_timeout(self, seconds: float) -> None:
        """How long the device waits for an answer before it gives the token up (module docstring)."""
        if self.copies and seconds > COPY_WAIT_S / 2:
            raise ValueError(f"the handshake waits at most {COPY_WAIT_S / 2:g} s with staged slots (the copying "
                             f"blocks wait {COPY_WAIT_S} s for its answer), not {seconds:g}")
        for off in self.box.values():
            self.words[off + _LIMIT] = int(seconds * 1e9)

    def serving(self, serve):
        """A context in which ``serve()`` runs over and over on the server's thread (``server.py``):
        for the length of a launch, where the decoding thread lets go of the interpreter. Nothing
        where ``serve`` is None or ``serve_thread`` is off."""
        if serve is None or not self.serve_thread:
            return contextlib.nullcontext()
        if self.server is None:
            self.server = Server()
        return self.server.during(serve)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    # ---- one token ---------------------------------------------------------------------
    def begin(self, through=True) -> Flight:
        """A new token, in the lane after the last one's (nothing of the token before that is in
        flight); ``through``: hit-through (where the handshake has the table), which a read-ahead
        planner must not use: its reads, started in a hit layer's claim, take slots that a later
        layer may be reading through the table already."""
        self.token += 1
        f = Flight(self.token % self.LANES, self.token, through and self.lut is not None)
        self.words[self.control[f.lane] + _TOKEN] = f.token
        return f

    def slots(self, f: Flight, layer, indices, extra=None) -> mx.array:
        """``indices``' slot ids as the device will have them once the host answered ``layer`` of
        token ``f``; the host's claim also receives ``extra`` (at most ``n_extra`` values, as float32)."""
        key = f.lane, layer
        if layer in f.tickets:  # the copying blocks know a launch by its token: one a mailbox a token
            raise HandshakeError(f"MoE layer {layer} is launched twice in one token")
        ticket = int(self.words[self.box[key] + _READY]) + 1  # no kernel of this mailbox is in flight now
        f.tickets[layer] = ticket
        extra = self.no_extra if extra is None else extra.reshape(-1).astype(mx.float32)
        n = f.extras[layer] = 0 if extra is self.no_extra else extra.size
        if n > self.n_extra:
            raise ValueError(f"the handshake carries at most {self.n_extra} extra values, not {n}")
        lut = self.lut_at[layer] if f.through else self.no_lut
        copies = bool(self.copies)  # staged slots: the answer's reads land in the same kernel, before the experts
        blocks, threads = self._grid(layer) if copies else (1, self.threads)
        out = self.kernel(inputs=[indices.astype(mx.uint32), self.where[key], extra, lut,
                                  self.go[key] if copies else self.no_lut],
                          template=[("K", self.k), ("X", n), ("H", int(f.through)), ("C", int(copies))],
                          grid=(blocks * threads, 1, 1), threadgroup=(threads, 1, 1),
                          output_shapes=[indices.shape], output_dtypes=[mx.uint32])[0]
        if copies:
            f.copied[layer] = (out, [])
        f.queue.append((layer, ticket))
        return out

    def land(self, f: Flight, layer, copies, pairs) -> None:
        """The answer being made for ``layer`` lands ``copies`` ([n, 3] uint64: source, destination,
        bytes), the bounce rows ``pairs``, by its kernel."""
        if not len(copies):
            return
        if len(copies) > self.copies:
            raise HandshakeError(f"an answer at MoE layer {layer} lands {len(copies)} copies; the handshake holds "
                                 f"{self.copies}")
        key = f.lane, layer
        off = self.box[key]
        self._since[layer] = 0
        self.copy_words[self.index[key], :len(copies)] = copies
        self.words[off + _COPY_N] = len(copies)
        self.words[off + _COPY_TICKET] = f.tickets[layer]  # last: the kernel reads the copies once it sees it
        f.copied[layer] = (f.copied[layer][0], pairs)

    def arrived(self, f: Flight) -> bool:
        """Whether ``serve`` has anything to do for token ``f`` now: its next layer's ids are in (or
        the device gave the token up)."""
        if not f.queue:
            return False
        layer, ticket = f.queue[0]
        return f.void or self.words[self.box[f.lane, layer] + _READY] == ticket

    def serve(self, f: Flight, claim, wait: bool, settle=None) -> float:
        """Answer token ``f``'s queued layers whose ids have arrived, in order (all of them with
        ``wait``): ``claim(layer, ids, extra) -> slot ids`` (extra: the layer's float32 values, or
        None). Layers that passed through are claimed as hits: by ``settle(layers, ids, used)`` for
        the run of them since the last claim, in one go where given (``used``: the slots each computed
        on), else by ``claim``, whose slots must be the ones used. Such a run is settled before the
        next claim, before a wait, and once the token is answered to its end (nothing of the next
        token is claimed before), not on every call: a token that hits everywhere settles once.
        Returns the seconds spent waiting for the device."""
        waited, passed = 0.0, f.passed
        while f.queue:
            layer, ticket = f.queue[0]
            off = self.box[f.lane, layer]
            if f.void:
                f.queue.popleft()  # skipped by the device: nothing to claim, nothing waits
                continue
            if self.words[off + _READY] != ticket:
                if not wait:
                    break
                self._settle(passed, settle)
                waited += self._wait(off, ticket, layer)
            if self.words[off + _VOID] == ticket:
                f.void = True
                continue
            ids = self.words[off + _HEAD:off + _HEAD + self.k].tolist()
            if self.words[off + _PASSED] == ticket:  # hit-through: computed already, on these slots
                self.passed += 1
                f.answers[layer] = used = self.words[off + _HEAD + self.k:off + _HEAD + 2 * self.k].tolist()
                f.queue.popleft()
                if settle is not None:
                    passed.append((layer, ids, used))
                else:
                    check_used([layer], [used], [claim(layer, ids, self._extra(f, layer, off))])
                continue
            self._settle(passed, settle)
            f.answers[layer] = slots = claim(layer, ids, self._extra(f, layer, off))
            self.words[off + _HEAD + self.k:off + _HEAD + 2 * self.k] = slots
            self.words[off + _DONE] = ticket
            f.queue.popleft()
        if not f.queue:
            self._settle(passed, settle)
        return waited

    def gave_up(self, f: Flight):
        """The layer of token ``f`` the device gave up on, or None (read after the token's sync)."""
        for layer, ticket in f.tickets.items():
            off = self.box[f.lane, layer]
            if self.words[off + _GAVE_UP] == ticket and self.words[off + _VOID] != ticket:
                return layer
        return None

    def abort(self, f: Flight) -> None:
        """End token ``f`` after an error, or drop it unserved (a token running ahead of one given
        up): its kernels not started yet skip their mailboxes (void); the mailbox the device waits at
        (if any) is answered with the placeholder; then wait for the device, so nothing launched
        still reads a slot afterwards. A kernel that had already started and waits after this gives
        the token up when its wait runs out. The host answers only tickets the device has shown (the
        answer never runs ahead of the device's ticket), so no later token can find an answer
        waiting for it."""
        ctl = self.control[f.lane]
        self.words[ctl + _POISON] = self.words[ctl + _TOKEN]
        f.passed.clear()  # the run ends in an error, or the token's step never began (nothing was claimed)
        while f.queue:
            layer, ticket = f.queue.popleft()
            off = self.box[f.lane, layer]
            if self.words[off + _READY] == ticket:
                self.words[off + _HEAD + self.k:off + _HEAD + 2 * self.k] = self.words[off + _PLACEHOLDER]
                self.words[off + _DONE] = ticket
        if f.last is not None:
            mx.eval(f.last)
            f.last = None

    # ---- internals ---------------------------------------------------------------------
    def _grid(self, layer) -> tuple[int, int]:
        """(blocks, threads) of ``layer``'s kernel with staged slots. Where every layer passes
        through, 128 blocks cost about 9x one block's time on the device, and the small kernels beside
        them slow down; but one block lands a megabyte miss slowly (bench/RESULTS.md, gpu_kernels).
        ``grid``: "wide", "one", or "adaptive": wide for a layer's first ``_WIDE_AFTER`` launches
        and the ``_WIDE_AFTER`` after one whose answer landed copies, else one block. Either grid lands
        every copy, so the choice changes time only, never residency or tokens."""
        since = self._since.get(layer, 0)
        self._since[layer] = since + 1
        if self.grid not in GRIDS:
            raise ValueError(f"Handshake.grid {self.grid!r}: use one of {', '.join(GRIDS)}")
        if self.grid == "wide" or (self.grid == "adaptive" and since < _WIDE_AFTER):
            return _COPY_BLOCKS, self.copy_threads
        return 1, self.one_threads

    def _extra(self, f, layer, off):
        n, at = f.extras[layer], off + _HEAD + 2 * self.k
        return self.words[at:at + n].astype(np.uint32).view(np.float32) if n else None

    @staticmethod
    def _settle(passed, settle) -> None:
        if passed:
            layers, ids, used = zip(*passed)
            passed.clear()
            settle(list(layers), np.array(ids, dtype=np.int64), np.array(used, dtype=np.int64))

    def _wait(self, off, ticket, layer) -> float:
        t0 = time.perf_counter()
        spins = 0
        while self.words[off + _READY] != ticket:
            spins += 1
            if spins % 256 == 0:
                time.sleep(0)  # let other threads (I/O workers) take the interpreter
                if time.perf_counter() - t0 > self.host_timeout:
                    raise HandshakeError(f"the device did not reach MoE layer {layer}'s handshake in "
                                         f"{self.host_timeout:.0f} s; set Engine.handshake = None to sync per layer")
        return time.perf_counter() - t0

    def _self_test(self) -> str | None:
        """Through the probe mailbox of each lane: one round trip, the host answering ids + 1 (and
        receiving the extra values, and landing a staged copy); one without extra values that the
        device gives up on (a zero wait), which must come back as the placeholder; one that passes
        through on the table (hit-through). The staged copy goes as three copies (one of them not a
        multiple of 16 bytes), by the wide grid in one lane and one block in the other. Every kernel
        is compiled here, not while the device waits for the host. The device waits up to 2 s for the
        self-test's answers (a busy host is not a broken handshake). Returns what came back wrong, or
        None."""
        placeholder = int(self.words[self.box[0, "probe"] + _PLACEHOLDER])
        ids = mx.array(np.arange(self.k, dtype=np.uint32).reshape(1, 1, -1) * 3 + 1)
        want = np.array(ids).reshape(-1) + 1
        extra = mx.arange(self.n_extra, dtype=mx.float32) / 3 - 1 if self.n_extra else None
        source = cuda.Pinned(cuda.runtime(), 1 << 16) if self.copies else None  # a staged copy's bounce row
        if source is not None:
            np.frombuffer(source.buffer, dtype=np.uint8)[:] = np.arange(1 << 16) % 251
        limit = int(self.words[self.box[0, "probe"] + _LIMIT])
        wait = max(limit, int(2e9))
        cases = [(wait, "answered"), (0, "given up")] + ([(wait, "hit-through")] if self.lut is not None else [])
        passed0, grid0, self.host_timeout = self.passed, self.grid, 20.0
        try:
            for run in range(self.LANES):
                self.grid = ("wide", "one")[run % 2]
                for wait_ns, case in cases:
                    f = self.begin(through=case == "hit-through")
                    box = self.box[f.lane, "probe"]
                    target = mx.zeros((1 << 16,), dtype=mx.uint8)
                    mx.eval(target)
                    sent, sent_ids, expect = [], ids, want if wait_ns else np.full(self.k, placeholder)
                    if case == "hit-through":  # the table's slots are what the claim answers, never the placeholder
                        row = np.arange(self._probe_lut.size) + 1
                        self._probe_lut[:] = np.where(row == placeholder, 0, row)
                        sent_ids = ids % self._probe_lut.size
                        expect = self._probe_lut[np.array(sent_ids).reshape(-1)].astype(np.int64)

                    def claim(layer, got, values):
                        sent.append(values)
                        if source is not None and case == "answered":
                            at, cut = address(memoryview(target)), [0, 1 << 15, (1 << 16) - 5, 1 << 16]
                            self.land(f, layer, np.array([[source.device + a, at + a, b - a] for a, b in
                                                          zip(cut, cut[1:])], dtype=np.uint64), [])
                        return [int(self._probe_lut[e]) for e in got] if f.through else [e + 1 for e in got]

                    self.words[box + _LIMIT] = wait_ns
                    out = self.slots(f, "probe", sent_ids, extra if wait_ns else None) * 2
                    mx.async_eval(out)
                    f.last = out
                    if wait_ns:
                        self.serve(f, claim, wait=True)
                    where = f"lane {f.lane}, {case}, grid {self.grid}: "
                    if wait_ns and extra is not None and not np.array_equal(sent[0], np.array(extra)):
                        return where + "the extra values"
                    got = np.array(out).reshape(-1) // 2
                    if not np.array_equal(got, expect):
                        return where + f"slots {got.tolist()} for {expect.tolist()}"
                    if (self.gave_up(f) == "probe") != (case == "given up"):
                        return where + ("given up" if case != "given up" else "not given up")
                    if (self.words[box + _PASSED] == f.tickets["probe"]) != (case == "hit-through"):
                        return where + ("passed through" if case != "hit-through" else "did not pass through")
                    if source is not None and case == "answered" and \
                            not np.array_equal(np.array(target), np.frombuffer(source.buffer, dtype=np.uint8)):
                        return where + "the staged copy's bytes"
                    self.words[box + _LIMIT] = limit
        except HandshakeError as e:
            self.abort(f)
            return f"lane {f.lane}, {case}: {e}"
        finally:
            self.host_timeout, self.grid = HOST_TIMEOUT_S, grid0
            for lane in range(self.LANES):
                self.words[self.box[lane, "probe"] + _LIMIT] = limit
            if self.lut is not None:
                self._probe_lut[:] = placeholder
            self.passed = passed0
        return None
