"""Static reports: execute the notebooks with papermill, export pages and figures.

``build_report(out, params=..., only=...)`` runs every ``notebooks/NN_*.ipynb`` headless
(papermill, kernel named explicitly), then writes into ``out``::

    index.html                    per notebook: question, headline number, caveat, status; figures folded
    report.json                   the same, machine readable
    <nb>.html                     static page (nbconvert, no widget state, nothing remote)
    notebooks/<nb>.ipynb          the executed notebook
    figures/<nb>/<chart>.svg|png  every chart the notebook registered (vl-convert)
    figures/<nb>/<chart>.vl.json  its Vega-Lite spec, data inlined

Charts are found through ``workbench.viz.display.show`` which records each chart's
Vega-Lite spec in the cell output (``CHART_MIME``). The kernel runs with
``WORKBENCH_STATIC=1`` so live panels render once, straight into the cell output.

The output directory is built in a temporary sibling and renamed into place, so a reader
never sees a half-written report. ``out`` must be new, empty, or a previous report (marked by
``.workbench-report``, the list of files it wrote); anything else is refused before a notebook
runs, so nothing a user wrote is ever deleted. When every notebook fails, the previous report
stays in place. Parameters: ``params`` is a preset name (``"small"``,
``"full"``), a YAML/JSON file, or a dict. A file may name a preset to start from
(``preset: small``); ``all:`` holds parameters for every notebook that declares them and
a section named after a notebook (``01_unpert:`` or ``"01":``) holds that notebook's.
Any other top-level key is treated like a key under ``all``.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import html
import json
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from workbench.checks import output_dir, read_text, whole
from workbench.fsutil import marked_temp_dir, unmark
from workbench.viz.headline import HEADLINE_MIME
from workbench.viz.display import CHART_MIME, STATIC_ENV
from workbench.viz.render import spec_rows, spec_to_png, spec_to_svg

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO / "notebooks"
DEFAULT_KERNEL = "python3"
DEFAULT_OUT = REPO / "reports" / "latest"
# The kernel's own log is not the notebook's output (untouched; a failing cell or a dead kernel is
# reported by papermill): ipykernel logs "Kernel is running over TCP without encryption" on every
# start (it listens on localhost only), and jupyter_client interrupts the kernel at every shutdown,
# which ipykernel can log as "ERROR | KeyboardInterrupt caught in kernel". Keep it to critical.
KERNEL_ARGS = ["--IPKernelApp.log_level=CRITICAL"]
NB_RE = re.compile(r"^(\d\d)_[A-Za-z0-9_]+$")

# Parameter presets. "small" keeps CI fast on 2 cores (every notebook in seconds).
PRESETS: dict[str, dict] = {
    "full": {},
    "small": {
        "all": {"small": True},
        "00_quickstart": {"max_tokens": 8},
        "01_unpert": {"max_tokens": 6, "prompt_tokens": 8},
        "02_lookahead": {"max_tokens": 12},
        "03_cosine": {"max_layers": 2},
        "04_gates": {"max_tokens": 12, "max_rows": 32},
        "05_mtp_union": {"max_tokens": 16, "g_max": 6},
        "06_policies": {"max_tokens": 24, "policies": "lru,twohit,s3fifo"},
        "07_read_path": {"threads": "1,2", "modes": "buffered"},
        "08_ledger": {"max_layers": 2},
        "09_sweep": {"max_tokens": 16, "policies": "lru,fifo", "arenas": "0.25,0.5", "workers": 1},
    },
}


# --------------------------------------------------------------------------- notebooks

def list_notebooks(only=None, notebook_dir: Path | str | None = None) -> list[Path]:
    """Notebooks ``NN_name.ipynb`` in order; ``only`` is names or ``NN`` prefixes (list or "a,b")."""
    nb_dir = Path(notebook_dir).resolve() if notebook_dir else NOTEBOOK_DIR
    if not nb_dir.is_dir():
        raise ValueError(f"notebook directory {nb_dir} does not exist; run from a workbench checkout")
    paths = sorted(p for p in nb_dir.glob("*.ipynb") if NB_RE.match(p.stem))
    if only:
        wanted = [s.strip() for s in (only.split(",") if isinstance(only, str) else only) if s.strip()]
        chosen, unknown = [], []
        for w in wanted:
            w = Path(w).stem
            hits = [p for p in paths if p.stem == w or p.stem.split("_", 1)[0] == w or p.stem.startswith(w)]
            if not hits:
                unknown.append(w)
            chosen += [p for p in hits if p not in chosen]
        if unknown:
            names = ", ".join(p.stem for p in paths)
            raise ValueError(f"--only: no notebook matches {', '.join(unknown)}; available: {names}")
        paths = sorted(chosen)
    if not paths:
        raise ValueError(f"no notebooks named NN_name.ipynb in {nb_dir}")
    return paths


def load_params(params=None) -> dict:
    """Normalize ``params`` (None, preset name, file path, dict) to {"all": {...}, "<nb>": {...}}."""
    if params is None:
        raw: dict = {}
    elif isinstance(params, dict):
        raw = copy.deepcopy(params)
    elif isinstance(params, (str, Path)) and str(params) in PRESETS:
        raw = copy.deepcopy(PRESETS[str(params)])
    else:
        path = Path(params)
        if not path.exists():
            raise ValueError(f"--params {params!r}: no such file and not a preset "
                             f"(presets: {', '.join(PRESETS)})")
        text = read_text("--params", path)
        try:
            if path.suffix.lower() == ".json":
                raw = json.loads(text)
            else:
                import yaml

                raw = yaml.safe_load(text)
        except Exception as e:
            raise ValueError(f"--params {path}: cannot parse ({e}); write YAML or JSON mapping "
                             "like `all: {max_tokens: 8}`") from None
        raw = raw or {}
        if not isinstance(raw, dict):
            raise ValueError(f"--params {path}: top level must be a mapping, got {type(raw).__name__}")
    out: dict = {"all": {}}
    preset = raw.pop("preset", None)
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"params: unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
        out = load_params(preset)
    for key, value in raw.items():
        key = str(key)
        if key == "all" or NB_RE.match(key) or re.fullmatch(r"\d\d", key):
            if not isinstance(value, dict):
                raise ValueError(f"params: section {key!r} must be a mapping of parameter: value")
            out.setdefault(key, {}).update(value)
        else:
            out["all"][key] = value
    return out


_DECLARED: dict = {}


def declared_parameters(nb_path: Path) -> dict:
    """Parameters declared in the notebook's ``parameters`` cell (papermill's inspection, cached)."""
    import papermill as pm

    st = Path(nb_path).stat()
    key = (str(nb_path), st.st_mtime_ns, st.st_size)
    if key in _DECLARED:
        return _DECLARED[key]
    try:
        _DECLARED[key] = pm.inspect_notebook(str(nb_path))
        return _DECLARED[key]
    except ValueError as e:
        if "kernel name" in str(e):
            raise ValueError(f"{nb_path.name} has no kernelspec metadata; fix it with "
                             f"`jupytext --set-kernel python3 {nb_path}`") from None
        raise


def params_for(nb_path: Path, params: dict, strict: bool = True) -> dict:
    """The parameters to inject into one notebook: declared ``all`` keys plus its own section."""
    declared = declared_parameters(nb_path)
    stem = nb_path.stem
    chosen = {k: v for k, v in params.get("all", {}).items() if k in declared}
    for key in (stem.split("_", 1)[0], stem):
        section = params.get(key, {})
        unknown = [k for k in section if k not in declared]
        if unknown and strict:
            raise ValueError(f"params for {stem}: {', '.join(unknown)} not declared in its parameters "
                             f"cell; it declares: {', '.join(declared) or 'nothing'}")
        chosen.update({k: v for k, v in section.items() if k in declared})
    return chosen


def check_params(paths: list[Path], params: dict) -> None:
    """Fail early, naming the key, when a parameter matches no selected notebook."""
    declared = {p.stem: declared_parameters(p) for p in paths}
    for key in params.get("all", {}):
        if not any(key in d for d in declared.values()):
            raise ValueError(f"params: {key!r} is not a parameter of any selected notebook "
                             f"({', '.join(declared)}); check the spelling")
    for p in paths:
        params_for(p, params)


# --------------------------------------------------------------------------- execution

def ensure_kernelspec(name: str = DEFAULT_KERNEL) -> str:
    """Return the kernelspec's directory, installing an ipykernel spec for this Python if missing."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    ksm = KernelSpecManager()
    try:
        return ksm.get_kernel_spec(name).resource_dir
    except NoSuchKernel:
        pass
    from ipykernel.kernelspec import install

    try:
        return install(user=True, kernel_name=name, display_name=f"Python 3 ({name})")
    except OSError:
        return install(prefix=sys.prefix, kernel_name=name, display_name=f"Python 3 ({name})")


