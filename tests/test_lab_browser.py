"""JupyterLab in a real browser, started by `make lab` as a learner starts it.

The server is the one `make lab` starts (LAB_ARGS adds a free port on 127.0.0.1, a fresh token,
no browser), with every Jupyter and JupyterLab directory, and the checkpoints, in a temporary
folder and autosave off, so neither the user's home nor the repository is written.  Headless
chromium drives it with every request outside that server aborted.  The tests check that the
whole course is reachable (lesson 00 opens first; notebooks/, exercises/ and solutions/ are in
the file browser), and open lesson 01, Run All, move its slider, see the figure change, and
follow its link to the exercise notebook.  The server's process group is ended on any outcome;
screenshots are saved to build/screenshots/.
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
EXERCISE = "exercises/01_attention_recap.ipynb"
FIRST_LESSON = "notebooks/00_welcome.ipynb"
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


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab as `make lab` starts it, on a free port: yields (base URL, token)."""
    chromium_path()  # skip (or fail in CI) before starting a server nobody can look at
    if not JUPYTER_LAB.exists():
        pytest.fail(f"{JUPYTER_LAB} missing: run make venv", pytrace=False)
    tmp_path = tmp_path_factory.mktemp("lab")
    port, token = free_port(), secrets.token_hex(24)
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "jupyter-lab.log"
    lab_args = ["--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
                "--LabApp.expose_app_in_browser=True", "--LabApp.extension_manager=readonly",
                f"--FileCheckpoints.checkpoint_dir={tmp_path / 'checkpoints'}"]  # not notebooks/.ipynb_checkpoints
    command = ["make", "--no-print-directory", "lab", f"LAB_ARGS={' '.join(lab_args)}"]
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
# Only the notebook in front: the server is shared by the tests, and JupyterLab may restore other tabs.
PROMPTS = """() => {
    const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    return panel ? [...panel.node.querySelectorAll(".jp-CodeCell .jp-InputPrompt")].map(p => p.textContent.trim()) : [];
}"""


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


CURRENT_PATH = """() => {
    const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    return panel && panel.context ? panel.context.path : null;
}"""
LISTED = """() => [...document.querySelectorAll(".jp-DirListing-itemName")].map(i => i.textContent.trim())"""


def open_notebook(page, base, token):
    page.goto(f"{base}/lab/tree/{NOTEBOOK}?reset&token={token}", timeout=START_S * 1000)  # reset: no restored tabs
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


def follow_exercise_link(page):
    """Click the lesson's link to its exercise notebook; return the path of the notebook that opens."""
    # JupyterLab resolves the relative href itself, so find the link by its text, as a reader does
    link = page.locator(".jp-RenderedMarkdown a", has_text=EXERCISE).first
    link.scroll_into_view_if_needed()
    link.click()
    page.wait_for_function(f"() => ({CURRENT_PATH})() === '{EXERCISE}'", timeout=START_S * 1000)
    page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell", timeout=START_S * 1000)
    return page.evaluate(CURRENT_PATH)


@pytest.mark.browser
@pytest.mark.slow
def test_make_lab_opens_lesson_00_with_the_whole_course_in_the_file_browser(lab):
    base, token = lab
    with urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=30) as response:
        root = {item["name"] for item in json.load(response)["content"]}
    assert {"notebooks", "exercises", "solutions"} <= root, f"server root lists {sorted(root)}"
    with launched() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(60_000)
        log = PageLog(page, allowed_origins=(base,))
        try:
            page.goto(f"{base}/?token={token}", timeout=START_S * 1000)  # where a learner lands
            page.wait_for_function(f"() => ({CURRENT_PATH})() === '{FIRST_LESSON}'", timeout=START_S * 1000)
            page.locator(".jp-BreadCrumbs-home").first.click()  # the file browser at the server's root
            page.wait_for_function(f"() => ({LISTED})().includes('exercises')", timeout=30_000)
            listed = page.evaluate(LISTED)
        finally:
            screenshot(page, "lab-file-browser")
    assert {"notebooks", "exercises", "solutions"} <= set(listed), f"file browser shows {listed}"
    assert [url for url in log.blocked if url != BADGE_IMAGE] == [], "JupyterLab tried to reach the network"


@pytest.mark.browser
@pytest.mark.slow
def test_lesson_01_runs_its_slider_redraws_and_its_exercise_link_opens(lab):
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
            page.evaluate("() => window.jupyterapp && window.jupyterapp.shell.collapseLeft()")
            screenshot(page, "lab-01_attention_recap")
            opened = follow_exercise_link(page)
        finally:
            screenshot(page, "lab-01-exercise-link")
    assert len(prompts) > 3
    assert after != before, "moving the slider did not redraw the panel"
    assert opened == EXERCISE
    assert [url for url in log.blocked if url != BADGE_IMAGE] == [], "JupyterLab tried to reach the network"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == stored, "the lesson file was rewritten"
