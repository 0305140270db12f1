"""I/O scheduler: a worker pool with an urgent queue served first.

Some workers (``reserved``) serve only urgent reads, so speculation never delays a
demand miss. A read in progress is never preempted; it runs piece by piece, and a
cancelled read stops between pieces (partially read) or never starts (cancelled
before read). Queued speculative reads can be promoted to urgent. A demand read of
several pieces (a blob over ``reader.PIECE_BYTES``) is split over the workers idle when it
starts: they and the reading thread take its pieces one at a time (``Parts``), so a
megabyte miss costs the waiting thread a piece, not the blob, and the disk sees them at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque

QUEUED, RUNNING, DONE, CANCELLED, FAILED = "queued", "running", "done", "cancelled", "failed"


class Done:
    """A one-shot completion flag (a held lock: cheaper to make than threading.Event)."""

    __slots__ = ("_lock", "_set")

    def __init__(self):
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self):
        if not self._set:
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self):
        if not self._set:
            self._lock.acquire()
            self._lock.release()


class ReadRequest:
    __slots__ = ("blob", "views", "slot", "speculative", "urgent", "state", "event", "error",
                 "bytes_read", "cancel_flag", "t_submit", "t_start", "t_done", "claimed", "step", "buffer", "land",
                 "page_cached")

    def __init__(self, blob, views, slot, speculative=False):
        self.blob, self.views, self.slot = blob, views, slot
        self.speculative = speculative
        self.urgent = not speculative
        self.state = QUEUED
        self.event = Done()
        self.error = None
        self.bytes_read = 0
        self.cancel_flag = False
        self.t_submit = self.t_start = self.t_done = 0
        self.claimed = None  # for speculation: None (not yet) or "late" (claimed while in flight)
        self.step = 0
        self.buffer = None  # what the read lands in before its slot (staged writes: a bounce row; arena.slots)
        self.land = None  # called (request) by the reading thread once it read it all (staged writes)
        self.page_cached = None  # demand reads through the page cache: whether the blob was in it before

    @property
    def finished(self) -> bool:
        return self.state in (DONE, CANCELLED, FAILED)


class Parts:
    """The pieces of one demand read (callables), taken one at a time by the thread that reads it
    and by the idle workers woken to help; the first error stops the rest."""

    __slots__ = ("jobs", "done", "taken", "error", "_lock")

    def __init__(self, jobs):
        self.jobs, self.done, self.taken, self.error = jobs, [Done() for _ in jobs], 0, None
        self._lock = threading.Lock()

    def run(self) -> None:
        """Read pieces until none is left; errors are kept for ``wait`` (on a worker: for the reader)."""
        while True:
            with self._lock:
                i = self.taken
                if i == len(self.jobs) or self.error is not None:
                    return
                self.taken += 1
            try:
                self.jobs[i]()
            except BaseException as e:  # an interrupt on the reading thread too: raised by ``wait``
                if self.error is None:
                    self.error = e
            finally:
                self.done[i].set()

    def wait(self) -> None:
        """Every piece taken has finished (none is still writing); then raise the first error."""
        with self._lock:
            taken = self.taken
        for done in self.done[:taken]:
            done.wait()
        if self.error is not None:
            raise self.error


class IOScheduler:
    def __init__(self, reader, workers: int = 8, reserved: int = 2, inline_below: int = 256 * 1024):
        if workers < 1:
            raise ValueError(f"io workers must be >= 1, got {workers}")
        if not 0 <= reserved <= workers:
            raise ValueError(f"reserved urgent workers must be between 0 and {workers}, got {reserved}")
        self.reader = reader
        self.urgent: deque = deque()
        self.spec: deque = deque()
        # The queues' lock, taken as ``with self._lock`` (a C lock): ``with`` on a Condition runs its
        # Python ``__enter__``, where a Ctrl-C can land after the acquire and leave the lock held (the
        # run then hung in ``close``: 1 in 30-60 interrupts of `workbench run`).
        self._lock = lock = threading.Lock()
        self.cv = threading.Condition(lock)  # workers that take any read wait here
        self._reserved_cv = threading.Condition(lock)  # workers reserved for urgent reads wait here
        self._idle = {False: 0, True: 0}  # workers waiting on each (reserved: True), not yet woken
        self.inline_below = inline_below
        self.split = True  # demand reads of several pieces are split over idle workers (module docstring)
        self._stop = False
        self.workers = workers
        self.reserved = reserved if workers > 1 else 0
        self.threads = [threading.Thread(target=self._work, args=(i < self.reserved,), daemon=True, name=f"wb-io-{i}")
                        for i in range(workers)]
        for t in self.threads:
            t.start()

    def submit(self, req: ReadRequest) -> ReadRequest:
        req.t_submit = time.perf_counter_ns()
        with self._lock:
            (self.urgent if req.urgent else self.spec).append(req)
            self._wake(1, req.urgent)
        return req

    def submit_many(self, reqs) -> None:
        """Reads of blobs of one size submitted together: urgent ones the calling thread will wait
        for, or speculative ones (a layer read ahead). Small blobs (below ``inline_below`` bytes),
        where a thread hand-off costs more than the read itself (and the readers' Python waits for
        the interpreter behind the thread that builds the device's work), it reads all at once here,
        unqueued. Others it queues, waking a worker a read; urgent: one fewer, as the calling thread
        reads too (see ``help``)."""
        if not reqs:
            return
        now = time.perf_counter_ns()
        if reqs[0].blob.size < self.inline_below:
            for req in reqs:
                req.t_submit = now
            self._run_all(reqs)
            return
        urgent = reqs[0].urgent
        with self._lock:
            for req in reqs:
                req.t_submit = now
                (self.urgent if req.urgent else self.spec).append(req)
            self._wake(len(reqs) - urgent, urgent)

    def promote(self, req: ReadRequest) -> None:
        """A queued speculative read becomes urgent (it is wanted now)."""
        with self._lock:
            req.urgent = True
            if req.state == QUEUED and req in self.spec:
                self.spec.remove(req)
                self.urgent.append(req)
                self._wake(1, True)

    def cancel(self, req: ReadRequest) -> None:
        with self._lock:
            if req.state == QUEUED:
                for q in (self.urgent, self.spec):  # in neither: made, not submitted (an interrupt between)
                    if req in q:
                        q.remove(req)
                        break
                req.state = CANCELLED
                req.t_done = time.perf_counter_ns()
                req.event.set()
            elif req.state == RUNNING:
                req.cancel_flag = True

    def wait(self, req: ReadRequest) -> None:
        self.help(req)
        req.event.wait()
        if req.error is not None:
            raise req.error

    def help(self, req: ReadRequest) -> None:
        """The waiting thread reads ``req`` itself if no worker has started it yet: a demand miss
        then costs one read, not a read plus two thread hand-offs."""
        if req.state != QUEUED:  # taken already (a state never goes back to queued)
            return
        taken = False
        try:
            with self._lock:
                if req.state != QUEUED or not req.urgent or req not in self.urgent:
                    return
                taken = True
                self.urgent.remove(req)
                req.state = RUNNING
            self._run_all((req,))  # an interrupt is raised here; a read's error is the waiter's to raise
        finally:
            if taken and not req.event.is_set():  # interrupted before the read began: it never will
                with self._lock:
                    if req in self.urgent:
                        self.urgent.remove(req)
                    req.state = CANCELLED
                    req.event.set()

    def _run_all(self, reqs) -> None:
        """Read ``reqs`` (taken from the queues, or never queued) one after another on this thread,
        then settle them: every one ends done, cancelled or failed, even if this thread is interrupted.
        A read's error surfaces on the thread that waits for it (``wait``); an interrupt (Ctrl-C, on
        the thread that reads inline) stops the reads and is raised here: a speculative read is
        waited for by no one, so it would be lost."""
        states = []
        try:
            for req in reqs:
                req.state, req.t_start = RUNNING, time.perf_counter_ns()
                interrupt = None
                try:
                    probe = not req.speculative and self.reader.through_page_cache  # demand reads: was it cached?
                    req.bytes_read, req.page_cached = self.reader.read_probed(
                        req.blob, req.views, lambda: req.cancel_flag, probe,
                        self._share if self.split and not req.speculative else None)
                    state = CANCELLED if req.bytes_read < req.blob.size else DONE
                    if state == DONE and req.land is not None:
                        req.land(req)
                except Exception as e:
                    req.error, state = e, FAILED
                except BaseException as e:
                    req.error, state, interrupt = e, FAILED, e
                req.t_done = time.perf_counter_ns()
                states.append(state)
                if interrupt is not None:
                    raise interrupt
        finally:
            with self._lock:
                for i, req in enumerate(reqs):
                    req.state = states[i] if i < len(states) else CANCELLED  # never read
                    req.event.set()

    def _share(self, jobs) -> None:
        """Run one demand read's pieces (``jobs``) on this thread and on the workers idle now, at
        once; returns (or raises the first error) once every piece taken has finished."""
        parts = Parts(jobs)
        with self._lock:
            n = min(len(jobs) - 1, self._idle[True] + self._idle[False])
            self.urgent.extendleft([parts] * n)
            self._wake(n, True)
        try:
            parts.run()
        finally:
            if n:
                with self._lock:  # helpers not woken in time find nothing left: take them off the queue
                    self.urgent = deque(r for r in self.urgent if r is not parts)
            parts.wait()

    def close(self):
        with self._lock:
            self._stop = True
            for q in (self.urgent, self.spec):
                for req in q:
                    if not isinstance(req, Parts):  # a split read's helpers: its reader waits for its own pieces
                        req.state = CANCELLED
                        req.event.set()
                q.clear()
            self.cv.notify_all()
            self._reserved_cv.notify_all()
        for t in self.threads:
            t.join(timeout=5)

    def _wake(self, n, urgent):
        """Wake up to ``n`` idle workers that can take a new read (the lock held): an urgent one goes
        to the reserved workers first; a speculative one never wakes a worker that cannot take it."""
        for reserved, cv in ((True, self._reserved_cv), (False, self.cv)):
            if reserved and not urgent:
                continue
            k = min(n, self._idle[reserved])
            if k:
                self._idle[reserved] -= k  # counted off here: a second wake-up never picks the same worker
                cv.notify(k)
                n -= k

    def _take(self, urgent_only):
        while not self._stop:
            if self.urgent:
                return self.urgent.popleft()
            if self.spec and not urgent_only:
                return self.spec.popleft()
            if urgent_only and self.spec:  # woken for an urgent read another worker took: pass it on
                self._wake(len(self.spec), False)
            self._idle[urgent_only] += 1
            (self._reserved_cv if urgent_only else self.cv).wait()
        return None

    def _work(self, urgent_only):
        while True:
            with self._lock:
                req = self._take(urgent_only)
                if req is None:
                    return
                if isinstance(req, Parts):  # pieces of a read another thread is reading
                    parts = req
                else:
                    parts, req.state = None, RUNNING
            if parts is not None:
                parts.run()
                continue
            try:
                self._run_all((req,))
            except BaseException:  # recorded on the request (``req.error``): its waiter raises it
                pass
