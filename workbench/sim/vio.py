"""Virtual-time I/O for the arena (``Arena(..., writes="none")``): reads complete at simulated
times instead of on threads, so the simulator runs the engine's own arena rules.

``workers`` virtual workers, the first ``urgent_workers`` serve only the urgent queue, the
others take urgent work first, then speculative (both FIFO). A read takes ``read_latency_s +
bytes / stream_bandwidth`` per piece (pieces of ``piece_bytes``, or one piece) and is never
preempted. Cancelling a queued read drops it (cancelled before read); a running read finishes,
or with pieces stops after its current piece (partially read). Waiting for a read (``event.wait``)
moves the clock ``now`` to its end: that is a stall. ``help`` does nothing (no decode thread
reads here).
"""

from __future__ import annotations

from collections import deque

from ..io.scheduler import CANCELLED, DONE, QUEUED, RUNNING
from ..store.manifest import Blob


class TraceManifest:
    """What the arena needs of a store, for a trace: expert ids, MoE layers, one expert size."""

    tensors = ()

    def __init__(self, n_experts: int, moe_layers, expert_bytes: int):
        self.n_experts, self.moe_layers, self.expert_bytes = n_experts, list(moe_layers), expert_bytes

    def blob(self, layer: int, expert: int) -> Blob:
        return Blob(layer, expert, 0, self.expert_bytes, 0)


class _Event:
    __slots__ = ("io", "req", "_set")

    def __init__(self, io, req):
        self.io, self.req, self._set = io, req, False

    def set(self):
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self):
        if not self._set:
            self.io.wait(self.req)


class VirtualIO:

    def __init__(self, timing):
        self.t = timing
        self.bw = timing.stream_bandwidth or timing.bandwidth / timing.workers
        self.reserved = [w < timing.urgent_workers for w in range(timing.workers)]
        self.reset()

    def reset(self):
        """Clock back to 0, every worker idle (nothing may be queued or running)."""
        self.now = 0.0
        self.free_at = [0.0] * self.t.workers
        self.urgent: deque = deque()
        self.spec: deque = deque()
        self.running: list = []
        self.cut: dict = {}  # running read -> bytes it stops at (cancelled between pieces)
        self.worker_of: dict = {}  # running read -> its worker

    # ---- the scheduler interface the arena calls -----------------------------------------
    def submit(self, req) -> None:
        self._queue(req)
        self._start_due(self.now)

    def submit_many(self, reqs) -> None:
        for req in reqs:
            self._queue(req)
        self._start_due(self.now)

    def promote(self, req) -> None:
        req.urgent = True
        if req.state == QUEUED and req in self.spec:
            self.spec.remove(req)
            self.urgent.append(req)
            self._start_due(self.now)

    def cancel(self, req) -> None:
        self.advance(self.now)
        if req.state == QUEUED:
            (self.urgent if req in self.urgent else self.spec).remove(req)
            req.state, req.t_done = CANCELLED, self.now
            req.event.set()
        elif req.state == RUNNING:
            req.cancel_flag = True
            pb = self.t.piece_bytes
            if pb is None:
                return
            n, piece_t = self._pieces(req.blob.size)
            done = int((self.now - req.t_start) // piece_t) + 1 if self.now > req.t_start else 1
            if done < n:
                end = req.t_start + done * piece_t
                w = self.worker_of[req]
                if self.free_at[w] == req.t_done:
                    self.free_at[w] = end
                req.t_done = end
                self.cut[req] = min(req.blob.size, done * pb)

    def help(self, req) -> None:
        pass

    def close(self) -> None:
        pass

    # ---- the clock -----------------------------------------------------------------------
    def advance(self, t: float) -> None:
        """Move the clock to ``t`` (never back): start and finish every read due by then."""
        self.now = max(self.now, t)
        self._start_due(self.now)
        if self.running:
            still = []
            for req in self.running:
                if req.t_done <= self.now:
                    self._finish(req)
                else:
                    still.append(req)
            self.running = still

    def wait(self, req) -> None:
        while req.state == QUEUED:
            nxt = self._next(float("inf"))
            if nxt is None:
                raise RuntimeError("virtual I/O deadlock: a queued read can never start")
            self._start(*nxt)
        self.advance(req.t_done)

    # ---- internals -----------------------------------------------------------------------
    def _pieces(self, nbytes):
        pb = self.t.piece_bytes or nbytes
        return max(1, -(-nbytes // pb)), self.t.read_latency_s + min(pb, nbytes) / self.bw

    def _duration(self, nbytes):
        pb = self.t.piece_bytes or nbytes
        n, piece_t = self._pieces(nbytes)
        return (n - 1) * piece_t + self.t.read_latency_s + (nbytes - (n - 1) * pb) / self.bw

    def _queue(self, req):
        req.event = _Event(self, req)
        req.t_submit = self.now
        (self.urgent if req.urgent else self.spec).append(req)

    def _next(self, limit):
        if not self.urgent and not self.spec:
            return None
        best = None
        for w, free in enumerate(self.free_at):
            if self.urgent:
                req = self.urgent[0]
            elif not self.reserved[w] and self.spec:
                req = self.spec[0]
            else:
                continue
            s = max(free, req.t_submit)
            if s <= limit and (best is None or s < best[0]):
                best = (s, w, req)
        return best

    def _start(self, s, w, req):
        (self.urgent if req.urgent else self.spec).popleft()
        req.state, req.t_start = RUNNING, s
        req.t_done = s + self._duration(req.blob.size)
        self.worker_of[req] = w
        self.free_at[w] = req.t_done
        self.running.append(req)

    def _start_due(self, t):
        while True:
            nxt = self._next(t)
            if nxt is None:
                return
            self._start(*nxt)

    def _finish(self, req):
        self.worker_of.pop(req, None)
        read = self.cut.pop(req, req.blob.size)
        req.bytes_read = read
        req.state = DONE if read >= req.blob.size else CANCELLED
        req.event.set()
