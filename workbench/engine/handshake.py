"""Per-layer decode with no host sync per MoE layer, on CUDA: the handshake.

Per-layer decode must learn each MoE layer's expert ids before it can claim them. Elsewhere it
syncs: ``mx.eval`` of the ids, the claim, then the rest of the layer is launched. On CUDA the
engine instead puts one small kernel before each layer's experts, in the device's stream. The
kernel writes the layer's ids to the layer's *mailbox* in pinned host memory, waits until the
host has claimed them and written their slot ids back, and outputs those slot ids, which the
experts compute with. The host builds and launches the whole token (``per_layer``: layer by
layer, each launched as it is built) and answers each mailbox as its ids arrive, in layer order:
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

Memory: a control block (the host's token number; the token the device gave up on), then one
mailbox of ``stride`` uint64 words per MoE layer: the device's ticket (how many times the kernel
ran for this layer), the host's answer (the ticket it answered), the ticket the device gave up on,
the placeholder slot, the wait in ns, the control block's address, the ticket it skipped (void),
then the ids, the slot ids and the layer's *extra* values (float32 bits: the read-ahead planner's
prediction, so read-ahead needs no sync either).
"""

from __future__ import annotations

import time
import warnings
from collections import deque

import mlx.core as mx
import numpy as np

from .. import cuda

HOST_TIMEOUT_S = 60.0  # how long the host waits for the device to reach a layer
_READY, _DONE, _GAVE_UP, _PLACEHOLDER, _LIMIT, _CONTROL, _VOID = range(7)
_HEAD = 8  # words before the ids
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
__device__ __forceinline__ unsigned long long wb_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
"""

_SOURCE = """
    unsigned long long* box = (unsigned long long*)box_at[0];
    unsigned long long* ctl = (unsigned long long*)box[5];
    __shared__ unsigned long long ticket;
    __shared__ int answered;
    unsigned int t = threadIdx.x;
    if (t == 0) {
        ticket = wb_load(box) + 1;
        answered = wb_load(ctl + 1) != wb_load(ctl);  // 0: an earlier layer of this token was given up
    }
    __syncthreads();
    if (!answered) {
        if (t == 0) { wb_store(box + 6, ticket); wb_store(box + 2, ticket); wb_store(box, ticket); }
        if (t < K) out[t] = (unsigned int)box[3];
        return;
    }
    if (t < K) box[8 + t] = (unsigned long long)ids[t];
    for (int i = t; i < X; i += blockDim.x) box[8 + 2 * K + i] = (unsigned long long)__float_as_uint(extra[i]);
    __threadfence_system();
    __syncthreads();
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
    if (t < K) out[t] = answered ? (unsigned int)wb_load(box + 8 + K + t) : (unsigned int)box[3];
"""


class HandshakeError(RuntimeError):
    """The device did not reach a layer's handshake in time."""


