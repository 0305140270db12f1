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
from workbench.viz.palette import MIN_CONTRAST, contrast
from workbench.viz.units import axes_without_unit, field_titled_axes

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
        assert field_titled_axes(spec["spec"]) == [], f"{name}/{c['name']}: an axis titled by a field name"
        assert close_series(spec["spec"]) == [], f"{name}/{c['name']}: series too alike in colour"
        assert (out / c["png"]).read_bytes()[:4] == b"\x89PNG"
        assert "<svg" in (out / c["svg"]).read_text()[:500]
        json.loads((out / c["spec"]).read_text())
    titles = [c["title"] for c in res.charts]
    assert len(set(titles)) == len(titles), f"{name} repeats a chart title: {titles}"
    page = (out / res.page).read_text()
    assert report.find_remote_refs(page) == []
    assert "Traceback" not in page and "Error loading script" not in page


def close_series(spec) -> list:
    """Pairs of one colour scale's series whose colours differ by less than MIN_CONTRAST."""
    from workbench.viz.render import spec_nodes

    close = []
    for node in spec_nodes(spec):
        scale = (node.get("encoding", {}).get("color") or {}).get("scale") or {}
        domain, colours = scale.get("domain") or [], scale.get("range") or []
        if isinstance(colours, list) and len(domain) <= 10:
            pairs = list(zip(domain, colours))
            close += [(a, b) for i, (a, ca) in enumerate(pairs) for b, cb in pairs[i + 1:] if contrast(ca, cb) < MIN_CONTRAST]
    return close


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


def _promised(source: str) -> tuple[int, int]:
    """(tables, charts) a cell shows unconditionally: its top-level ``wb.show_table(...)`` and
    ``wb.show(...)`` statements."""
    try:
        body = ast.parse(source).body
    except SyntaxError:  # cell magics
        return 0, 0
    calls = [s.value.func for s in body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
    names = [f.attr for f in calls if isinstance(f, ast.Attribute) and getattr(f.value, "id", None) == "wb"]
    return names.count("show_table"), names.count("show")


@pytest.mark.parametrize("name", EXPECTED)
def test_every_promised_table_and_chart_is_on_the_page(small_report, name):
    """A table or chart the notebook shows is in its cell's output and on the exported page (a styled
    table that is not a cell's last value is shown by nobody unless displayed)."""
    import re

    out, rep = small_report
    res = next(r for r in rep.notebooks if r.name == name)
    nb = nbformat.read(out / res.notebook, as_version=4)
    page = (out / res.page).read_text()
    promised_tables = 0
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        tables, charts = _promised(cell.source)
        promised_tables += tables
        html_out = [str((o.get("data") or {}).get("text/html", "")) for o in cell.get("outputs", [])]
        shown = sum("<table" in h for h in html_out)
        drawn = sum(report.CHART_MIME in (o.get("data") or {}) for o in cell.get("outputs", []))
        assert shown >= tables, f"{name} code cell {i}: {tables} tables promised, {shown} shown"
        assert drawn >= charts, f"{name} code cell {i}: {charts} charts promised, {drawn} drawn"
        for h in html_out:
            for caption in re.findall(r"<caption>(.*?)</caption>", h, re.S):
                assert caption.strip() in page, f"{name}: table {caption.strip()[:60]!r} is not on the page"
    assert page.count("<table") >= promised_tables


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_table_is_built_and_dropped(path):
    """A bare ``wb.table(...)`` statement builds a table Jupyter shows only as a cell's last value:
    notebooks display tables with ``wb.show_table`` (``wb.table`` is for a panel's return value)."""
    import jupytext

    for cell in jupytext.read(path.with_suffix(".py")).cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                f = node.value.func
                assert not (isinstance(f, ast.Attribute) and f.attr == "table"), \
                    f"{path.name}: `{ast.unparse(node)[:60]}` is never shown; use wb.show_table"
