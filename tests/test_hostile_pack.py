"""Packing and the store cache: interrupted, raced, wrong targets, content keys, file modes, full disks."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.hostile_util import REPO, assert_clean_error
from workbench import fsutil
from workbench.fsutil import os_error_hint, temp_dir
from workbench.model import weight_files
from workbench.store import cache
from workbench.store.manifest import MANIFEST, StoreError
from workbench.store.pack import pack


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("WORKBENCH_CACHE", str(root))
    return root


# ---- targets ----------------------------------------------------------------------------

def test_pack_refuses_a_non_empty_dir_before_reading_anything(model_dir, tmp_path, monkeypatch):
    import workbench.store.pack as packmod

    target = tmp_path / "busy"
    target.mkdir()
    (target / "mine.txt").write_text("keep")
    monkeypatch.setattr(packmod, "load_mlx_model", lambda *a: pytest.fail("read the model before checking"))
    with pytest.raises(StoreError, match="not empty and holds no store"):
        pack(model_dir, target, progress=False)
    assert [p.name for p in target.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "model"]


def test_pack_refuses_the_model_dir_and_a_file(model_dir, tmp_path):
    with pytest.raises(StoreError, match="is the model directory itself"):
        pack(model_dir, model_dir, progress=False)
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreError, match="is a file"):
        pack(model_dir, tmp_path / "f", progress=False)


def test_pack_into_an_existing_store_and_an_empty_dir(model_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    out = pack(model_dir, tmp_path / "empty", progress=False)
    with pytest.raises(FileExistsError, match="already holds a store"):
        pack(model_dir, out, progress=False)
    assert pack(model_dir, out, progress=False, reuse=True) == out
    assert not list(tmp_path.glob(".*"))  # no lock file or temp folder left


def test_pack_says_where_and_how_large(model_dir, tmp_path, capsys):
    pack(model_dir, tmp_path / "s", progress=True)
    err = capsys.readouterr().err
    assert f"packing {model_dir} into {tmp_path / 's'} (about" in err and "GB)" in err


def test_pack_refuses_when_the_disk_has_no_room(model_dir, tmp_path, monkeypatch):
    import workbench.store.pack as packmod

    monkeypatch.setattr(packmod.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 100, 10))
    with pytest.raises(StoreError, match=r"needs about .* GB free; free space or set WORKBENCH_CACHE"):
        pack(model_dir, tmp_path / "s", progress=False)
    assert not (tmp_path / "s").exists()


# ---- content key --------------------------------------------------------------------------

def test_cache_key_follows_content_not_mtime(model_dir, tmp_path):
    key = cache.store_key(model_dir)
    for f in model_dir.iterdir():
        os.utime(f, ns=(1, 10**18))  # touched
    assert cache.store_key(model_dir) == key
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    assert cache.store_key(copy) == key
    weights = next(iter(weight_files(copy)))
    size = weights.stat().st_size
    with open(weights, "r+b") as f:  # same shapes, other values: another store
        f.seek(size - 100)
        f.write(os.urandom(64))
    assert cache.store_key(copy) != key
    cfg = json.loads((copy / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-6
    (copy / "config.json").write_text(json.dumps(cfg))
    assert cache.store_key(copy) != key


def test_damaged_safetensors_header_is_one_line(model_dir):
    weights = next(iter(weight_files(model_dir)))
    with open(weights, "r+b") as f:
        f.write((2**60).to_bytes(8, "little"))
    with pytest.raises(ValueError, match="header length .* does not fit the file"):
        cache.store_key(model_dir)


# ---- interrupted packers --------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from workbench.fsutil import TEMP_MARK, hold_lock, temp_dir
    tmp = temp_dir(".s.tmp-", Path(sys.argv[1]))
    (tmp / "experts.bin").write_bytes(b"partial")
    hold_lock(tmp / TEMP_MARK)
    print(tmp, flush=True)
    time.sleep(600)
""")


def _holder(parent):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(parent)], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    return p, Path(p.stdout.readline().strip())


def test_a_live_packers_folder_is_kept_a_dead_ones_removed(model_dir, tmp_path):
    p, tmp = _holder(tmp_path)
    try:
        assert tmp.is_dir() and not fsutil.is_stale(tmp)
        assert fsutil.clean_stale(tmp_path) == [] and tmp.is_dir()
    finally:
        p.kill()
        p.wait()
    assert fsutil.is_stale(tmp)
    unmarked = temp_dir(".s.tmp-", tmp_path)  # not a packer's folder: never touched
    pack(model_dir, tmp_path / "s", progress=False)
    assert not tmp.exists() and unmarked.is_dir()
    assert (tmp_path / "s" / MANIFEST).exists() and not (tmp_path / "s" / fsutil.TEMP_MARK).exists()


def test_cache_list_shows_and_rm_removes_a_dead_packers_folder(cache_env):
    root = cache_env / "stores"
    root.mkdir(parents=True)
    p, tmp = _holder(root)
    p.kill()
    p.wait()
    rows = cache.list_stores()
    assert [(r["name"], r["stale"]) for r in rows] == [(tmp.name, True)]
    cache.remove_store(tmp.name)
    assert not tmp.exists()
    (root / "user-dir").mkdir()
    with pytest.raises(ValueError, match="not a cached store"):
        cache.remove_store("user-dir")
    with pytest.raises(ValueError, match="no cached store"):
        cache.remove_store("../..")
    assert (root / "user-dir").is_dir()


