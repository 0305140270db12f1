"""End-to-end: JupyterLab on loopback, notebook 01 in headless Chromium: three quick slider steps, and
the chart changes to the last value's.

Needs Debian's ``chromium`` (/usr/bin/chromium, or $WORKBENCH_CHROMIUM) and the ``playwright``
Python package (no ``playwright install``: we drive the system browser through
``executable_path``). ``scripts/ci_browser_setup.sh`` installs both. When either is missing
the test FAILS with instructions; only ``WORKBENCH_SKIP_BROWSER=1`` turns it into a skip.

Screenshots go to $WORKBENCH_SCREENSHOT_DIR (default: reports/browser/).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "01_unpert.ipynb"
SLIDER_LABEL = os.environ.get("WORKBENCH_BROWSER_SLIDER", "arena")  # description text of the slider to move
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.browser

KERNEL_READY = """() => {
    const app = window.jupyterapp; if (!app) return false;
    const w = app.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.connectionStatus === 'connected' && k.status === 'idle';
}"""


def _requirements():
    """Path to chromium; fails (or skips with WORKBENCH_SKIP_BROWSER=1) when something is missing."""
    problems = []
    chromium = os.environ.get("WORKBENCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        problems.append(f"no Chromium at {chromium} (apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problems.append("the playwright Python package is missing (pip install playwright; "
                        "do not run `playwright install`, the system chromium is used)")
    if problems:
        msg = ("browser test cannot run: " + "; ".join(problems)
               + ". Run scripts/ci_browser_setup.sh, or set WORKBENCH_SKIP_BROWSER=1 to skip on purpose.")
        if os.environ.get("WORKBENCH_SKIP_BROWSER") == "1":
            pytest.skip(msg)
        pytest.fail(msg, pytrace=False)
    return chromium


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc, log: Path, timeout: float = 90.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"JupyterLab did not answer {url} in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def jupyterlab(tmp_path):
    """A JupyterLab server on 127.0.0.1 (free port, no token) serving a copy of notebook 01."""
    _requirements()  # fail (not skip) before starting anything
    with lab_server(tmp_path) as server:
        yield server


@contextlib.contextmanager
def lab_server(tmp_path: Path):
    assert NOTEBOOK.exists(), f"{NOTEBOOK} is missing"
    root = tmp_path / "root"
    root.mkdir()
    # a copy (autosave must not touch the repo) with the CI-sized parameters of the "small" preset
    import nbformat

    from workbench.report import load_params, params_for

    nb = nbformat.read(NOTEBOOK, as_version=4)
    small = params_for(NOTEBOOK, load_params("small"))
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source += "\n# browser test: small preset\n" + "\n".join(f"{k} = {v!r}" for k, v in small.items())
    nbformat.write(nb, root / NOTEBOOK.name)
    settings = tmp_path / "settings"
    notif = settings / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)
    (notif / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    nbset = settings / "@jupyterlab" / "notebook-extension"
    nbset.mkdir(parents=True)
    (nbset / "tracker.jupyterlab-settings").write_text(json.dumps({"autoStartDefaultKernel": True}))
    port = _free_port()
    env = dict(os.environ)
    env.pop("WORKBENCH_STATIC", None)  # live widgets
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(tmp_path / "workspaces")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    log = tmp_path / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           "--IdentityProvider.token=", "--ServerApp.password=",
           f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
           "--ServerApp.open_browser=False", "--LabApp.extension_manager=readonly"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers run as root
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                cwd=root, start_new_session=True)
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/status", proc, log)
        yield {"url": f"http://127.0.0.1:{port}", "root": root, "log": log}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # lets the server shut its kernels down
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # our own session: server + its kernels
                proc.wait(timeout=10)


def _chart_html(page) -> str:
    """The markup of the chart(s) inside the live panel's Output (inline SVG or <img> data URI)."""
    return page.evaluate("""() => {
        const panel = document.querySelector('.workbench-panel');
        if (!panel) return '';
        const parts = [];
        panel.querySelectorAll('svg, img').forEach(el => {
            if (el.closest('.widget-slider, .widget-hslider, .widget-dropdown')) return;
            if (el.tagName.toLowerCase() === 'svg' && el.closest('svg') !== el) return;
            parts.push(el.tagName.toLowerCase() === 'img' ? el.getAttribute('src') : el.outerHTML);
        });
        return parts.join('\\n');
    }""")


