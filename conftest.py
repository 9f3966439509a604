"""Repository-wide pytest hooks: figure comparison and per-notebook wall time for the nbval runs.

Each notebook's time (kernel start, every cell, shutdown) is summed from pytest's reports,
printed at the end, and a notebook over the budget fails the run.  The budget is 90 s on the
2-core course machine (``NB_BUDGET_S`` overrides it).
"""

import collections
import os

# nbval compares plotly figures at the precision a reader reads them (tools/nbval_figures.py).
pytest_plugins = ["tools.nbval_figures"]

BUDGET_S = float(os.environ.get("NB_BUDGET_S", "90"))
_seconds = collections.defaultdict(float)


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _seconds[path] += report.duration


def _over_budget():
    return {path: t for path, t in _seconds.items() if t > BUDGET_S}


def pytest_terminal_summary(terminalreporter):
    if not _seconds:
        return
    terminalreporter.section(f"notebook wall time (budget {BUDGET_S:.0f} s each)")
    for path, t in sorted(_seconds.items()):
        flag = "  OVER BUDGET" if t > BUDGET_S else ""
        terminalreporter.write_line(f"{t:7.1f} s  {path}{flag}")


def pytest_sessionfinish(session, exitstatus):
    if _over_budget() and exitstatus == 0:
        session.exitstatus = 1
