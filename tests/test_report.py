"""workbench.report and workbench.viz (display, panels): parameters, HTML export, figures, panels, CLI."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import nbformat
import pytest

from workbench import report
from workbench.viz import controls as ui
from workbench.viz import display as wb
from workbench.viz.panel import panel
from workbench.viz.render import chart_spec, spec_rows


# --------------------------------------------------------------------------- parameters

def test_presets_and_files(tmp_path):
    assert report.load_params(None) == {"all": {}}
    small = report.load_params("small")
    assert small["all"]["small"] is True and small["00_quickstart"]["max_tokens"] > 0
    y = tmp_path / "p.yaml"
    y.write_text("preset: small\nseed: 3\n'01_unpert': {max_tokens: 4}\n")
    p = report.load_params(y)
    assert p["all"] == {"small": True, "seed": 3}
    assert p["01_unpert"]["max_tokens"] == 4
    j = tmp_path / "p.json"
    j.write_text(json.dumps({"all": {"max_tokens": 5}}))
    assert report.load_params(j)["all"]["max_tokens"] == 5


@pytest.mark.parametrize("text, match", [
    ("- a\n- b\n", "mapping"),
    ("preset: huge\n", "unknown preset"),
    ("'01_unpert': 3\n", "must be a mapping"),
    ("a: [\n", "cannot parse"),
])
def test_bad_params_file(tmp_path, text, match):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=match):
        report.load_params(f)


def test_missing_params_file_names_presets():
    with pytest.raises(ValueError, match="presets: full, small"):
        report.load_params("no/such/file.yaml")


def _nb(path: Path, params_src: str, body: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell(params_src)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {path.stem}"), cell, nbformat.v4.new_code_cell(body)]
    nbformat.write(nb, path)
    return path


CHART_BODY = textwrap.dedent("""
    import altair as alt, pandas as pd
    from workbench.viz import controls as ui, display as wb
    from workbench.viz.panel import panel
    wb.setup()
    df = pd.DataFrame({"x": list(range(n)), "y": [i * i for i in range(n)]})
    wb.show(alt.Chart(df, title="squares").mark_line().encode(x=alt.X("x:Q", title="x (count)"),
            y=alt.Y("y:Q", title="y (count²)")), "squares")
    display(panel(lambda n: alt.Chart(df.head(n), title=f"first {n}").mark_bar().encode(x="x:O", y="y:Q"),
             {"n": ui.slider("rows", 1, 10, value=n)}, name="bars"))
    if fail:
        raise RuntimeError("asked to fail")
