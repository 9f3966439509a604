"""Real-browser plumbing for the tests marked ``browser``: Debian's chromium driven by playwright.

Policy: on a laptop without chromium the browser tests are skipped with the reason and the
command that fixes it; in CI (environment variable ``CI`` set, e.g. ``CI=true``) a missing
browser fails them, so CI can never skip them silently.  playwright's own browser download
is never used: the tests launch the system chromium (``COURSE_CHROMIUM`` overrides its path).
"""

import contextlib
import os
import pathlib

import pytest

CHROMIUM = os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOTS = pathlib.Path(__file__).resolve().parent.parent / "build" / "screenshots"
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")


def in_ci():
    """True when the ``CI`` environment variable says this is a CI run."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason):
    """Skip the test with ``reason``, or fail it in CI, where nothing may be skipped silently."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set: browser tests must run in CI)", pytrace=False)
    pytest.skip(reason)


def chromium_path():
    """The chromium executable, after the skip-or-fail policy when it or playwright is missing."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing(f"chromium not installed ({CHROMIUM} not found): apt-get install chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing("playwright (python) not installed: make venv")
    return CHROMIUM


@contextlib.contextmanager
def launched():
    """A headless chromium browser, closed (with its playwright driver) on exit."""
    path = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=LAUNCH_ARGS, timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()


class PageLog:
    """What a page did that a test may forbid: console errors, uncaught exceptions, blocked requests.

    Every request is aborted unless it goes to a local file (or one of ``allowed_origins``,
    e.g. the test's own JupyterLab server), so a test proves the page works with no network.
    """

    def __init__(self, page, allowed_origins=()):
        self.errors, self.blocked = [], []
        self._allowed = tuple(allowed_origins)
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))
        page.route("**/*", self._route)

    def _console(self, message):
        if message.type == "error":
            self.errors.append(f"console: {message.text}")

    def _route(self, route):
        url = route.request.url
        if url.startswith(LOCAL_SCHEMES) or url.startswith(self._allowed):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()


def screenshot(page, name):
    """Save a screenshot of ``page`` to build/screenshots/``name``.png; return its path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path