def test_notebook01_slider_changes_chart(jupyterlab, tmp_path):
    chromium = _requirements()
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("WORKBENCH_SCREENSHOT_DIR", REPO / "reports" / "browser"))
    shots.mkdir(parents=True, exist_ok=True)
    url = f"{jupyterlab['url']}/lab/tree/{NOTEBOOK.name}"
    console: list[str] = []
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=chromium, headless=True,
            args=CHROME_ARGS, viewport={"width": 1400, "height": 1000})
        page = ctx.pages[0] if ctx.pages else ctx.new_page()
        try:
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.goto(url, wait_until="domcontentloaded", timeout=90_000)
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=90_000)
            # kernel started, connected and idle (what the status bar shows as "Python 3 | Idle")
            page.wait_for_function(KERNEL_READY, timeout=120_000)
            dialog = page.locator(".jp-Dialog")  # a "Select Kernel" dialog: take the notebook's kernel
            if dialog.count() and dialog.first.is_visible():
                dialog.locator("button", has_text="Select").first.click()
                page.wait_for_function(KERNEL_READY, timeout=120_000)
            # Run > Run All Cells (the same command the menu item runs)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.commands"
                                   ".isEnabled('notebook:run-all-cells')", timeout=60_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_selector(".workbench-panel .widget-slider", timeout=int(os.environ.get('WORKBENCH_BROWSER_TIMEOUT', 180)) * 1000)
            page.wait_for_function(
                "() => { const p = document.querySelector('.workbench-panel');"
                " return p && p.innerText.includes('updated in'); }", timeout=int(os.environ.get('WORKBENCH_BROWSER_TIMEOUT', 180)) * 1000)
            before = _chart_html(page)
            assert before, "no chart (svg/img) rendered inside the live panel"
            page.screenshot(path=str(shots / "01_before.png"), full_page=False)
            panel_sh = page.locator(".workbench-panel").first
            panel_sh.screenshot(path=str(shots / "01_panel_before.png"))

            slider = page.locator(".workbench-panel .widget-slider", has_text=SLIDER_LABEL).first
            assert slider.count() == 1, f"no slider labelled {SLIDER_LABEL!r} in the panel"
            readout = slider.locator(".widget-readout")
            value_before = readout.inner_text()
            status_before = page.locator(".workbench-panel").first.inner_text()
            handle = slider.locator(".noUi-handle").first
            handle.focus()
            for _ in range(3):  # three quick steps: the panel runs once, at the last value
                handle.press("ArrowRight")
            value_after = readout.inner_text()
            shown = float(value_after.rstrip("%")) / (100 if value_after.endswith("%") else 1)
            want = f"{SLIDER_LABEL}={shown:.3g}"  # the status names the values it drew (key = label's first word)
            t0 = time.time()
            after = before
            limit = int(os.environ.get("WORKBENCH_BROWSER_TIMEOUT", 180))
            while time.time() - t0 < limit:
                after = _chart_html(page)
                status = page.locator(".workbench-panel").first.inner_text()
                settled = page.evaluate(KERNEL_READY) and "updated in" in status and want in status
                if after and after != before and settled:
                    break
                page.wait_for_timeout(250)
            assert want in page.locator(".workbench-panel").first.inner_text(), \
                f"the panel does not show the last value ({want}): {page.locator('.workbench-panel').first.inner_text()[:300]}"
            page.screenshot(path=str(shots / "01_after.png"), full_page=False)
            panel_sh.screenshot(path=str(shots / "01_panel_after.png"))
            assert value_after != value_before, f"slider did not move (readout {value_before!r})"
            assert after != before, ("chart did not change after moving the slider "
                                     f"({value_before} -> {value_after}); panel says: "
                                     f"{page.locator('.workbench-panel').first.inner_text()[:500]}")
            text = page.locator(".jp-NotebookPanel").first.inner_text()
            assert "Error loading script" not in text
            assert "Traceback" not in text, text[text.find("Traceback") - 200:][:2000]
            assert "error:" not in page.locator(".workbench-panel").first.inner_text()
        except BaseException:
            page.screenshot(path=str(shots / "01_failure.png"), full_page=False)
            print("browser console:\n" + "\n".join(console[-40:]))
            print("jupyterlab log:\n" + jupyterlab["log"].read_text()[-4000:])
            raise
        finally:
            ctx.close()
    assert status_before  # sanity: the panel had a status line
