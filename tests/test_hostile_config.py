"""Damaged model configs: one line naming the file and the field, before anything is built."""

from __future__ import annotations

import json

import pytest

from tests.hostile_util import assert_clean_error, cli
from workbench.model import ModelError, load_config, validate_config
from workbench.store.pack import pack


def _write_cfg(model_dir, fn):
    p = model_dir / "config.json"
    cfg = json.loads(p.read_text())
    out = fn(cfg)
    p.write_text(json.dumps(cfg if out is None else out))


def _set(key, value):
    def fn(c):
        c[key] = value
    return fn


CONFIG_CASES = [
    ("list", lambda c: [c], "the config is a JSON list"),
    ("string", lambda c: "qwen3_moe", "the config is a JSON string"),
    ("vocab_0", _set("vocab_size", 0), "field 'vocab_size' is 0"),
    ("vocab_float", _set("vocab_size", 128.5), "field 'vocab_size' is 128.5"),
    ("vocab_bool", _set("vocab_size", True), "field 'vocab_size' is True"),
    ("hidden_2_31", _set("hidden_size", 2 ** 31), "field 'hidden_size' is 2147483648"),
    ("hidden_string", _set("hidden_size", "64"), "field 'hidden_size' is '64'"),
    ("hidden_null", _set("hidden_size", None), "field 'hidden_size' is None"),
    ("layers_100000", _set("num_hidden_layers", 100000), "field 'num_hidden_layers' is 100000"),
    ("topk_negative", _set("num_experts_per_tok", -2), "field 'num_experts_per_tok' is -2"),
    ("topk_zero", _set("num_experts_per_tok", 0), "field 'num_experts_per_tok' is 0"),
    ("topk_over_experts", _set("num_experts_per_tok", 9), "field 'num_experts_per_tok' is 9"),
    ("experts_0", _set("num_experts", 0), "field 'num_experts' is 0"),
    ("experts_huge", _set("num_experts", 10 ** 12), "field 'num_experts' is 1000000000000"),
    ("moe_width_negative", _set("moe_intermediate_size", -1), "field 'moe_intermediate_size' is -1"),
    ("heads_0", _set("num_attention_heads", 0), "field 'num_attention_heads' is 0"),
    ("model_type_null", _set("model_type", None), "field 'model_type' is None"),
    ("model_type_missing", lambda c: c.pop("model_type") and None, "field 'model_type' is missing"),
]


@pytest.mark.parametrize("name, fn, msg", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config_is_refused(model_dir, tmp_path, name, fn, msg):
    _write_cfg(model_dir, fn)
    with pytest.raises(ModelError) as e:
        load_config(model_dir)
    text = str(e.value)
    assert msg in text and str(model_dir / "config.json") in text and "\n" not in text
    with pytest.raises(ModelError):
        pack(model_dir, tmp_path / "store", progress=False)
    assert not (tmp_path / "store").exists()


def test_config_not_json(model_dir):
    (model_dir / "config.json").write_text("{'model_type': 'qwen3_moe'}")
    with pytest.raises(ModelError, match="is not valid JSON"):
        load_config(model_dir)
    (model_dir / "config.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ModelError, match="is not UTF-8 text .*restore the model's config.json"):
        load_config(model_dir)


def test_missing_args_of_the_family_are_one_line(model_dir, tmp_path):
    _write_cfg(model_dir, lambda c: c.pop("hidden_size") and None)
    with pytest.raises(ModelError, match="cannot build a qwen3_moe model"):
        pack(model_dir, tmp_path / "store", progress=False)


def test_valid_config_passes_unchanged(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    assert validate_config(cfg, "x")["hidden_size"] == cfg["hidden_size"]


@pytest.mark.parametrize("fn, msg", [(lambda c: [c], "JSON list"), (_set("hidden_size", 2 ** 31), "hidden_size"),
                                     (_set("num_experts_per_tok", -2), "num_experts_per_tok")])
def test_cli_pack_and_run_bad_config_exit_2(model_dir, tmp_path, monkeypatch, capsys, fn, msg):
    from workbench.cli import main

    _write_cfg(model_dir, fn)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "c"))
    for argv in (["pack", str(model_dir), str(tmp_path / "s")], ["run", str(model_dir), "--prompt-ids", "1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and "config.json" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "s").exists() and not (tmp_path / "c").exists()


def test_cli_subprocess_bad_config(model_dir, tmp_path):
    _write_cfg(model_dir, _set("num_hidden_layers", 100000))
    assert_clean_error(cli("pack", model_dir, tmp_path / "s"), "num_hidden_layers", "config.json")
