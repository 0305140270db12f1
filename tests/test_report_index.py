"""The report index people read: question, headline and caveat per notebook, folded code and
figures, a banner on reduced-preset reports, and no kernel transport warnings on stderr."""

import nbformat
import pytest

from workbench import report
from workbench.viz.headline import HEADLINE_MIME, headline_bundle

BODY = """
from workbench.viz.headline import headline
print("computed", n * 2)
if with_headline:
    headline("How many squares fit?", f"{n * n} squares", "one run, no repeats", uncertainty="± 0 (exact)")
"""


def _nb(path, with_headline):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell(f"n = 3\nsmall = False\nwith_headline = {with_headline}")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {path.stem[:2]} · What does {path.stem} measure?\n\ntext"),
                params, nbformat.v4.new_code_cell(BODY)]
    nbformat.write(nb, path)


def test_headline_bundle_validates_and_records():
    b = headline_bundle("Q?", "42%", "small sample", "± 3 pts")
    assert b[HEADLINE_MIME] == {"question": "Q?", "value": "42%", "uncertainty": "± 3 pts", "caveat": "small sample"}
    assert "42%" in b["text/html"] and "Caveat" in b["text/plain"]
    with pytest.raises(ValueError, match="non-empty caveat"):
        headline_bundle("Q?", "42%", "")


def test_reduced_preset_is_named():
    assert report.reduced_preset("small", {}) == "small"
    assert report.reduced_preset(None, report.load_params("small")) == "small"
    assert report.reduced_preset("full", report.load_params("full")) is None
    assert report.reduced_preset(None, {"all": {}}) is None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("idx")
    nbdir = root / "notebooks"
    nbdir.mkdir()
    _nb(nbdir / "00_alpha.ipynb", True)
    _nb(nbdir / "01_beta.ipynb", False)
    return root, report.build_report(root / "rep", preset="small", notebook_dir=nbdir, progress=False, jobs=2)


def test_index_shows_question_headline_and_caveat(built):
    root, rep = built
    assert rep.ok and rep.preset == "small"
    index = (root / "rep" / "index.html").read_text()
    assert "How many squares fit?" in index and "9 squares" in index and "± 0 (exact)" in index
    assert "one run, no repeats" in index
    assert "What does 01_beta measure?" in index and "no headline recorded" in index  # fallback: the title
    assert "Reduced preset" in index and "workbench report --params full" in index
    assert index.index("9 squares") < index.index("figure(s)</summary>")  # figures folded below


def test_pages_fold_code_and_carry_the_reduced_banner(built):
    root, _ = built
    page = (root / "rep" / "00_alpha.html").read_text()
    assert '<details class="wb-code"><summary>code</summary>' in page
    assert "computed 6" in page  # outputs stay visible
    assert "Reduced preset" in page
    assert report.find_remote_refs(page) == []


def test_kernel_transport_warning_is_silenced(tmp_path, capfd):
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _nb(nbdir / "00_alpha.ipynb", False)
    capfd.readouterr()
    rep = report.build_report(tmp_path / "rep", notebook_dir=nbdir, progress=False, jobs=1)
    assert rep.ok and rep.preset is None
    assert "without encryption" not in capfd.readouterr().err
    assert "Reduced preset" not in (tmp_path / "rep" / "index.html").read_text()
