"""The arena: a fixed set of slots that expert reads land in, and the residency map.

Keys are ``layer * n_experts + expert``. A slot is free, or holds a key that is either
*published* (router-visible: claimed by a real routing decision) or *speculative*
(prefetched, not yet claimed). Victims come from free slots first (lowest index), then
the policy's order, skipping pinned, speculative and limbo slots; a prefetch never
evicts its own target layer. Residency never depends on I/O timing: a slot whose read
is still running is waited for, never skipped.

The slot tensors have one extra row, the *placeholder* (zeros, never written): the
expert->slot table ``lut`` maps every expert that is not published there, so a decode
pass can run without asking the host which experts are resident (verified afterwards).

The residency map (``arena.map``, ``residency.py``) says which key each slot holds and
whether it is published. Slot memory, and how a read lands there, is one object, ``slots``
(``arena.slots``: direct, mapped, staged or none, picked by backend and arena size); ``writes``
names its mode.

The I/O backend (``scheduler``) takes ``submit``, ``submit_many``, ``promote``, ``cancel`` and
``help`` of ``ReadRequest``s and sets each one's ``state`` and ``event`` (``io.scheduler``).
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from ..io.scheduler import CANCELLED, DONE, FAILED, ReadRequest
from ..store.manifest import StoreError
from .policies import make_policy
from .policies.base import Policy
from .residency import Residency
from .slots import make_slots

OUTCOMES = ("cancelled_before_read", "partially_read", "completed_unused", "useful_late", "useful_timely")


class ArenaError(RuntimeError):
    """The arena cannot serve a request (too small, no eligible victim)."""


class Arena:
    def __init__(self, manifest, n_slots, scheduler, counters, hooks, policy="lru", policy_options=None,
                 writes=None):
        self.m = manifest
        self.E = manifest.n_experts
        self.n_slots = n_slots
        self.io = scheduler
        self.counters = counters
        self.hooks = hooks
        n_keys = (max(manifest.moe_layers) + 1) * self.E
        if isinstance(policy, Policy):  # built by the caller (the simulators accept classes and instances)
            self.policy = policy
        else:
            self.policy = make_policy(policy, n_slots, n_keys=n_keys, n_experts=self.E, **(policy_options or {}))
        self.slots = make_slots(writes, manifest, n_slots)
        self.writes = self.slots.name  # the mode that runs (``slots.MODES``; mapped on unified memory is direct)
        self.tensors = self.slots.tensors  # name -> [n_slots + 1, ...] (empty for none)
        self.placeholder = n_slots  # the extra row: zeros, never written
        self.map = Residency(max(manifest.moe_layers) + 1, self.E, n_slots, len(manifest.moe_layers) * self.E)
        # the map's containers, read on every claim (the same objects)
        self.lut, self.smap, self.key_of, self.mapped = self.map.lut, self.map.smap, self.map.key_of, self.map.mapped
        self.published = self.map.published
        self._exposed: list[int] = []
        self._blobs = {}  # key -> its Blob
        self.pinned = [False] * n_slots
        self._pins: list[int] = []
        self.spec: dict[int, ReadRequest] = {}  # slot -> unclaimed speculative read
        self.limbo: dict[int, int] = {}  # slot -> generation
        self.last_req: list = [None] * n_slots
        self.free = list(range(n_slots))
        self.gen = 0
        self.step = 0

    def preload(self, keys) -> None:
        """Read ``keys`` (a policy's warm set, e.g. a hotlist) before the first request, published."""
        by_layer: dict[int, list[int]] = {}
        for key in keys[: self.n_slots]:
            by_layer.setdefault(key // self.E, []).append(key % self.E)
        for layer, experts in by_layer.items():
            for i in range(0, len(experts), self.n_slots):
                self.at_layer(layer, sorted(experts[i:i + self.n_slots]))
                self.release()

    def close(self) -> None:
        """Mapped slot memory goes back to the GPU (the arena's tensors stay valid)."""
        self.slots.close()

    def settle_hits(self, layers, ids) -> None:
        """What ``at_layer`` + ``release`` + ``after_layer`` do, layer after layer, when every wanted
        expert is published and no speculation is open (one token's ids per layer: distinct;
        None only when frozen)."""
        for layer in layers:
            self.counters.row(self.step, layer)["hits"] += self.m.top_k
        if not self.map.frozen:
            keys = np.asarray(layers, dtype=np.int64)[:, None] * self.E + np.sort(ids, axis=1)
            self.policy.access_many(keys.reshape(-1).tolist())
        self.gen += len(layers)

    # ---- demand path -------------------------------------------------------------------
    def at_layer(self, layer: int, experts) -> np.ndarray:
        """Make ``experts`` (unique ids) of ``layer`` resident and published; returns the layer's
        expert->slot table (the placeholder for experts not published). Compute on the slots with
        ids from ``slots.landed`` (or after ``slots.flush``): staged reads land then."""
        c = self.counters.row(self.step, layer)
        base = layer * self.E
        keys = [e + base for e in (experts.tolist() if isinstance(experts, np.ndarray) else experts)]
        slots = list(map(self.smap.get, keys))
        for s in slots:  # pin what is mapped before allocating any miss
            if s is not None:
                self.pinned[s] = True
                self._pins.append(s)
        if all(s is not None and self.published[s] for s in slots):  # every wanted expert hits
            return self._all_hit(layer, keys, slots, c)
        waits = self._claim(layer, keys, slots, c)
        for key in keys:  # every read landed: publish before any hook can raise
            s = self.smap[key]
            if not self.published[s]:
                self.map.publish(s)
        self._to_limbo(layer)
        try:
            for req in waits:
                if req.claimed == "late":
                    self._outcome(req, "useful_late", layer)
                else:
                    c["bytes_read"] += req.bytes_read
                if self.hooks.active:
                    self.hooks.fire("io.done", req, layer=layer, expert=req.blob.expert, slot=req.slot)
        except BaseException:
            self.release()
            raise
        return self.lut[layer]

    def _all_hit(self, layer, keys, slots, c) -> np.ndarray:
        c["hits"] += len(keys)
        if not self.map.frozen:
            self.policy.access_many(keys)
        if self.spec:
            self._to_limbo(layer)
        if self.hooks.active:
            try:
                for key, s in zip(keys, slots):
                    self.hooks.fire("cache.hit", key, layer=layer, expert=key - layer * self.E, slot=s)
            except BaseException:
                self.release()
                raise
        return self.lut[layer]

    def _claim(self, layer, keys, slots, c) -> list:
        """The claim of a layer with at least one miss: hits touched, speculative reads claimed, misses
        given a victim's slot and read; waits for every read the claim needs (returned)."""
        waits, batch, fresh, missed = [], [], [], []
        base = layer * self.E
        t0 = time.perf_counter_ns()
        try:
            for key, s in zip(keys, slots):
                req = self.spec.pop(s, None) if s is not None else None
                if req is not None:
                    self.limbo.pop(s, None)
                    self.policy.access(key, speculative=True)
                    if req.state == DONE:  # its data is in the slot: on an error below it stays mapped
                        self._outcome(req, "useful_timely", layer)
                    elif req.finished:  # cancelled or failed before it was claimed: read it now
                        fresh.append(s)
                        self.slots.recycle(req)
                        self._outcome(req, "partially_read" if req.bytes_read else "cancelled_before_read", layer)
                        waits.append(self._read(s, key, batch))
                    else:
                        req.claimed = "late"
                        self.io.promote(req)
                        waits.append(req)
                elif s is not None:
                    c["hits"] += 1
                    self.policy.access(key)
                    if self.hooks.active:
                        self.hooks.fire("cache.hit", key, layer=layer, expert=key - base, slot=s)
                else:
                    s = self._victim()
                    self.map.assign(s, key)
                    self.pinned[s] = True
                    self._pins.append(s)
                    fresh.append(s)
                    self.policy.admit(key)
                    c["misses"] += 1
                    c["sync_misses"] += 1
                    if self.hooks.active:
                        self.hooks.fire("cache.miss", key, layer=layer, expert=key - base, slot=s)
                    waits.append(self._read(s, key, batch))
                    missed.append(waits[-1])
            self.io.submit_many(batch)
            batch = []
            self._wait_all(waits)
        except BaseException:
            self._drop_failed(waits, batch, fresh)
            self.release()
            raise
        finally:
            c["io_wait_ns"] += time.perf_counter_ns() - t0
        c["page_cache_hits"] += sum(1 for req in missed if req.page_cached)
        return waits

    def expose(self, reqs) -> None:
        """Map completed speculative reads in ``lut`` (not published: the router does not see them)
        so a recompute can compute on them; a claim then publishes them. Until ``unexpose``."""
        self.slots.flush()  # the decode thread read some of them itself
        for req in reqs:
            if req.state == DONE and self.spec.get(req.slot) is req:
                self.map.show(req.slot)
                self._exposed.append(req.slot)

    def unexpose(self) -> None:
        for s in self._exposed:
            self.map.hide(s)
        self._exposed.clear()

    def release(self, hold=False, held=()) -> list:
        """Unpin the current layer's slots, and ``held`` (what an earlier ``release(hold=True)``
        returned). Call once their expert compute is evaluated, or is certain to be evaluated before
        any slot can change owner (the next router sync). ``hold``: the current layer's slots stay
        pinned, returned for a later call. Reads not landed yet (a claim that ended in an error
        before its compute) land first."""
        pins, self._pins = self._pins, []
        try:
            self.slots.flush()
        except BaseException:  # nothing is held after an error
            hold = False
            raise
        finally:
            for s in (*held, *(() if hold else pins)):
                self.pinned[s] = False
        return pins if hold else []

    def after_layer(self) -> None:
        """Release the previous limbo generation and rotate the current one."""
        if self.limbo:
            old = [s for s, g in self.limbo.items() if g < self.gen]
            for s in old:
                del self.limbo[s]
                self._unmap(s)
        self.gen += 1

    def clear_limbo(self) -> None:
        """Unmap every slot in limbo now (their outcomes land in this step)."""
        for s in list(self.limbo):
            self._unmap(s)

    # ---- speculative path --------------------------------------------------------------
    def prefetch(self, layer: int, expert: int, top_k: int, evict: bool = True, batch=None) -> ReadRequest | None:
        """Start a speculative read of (layer, expert); never publishes, never evicts ``layer``;
        with ``evict=False`` it takes a free slot or nothing; with ``batch`` (a list) it is queued
        there, for the caller to submit (``submit_many``)."""
        key = layer * self.E + expert
        if key in self.smap or self.n_slots - 2 * top_k - len(self.spec) - len(self.limbo) <= 0:
            return None
        s = self._victim(avoid_layer=layer, required=False) if evict or self.free else None
        if s is None:
            return None
        self.map.assign(s, key)
        req = self._request(s, key, speculative=True)
        self.spec[s] = req
        self.policy.admit(key, speculative=True)
        c = self.counters.row(self.step, layer)
        c["prefetch_issued"] += 1
        c["prefetch_issued_bytes"] += req.blob.size
        try:
            self._submit(req, layer, batch)
        except BaseException:  # never submitted: settle it as cancelled and give the slot back
            req.state = CANCELLED
            req.event.set()
            self._unmap(s)
            raise
        return req

    def speculative(self, layer: int, expert: int) -> ReadRequest | None:
        """The open speculative read of (layer, expert), if any."""
        s = self.smap.get(layer * self.E + expert)
        return None if s is None else self.spec.get(s)

    def finish_speculation(self) -> None:
        """End of a request: every read has landed; settle every open speculative read and unmap
        it (deterministic)."""
        error = None
        try:
            self.slots.drain()  # a run that failed between a claim and its compute left a landing unrun
        except BaseException as e:  # settle the speculation anyway, then report it
            error = e
        self.unexpose()  # a run that failed while recomputing left exposed slots in the table
        for s, req in list(self.spec.items()):
            self.io.cancel(req)
        for s in list(self.spec) + list(self.limbo):
            try:
                if self.key_of[s] >= 0:
                    self._unmap(s)  # waits for the read, frees the slot, then reports the outcome
            except BaseException as e:  # a hook raised: finish settling, then report it
                error = error or e
        if error is not None:
            raise error

    # ---- reads -----------------------------------------------------------------------
    def _request(self, s, key, speculative=False) -> ReadRequest:
        blob = self._blobs.get(key)
        if blob is None:
            blob = self._blobs[key] = self.m.blob(*divmod(key, self.E))
        req = self.slots.request(blob, s, speculative=speculative)
        req.step = self.step
        return req

    # ---- internals ---------------------------------------------------------------------
    def _to_limbo(self, layer):
        for s, req in list(self.spec.items()):
            if self.key_of[s] // self.E == layer and s not in self.limbo:
                self.io.cancel(req)  # queued: dropped; running: stops at the next piece
                self.limbo[s] = self.gen

    def _drop(self, s):
        """Forget slot ``s``'s key: residency map, table, policy."""
        key = self.map.drop(s)
        if key >= 0:
            self.policy.remove(key)

    def _unmap(self, s):
        key = self.key_of[s]
        req = self.spec.pop(s, None)
        self.limbo.pop(s, None)
        if req is not None:
            req.event.wait()
            self.slots.recycle(req)
        self._drop(s)
        heapq.heappush(self.free, s)
        if req is not None:  # the slot is free before any outcome hook runs
            self._outcome(req, _unused_outcome(req), key // self.E)

    def _read(self, s, key, batch) -> ReadRequest:
        """A demand read of ``key`` into slot ``s``, queued with ``batch`` (submitted together)."""
        req = self._request(s, key)
        try:
            self._submit(req, key // self.E, batch)
        except BaseException:  # never queued (a hook raised): its bounce row goes back
            self.slots.recycle(req)
            raise
        return req

    def _submit(self, req, layer, batch=None):
        prev = self.last_req[req.slot]
        if prev is not None and not prev.finished:
            prev.event.wait()  # a slot never takes a new read while its last one is running
        if self.hooks.active:  # before the read is recorded: a hook that raises leaves nothing to wait for
            self.hooks.fire("io.submit", req, layer=layer, expert=req.blob.expert, slot=req.slot)
        self.last_req[req.slot] = req
        if batch is None:
            self.io.submit(req)
        else:
            batch.append(req)

    def _victim(self, avoid_layer=None, required=True):
        if self.free:
            return heapq.heappop(self.free)
        for key in self.policy.order():
            s = self.smap[key]
            if self.pinned[s] or s in self.spec or s in self.limbo:
                continue
            if avoid_layer is not None and key // self.E == avoid_layer:
                continue
            break
        else:
            if not required:
                return None
            raise ArenaError(
                f"no eligible victim among {self.n_slots} slots ({sum(self.pinned)} pinned, {len(self.spec)} "
                f"speculative, {len(self.limbo)} in limbo); give the arena more slots"
            )
        self.counters.row(self.step, key // self.E)["evictions"] += 1
        if self.hooks.active:
            self.hooks.fire("cache.evict", key, layer=key // self.E, expert=key % self.E, slot=s)
        self._drop(s)
        return s

    def _wait_all(self, reqs):
        """Wait for ``reqs``, reading them on this thread where no worker has started them; staged
        ones land with the caller's compute (``landed``), or in ``release``."""
        error = None
        for req in reversed(reqs):  # workers take the queue front; the decode thread helps from the back
            self.io.help(req)
        for req in reqs:
            req.event.wait()
            if req.error is not None and error is None:
                error = req.error
            elif req.state == CANCELLED and error is None:
                error = StoreError(f"read of layer {req.blob.layer} expert {req.blob.expert} was cancelled")
        if error is not None:
            raise error

    def _drop_failed(self, reqs, unsubmitted, fresh):
        """After an error in ``at_layer``: never wait for a read that was not submitted; wait for
        the rest; unmap every slot this call assigned whose read did not complete. Reads that did
        complete (claimed speculative ones too) stay mapped, unpublished, with their data in the slot."""
        for req in unsubmitted:
            if not req.event.is_set():  # read already (the claiming thread reads small ones in submit_many)
                req.state = CANCELLED
                req.event.set()
        for req in reqs:
            req.event.wait()
            if req.state in (FAILED, CANCELLED) and self.key_of[req.slot] >= 0:
                self.spec.pop(req.slot, None)
                self.slots.recycle(req)
                self._unmap(req.slot)
        done = {req.slot for req in reqs if req.state == DONE}
        for s in fresh:
            if s not in done and self.key_of[s] >= 0:
                self._unmap(s)

    def _outcome(self, req, outcome, layer):
        c = self.counters.row(self.step, layer)
        c["prefetch_" + outcome] += 1
        c["prefetch_" + outcome + "_bytes"] += req.blob.size
        c["prefetch_" + outcome + "_bytes_read"] += req.bytes_read
        c["bytes_read"] += req.bytes_read
        if self.hooks.active:
            self.hooks.fire("prefetch.outcome", outcome, layer=layer, expert=req.blob.expert, slot=req.slot)
            if outcome in ("cancelled_before_read", "partially_read"):
                self.hooks.fire("io.cancel", req, layer=layer, expert=req.blob.expert, slot=req.slot)
            elif outcome != "useful_late":  # late reads were reported done when waited for
                self.hooks.fire("io.done", req, layer=layer, expert=req.blob.expert, slot=req.slot)


def _unused_outcome(req) -> str:
    if req.state == DONE:
        return "completed_unused"
    return "partially_read" if req.bytes_read else "cancelled_before_read"
