"""`report --out` / `demo --out` never delete what the report did not write."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workbench import report
from tests.test_report import CHART_BODY, _nb


@pytest.fixture
def failing_nbdir(tmp_path):
    d = tmp_path / "notebooks"
    d.mkdir()
    _nb(d / "00_alpha.ipynb", "n = 2\nfail = True", CHART_BODY)
    return d


def _user_dir(tmp_path):
    d = tmp_path / "d"
    (d / "src").mkdir(parents=True)
    (d / "thesis.tex").write_text("keep")
    (d / "src" / "a.py").write_text("keep")
    return d


def test_non_empty_unmarked_dir_is_refused_before_anything_runs(tmp_path, failing_nbdir):
    d = _user_dir(tmp_path)
    with pytest.raises(ValueError, match="not empty and is not a workbench report.*nothing was written"):
        report.build_report(d, notebook_dir=failing_nbdir, progress=False)
    assert (d / "thesis.tex").read_text() == "keep" and (d / "src" / "a.py").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "notebooks"]  # no temp dir left


def test_file_as_out_is_refused(tmp_path):
    f = tmp_path / "f"
    f.write_text("keep")
    with pytest.raises(ValueError, match="is a file"):
        report.check_out(f)
    assert f.read_text() == "keep"


def test_previous_report_with_a_user_file_is_refused(tmp_path):
    d = tmp_path / "rep"
    d.mkdir()
    (d / "index.html").write_text("old")
    (d / report.MARK).write_text(json.dumps(["index.html"]))
    assert report.check_out(d) == d.resolve()
    (d / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="did not write.*notes.txt"):
        report.check_out(d)
    (d / report.MARK).write_text("{broken")
    with pytest.raises(ValueError, match="unreadable"):
        report.check_out(d)


def test_empty_dir_is_fine(tmp_path):
    (tmp_path / "e").mkdir()
    assert report.check_out(tmp_path / "e") == (tmp_path / "e").resolve()


def test_failed_report_leaves_the_old_one_in_place(tmp_path, failing_nbdir):
    d = tmp_path / "rep"
    d.mkdir()
    (d / "index.html").write_text("old report")
    (d / report.MARK).write_text(json.dumps(["index.html"]))
    rep = report.build_report(d, notebook_dir=failing_nbdir, progress=False, jobs=1)
    assert not rep.ok and not rep.published
    assert (d / "index.html").read_text() == "old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notebooks", "rep"]


def test_cli_refuses_user_dir_exit_2_one_line(tmp_path):
    d = _user_dir(tmp_path)
    for argv in (["report", "--out", str(d), "--only", "00"], ["demo", "--out", str(d)]):
        r = subprocess.run([sys.executable, "-m", "workbench.cli", *argv], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert "not a workbench report" in r.stderr
    assert (d / "thesis.tex").read_text() == "keep" and (d / "src" / "a.py").exists()


def test_report_from_before_the_mark_is_recognised_by_its_report_json(tmp_path):
    d = tmp_path / "latest"
    (d / "notebooks").mkdir(parents=True)
    nb = {"page": "00_a.html", "notebook": "notebooks/00_a.ipynb",
          "charts": [{"svg": "figures/00_a/c.svg", "png": "figures/00_a/c.png", "spec": "figures/00_a/c.vl.json"}]}
    (d / "report.json").write_text(json.dumps({"notebooks": [nb]}))
    for f in ("index.html", "00_a.html", "notebooks/00_a.ipynb", "figures/00_a/c.svg"):
        (d / f).parent.mkdir(parents=True, exist_ok=True)
        (d / f).write_text("x")
    assert report.check_out(d) == d.resolve()
    (d / "thesis.tex").write_text("mine")
    with pytest.raises(ValueError, match="did not write.*thesis.tex"):
        report.check_out(d)
