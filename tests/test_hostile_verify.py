"""--verify changed: a blob whose file changed after its first check is checked again."""

from __future__ import annotations

import os

import pytest

from tests.hostile_util import copy_store
from workbench.config import IOConfig
from workbench.engine.engine import Engine
from workbench.store.manifest import EXPERTS, StoreError
from workbench.store.reader import VERIFY_MODES, BlobReader


def _flip_verified(eng, store):
    """Flip one byte in every blob already checked once, and move the mtime on."""
    with open(store / EXPERTS, "r+b") as f:
        for layer, expert in list(eng.reader._verified):
            b = eng.m.blob(layer, expert)
            f.seek(b.offset + 7)
            byte = f.read(1)
            f.seek(b.offset + 7)
            f.write(bytes([byte[0] ^ 0xFF]))
    st = os.stat(store / EXPERTS)
    os.utime(store / EXPERTS, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _run(eng, rounds=6):
    for start in range(0, 8 * rounds, 8):
        eng.generate(list(range(start, start + 6)), max_tokens=4, progress=False)


@pytest.mark.parametrize("mode, caught", [("changed", True), ("always", True), ("first", False)])
def test_blob_changed_after_first_read(tiny, tmp_path, mode, caught):
    _, src = tiny("qwen3_moe", 4)
    store = copy_store(src, tmp_path / "s")
    with Engine(store, arena="4", io=IOConfig(verify=mode), progress=False) as eng:
        _run(eng, 2)
        assert eng.reader._verified
        _flip_verified(eng, store)
        if caught:
            with pytest.raises(StoreError, match="checksum mismatch in layer"):
                _run(eng)
        else:
            _run(eng)  # documented: `first` does not see damage after the first read


def test_changed_rechecks_only_after_the_file_changed(tiny, tmp_path, monkeypatch):
    import workbench.store.reader as reader_module

    _, src = tiny("qwen3_moe", 4)
    store = copy_store(src, tmp_path / "s")
    real_crc, real_read = reader_module.crc32, BlobReader.read_probed
    crcs, reads = [], []
    monkeypatch.setattr(reader_module, "crc32", lambda *a: crcs.append(1) or real_crc(*a))
    monkeypatch.setattr(BlobReader, "read_probed", lambda self, *a, **k: reads.append(1) or real_read(self, *a, **k))
    with Engine(store, arena="4", io=IOConfig(verify="changed"), progress=False) as eng:
        n_tensors = len(eng.m.tensors)
        _run(eng, 4)
        checks = len(crcs) // n_tensors
        assert checks == len(eng.reader._verified) and len(reads) > checks  # re-reads of unchanged blobs: no crc
        st = os.stat(store / EXPERTS)
        os.utime(store / EXPERTS, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, new mtime
        n_reads = len(reads)
        _run(eng, 2)
        assert len(reads) > n_reads and len(crcs) // n_tensors > checks  # read after the change: checked again


def test_unknown_verify_mode_lists_the_modes(tiny):
    _, store = tiny("qwen3_moe", 4)
    from workbench.store.manifest import Manifest

    with pytest.raises(ValueError, match=", ".join(VERIFY_MODES)):
        BlobReader(store, Manifest.load(store), verify="sometimes")


def test_engine_api_refuses_too_many_io_workers_before_opening(tiny, tmp_path):
    with pytest.raises(ValueError, match="--io-workers 100000 is out of range: give a value in \\[1, 256\\]"):
        Engine(tmp_path / "not-even-a-store", io=IOConfig(workers=100000), progress=False)


def test_the_store_checksum_is_zlibs_crc32():
    """The fast CRC-32 the store checks with (zlib-ng's where installed) gives zlib's values, chained
    over a blob's tensors as the reader and the packer chain it."""
    import zlib

    import numpy as np

    from workbench.store.manifest import crc32

    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 1, 17, 4096, 100_003, 1 << 20)]
    chained = 0
    for p in parts:
        assert crc32(p) == zlib.crc32(p)
        chained = crc32(memoryview(p), chained)
    assert chained == zlib.crc32(b"".join(parts))