@contextlib.contextmanager
def kernel_env(static: bool = True):
    """Environment the kernel inherits: repo importable, static panels."""
    saved = {k: os.environ.get(k) for k in (STATIC_ENV, "PYTHONPATH")}
    try:
        if static:
            os.environ[STATIC_ENV] = "1"
        pp = os.environ.get("PYTHONPATH", "")
        if str(REPO) not in pp.split(os.pathsep):
            os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([pp] if pp else []))
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _chdir(path: Path):
    """Kernels start in the notebooks' folder (as in JupyterLab); set once for all threads."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def execute_notebook(nb_path: Path, out_path: Path, parameters: dict | None = None, *,
                     kernel: str = DEFAULT_KERNEL, timeout: int = 600,
                     cwd: str | None = None) -> tuple[bool, float, str]:
    """Run one notebook headless; returns (ok, seconds, error message).

    ``cwd``: the kernel's working directory. papermill changes the *process* directory for
    it, which races between threads; ``build_report`` passes None and sets it once instead.
    """
    nb_path, out_path = Path(nb_path).resolve(), Path(out_path).resolve()
    import papermill as pm

    ensure_kernelspec(kernel)
    t0 = time.perf_counter()
    error = ""
    with kernel_env(static=True):
        try:
            pm.execute_notebook(
                str(nb_path), str(out_path), parameters=parameters or {}, kernel_name=kernel,
                progress_bar=False, request_save_on_cell_execute=False, cwd=cwd,
                execution_timeout=timeout, log_output=False, extra_arguments=KERNEL_ARGS)
        except pm.PapermillExecutionError as e:
            error = f"cell {e.exec_count}: {e.ename}: {e.evalue}"
        except Exception as e:  # kernel died, timeout, bad notebook
            error = f"{type(e).__name__}: {e}"
    return (not error), time.perf_counter() - t0, error


# --------------------------------------------------------------------------- extraction

def extract_charts(nb) -> list[dict]:
    """Every chart a notebook registered: [{"name", "title", "spec", "cell"}], names made unique."""
    charts, seen = [], {}
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            rec = data.get(CHART_MIME)
            if rec is None:
                continue
            if isinstance(rec, str):
                rec = json.loads(rec)
            name = rec.get("name") or "chart"
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > 1:
                name = f"{name}_{seen[name]}"
            charts.append({"name": name, "title": rec.get("title", ""), "spec": rec["spec"], "cell": i})
    return charts


def extract_headline(nb) -> dict:
    """The notebook's headline (``workbench.viz.headline``, the last one wins); without one, the
    question is the notebook's title and the headline says that none was recorded."""
    found = None
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            rec = (out.get("data") or {}).get(HEADLINE_MIME)
            if rec is not None:
                found = json.loads(rec) if isinstance(rec, str) else dict(rec)
    if found is not None:
        return found
    title = next((line.lstrip("#").strip() for cell in nb.cells if cell.cell_type == "markdown"
                  for line in cell.source.splitlines() if line.startswith("#")), "")
    title = re.sub(r"^\d\d\s*[·:.-]\s*", "", title)
    return {"question": title, "value": None, "uncertainty": None, "caveat": None}


