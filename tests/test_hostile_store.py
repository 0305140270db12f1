"""Crafted and damaged stores: refused at open, before anything is allocated, with one line."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.hostile_util import assert_clean_error, cli, copy_store, edit_manifest
from workbench.engine.engine import Engine
from workbench.store.manifest import EXPERTS, MANIFEST, RESIDENT, Manifest, StoreError


@pytest.fixture
def store(tiny, tmp_path):
    _, src = tiny("qwen3_moe", 4)
    return copy_store(src, tmp_path / "store")


def _set(key, value):
    def fn(d):
        d[key] = value
    return fn


def _blob(i, j, value):
    def fn(d):
        d["blobs"][i][j] = value
    return fn


def _tensor(key, value):
    def fn(d):
        d["tensors"][0][key] = value
    return fn


def _drop(key):
    def fn(d):
        del d[key]
    return fn


def _cfg(key, value):
    def fn(d):
        d["config"][key] = value
    return fn


def _overlap(d):
    d["blobs"][1][2] = d["blobs"][0][2] + 16


def _huge_shape(d):  # a consistent 1 GiB per-expert tensor: sizes nothing, it is not the model's
    t = d["tensors"][0]
    t["shape"], t["dtype"], t["nbytes"] = [1 << 15, 1 << 13], "uint32", 1 << 30
    size = sum(x["nbytes"] for x in d["tensors"])
    for i, b in enumerate(d["blobs"]):
        b[2], b[3] = i * size, size
    d["experts_file_size"] = len(d["blobs"]) * size


MANIFEST_CASES = [
    ("list", lambda d: [d], False, "JSON list, not an object"),
    ("tensors_string", _set("tensors", "abc"), False, "tensors must be a non-empty list"),
    ("tensors_empty", _set("tensors", []), False, "tensors must be a non-empty list"),
    ("no_blobs", _drop("blobs"), False, "field 'blobs' is missing"),
    ("n_experts_null", _set("n_experts", None), False, "n_experts is None"),
    ("n_experts_float", _set("n_experts", 8.0), False, "n_experts is 8.0"),
    ("n_experts_huge", _set("n_experts", 10 ** 12), False, "n_experts is 1000000000000"),
    ("top_k_0", _set("top_k", 0), False, "top_k is 0"),
    ("top_k_over_n", _set("top_k", 9), False, "top_k is 9"),
    ("top_k_vs_config", _set("top_k", 3), False, "differs from the config's 2"),
    ("shape_zero", _tensor("shape", [0, 8]), False, "shape [0, 8]"),
    ("shape_overflow", _tensor("shape", [2 ** 40, 2 ** 40]), False, "shape [1099511627776"),
    ("shape_string", _tensor("shape", "32x8"), False, "shape '32x8'"),
    ("dtype_float64", _tensor("dtype", "float64"), False, "dtype 'float64' is not one of"),
    ("nbytes_wrong", _tensor("nbytes", 7), False, "nbytes 7 != 1024"),
    ("name_not_str", _tensor("name", 3), False, "distinct name"),
    ("huge_shape", _huge_shape, False, "does not match the model's"),
    ("shape_other_model", _tensor("shape", [16, 16]), False, "does not match the model's"),
    ("offset_2_64", _blob(3, 2, 2 ** 64), False, "lies outside experts.bin"),
    ("offset_negative", _blob(3, 2, -16384), False, "lies outside experts.bin"),
    ("offset_float", _blob(3, 2, 16384.0), False, "of whole numbers"),
    ("offset_string", _blob(3, 2, "0"), False, "of whole numbers"),
    ("size_wrong", _blob(3, 3, 1), False, "size 1 !="),
    ("crc_33_bits", _blob(3, 4, 2 ** 33), False, "not a 32-bit value"),
    ("expert_out_of_range", _blob(3, 1, 99), False, "expert 99"),
    ("duplicate_blob", _blob(3, 1, 2), False, "listed twice"),
    ("blob_short", lambda d: d["blobs"][3].pop() and None, False, "[layer, expert, offset, size, crc32]"),
    ("fewer_blobs", lambda d: d["blobs"].pop() and None, False, "one entry per (layer, expert): 16, found 15"),
    ("blobs_dict", _set("blobs", {}), False, "found a JSON object"),
    ("overlap", _overlap, False, "overlap in experts.bin"),
    ("experts_file_size_0", _set("experts_file_size", 0), False, "experts_file_size is 0"),
    ("experts_file_size_small", _set("experts_file_size", 20000), False, "lies outside experts.bin's 20000"),
    ("moe_layers_string", _set("moe_layers", "0,1"), False, "moe_layers must be"),
    ("moe_layers_out_of_range", _set("moe_layers", [0, 7]), False, "moe_layers must be"),
    ("moe_layers_other_model", _set("moe_layers", [1]), False, "one entry per"),
    ("n_layers_null", _set("n_layers", None), False, "n_layers is None"),
    ("config_list", _set("config", [1, 2]), False, "config is a list"),
    ("config_edited", _cfg("hidden_size", 65), False, "does not match config_hash"),
    ("config_topk_negative", _cfg("num_experts_per_tok", -2), True, "'num_experts_per_tok' is -2"),
    ("config_hidden_2_31", _cfg("hidden_size", 2 ** 31), True, "'hidden_size' is 2147483648"),
    ("config_vocab_0", _cfg("vocab_size", 0), True, "'vocab_size' is 0"),
    ("config_layers_100000", _cfg("num_hidden_layers", 100000), True, "'num_hidden_layers' is 100000"),
    ("config_family", _cfg("model_type", "no_such_family"), True, "model_type 'qwen3_moe' differs"),
    ("quantized_list", _set("quantized", [1]), False, "quantized must map"),
    ("resident_crc_string", _set("resident_crc32", "x"), False, "resident_crc32 is 'x'"),
    ("format", _set("format", "workbench-store/0"), False, "store format"),
]


@pytest.mark.parametrize("name, fn, rehash, msg", MANIFEST_CASES, ids=[c[0] for c in MANIFEST_CASES])
def test_crafted_manifest_is_refused_at_open(store, name, fn, rehash, msg):
    edit_manifest(store, fn, rehash=rehash)
    with pytest.raises(StoreError) as e:
        Manifest.load(store)
    text = str(e.value)
    assert msg in text and "\n" not in text
    with pytest.raises(StoreError):
        Engine(store, progress=False)


def test_manifest_not_json_or_not_utf8(store):
    (store / MANIFEST).write_text('{"format": ')
    with pytest.raises(StoreError, match="is corrupt"):
        Manifest.load(store)
    (store / MANIFEST).write_bytes(b'{"format": "\xff\xfe"}')
    with pytest.raises(StoreError, match="is not UTF-8 text .*pack the model again"):
        Manifest.load(store)


def test_experts_symlink_to_short_file(store, tmp_path):
    """The case that segfaulted in PageCacheProbe: experts.bin a symlink to a short file."""
    short = tmp_path / "short.bin"
    short.write_bytes(b"\0" * 5000)
    (store / EXPERTS).unlink()
    os.symlink(short, store / EXPERTS)
    with pytest.raises(StoreError, match="truncated"):
        Manifest.load(store)
    edit_manifest(store, _set("experts_file_size", 0))
    with pytest.raises(StoreError, match="experts_file_size is 0"):
        Manifest.load(store)


def test_experts_is_a_directory(store):
    (store / EXPERTS).unlink()
    (store / EXPERTS).mkdir()
    with pytest.raises(StoreError, match="not a regular file"):
        Manifest.load(store)


def test_page_cache_probe_stays_inside_its_mapping(store):
    from workbench.store.reader import PageCacheProbe

    fd = os.open(store / EXPERTS, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        probe = PageCacheProbe(fd, size)
        assert probe.cached(size - 10, 1 << 30) is None  # would write 2^18 entries into a 64-entry vector
        assert probe.cached(-4096, 100) is None and probe.cached(0, 0) is None
        assert probe.cached(0, 4096) in (True, False, None)
        probe.close()
    finally:
        os.close(fd)


def test_resident_flipped_bytes_are_caught_at_open(store):
    with open(store / RESIDENT, "r+b") as f:
        f.seek(4096 if os.path.getsize(store / RESIDENT) > 8192 else 200)
        f.write(b"\xa5" * 4096)
    with pytest.raises(StoreError, match="checksum mismatch in .*resident.safetensors"):
        Engine(store, progress=False)


def test_resident_replaced_by_another_size(store):
    with open(store / RESIDENT, "ab") as f:
        f.write(b"\0")
    with pytest.raises(StoreError, match="does not match the manifest"):
        Manifest.load(store)


def test_old_store_without_resident_checksum_warns_and_runs(store):
    edit_manifest(store, lambda d: [d.pop("resident_crc32"), d.pop("resident_size")] and None)
    with pytest.warns(UserWarning, match="predates resident checksums.*pack the model again"):
        m = Manifest.load(store)
    assert m.n_experts == 8


@pytest.mark.parametrize("name, fn, msg", [
    ("n_experts_null", _set("n_experts", None), "n_experts is None"),
    ("overlap", _overlap, "overlap"),
    ("list", lambda d: [d], "not an object"),
])
def test_cli_run_on_crafted_store_exit_2_one_line(store, name, fn, msg):
    edit_manifest(store, fn)
    assert_clean_error(cli("run", store, "--prompt-ids", "1,2"), msg)


def test_cli_run_on_flipped_resident(store):
    with open(store / RESIDENT, "r+b") as f:
        f.seek(300)
        f.write(b"\x00\xff" * 64)
    assert_clean_error(cli("run", store, "--prompt-ids", "1,2"), "checksum mismatch")


def test_float_width_is_the_checkpoints_not_the_configs(tiny, tmp_path):
    """A bf16 or fp16 checkpoint packs float tensors of that width: not a mismatch with the model."""
    _, src = tiny("qwen3_moe", None)
    store = copy_store(src, tmp_path / "s")

    def to_half(d):
        for t in d["tensors"]:
            assert t["dtype"] == "float32"
            t["dtype"], t["nbytes"] = "bfloat16", t["nbytes"] // 2
        size = sum(t["nbytes"] for t in d["tensors"])
        for b in d["blobs"]:
            b[3] = size
    edit_manifest(store, to_half)
    Manifest.load(store)  # shapes match the model; only the float width differs
    edit_manifest(store, _tensor("dtype", "int8"))
    with pytest.raises(StoreError):
        Manifest.load(store)


def test_a_real_bfloat16_checkpoint_packs_and_opens(tiny, tmp_path):
    import mlx.core as mx

    src, _ = tiny("qwen3_moe", None)
    model = tmp_path / "bf16"
    model.mkdir()
    shutil.copy(src / "config.json", model / "config.json")
    weights = mx.load(str(src / "model.safetensors"))
    mx.save_safetensors(str(model / "model.safetensors"), {k: v.astype(mx.bfloat16) for k, v in weights.items()})
    from workbench.store.pack import pack

    store = pack(model, tmp_path / "s", progress=False)
    assert {t.dtype for t in Manifest.load(store).tensors} == {"bfloat16"}
    with Engine(store, arena="0.5", progress=False) as eng:  # opens (MLX's CPU gather_mm runs float32 only)
        assert eng.m.n_experts == 8
