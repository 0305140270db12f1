"""The validation layer (workbench.checks): numbers from text, choices, and paths checked before they are opened."""

from __future__ import annotations

import os
import stat

import pytest

from workbench import checks


def test_numbers_from_text():
    assert checks.parse_whole("--lookahead", " 3 ", 1) == 3
    for bad in ("x", "2.5", True, None, "two"):
        with pytest.raises(ValueError, match="--lookahead must be a whole number"):
            checks.parse_whole("--lookahead", bad, 1)
    with pytest.raises(ValueError, match=r"--workers 0 is out of range: give a value >= 1"):
        checks.parse_whole("--workers", "0", 1)
    for bad in ("nan", "inf", "-inf"):
        with pytest.raises(ValueError, match="--temp must be a finite number"):
            checks.real("--temp", bad, 0)
    with pytest.raises(ValueError, match=r"--seed 1180591620717411303424 is out of range"):
        checks.whole("--seed", 2**70, 0, 2**64 - 1)
    with pytest.raises(ValueError, match="--policy 'nosuch' is not known; give one of lru, fifo"):
        checks.one_of("--policy", "nosuch", ("lru", "fifo"))


def test_input_file(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("héllo")
    assert checks.read_text("--hotlist", f) == "héllo"
    assert checks.read_text("--hotlist", os.symlink(f, tmp_path / "ln") or tmp_path / "ln") == "héllo"
    with pytest.raises(ValueError, match="--hotlist .*missing does not exist"):
        checks.input_file("--hotlist", tmp_path / "missing")
    with pytest.raises(ValueError, match="is a directory, not a regular file"):
        checks.input_file("--hotlist", tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"manifest .*fifo is a FIFO \(named pipe\), not a regular file"):
        checks.read_bytes("manifest", fifo)  # returns at once: never opened
    with pytest.raises(ValueError, match="is a character device"):
        checks.read_bytes("manifest", "/dev/zero")
    with pytest.raises(ValueError, match="more than the 3 a file of its kind may be"):
        checks.read_bytes("manifest", f, max_bytes=3)
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        checks.read_text("--grid", tmp_path / "bin")
    if os.geteuid() != 0:
        f.chmod(0)
        with pytest.raises(ValueError, match="not readable"):
            checks.input_file("--hotlist", f)


def test_read_json(tmp_path):
    f = tmp_path / "c.json"
    f.write_text('{"a": 1}')
    assert checks.read_json("config", f, fix="restore it") == {"a": 1}
    f.write_text('{"a": ')
    with pytest.raises(ValueError, match=r"config .*c.json is corrupt: it is not valid JSON \(.*\); restore it$"):
        checks.read_json("config", f, fix="restore it")


def test_output_paths(tmp_path):
    assert checks.output_file("--trace", tmp_path / "new" / "t.parquet") == tmp_path / "new" / "t.parquet"
    with pytest.raises(ValueError, match="--trace .* is a directory"):
        checks.output_file("--trace", tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        checks.output_file("OUT", tmp_path / "file" / "t.csv")
    with pytest.raises(ValueError, match="--out .*file is a file, not a folder"):
        checks.output_dir("--out", tmp_path / "file")
    assert checks.output_dir("--out", tmp_path / "a" / "b") == tmp_path / "a" / "b"
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
        with pytest.raises(ValueError, match="is not writable"):
            checks.output_dir("--out", ro)
        with pytest.raises(ValueError, match="folder .*ro is not writable"):
            checks.output_file("--trace", ro / "t.parquet")
        ro.chmod(0o700)
