"""kill -9 while a writer runs (synth-store, report, a trace or any atomic write) leaves a marked temp
the next run of that writer removes; files that only look alike are never touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from hostile_util import REPO, cli
from workbench import fsutil
from workbench.store.manifest import MANIFEST

KILLED = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import workbench.store.synth as synth
    from workbench import fsutil
    what, target = sys.argv[1], Path(sys.argv[2])

    def hang(*a, **k):
        print("writing", flush=True)
        time.sleep(600)

    if what == "synth-store":
        synth._random_expert = hang
        synth.synth_store(target, layers=2, experts=4, hidden=64, width=64, top_k=2, progress=False)
    elif what == "report":  # build_report's temp folder, as it holds it while notebooks run
        with fsutil.marked_temp_dir(target) as tmp:
            (tmp / "index.html").write_text("partial")
            hang()
    else:  # the trace writer's atomic write
        fsutil.atomic_write(target, lambda tmp: (Path(tmp).write_bytes(b"PAR1"), hang()))
""")


def _kill_while_writing(what, target) -> list[Path]:
    p = subprocess.Popen([sys.executable, "-c", KILLED, what, str(target)], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.stdout.readline().strip() == "writing"
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=60)
    left = sorted(Path(target).parent.glob(f".{Path(target).name}.tmp-*"))
    assert len(left) == 1 and fsutil.is_stale(left[0]), left
    return left


def test_killed_synth_store_is_cleaned_by_the_next(tmp_path):
    out = tmp_path / "syn"
    left = _kill_while_writing("synth-store", out)
    r = cli("synth-store", out, "--layers", 2, "--experts", 4, "--hidden", 64, "--expert-width", 64, "--top-k", 2)
    assert r.returncode == 0, r.stderr
    assert not left[0].exists() and (out / MANIFEST).exists() and not (out / fsutil.TEMP_MARK).exists()


def test_killed_report_folder_is_cleaned_by_the_next(tmp_path):
    out = tmp_path / "rep"
    left = _kill_while_writing("report", out)
    mine = tmp_path / f".{out.name}.tmp-notmine1"  # the user's, unmarked: kept
    mine.mkdir()
    with fsutil.marked_temp_dir(out) as tmp:
        assert not left[0].exists() and tmp.is_dir() and not fsutil.is_stale(tmp)
    assert mine.is_dir()


def test_killed_trace_write_is_cleaned_by_the_next(tmp_path):
    target = tmp_path / "t.parquet"
    left = _kill_while_writing("trace", target)
    user = tmp_path / ".t.parquet.tmp-notmine"  # not 8 characters after tmp-: not a temp of ours
    user.write_text("keep")
    fsutil.atomic_write(target, lambda tmp: Path(tmp).write_text("new"))
    assert not left[0].exists() and target.read_text() == "new" and user.read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == [user.name, "t.parquet"]


def test_a_live_writers_temp_file_is_kept(tmp_path):
    target = tmp_path / "x.csv"
    seen = []

    def write(tmp):
        Path(tmp).write_text("a")
        seen.append(fsutil.is_stale(Path(tmp)))  # locked while the writer runs
        fsutil.clean_stale(tmp_path)
        seen.append(Path(tmp).exists())

    fsutil.atomic_write(target, write)
    assert seen == [False, True] and target.read_text() == "a"