_REMOTE = re.compile(
    r"""(?:<script[^>]*\ssrc\s*=\s*["']?\s*(https?:)?//"""
    r"""|<link[^>]*\shref\s*=\s*["']?\s*(https?:)?//"""
    r"""|<img[^>]*\ssrc\s*=\s*["']?\s*(https?:)?//"""
    r"""|<iframe[^>]*\ssrc\s*=\s*["']?\s*(https?:)?//"""
    r"""|@import\s+(url\()?\s*["']?\s*(https?:)?//"""
    r"""|url\(\s*["']?\s*(https?:)?//"""
    r"""|import\(\s*["'](https?:)?//)""", re.I)


def find_remote_refs(text: str) -> list[str]:
    """Places where an HTML page would load something over the network (scripts, css, images)."""
    return [text[max(0, m.start() - 20): m.end() + 60] for m in _REMOTE.finditer(text)]


_TEMPLATE = r"""
{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}
<style type="text/css">
.wb-banner { font-family: system-ui, sans-serif; padding: 10px 16px; margin: 0 0 12px 0;
  background: #f4f6f8; border-bottom: 1px solid #dde; font-size: 14px; }
.wb-banner a { margin-right: 14px; }
.wb-banner .wb-failed { color: #b00; font-weight: bold; }
.wb-banner code { font-size: 12px; }
.wb-reduced { background: #fff4d6; border: 1px solid #e0b84a; padding: 8px 14px; margin: 0 0 12px 0;
  font-family: system-ui, sans-serif; font-size: 14px; }
details.wb-code > summary { cursor: pointer; color: #666; font-family: system-ui, sans-serif; font-size: 12px;
  margin: 2px 0 2px 8px; }
/* static pages: wrap long code lines instead of clipping them; scroll wide tables */
.jp-InputArea-editor .highlight pre, .jp-RenderedText pre { white-space: pre-wrap; overflow-wrap: anywhere; }
.jp-InputArea-editor { overflow: visible; }
.jp-OutputArea-output { overflow-x: auto; }
.jp-RenderedHTMLCommon table caption { caption-side: top; font-weight: bold; text-align: left; padding: 4px 0; }
</style>
{%- endblock extra_css -%}
{% block input_group -%}
<details class="wb-code"><summary>code</summary>
{{ super() }}
</details>
{%- endblock input_group %}
{% block data_widget_view scoped %}{% endblock data_widget_view %}
{% block data_svg scoped -%}
{%- set rec = output.data.get('application/vnd.workbench.chart+json') or {} -%}
{%- set alt = (rec.get('title') or rec.get('name') or 'chart') if rec else 'figure' -%}
<div class="jp-RenderedSVG jp-OutputArea-output {{ extra_class }}" data-mime-type="image/svg+xml">
<img alt="{{ alt | escape_html }}" title="{{ alt | escape_html }}"
 src="data:image/svg+xml;base64,{{ output.data['image/svg+xml'] | text_base64 | escape_html }}">
</div>
{%- endblock data_svg %}
"""