def test_packing_into_the_cache_removes_every_dead_packers_folder(model_dir, cache_env):
    root = cache_env / "stores"
    root.mkdir(parents=True)
    p, tmp = _holder(root)  # a folder of another store name
    p.kill()
    p.wait()
    store = cache.resolve_store(model_dir, progress=False)
    assert not tmp.exists() and [x.name for x in root.iterdir()] == [store.name]


SLOW_PACK = textwrap.dedent("""
    import sys, time
    import workbench.store.pack as p
    real = p._write
    def slow(model, config, experts, out, progress):
        (out / "experts.bin").write_bytes(b"partial")
        print("packing", flush=True)
        time.sleep(600)
    p._write = slow
    p.pack(sys.argv[1], sys.argv[2], progress=False)
""")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_pack_leaves_a_folder_the_next_pack_removes(model_dir, tmp_path, sig):
    target = tmp_path / "out" / "s"
    p = subprocess.Popen([sys.executable, "-c", SLOW_PACK, str(model_dir), str(target)], stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.stdout.readline().strip() == "packing"
    os.kill(p.pid, sig)
    p.wait(timeout=60)
    left = list((tmp_path / "out").glob(".s.tmp-*"))
    assert len(left) == 1 and fsutil.is_stale(left[0])
    pack(model_dir, target, progress=False)
    assert not left[0].exists() and (target / MANIFEST).exists()


@pytest.mark.slow
def test_three_runs_packing_one_model_into_one_cache_all_succeed(model_dir, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), WORKBENCH_CACHE=str(tmp_path / "cache"))
    argv = [sys.executable, "-m", "workbench.cli", "run", str(model_dir), "--prompt-ids", "1,2,3", "--max-tokens", "3",
            "--json"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-500:] for o in outs]
    assert len({json.dumps(json.loads(o[0])["tokens"]) for o in outs}) == 1
    stores = list((tmp_path / "cache" / "stores").iterdir())
    assert len(stores) == 1 and (stores[0] / MANIFEST).exists()  # one store, no temp folder, no lock left


# ---- modes and hints ----------------------------------------------------------------------------

def test_store_trace_and_report_dirs_follow_the_umask(model_dir, tmp_path):
    from workbench.fsutil import atomic_write

    old = os.umask(0o022)
    try:
        store = pack(model_dir, tmp_path / "s", progress=False)
        atomic_write(tmp_path / "t.parquet", lambda tmp: Path(tmp).write_text("x"))
        rep = temp_dir(".r.tmp-", tmp_path)
    finally:
        os.umask(old)
    assert store.stat().st_mode & 0o777 == 0o755
    assert all(f.stat().st_mode & 0o777 == 0o644 for f in store.iterdir())
    assert (tmp_path / "t.parquet").stat().st_mode & 0o777 == 0o644
    assert rep.stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("code, needle", [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "cannot write there"),
                                          (errno.EACCES, "cannot write there")])
def test_os_error_hints_name_the_place_and_the_cache(code, needle, cache_env):
    msg = os_error_hint(OSError(code, os.strerror(code), "/somewhere/x"))
    assert needle in msg and "/somewhere/x" in msg and f"WORKBENCH_CACHE (now {cache_env})" in msg and "\n" not in msg


@pytest.mark.slow
def test_full_disk_during_pack_is_one_line_and_leaves_nothing(model_dir, tmp_path):
    """A real write failure mid-pack: a 64 KiB file-size limit (EFBIG, like a full disk)."""
    script = textwrap.dedent("""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        from workbench.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    r = subprocess.run([sys.executable, "-c", script, "pack", str(model_dir), str(tmp_path / "out" / "s")],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)
    assert_clean_error(r, "the disk is full", "WORKBENCH_CACHE")
    assert list((tmp_path / "out").iterdir()) == []


def test_cli_cache_commands(model_dir, cache_env, capsys):
    from workbench.cli import main

    assert main(["cache", "path"]) == 0 and capsys.readouterr().out.strip() == str(Path(cache_env) / "stores")
    assert main(["run", str(model_dir), "--prompt-ids", "1,2", "--max-tokens", "2", "--json"]) == 0
    capsys.readouterr()
    assert main(["cache", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0]["source"] == str(model_dir.resolve())
    for argv, needle in ((["cache", "rm", "nope"], "no cached store 'nope'"), (["cache", "rm"], "--all")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1
    assert main(["cache", "rm", rows[0]["name"]]) == 0
    capsys.readouterr()
    assert main(["cache", "list", "--json"]) == 0 and json.loads(capsys.readouterr().out) == []


def test_run_store_flag_packs_there_and_reuses(model_dir, tmp_path, cache_env, capsys):
    from workbench.cli import main

    for _ in range(2):
        assert main(["run", str(model_dir), "--store", str(tmp_path / "mystore"), "--prompt-ids", "1,2",
                     "--max-tokens", "2", "--json"]) == 0
    assert (tmp_path / "mystore" / MANIFEST).exists() and not cache_env.exists()