class Handshake:
    """The mailboxes of one engine (one per MoE layer, plus one for the self-test), the kernel, and
    the state of the token in flight."""

    def __init__(self, layers, top_k, placeholder, timeout_s=0.05, extra=0):
        self.k, self.n_extra = top_k, extra  # extra: at most this many float32 values travel with a layer's ids
        self.host_timeout = HOST_TIMEOUT_S
        self.stride = -(-(_HEAD + 2 * top_k + extra) // 16) * 16  # words; a mailbox starts on 128 bytes
        names = list(layers) + ["probe"]
        self.memory = cuda.Pinned(cuda.runtime(), (len(names) + 1) * self.stride * 8)
        self.words = np.frombuffer(self.memory.buffer, dtype=np.uint64)
        self.words[:] = 0
        self.box = {name: (i + 1) * self.stride for i, name in enumerate(names)}  # the control block first
        self.where = {name: mx.array(np.array([self.memory.device + off * 8], dtype=np.uint64))
                      for name, off in self.box.items()}
        for off in self.box.values():
            self.words[off + _PLACEHOLDER] = placeholder
            self.words[off + _CONTROL] = self.memory.device
        self.set_timeout(timeout_s)
        mx.eval(list(self.where.values()))
        self.threads = max(32, -(-top_k // 32) * 32)
        self.no_extra = mx.zeros((1,), dtype=mx.float32)
        self.kernel = mx.fast.cuda_kernel(name="workbench_handshake", input_names=["ids", "box_at", "extra"],
                                          output_names=["out"], source=_SOURCE, header=_HEADER)
        self.per_layer = False  # True: launch each layer as it is built; False: the whole token at once (faster:
        # bench/RESULTS.md, bench_engine, "Whole-token handshake")
        self.token = 0
        self.begin()

    @classmethod
    def create(cls, layers, top_k, placeholder, timeout_s=0.05, extra=0) -> "Handshake | None":
        """A working handshake on this backend, or None (not CUDA, or the self-test failed)."""
        if not cuda.in_use():
            return None
        try:
            hs = cls(layers, top_k, placeholder, timeout_s, extra)
            if hs._self_test():
                return hs
            why = "its round trip came back wrong"
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
        warnings.warn(f"the handshake does not work on this device ({why}); per-layer decode syncs per layer",
                      RuntimeWarning, stacklevel=3)
        return None

    def set_timeout(self, seconds: float) -> None:
        """How long the device waits for an answer before it gives the token up (module docstring)."""
        for off in self.box.values():
            self.words[off + _LIMIT] = int(seconds * 1e9)

    # ---- one token ---------------------------------------------------------------------
    def begin(self) -> None:
        """A new token (nothing of the last one is in flight)."""
        self.token += 1
        self.words[_TOKEN] = self.token
        self.queue: deque = deque()  # launched layers not answered yet, in order: (layer, ticket)
        self.tickets: dict = {}  # layer -> the ticket its kernel takes in this token
        self.answers: dict = {}  # layer -> the slot ids the host answered
        self.extras: dict = {}  # layer -> how many extra values its kernel sends
        self.saved: dict = {}  # decoder layer -> its output in this token (LayerProbe; a recovery starts from one)
        self.void = False  # the device gave this token up: later layers have no ids
        self.last = None  # the latest output launched (abort waits for it)

    def slots(self, layer, indices, extra=None) -> mx.array:
        """``indices``' slot ids as the device will have them once the host answered ``layer``; the
        host's claim also receives ``extra`` (at most ``n_extra`` values, as float32)."""
        ticket = int(self.words[self.box[layer] + _READY]) + 1  # no kernel of this layer is in flight now
        self.tickets[layer] = ticket
        extra = self.no_extra if extra is None else extra.reshape(-1).astype(mx.float32)
        n = self.extras[layer] = 0 if extra is self.no_extra else extra.size
        if n > self.n_extra:
            raise ValueError(f"the handshake carries at most {self.n_extra} extra values, not {n}")
        out = self.kernel(inputs=[indices.astype(mx.uint32), self.where[layer], extra],
                          template=[("K", self.k), ("X", n)],
                          grid=(self.threads, 1, 1), threadgroup=(self.threads, 1, 1),
                          output_shapes=[indices.shape], output_dtypes=[mx.uint32])[0]
        self.queue.append((layer, ticket))
        return out

    def launched(self, y) -> None:
        """``y`` (what computes on the slot ids of the layers queued so far) is launched."""
        self.last = y

    def serve(self, claim, wait: bool) -> float:
        """Answer the queued layers whose ids have arrived, in order (all of them with ``wait``):
        ``claim(layer, ids, extra) -> slot ids`` (extra: the layer's float32 values, or None).
        Returns the seconds spent waiting for the device."""
        waited = 0.0
        while self.queue:
            layer, ticket = self.queue[0]
            off = self.box[layer]
            if self.void:
                self.queue.popleft()  # skipped by the device: nothing to claim, nothing waits
                continue
            if self.words[off + _READY] != ticket:
                if not wait:
                    return waited
                waited += self._wait(off, ticket, layer)
            if self.words[off + _VOID] == ticket:
                self.void = True
                continue
            ids = self.words[off + _HEAD:off + _HEAD + self.k].tolist()
            n, at = self.extras[layer], off + _HEAD + 2 * self.k
            extra = self.words[at:at + n].astype(np.uint32).view(np.float32) if n else None
            self.answers[layer] = slots = claim(layer, ids, extra)
            self.words[off + _HEAD + self.k:off + _HEAD + 2 * self.k] = slots
            self.words[off + _DONE] = ticket
            self.queue.popleft()
        return waited

    def gave_up(self):
        """The layer of this token the device gave up on, or None (read after the token's sync)."""
        for layer, ticket in self.tickets.items():
            off = self.box[layer]
            if self.words[off + _GAVE_UP] == ticket and self.words[off + _VOID] != ticket:
                return layer
        return None

    def abort(self) -> None:
        """End the token after an error: answer the mailbox the device waits at (if any) with the
        placeholder, then wait for the device, so nothing launched still reads a slot afterwards. A
        launched kernel that has not reached its mailbox yet gives the token up when it does (the
        rest are void); one never launched never runs. The host answers only tickets the device has
        shown (the answer never runs ahead of the device's ticket), so no later token can find an
        answer waiting for it."""
        while self.queue:
            layer, ticket = self.queue.popleft()
            off = self.box[layer]
            if self.words[off + _READY] == ticket:
                self.words[off + _HEAD + self.k:off + _HEAD + 2 * self.k] = self.words[off + _PLACEHOLDER]
                self.words[off + _DONE] = ticket
        if self.last is not None:
            mx.eval(self.last)
            self.last = None

    # ---- internals ---------------------------------------------------------------------
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

    def _self_test(self) -> bool:
        """One round trip through the probe mailbox, the host answering ids + 1 (and receiving the
        extra values); then one without extra values that the device gives up on (a zero wait), which
        must come back as the placeholder and void the token. Both kernels are compiled here, not while
        the device waits for the host."""
        placeholder = int(self.words[self.box["probe"] + _PLACEHOLDER])
        ids = mx.array(np.arange(self.k, dtype=np.uint32).reshape(1, 1, -1) * 3 + 1)
        want = np.array(ids).reshape(-1) + 1
        extra = mx.arange(self.n_extra, dtype=mx.float32) / 3 - 1 if self.n_extra else None
        sent = []

        def claim(layer, got, values):
            sent.append(values)
            return [e + 1 for e in got]

        limit = int(self.words[self.box["probe"] + _LIMIT])
        self.host_timeout = 20.0
        try:
            for wait_ns, expect in ((limit, want), (0, np.full(self.k, placeholder))):
                self.begin()
                self.words[self.box["probe"] + _LIMIT] = wait_ns
                out = self.slots("probe", ids, extra if wait_ns else None) * 2
                mx.async_eval(out)
                self.launched(out)
                if wait_ns:
                    self.serve(claim, wait=True)
                    if extra is not None and not np.array_equal(sent[0], np.array(extra)):
                        return False
                if not np.array_equal(np.array(out).reshape(-1), expect * 2):
                    return False
                if (self.gave_up() == "probe") != (wait_ns == 0):
                    return False
        except HandshakeError:
            self.abort()
            return False
        finally:
            self.host_timeout = HOST_TIMEOUT_S
            self.words[self.box["probe"] + _LIMIT] = limit
        self.begin()
        return True
