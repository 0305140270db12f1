"""Slot memory (``arena.slots``): the factory's choice of mode, and how a read lands per mode."""

from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from workbench.arena.slots import DirectSlots, NoSlots, StagedSlots, default_mode, make_slots, unified_memory
from workbench.store.manifest import TensorSpec

TENSORS = [TensorSpec("w", (4, 8), "uint8", 32), TensorSpec("s", (3,), "float32", 12)]
MANIFEST = SimpleNamespace(tensors=TENSORS, n_routed=16, expert_bytes=44, n_experts=4, top_k=2)


def _fill(req, seed):
    """What a read does: fill the request's views; returns the bytes it wrote per tensor."""
    data = []
    for i, view in enumerate(req.views):
        b = bytes((seed + i + j) % 251 for j in range(len(view)))
        view[:] = b
        data.append(b)
    return data


def _slot_bytes(slots, slot):
    return [np.array(slots.tensors[t.name][slot]).tobytes() for t in TENSORS]


def test_the_factory_picks_by_backend_and_arena_size():
    if not unified_memory():
        pytest.skip("unified memory only (CPU, Metal)")
    assert default_mode(full=False) == default_mode(full=True) == "direct"
    for mode, cls, name in ((None, DirectSlots, "direct"), ("mapped", DirectSlots, "direct"),
                            ("staged", StagedSlots, "staged"), ("none", NoSlots, "none")):
        slots = make_slots(mode, MANIFEST, 4)
        assert type(slots) is cls and slots.name == name, mode
        assert slots.in_place == (name == "direct")
        assert [tuple(a.shape) for a in slots.tensors.values()] == ([] if name == "none" else [(5, 4, 8), (5, 3)])
    with pytest.raises(ValueError, match="valid: direct, mapped, staged, none"):
        make_slots("pinned", MANIFEST, 4)


def test_direct_reads_land_in_the_slot_and_none_lands_nowhere():
    slots = make_slots("direct", MANIFEST, 4)
    req = slots.request("blob", 2, speculative=True)
    assert (req.slot, req.speculative, req.land) == (2, True, None)
    want = _fill(req, 7)
    assert _slot_bytes(slots, 2) == want
    assert _slot_bytes(slots, 4) == [bytes(32), bytes(12)]  # the placeholder row stays zeros
    none = make_slots("none", MANIFEST, 4)
    assert none.request("blob", 1).views is None and none.tensors == {}
    assert np.array(none.landed(np.array([3, 1]))).tolist() == [3, 1]


def test_staged_reads_land_with_the_next_claim_and_rows_come_back():
    slots = make_slots("staged", MANIFEST, 4)
    req = slots.request("blob", 1)
    want = _fill(req, 3)
    assert _slot_bytes(slots, 1) != want  # in its bounce row, not in the slot yet
    req.land(req)  # the reading thread, once the read is complete
    assert req.buffer is None and len(slots.staging.pending) == 1
    ids = slots.landed(np.array([1, 0]))
    assert np.array(ids).tolist() == [1, 0] and _slot_bytes(slots, 1) == want
    free = len(slots.staging.free)
    lost = slots.request("blob", 2)  # never read: its row goes back
    assert len(slots.staging.free) == free - 1
    slots.recycle(lost)
    assert lost.buffer is None and len(slots.staging.free) == free
    slots.drain()
    assert slots.staging.pending == []


def test_handed_over_reads_are_the_callers_to_land_and_a_reland_lands_them():
    """The handshake's path for staged slots: reads completed during a claim are handed over (the
    last one per slot; an earlier owner's row goes back at once), nothing lands meanwhile; rows the
    device may not have copied (a give-up) land with the next ``landed``. In-place slots hand over
    nothing."""
    slots = make_slots("staged", MANIFEST, 4)
    reqs = [slots.request("blob", s) for s in (1, 2, 1)]  # slot 1 read twice: the first is a previous owner's
    data = [_fill(req, seed) for req, seed in zip(reqs, (3, 5, 9))]
    free = len(slots.staging.free)

    def claim():
        for req in reqs:
            req.land(req)
        slots.flush()  # what a claim's release does: it must not land them now
        return "table"

    table, pairs = slots.hand_over(claim)
    assert table == "table" and [slot for _, slot in pairs] == [2, 1]
    assert slots.staging.pending == [] and slots.staging.divert is None
    assert _slot_bytes(slots, 1) != data[2] and len(slots.staging.free) == free + 1  # the earlier row is back
    slots.retire("kernel output", pairs)
    slots.reland("kernel output", pairs)  # the device gave up: they land with the next claim
    assert slots.staging._inflight == deque() and len(slots.staging.pending) == 2
    slots.landed(np.array([1, 2]))
    assert _slot_bytes(slots, 1) == data[2] and _slot_bytes(slots, 2) == data[1]
    direct = make_slots("direct", MANIFEST, 4)
    assert direct.hand_over(lambda: 7) == (7, []) and direct.handshake_copies(8) == 0
    assert make_slots("none", MANIFEST, 4).handshake_copies(8) is None


def test_default_slot_memory_by_backend_arena_and_expert_size(monkeypatch):
    """direct on unified memory; on CUDA staged for a full arena or experts of MAPPED_BELOW bytes or
    more (megabyte experts cross the bus once per miss, not once per use), mapped for small ones."""
    from workbench.arena import slots

    monkeypatch.setattr(slots, "unified_memory", lambda: True)
    assert slots.default_mode(False, 2_600_000) == slots.default_mode(True, 31_000) == "direct"
    monkeypatch.setattr(slots, "unified_memory", lambda: False)
    assert slots.default_mode(False, 31_000) == "mapped"
    assert slots.default_mode(False, slots.MAPPED_BELOW) == slots.default_mode(False, 2_600_000) == "staged"
    assert slots.default_mode(True, 31_000) == "staged"
