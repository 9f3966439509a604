"""Repository-wide pytest hooks: per-notebook wall time for the nbval runs.

Each notebook's time (kernel start, every cell, shutdown) is summed from pytest's reports,
printed at the end, and a notebook over the budget fails the run.  The budget is 90 s on the
2-core course machine (``NB_BUDGET_S`` overrides it).
"""

import collections
import os

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
