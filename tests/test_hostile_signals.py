"""Interruptions (slow group, CI runs it): Ctrl-C and SIGTERM during a run leave no trace file behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.hostile_util import CLI_CTRL_C, REPO


def _start_run(store, trace):
    argv = [*CLI_CTRL_C, "run", str(store), "--prompt-ids", "1,2,3", "--max-tokens", "100000",
            "--arena", "4", "--trace", str(trace)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO)))
    seen = b""
    deadline = time.time() + 120
    while b"decode" not in seen and time.time() < deadline:  # the progress bar: decoding has started
        chunk = os.read(p.stderr.fileno(), 256)
        if not chunk:
            break
        seen += chunk
    assert b"decode" in seen, seen
    time.sleep(0.5)
    return p


@pytest.mark.slow
@pytest.mark.parametrize("sig, rc", [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)])
def test_interrupted_run_writes_no_trace(tiny, tmp_path, sig, rc):
    _, store = tiny("qwen3_moe", 4)
    trace = tmp_path / "run.parquet"
    p = _start_run(store, trace)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == rc
    assert b"Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no trace, no temp file