def _strip_widgets(nb) -> None:
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        outs = []
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data and "application/vnd.jupyter.widget-view+json" in data:
                continue  # live widgets (progress bars, controls): nothing to show statically
            outs.append(out)
        if "outputs" in cell:
            cell["outputs"] = outs


def notebook_html(nb, banner: str = "") -> str:
    """Static HTML for an executed notebook: no widget state, no remote scripts or css."""
    import jinja2
    from nbconvert import HTMLExporter

    nb = copy.deepcopy(nb)
    _strip_widgets(nb)
    exporter = HTMLExporter(extra_loaders=[jinja2.DictLoader({"workbench.html.j2": _TEMPLATE})],
                            template_file="workbench.html.j2")
    body, _ = exporter.from_notebook_node(nb)
    if banner:
        body = body.replace("<main>", "<main>\n" + banner, 1)
    remote = find_remote_refs(body)
    if remote:
        raise RuntimeError(f"report page would load from the network: {remote[:3]}")
    return body


# --------------------------------------------------------------------------- report

@dataclass
class NotebookResult:
    name: str
    ok: bool
    seconds: float
    error: str = ""
    parameters: dict = field(default_factory=dict)
    page: str = ""
    notebook: str = ""
    charts: list = field(default_factory=list)  # [{"name","title","svg","png","spec","rows"}]
    headline: dict = field(default_factory=dict)  # {"question","value","uncertainty","caveat"}