""")


@pytest.fixture
def nbdir(tmp_path):
    d = tmp_path / "notebooks"
    d.mkdir()
    _nb(d / "00_alpha.ipynb", "n = 5\nfail = False", CHART_BODY)
    _nb(d / "01_beta.ipynb", "n = 3\nfail = False", CHART_BODY)
    return d


def test_only_and_strict_params(nbdir):
    assert [p.stem for p in report.list_notebooks("01", nbdir)] == ["01_beta"]
    assert [p.stem for p in report.list_notebooks(["00_alpha", "01"], nbdir)] == ["00_alpha", "01_beta"]
    with pytest.raises(ValueError, match="no notebook matches 07"):
        report.list_notebooks("07", nbdir)
    paths = report.list_notebooks(None, nbdir)
    report.check_params(paths, report.load_params({"all": {"n": 2}}))
    with pytest.raises(ValueError, match="'typo' is not a parameter"):
        report.check_params(paths, report.load_params({"typo": 1}))
    with pytest.raises(ValueError, match="not declared in its parameters cell; it declares: n, fail"):
        report.check_params(paths, report.load_params({"01": {"m": 1}}))
    assert report.params_for(paths[1], report.load_params({"all": {"n": 2}, "01_beta": {"n": 4}})) == {"n": 4}


def test_repo_notebooks_accept_the_small_preset():
    paths = report.list_notebooks()
    report.check_params(paths, report.load_params("small"))
    for p in paths:
        assert "small" in report.declared_parameters(p), f"{p.name} lacks the `small` parameter"


# --------------------------------------------------------------------------- html / charts

def test_remote_refs_detected():
    bad = ['<script src="https://cdn.x/vega.js"></script>', "<link rel=stylesheet href='http://a/b.css'>",
           "<style>@import url(https://fonts.x/f.css);</style>", "<img src=//cdn.x/a.png>",
           '<script>import("https://cdn.x/m.mjs")</script>']
    for b in bad:
        assert report.find_remote_refs(b), b
    ok = '<a href="https://github.com/x">a link is fine</a><script src="local.js"></script><img src="data:image/png;base64,AA">'
    assert report.find_remote_refs(ok) == []


def test_notebook_html_is_static_and_offline():
    import altair as alt
    import pandas as pd

    chart = alt.Chart(pd.DataFrame({"a": [1, 2]})).mark_bar().encode(x="a:Q")  # untitled: alt is its name
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb.cells.append(nbformat.v4.new_markdown_cell("# t\n\nmath $x^2$"))
    nb.cells.append(nbformat.v4.new_code_cell("x", outputs=[
        nbformat.v4.new_output("display_data", data=wb.chart_bundle(chart, "c")),
        nbformat.v4.new_output("display_data", data={"application/vnd.jupyter.widget-view+json":
                                                     {"model_id": "abc", "version_major": 2, "version_minor": 0},
                                                     "text/plain": "HBox()"}),
    ]))
    html = report.notebook_html(nb, banner="<div class='wb-banner'>B</div>")
    assert report.find_remote_refs(html) == []
    assert 'alt="c"' in html and "data:image/svg+xml;base64," in html and "wb-banner" in html
    assert "abc" not in html and "HBox()" not in html  # widget views dropped, no widget manager
    charts = report.extract_charts(nb)
    assert [c["name"] for c in charts] == ["c"] and spec_rows(charts[0]["spec"]) == 2


def test_chart_bundle_checks_name_and_rows():
    import altair as alt
    import pandas as pd

    with pytest.raises(ValueError, match="file-safe"):
        wb.chart_bundle(alt.Chart(pd.DataFrame({"a": [1]})).mark_point().encode(x="a:Q"), "bad name")
    big = alt.Chart(pd.DataFrame({"a": range(6000)})).mark_point().encode(x="a:Q")
    with pytest.warns(UserWarning, match="sampling"):  # render.py's transformer caps rows instead of failing
        b = wb.chart_bundle(big, "big")
    assert spec_rows(b[wb.CHART_MIME]["spec"]) == 5000


def test_extract_charts_makes_names_unique():
    spec = {"data": {"values": [{"a": 1}]}, "mark": "point"}
    out = lambda name: nbformat.v4.new_output("display_data", data={wb.CHART_MIME: {"name": name, "spec": spec}})
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("", outputs=[out("a"), out("a"), out("b")]))
    assert [c["name"] for c in report.extract_charts(nb)] == ["a", "a_2", "b"]


# --------------------------------------------------------------------------- panels

def test_panel_rerenders_on_control_change(monkeypatch):
    import altair as alt
    import pandas as pd

    monkeypatch.delenv(wb.STATIC_ENV, raising=False)
    seen = []

    def render(n, kind):
        seen.append((n, kind))
        return alt.Chart(pd.DataFrame({"x": range(n)})).mark_bar().encode(x="x:O")

    p = panel(render, {"n": ui.slider("n", 1, 9, value=3), "kind": ui.dropdown("kind", ["a", "b"])})
    p.update()
    p.controls["n"].value = 5
    p.controls["kind"].value = "b"
    assert seen == [(3, "a"), (5, "a"), (5, "b")] and p.renders == 3
    assert p.controls["n"].continuous_update is False  # expensive sliders update on release
    assert spec_rows(chart_spec(p.last)) == 5  # (the Output widget only captures inside a kernel)
    assert "n=5, kind=b" in p._status.value


def test_panel_shows_errors_instead_of_dying(monkeypatch):
    monkeypatch.delenv(wb.STATIC_ENV, raising=False)

    def render(n):
        raise ValueError(f"bad n {n}")

    p = panel(render, {"n": ui.slider("n", 1, 9, value=2)})
    p.update()
    assert p.last_error == "ValueError: bad n 2" and "bad n 2" in p._status.value


# --------------------------------------------------------------------------- end to end

def test_build_report_end_to_end(nbdir, tmp_path, monkeypatch):
    """Two notebooks in parallel: 00 is asked to fail, 01 runs with its own parameter; relative --out."""
    out = tmp_path / "rep"
    out.mkdir()
    (out / "stale.txt").write_text("old report")
    (out / report.MARK).write_text(json.dumps(["stale.txt"]))  # a previous report that wrote stale.txt
    monkeypatch.chdir(tmp_path)
    rep = report.build_report("rep", params={"00": {"fail": True}, "01_beta": {"n": 4}},
                              notebook_dir=nbdir.relative_to(tmp_path), progress=False, jobs=2)
    assert str(rep) == str(out) and Path.cwd() == tmp_path
    alpha, beta = rep.notebooks
    assert not rep.ok and not alpha.ok and "asked to fail" in alpha.error
    assert beta.ok, beta.error
    assert not (out / "stale.txt").exists()  # replaced as a whole
    assert not list(tmp_path.glob(".rep.*"))  # no temp dirs left
    index = (out / "index.html").read_text()
    assert "FAILED" in index and "00_alpha.html" in index and "figures/01_beta/squares.png" in index
    assert report.find_remote_refs(index) == []
    assert (out / "00_alpha.html").exists()  # the failed notebook's partial page is still written
    data = json.loads((out / "report.json").read_text())
    b = next(r for r in data["notebooks"] if r["name"] == "01_beta")
    assert b["parameters"] == {"n": 4}
    assert {c["name"] for c in b["charts"]} == {"squares", "bars"}
    assert next(c for c in b["charts"] if c["name"] == "squares")["rows"] == 4
    for c in b["charts"]:
        assert (out / c["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<svg" in (out / c["svg"]).read_text()
    page = (out / "01_beta.html").read_text()
    assert report.find_remote_refs(page) == [] and "this static run used" in page


def test_cli_parses_and_reports_bad_input(tmp_path, capsys):
    import argparse

    from workbench import cli_report

    parser = argparse.ArgumentParser(prog="workbench")
    cli_report.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", "--params", "small", "--out", "x", "--only", "01,05", "--jobs", "1"])
    assert (args.params, args.out, args.only, args.jobs, args.kernel) == ("small", "x", "01,05", 1, "python3")
    assert args.func is cli_report.run_report
    from workbench.cli import main

    rc = main(["report", "--only", "99", "--out", str(tmp_path / "r")])
    assert rc == 2 and "no notebook matches 99" in capsys.readouterr().err
