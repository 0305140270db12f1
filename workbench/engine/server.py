"""The handshake's second server: a thread that answers mailboxes while the decoding thread is
inside ``mx.async_eval``.

Launching a token (``mx.async_eval``) is MLX's C++ encoding the token's kernels, milliseconds a token
(most of a resident token's host time, bench/RESULTS.md, host_profile), during which MLX lets go of
the interpreter. The device runs the token before meanwhile; a layer of it that misses would wait
until the call returns. ``Server.during`` calls a serve function over and over on its own thread
for the length of that call, so the miss waits about a read.

Why no lock: inside the call the decoding thread touches no engine state, and it waits for the
server's last serve to return before it goes on. What a serve may do: answers make no MLX call (MLX
keeps each thread's command encoders apart): staged rows come back on the decoding thread
(``Slots.reclaim``) and a server thread that runs out of them makes more (``staging.host_only``);
hooks, whose callbacks may call MLX, keep the serving on the decoding thread unless every one was added
host-only (``Hooks.add``; a trace recorder's are) (``HandshakePass.launch``).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from ..arena.staging import host_only

POLL_S = 50e-6  # at most this long between serve calls (the interpreter is free then)


class Server:
    """One daemon thread, idle until ``during``; ``close`` ends it."""

    def __init__(self):
        self._go, self._halt, self._stopped = threading.Lock(), threading.Lock(), threading.Lock()
        for lock in (self._go, self._halt, self._stopped):
            lock.acquire()  # each released once per block: start, stop (the block's end), stopped
        self._serve, self._exit, self._error = None, False, None
        self._thread = threading.Thread(target=self._loop, daemon=True, name="wb-serve")
        self._thread.start()

    @contextmanager
    def during(self, serve):
        """``serve()`` runs over and over on the server's thread until the block ends; its first
        error is raised after the block (an error of the block's own comes first)."""
        self._serve, self._error = serve, None
        self._go.release()
        try:
            yield
        finally:
            self._halt.release()
            self._stopped.acquire()  # the last serve call has returned: nothing of it runs on
            self._serve = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        self._exit = True
        self._go.release()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        host_only()
        while True:
            self._go.acquire()
            if self._exit:
                return
            try:
                while True:
                    self._serve()
                    if self._halt.acquire(timeout=POLL_S):  # the block ended
                        break
            except BaseException as e:  # raised on the decoding thread, after the block
                self._error = e
                self._halt.acquire()
            finally:
                self._stopped.release()
