"""JupyterLab in a real browser: open lesson 01, Run All, move its slider, see the figure change.

The test starts ``.venv/bin/jupyter-lab`` on 127.0.0.1 (a free port, a fresh token) with every
Jupyter and JupyterLab directory, and the checkpoints, in a temporary folder and autosave off,
so neither the user's home nor the repository is written.  Headless chromium drives it with
every request outside that server aborted.  The server's process group is ended on any
outcome; a screenshot is saved to build/screenshots/lab-01_attention_recap.png.
"""

import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.browser import PageLog, chromium_path, launched, screenshot
from tests.conftest import ROOT

NOTEBOOK = "notebooks/01_attention_recap.ipynb"
JUPYTER_LAB = ROOT / ".venv" / "bin" / "jupyter-lab"
START_S, RUN_ALL_S, REDRAW_S = 90, 120, 45
# The one remote resource a lesson shows: the Colab badge image (a broken image offline, by design).
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"

# User settings for the test's JupyterLab: nothing is saved, nothing is fetched, every cell is rendered.
SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def lab_environment(tmp):
    """Environment variables that keep every Jupyter file inside ``tmp``."""
    env = dict(os.environ)
    for name, sub in [("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                      ("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython"),
                      ("JUPYTERLAB_SETTINGS_DIR", "settings"), ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")]:
        env[name] = str(tmp / sub)
        (tmp / sub).mkdir()
    for plugin, values in SETTINGS.items():
        path = tmp / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env.update(JUPYTER_PLATFORM_DIRS="1", PYDEVD_DISABLE_FILE_VALIDATION="1", COURSE_SMALL="1")
    return env


def stop(server, base, token):
    """Ask the server to shut down (it ends its kernels); then end its process group."""
    with contextlib.suppress(OSError):
        request = urllib.request.Request(f"{base}/api/shutdown", method="POST",
                                         headers={"Authorization": f"token {token}"})
        urllib.request.urlopen(request, timeout=10).close()
    for sig, wait_s in ((None, 15), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=wait_s)
            break
    # Whatever is left in the group (a kernel that outlived the server) goes too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)


def wait_until_up(server, base, token, log_path):
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"jupyter-lab exited ({server.returncode}):\n{log_path.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as response:
                if response.status == 200:
                    return
        time.sleep(0.5)
    pytest.fail(f"jupyter-lab did not answer within {START_S} s:\n{log_path.read_text()[-3000:]}")


@pytest.fixture
def lab(tmp_path):
    """A running JupyterLab on the repository: yields (base URL, token)."""
    chromium_path()  # skip (or fail in CI) before starting a server nobody can look at
    if not JUPYTER_LAB.exists():
        pytest.fail(f"{JUPYTER_LAB} missing: run make venv", pytrace=False)
    port, token = free_port(), secrets.token_hex(24)
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "jupyter-lab.log"
    command = [str(JUPYTER_LAB), "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}",
               "--LabApp.expose_app_in_browser=True", "--LabApp.extension_manager=readonly",
               f"--FileCheckpoints.checkpoint_dir={tmp_path / 'checkpoints'}"]  # not notebooks/.ipynb_checkpoints
    if os.geteuid() == 0:  # CI containers run as root
        command.append("--allow-root")
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=ROOT, env=lab_environment(tmp_path), stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until_up(server, base, token, log_path)
        yield base, token
    finally:
        stop(server, base, token)
        sys.stdout.write(f"\njupyter-lab log tail:\n{log_path.read_text()[-1500:]}\n")


KERNEL_IDLE = """() => {
    const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const kernel = panel && panel.sessionContext && panel.sessionContext.session
                   && panel.sessionContext.session.kernel;
    return kernel ? kernel.status : "no kernel";
}"""
PROMPTS = """() => [...document.querySelectorAll(".jp-CodeCell .jp-InputPrompt")].map(p => p.textContent.trim())"""


def wait_for_run_all(page):
    """Wait until every code cell has run and the kernel is idle; return the prompts."""
    deadline = time.monotonic() + RUN_ALL_S
    while time.monotonic() < deadline:
        prompts = page.evaluate(PROMPTS)
        done = prompts and all(p not in ("[ ]:", "[*]:", "") for p in prompts)
        if done and page.evaluate(KERNEL_IDLE) == "idle":
            return prompts
        page.wait_for_timeout(1000)
    pytest.fail(f"Run All did not finish within {RUN_ALL_S} s: prompts {page.evaluate(PROMPTS)}")


def widget_output(slider):
    """What the output area of ``slider``'s panel shows: its text and its figures' SVG."""
    return slider.evaluate("""s => {
        const panel = s.closest(".widget-interact") || s.closest(".jp-OutputArea");
        const out = panel.querySelector(".widget-output") || panel;
        return out.innerText + "|" + [...out.querySelectorAll(".js-plotly-plot .main-svg")]
            .map(svg => svg.innerHTML.length + ":" + svg.textContent).join(",");
    }""")


def open_notebook(page, base, token):
    page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}", timeout=START_S * 1000)
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=START_S * 1000)
    page.wait_for_function(f"() => ({KERNEL_IDLE})() === 'idle'", timeout=START_S * 1000)


def run_all(page):
    """Run -> Run All Cells from the menu bar; return the prompts once done; fail on a traceback."""
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    prompts = wait_for_run_all(page)
    errors = page.evaluate("""() => [...document.querySelectorAll(".jp-OutputArea-output")]
        .filter(o => o.dataset.mimeType === "application/vnd.jupyter.stderr" && /Error|Traceback/.test(o.innerText))
        .map(o => o.innerText.slice(0, 300))""")
    assert errors == [], "a cell raised"
    return prompts


def move_slider(page):
    """Focus the first slider's handle and press ArrowRight; return the panel before and after."""
    handle = page.locator(".jupyter-widgets .widget-slider .noUi-handle").first
    handle.wait_for(state="attached", timeout=REDRAW_S * 1000)
    handle.scroll_into_view_if_needed()
    slider = handle.element_handle()
    page.wait_for_function("s => /\\S/.test(s.closest('.widget-interact, .jp-OutputArea').innerText)",
                           arg=slider, timeout=REDRAW_S * 1000)
    before = widget_output(slider)
    handle.focus()
    page.keyboard.press("ArrowRight")  # one step: one change, one redraw
    deadline = time.monotonic() + REDRAW_S
    while widget_output(slider) == before and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    page.wait_for_function(f"() => ({KERNEL_IDLE})() === 'idle'", timeout=REDRAW_S * 1000)
    page.wait_for_timeout(1000)  # let plotly finish drawing before the screenshot
    handle.scroll_into_view_if_needed()
    return before, widget_output(slider)


@pytest.mark.browser
@pytest.mark.slow
def test_lesson_01_runs_and_its_slider_redraws(lab):
    base, token = lab
    path = ROOT / NOTEBOOK
    if not path.exists():
        pytest.fail(f"{NOTEBOOK} missing", pytrace=False)
    stored = hashlib.sha256(path.read_bytes()).hexdigest()
    with launched() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(60_000)
        log = PageLog(page, allowed_origins=(base,))
        try:
            open_notebook(page, base, token)
            prompts = run_all(page)
            before, after = move_slider(page)
        finally:
            page.evaluate("() => window.jupyterapp && window.jupyterapp.shell.collapseLeft()")
            screenshot(page, "lab-01_attention_recap")
    assert len(prompts) > 3
    assert after != before, "moving the slider did not redraw the panel"
    assert [url for url in log.blocked if url != BADGE_IMAGE] == [], "JupyterLab tried to reach the network"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == stored, "the lesson file was rewritten"
