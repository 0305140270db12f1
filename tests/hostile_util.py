"""Helpers for the hostile-input tests: damaged copies of tiny stores, the CLI in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from workbench.model import config_hash
from workbench.store.manifest import MANIFEST

REPO = Path(__file__).resolve().parent.parent


def copy_store(src, dst) -> Path:
    shutil.copytree(src, dst)
    return Path(dst)


def edit_manifest(store, fn, rehash=False) -> None:
    """Apply ``fn(data)`` to the manifest (may return a replacement); ``rehash`` keeps config_hash valid."""
    p = Path(store) / MANIFEST
    data = json.loads(p.read_text())
    out = fn(data)
    data = data if out is None else out
    if rehash and isinstance(data, dict):
        data["config_hash"] = config_hash(data["config"])
    p.write_text(json.dumps(data))


def cli(*argv, env=None, cwd=None, timeout=300):
    """Run ``python -m workbench.cli ARGV`` -> CompletedProcess (text)."""
    e = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "workbench.cli", *map(str, argv)], capture_output=True,
                          text=True, timeout=timeout, env=e, cwd=cwd or REPO)


def assert_clean_error(r, *needles):
    """Exit 2, no traceback, the error one line (the last; progress lines before it are allowed),
    every needle in it."""
    err = r.stderr.strip()
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    progress = [ln for ln in lines[:-1] if ln.startswith("packing ") or "|" in ln]
    assert r.returncode == 2, (r.returncode, err)
    assert "Traceback" not in err and lines and len(progress) == len(lines) - 1, err
    for n in needles:
        assert n in lines[-1], err


def interrupt_reads_at(monkeypatch, call: int) -> None:
    """Ctrl-C inside the I/O scheduler: its ``call``-th ``time.perf_counter_ns`` raises KeyboardInterrupt
    (``submit_many`` takes one, then each read one at its start and one at its end)."""
    import time

    import workbench.io.scheduler as sched

    calls = {"n": 0}

    class Clock:
        @staticmethod
        def perf_counter_ns():
            calls["n"] += 1
            if calls["n"] == call:
                raise KeyboardInterrupt
            return time.perf_counter_ns()

    monkeypatch.setattr(sched, "time", Clock)


# The CLI in a child the tests send Ctrl-C: Ctrl-C raises KeyboardInterrupt there whatever the test run
# inherited (a script's background job starts with SIGINT ignored, and so would the child)
CLI_CTRL_C = [sys.executable, "-c", "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "runpy.run_module('workbench.cli', run_name='__main__', alter_sys=True)"]
