"""Every notebook: paired with its py:percent script, declares papermill parameters, and runs
headless with the ``small`` preset (through ``workbench.report``), producing charts with data.

The run is one report build (notebooks two at a time); its timings are printed.
"""

from __future__ import annotations

import ast
import html
import json
import time

import nbformat
import pytest

from workbench import report
from workbench.viz.render import spec_rows
from workbench.viz.units import axes_without_unit

NB_DIR = report.NOTEBOOK_DIR
NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
EXPECTED = ["00_quickstart", "01_unpert", "02_lookahead", "03_cosine", "04_gates", "05_mtp_union",
            "06_policies", "07_read_path", "08_ledger", "09_sweep"]


def test_all_notebooks_present():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_paired_clean_and_parameterized(path):
    import jupytext

    script = path.with_suffix(".py")
    assert script.exists(), f"{script.name} missing: run `jupytext --sync {path}`"
    nb, py = nbformat.read(path, as_version=4), jupytext.read(script)
    strip = lambda cells: [(c.cell_type, c.source.strip()) for c in cells]
    assert strip(nb.cells) == strip(py.cells), f"{path.name} and {script.name} differ: run `jupytext --sync {path}`"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path.name} is committed with outputs"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name} needs exactly one cell tagged `parameters`"
    assigned = [n.targets[0].id for n in ast.parse(tagged[0].source).body if isinstance(n, ast.Assign)]
    declared = report.declared_parameters(path)
    assert list(declared) == assigned, f"papermill could not parse some parameters of {path.name} (avoid '=' in comments)"
    assert "small" in declared
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith(f"# {path.stem[:2]} ·")


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "small"
    t0 = time.perf_counter()
    rep = report.build_report(out, params="small", progress=False)
    wall = time.perf_counter() - t0
    print(f"\nsmall report: {wall:.1f} s wall for {len(rep.notebooks)} notebooks")
    for r in rep.notebooks:
        print(f"  {r.name:<16} {r.seconds:6.1f} s  {len(r.charts)} charts  {'ok' if r.ok else r.error}")
    return out, rep


def test_small_report_runs_every_notebook(small_report):
    out, rep = small_report
    failed = {r.name: r.error for r in rep.notebooks if not r.ok}
    assert not failed, f"notebooks failed: {failed} (pages in {out})"
    assert [r.name for r in rep.notebooks] == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_charts_have_data(small_report, name):
    out, rep = small_report
    res = next(r for r in rep.notebooks if r.name == name)
    assert res.charts, f"{name} registered no chart (use workbench.viz.display.show or a panel)"
    nb = nbformat.read(out / res.notebook, as_version=4)
    specs = report.extract_charts(nb)
    assert [c["name"] for c in specs] == [c["name"] for c in res.charts]
    for c, spec in zip(res.charts, specs):
        assert c["rows"] > 0 and spec_rows(spec["spec"]) == c["rows"], f"{name}/{c['name']} has no data"
        assert spec["title"], f"{name}/{c['name']} has no title"
        assert axes_without_unit(spec["spec"]) == [], f"{name}/{c['name']}: axes without a unit"
        assert (out / c["png"]).read_bytes()[:4] == b"\x89PNG"
        assert "<svg" in (out / c["svg"]).read_text()[:500]
        json.loads((out / c["spec"]).read_text())
    titles = [c["title"] for c in res.charts]
    assert len(set(titles)) == len(titles), f"{name} repeats a chart title: {titles}"
    page = (out / res.page).read_text()
    assert report.find_remote_refs(page) == []
    assert "Traceback" not in page and "Error loading script" not in page


def test_index_shows_every_headline(small_report):
    out, rep = small_report
    index = (out / "index.html").read_text()
    assert "no headline recorded" not in index
    for r in rep.notebooks:
        h = r.headline
        assert h.get("value") and h.get("uncertainty") and h.get("caveat"), f"{r.name} records no full headline: {h}"
        assert html.escape(h["question"]) in index


def test_index_links_everything(small_report):
    out, rep = small_report
    index = (out / "index.html").read_text()
    assert report.find_remote_refs(index) == []
    for r in rep.notebooks:
        assert f"href='{r.page}'" in index
        for c in r.charts:
            assert c["png"] in index and c["svg"] in index
