"""Bad input gets one clear error naming the problem and the fix, and loses nothing."""

import json
import shutil

import pytest

from workbench.cli import main
from workbench.config import ArenaConfig, IOConfig
from workbench.engine.engine import Engine
from workbench.model import ModelError
from workbench.store.manifest import EXPERTS, MANIFEST, StoreError
from workbench.store.pack import pack


@pytest.fixture
def store_copy(tiny, tmp_path):
    _, store = tiny("qwen3_moe", 4)
    dst = tmp_path / "store"
    shutil.copytree(store, dst)
    return dst


def test_truncated_store(store_copy):
    with open(store_copy / EXPERTS, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(StoreError, match="truncated.*pack the model again"):
        Engine(store_copy, progress=False)


def test_missing_store_file(store_copy):
    (store_copy / "resident.safetensors").unlink()
    with pytest.raises(StoreError, match="missing resident.safetensors"):
        Engine(store_copy, progress=False)


def test_not_a_store(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        Engine.open(tmp_path, progress=False)


def test_checksum_mismatch_names_layer_and_expert(store_copy):
    m = json.loads((store_copy / MANIFEST).read_text())
    layer, expert, offset, size, _ = m["blobs"][3]
    with open(store_copy / EXPERTS, "r+b") as f:
        f.seek(offset + 10)
        f.write(b"\xff\x00\xff\x00")
    with pytest.raises(StoreError, match=f"checksum mismatch in layer {layer} expert {expert}"):
        Engine(store_copy, arena="1.0", io=IOConfig(verify="always"), progress=False)  # a full arena reads every blob at open
    with Engine(store_copy, arena=ArenaConfig("1.0", preload=False), io=IOConfig(verify="always"), progress=False) as eng:
        with pytest.raises(StoreError, match=f"checksum mismatch in layer {layer} expert {expert}"):
            for start in range(0, 120, 7):  # route until the corrupted expert is read
                eng.generate(list(range(start, start + 8)), max_tokens=4)
        # the engine stays usable and the arena consistent: no leaked pins or half-loaded slots
        assert not any(eng.arena.pinned)
        assert all(eng.arena.key_of[s] == k for k, s in eng.arena.smap.items())
        assert (layer * eng.m.n_experts + expert) not in eng.arena.smap


def test_manifest_from_another_model(tiny, tmp_path):
    _, a = tiny("qwen3_moe", 4)
    _, b = tiny("qwen3_moe", 4, hidden=128)
    mixed = tmp_path / "mixed"
    shutil.copytree(a, mixed)
    shutil.copy(b / MANIFEST, mixed / MANIFEST)
    with pytest.raises(StoreError, match="another model|does not match|truncated"):
        Engine(mixed, progress=False)


def test_arena_too_small(tiny):
    _, store = tiny("qwen3_moe", 4)
    with pytest.raises(ValueError, match="cannot hold one layer's 2 routed experts"):
        Engine(store, arena="1", progress=False)
    with pytest.raises(ValueError, match="cannot read arena size"):
        Engine(store, arena="lots", progress=False)


def test_unknown_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_family"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="not supported"):
        pack(tmp_path, tmp_path / "store", progress=False)


def test_dense_model_is_refused(tmp_path):
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    args = dict(model_type="llama", hidden_size=32, num_hidden_layers=1, intermediate_size=64, num_attention_heads=2,
                rms_norm_eps=1e-5, vocab_size=32, num_key_value_heads=2)
    model = llama.Model(llama.ModelArgs(**args))
    mx.save_safetensors(str(tmp_path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (tmp_path / "config.json").write_text(json.dumps(args))
    with pytest.raises(ModelError, match="no routed experts"):
        pack(tmp_path, tmp_path / "store", progress=False)
    assert not (tmp_path / "store").exists()


def test_failed_pack_leaves_nothing(tiny, tmp_path, monkeypatch):
    import workbench.store.pack as packmod

    model_dir, _ = tiny("mixtral", None)

    def boom(*a, **k):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(packmod.mx, "save_safetensors", boom)
    with pytest.raises(OSError, match="disk full"):
        pack(model_dir, tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli_errors_are_one_line(tiny, tmp_path, capsys):
    _, store = tiny("qwen3_moe", 4)
    cases = [
        (["run", str(store), "--prompt-ids", "1,2,999"], "outside the vocabulary"),
        (["run", str(store), "--prompt-ids", "1", "--arena", "1"], "cannot hold"),
        (["run", str(store), "--prompt-ids", "1", "--trace", str(tmp_path / "nope" / "t.parquet")], "folder"),
        (["run", str(store), "--prompt-ids", "1", "--policy", "nosuch"], "unknown policy"),
        (["run", str(tmp_path / "missing"), "--prompt-ids", "1"], "does not exist"),
    ]
    for argv, msg in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("argv", [["run", "-p", "hello", "--max-tokens", "1"], ["demo", "--no-report"]])
def test_no_reference_model_is_one_line_not_a_random_stand_in(argv, tmp_path, monkeypatch, capsys):
    """An install made apart from the checkout has no data/: the commands that default to the shipped
    model say so and how to fix it (exit 2), and build no random model in its place."""
    import workbench.data

    monkeypatch.setattr(workbench.data, "REFERENCE", tmp_path / "data" / "models" / "ref-moe")
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "reference model is not at" in err[0] and "pip install -e ." in err[0], err
    assert not (tmp_path / "cache").exists()
