"""Damaged or odd files and places, each refused with one line naming the file (or variable) and the fix:
a FIFO or /dev/zero as manifest.json or config.json, a truncated tokenizer, WORKBENCH_CACHE a file or
read-only, export OUT a folder, cache rm of a symlinked store, synth-store shapes, report values, ledger --model."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from hostile_util import REPO, assert_clean_error, cli
from workbench import report
from workbench.cli import main
from workbench.model import ModelError, load_config
from workbench.store.manifest import Manifest, StoreError
from workbench.store.pack import pack


@pytest.fixture(scope="module")
def ref_store(tmp_path_factory):
    return pack(REPO / "data" / "models" / "ref-moe", tmp_path_factory.mktemp("ref") / "s", progress=False)


def _copy(store, tmp_path, name="s"):
    return shutil.copytree(store, tmp_path / name)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_manifest_as_a_fifo_or_dev_zero(tiny, tmp_path, kind):
    s = _copy(tiny("qwen3_moe", 4)[1], tmp_path)
    (s / "manifest.json").unlink()
    os.mkfifo(s / "manifest.json") if kind == "fifo" else os.symlink("/dev/zero", s / "manifest.json")
    words = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
    with pytest.raises(StoreError, match=re.escape(f"manifest.json is {words}, not a regular file; delete the store")):
        Manifest.load(s)  # returns at once: never opened, never read
    assert_clean_error(cli("run", s, "--prompt-ids", "1,2", "--max-tokens", 1, timeout=60), words)


def test_config_as_a_fifo(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    os.mkfifo(d / "config.json")
    with pytest.raises(ModelError, match="config.json is a FIFO"):
        load_config(d)


def test_a_damaged_tokenizer_names_its_store(ref_store, tmp_path, capsys):
    s = _copy(ref_store, tmp_path)
    data = (s / "tokenizer.json").read_bytes()
    (s / "tokenizer.json").write_bytes(data[: len(data) // 2])
    assert main(["run", str(s), "-p", "def f(", "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"workbench: error: the tokenizer of store {s} cannot be loaded") and "pack the model" in err
    (s / "config.json").unlink()
    os.mkfifo(s / "config.json")  # mlx-lm's tokenizer loader reads it: it would block
    assert main(["run", str(s), "-p", "def f(", "--max-tokens", "1"]) == 2
    assert "config.json is a FIFO" in capsys.readouterr().err


def test_workbench_cache_a_file_or_read_only(tmp_path, monkeypatch, capsys):
    f = tmp_path / "cachefile"
    f.write_text("")
    monkeypatch.setenv("WORKBENCH_CACHE", str(f))
    for argv in (["run", str(REPO / "data" / "models" / "ref-moe"), "-p", "x"], ["cache", "list"]):
        assert main(argv) == 2
        assert f"WORKBENCH_CACHE {f} is a file, not a folder; set WORKBENCH_CACHE to a folder" in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        monkeypatch.setenv("WORKBENCH_CACHE", str(ro))
        assert main(["run", str(REPO / "data" / "models" / "ref-moe"), "-p", "x"]) == 2
        assert "is not writable; set WORKBENCH_CACHE to a writable folder" in capsys.readouterr().err


def test_cache_rm_of_a_symlinked_store_removes_the_link_only(tiny, tmp_path, monkeypatch, capsys):
    store = _copy(tiny("qwen3_moe", 4)[1], tmp_path)
    root = tmp_path / "cache" / "stores"
    root.mkdir(parents=True)
    os.symlink(store, root / "linked")
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    assert main(["cache", "rm", "--all"]) == 0
    assert not (root / "linked").exists() and (store / "manifest.json").is_file()


def test_export_to_a_folder(tiny, tmp_path):
    from workbench.engine.engine import Engine
    from workbench.trace.recorder import TraceRecorder

    with Engine(tiny("qwen3_moe", 4)[1], progress=False) as eng:
        eng.generate([1, 2, 3], max_tokens=2, trace=TraceRecorder(tmp_path / "t.parquet"))
    r = cli("export", tmp_path / "t.parquet", "--format", "csv", tmp_path, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"OUT {tmp_path} is a directory" in r.stderr and sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]


@pytest.mark.parametrize("flags, needle", [
    (["--hidden", 100], "--hidden 100 is not a multiple of the quantization group 64"),
    (["--top-k", 9], "--top-k 9 is larger than the 4 experts per layer (--experts); give --top-k 4 or less"),
    (["--layers", 0], "--layers 0 is out of range"),
])
def test_synth_store_shapes_name_the_flag(tmp_path, capsys, flags, needle):
    shape = {"--layers": 2, "--experts": 4, "--hidden": 64, "--expert-width": 64, "--top-k": 2}
    shape.update(dict(zip(flags[::2], flags[1::2])))
    argv = ["synth-store", str(tmp_path / "o")] + [str(x) for kv in shape.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and not (tmp_path / "o").exists(), err


@pytest.mark.parametrize("kw, needle", [
    ({"jobs": -1}, "--jobs -1 is out of range: give a value >= 1"),
    ({"timeout": -5}, "--timeout -5 is out of range: give a value >= 1"),
])
def test_report_values_are_refused_before_any_notebook_runs(tmp_path, kw, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        report.build_report(out=tmp_path / "r", **kw)
    assert not (tmp_path / "r").exists()


def test_report_params_not_a_mapping_and_out_not_writable(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="top level must be a mapping"):
        report.load_params(p)
    os.mkfifo(tmp_path / "fifo.yaml")
    with pytest.raises(ValueError, match="--params .*fifo.yaml is a FIFO"):
        report.load_params(tmp_path / "fifo.yaml")
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(ValueError, match="--out .*is not writable"):
            report.check_out(ro / "rep")


def test_ledger_model_a_store(tiny, capsys):
    store = tiny("qwen3_moe", 4)[1]
    assert main(["ledger", "--model", str(store), "--small", "--no-live"]) == 2
    assert f"--model {store} is a workbench store; the ledger also runs the model resident" in capsys.readouterr().err