@dataclass
class Report:
    out: str
    ok: bool
    seconds: float
    created: str
    kernel: str
    notebooks: list = field(default_factory=list)
    published: bool = True  # False when every notebook failed: ``out`` was left as it was
    preset: str | None = None  # a reduced preset (e.g. "small") the report was built with, else None

    def to_json(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:  # so f"{build_report(...)}/index.html" names the page
        return self.out

    def __fspath__(self) -> str:
        return self.out


def reduced_preset(preset, params: dict) -> str | None:
    """The name of the reduced preset a report runs with (None for the notebooks' own defaults)."""
    if preset is not None and preset != "full":
        return str(preset)
    return "small" if params.get("all", {}).get("small") else None


def _reduced_banner(preset: str | None) -> str:
    if not preset:
        return ""
    return (f"<div class='wb-reduced'><b>Reduced preset &ldquo;{html.escape(preset)}&rdquo;.</b> The notebooks ran "
            "with fewer tokens, layers and configurations so that the report builds in seconds; its numbers "
            "check that everything runs, they are not the measurements. Build the full report with "
            "<code>workbench report --params full</code>.</div>")


def _banner(res: NotebookResult, preset: str | None = None) -> str:
    status = ("<span class='wb-failed'>FAILED: " + html.escape(res.error) + "</span>") if not res.ok else "ok"
    params = ", ".join(f"{k}={v!r}" for k, v in res.parameters.items()) or "defaults"
    return (f"<div class='wb-banner'><a href='index.html'>&larr; report index</a>"
            f"<a href='notebooks/{res.name}.ipynb'>executed notebook</a>"
            f"<b>{html.escape(res.name)}</b> &middot; {status} &middot; {res.seconds:.1f} s &middot; "
            f"parameters: <code>{html.escape(params)}</code> &middot; "
            f"{len(res.charts)} figure(s)</div>" + _reduced_banner(preset))


def _write_figures(nb_name: str, charts: list[dict], root: Path) -> list[dict]:
    fig_dir = root / "figures" / nb_name
    fig_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for c in charts:
        base = fig_dir / c["name"]
        svg = spec_to_svg(c["spec"])
        base.with_suffix(".svg").write_text(svg)
        (fig_dir / f"{c['name']}.png").write_bytes(spec_to_png(c["spec"]))
        (fig_dir / f"{c['name']}.vl.json").write_text(json.dumps(c["spec"], indent=1, default=str))
        rel = f"figures/{nb_name}/{c['name']}"
        written.append({"name": c["name"], "title": c["title"], "svg": rel + ".svg",
                        "png": rel + ".png", "spec": rel + ".vl.json", "rows": spec_rows(c["spec"])})
    return written


def _headline_html(h: dict) -> str:
    question = html.escape(h.get("question") or "")
    if h.get("value"):
        unc = f" <span class='unc'>({html.escape(h['uncertainty'])})</span>" if h.get("uncertainty") else ""
        value = f"<div class='value'>{html.escape(h['value'])}{unc}</div>"
    else:
        value = "<div class='value none'>no headline recorded (the notebook does not call headline())</div>"
    caveat = f"<div class='caveat'><b>Caveat.</b> {html.escape(h['caveat'])}</div>" if h.get("caveat") else ""
    return f"<div class='question'>{question}</div>{value}{caveat}"


def _index_html(rep: Report, params: dict) -> str:
    cards = []
    for r in rep.notebooks:
        status = "ok" if r.ok else f"<span class='failed'>FAILED</span> {html.escape(r.error)}"
        figs = "".join(
            f"<figure><a href='{c['svg']}'><img src='{c['png']}' alt='{html.escape(c['title'] or c['name'])}'></a>"
            f"<figcaption><b>{html.escape(c['title'] or c['name'])}</b><br>"
            f"<a href='{c['svg']}'>SVG</a> · <a href='{c['png']}'>PNG</a> · <a href='{c['spec']}'>spec</a>"
            f" · {c['rows']} rows</figcaption></figure>" for c in r.charts)
        cards.append(
            f"<section class='card' id='{r.name}'><h2><a href='{r.page}'>{html.escape(r.name)}</a></h2>"
            f"{_headline_html(r.headline)}"
            f"<div class='meta'>{status} · {r.seconds:.1f} s · <a href='{r.notebook}'>executed notebook</a></div>"
            f"<details><summary>{len(r.charts)} figure(s)</summary>"
            f"<div class='grid'>{figs or '<p>no figures</p>'}</div></details></section>")
    status = "all notebooks ran" if rep.ok else "<span class='failed'>some notebooks failed</span>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>MoE Streaming Workbench report</title>
<style>
body {{ font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 24px auto; max-width: 1200px;
  color: #222; padding: 0 16px; }}
.failed {{ color: #b00; font-weight: bold; }}
.card {{ border: 1px solid #e3e3e3; padding: 10px 16px; margin: 0 0 14px 0; }}
.card h2 {{ margin: 2px 0 6px 0; font-size: 18px; }}
.question {{ color: #333; }}
.value {{ font-size: 22px; font-weight: bold; margin: 6px 0; }}
.value.none {{ font-size: 14px; font-weight: normal; color: #888; }}
.unc {{ font-size: 14px; font-weight: normal; color: #555; }}
.caveat {{ color: #555; font-size: 14px; }}
.meta {{ color: #666; font-size: 13px; margin: 6px 0; }}
.wb-reduced {{ background: #fff4d6; border: 1px solid #e0b84a; padding: 8px 14px; margin: 0 0 16px 0; }}
.grid {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 16px; margin-top: 8px; }}
figure {{ margin: 0; border: 1px solid #e3e3e3; padding: 8px; background: #fff; }}
figure img {{ max-width: 100%; height: auto; }}
figcaption {{ font-size: 13px; color: #444; margin-top: 6px; }}
summary {{ cursor: pointer; color: #444; }}
code, pre {{ font-size: 12px; background: #f5f5f5; }}
</style></head><body>
<h1>MoE Streaming Workbench report</h1>
{_reduced_banner(rep.preset)}
<p>Created {html.escape(rep.created)} · kernel <code>{html.escape(rep.kernel)}</code> ·
{rep.seconds:.1f} s · {status}</p>
{''.join(cards)}
<details><summary>parameters</summary><pre>{html.escape(json.dumps(params, indent=1, default=str))}</pre></details>
</body></html>
"""


MARK = ".workbench-report"  # in every report dir: the files the report wrote (JSON list)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir() and p.name != MARK)


def check_out(out) -> Path:
    """Refuse an ``--out`` that holds anything this module did not write; returns the resolved path.

    ``out`` may be missing, an empty directory, or a previous report (its ``MARK`` lists the
    files it wrote). Anything else would be deleted when the new report replaces it."""
    out = Path(out).resolve()
    fix = "give a new or empty directory in a writable folder"
    output_dir("--out", out, fix=fix)
    output_dir("--out", out.parent, fix=fix)  # the report is renamed into place there
    if os.path.ismount(out):
        raise ValueError(f"--out {out} is a mount point, which a finished report cannot replace; give a folder inside it")
    if not out.exists():
        return out
    files = _files(out)
    if not files and not any(out.iterdir()):
        return out
    mark = out / MARK
    ours = _files_of_old_report(out) if not mark.is_file() else None
    if not mark.is_file() and ours is None:
        raise ValueError(f"--out {out} is not empty and is not a workbench report ({len(files)} files, e.g. "
                         f"{files[0] if files else next(out.iterdir()).name}); nothing was written: "
                         "give a new or empty directory")
    if ours is None:
        try:
            ours = set(json.loads(mark.read_text()))
        except (ValueError, TypeError):
            raise ValueError(f"--out {out}: {MARK} is unreadable; give a new or empty directory") from None
    foreign = [f for f in files if f not in ours]
    if foreign:
        raise ValueError(f"--out {out} holds {len(foreign)} file(s) the previous report did not write "
                         f"(e.g. {foreign[0]}); move them away or give another directory")
    return out


def _files_of_old_report(out: Path) -> set | None:
    """The files a report written before ``MARK`` existed wrote, from its report.json (None if it has none)."""
    try:
        rep = json.loads((out / "report.json").read_text())
        files = {"index.html", "report.json"}
        for nb in rep["notebooks"]:
            files |= {nb["page"], nb["notebook"]}
            files |= {c[k] for c in nb["charts"] for k in ("svg", "png", "spec")}
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return {f for f in files if isinstance(f, str)}


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished temp dir onto ``out``; the old report (checked again: only files it
    wrote) is removed after."""
    unmark(tmp)  # first: the temp folder's marker is not a file of the report
    (tmp / MARK).write_text(json.dumps(_files(tmp)))
    check_out(out)
    old = None
    if out.exists() and any(out.iterdir()):
        old = out.with_name(f".{out.name}.old-{os.getpid()}-{int(time.time())}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build_report(out=None, params=None, only=None, *, preset: str | None = None,
                 kernel: str = DEFAULT_KERNEL, timeout: int = 600, progress: bool = True,
                 notebook_dir=None, jobs: int | None = None) -> Report:
    """Execute notebooks and write the static report to ``out``; returns a ``Report``.

    ``preset`` names a parameter preset to start from (``params`` then adds to it);
    ``jobs`` notebooks run at once (default: 2 if the machine has 2+ cores, else 1).
    """
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    whole("--jobs", jobs, 1, none_ok=True)
    whole("--timeout", timeout, 1)
    out = check_out(out if out else DEFAULT_OUT)
    paths = list_notebooks(only, notebook_dir)
    if preset is not None:
        base = load_params(preset)
        extra = load_params(params)
        for key, section in extra.items():
            base.setdefault(key, {}).update(section)
        params = base
    else:
        params = load_params(params)
    reduced = reduced_preset(preset, params)
    jobs = jobs or (2 if (os.cpu_count() or 1) >= 2 else 1)
    check_params(paths, params)
    ensure_kernelspec(kernel)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rep = Report(out=str(out), ok=True, seconds=0.0, kernel=kernel, preset=reduced,
                 created=_dt.datetime.now().isoformat(timespec="seconds"))
    with marked_temp_dir(out) as tmp:  # a killed report's folder is removed by the next report into ``out``
        (tmp / "notebooks").mkdir()
        bar = tqdm(total=len(paths), desc="report", unit="notebook", disable=not progress)
        with kernel_env(static=True), _chdir(paths[0].parent), ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [pool.submit(run_one, p, tmp, params_for(p, params), kernel=kernel, timeout=timeout,
                                   preset=reduced) for p in paths]
            for fut in futures:
                res = fut.result()
                bar.update(1)
                bar.set_postfix_str(res.name)
                rep.notebooks.append(res)
                rep.ok = rep.ok and res.ok
        bar.close()
        rep.seconds = time.perf_counter() - t0
        (tmp / "index.html").write_text(_index_html(rep, params))
        (tmp / "report.json").write_text(json.dumps(rep.to_json(), indent=1, default=str))
        if any(r.ok for r in rep.notebooks):
            _publish(tmp, out)
        else:  # nothing ran: keep the previous report
            rep.published = False
            shutil.rmtree(tmp, ignore_errors=True)
    return rep


def run_one(nb_path: Path, root: Path, parameters: dict, *, kernel: str = DEFAULT_KERNEL,
            timeout: int = 600, preset: str | None = None) -> NotebookResult:
    """Execute one notebook into ``root/notebooks`` and write its page and figures under ``root``."""
    import nbformat

    name = nb_path.stem
    executed = root / "notebooks" / f"{name}.ipynb"
    executed.parent.mkdir(parents=True, exist_ok=True)
    ok, seconds, error = execute_notebook(nb_path, executed, parameters, kernel=kernel, timeout=timeout)
    res = NotebookResult(name=name, ok=ok, seconds=seconds, error=error, parameters=parameters,
                         page=f"{name}.html", notebook=f"notebooks/{name}.ipynb")
    if not executed.exists():  # papermill failed before writing anything
        shutil.copy(nb_path, executed)
    nb = nbformat.read(executed, as_version=4)
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, executed)
    res.charts = _write_figures(name, extract_charts(nb), root)
    res.headline = extract_headline(nb)
    (root / res.page).write_text(notebook_html(nb, banner=_banner(res, preset)))
    return res
