"""Notebook hygiene: executed top to bottom, set up the same way, exercises in sync.

nbval compares only cells stored with an execution count, so an unexecuted or partly
executed lesson would silently compare nothing: these tests make that a failure.
"""

import re
import subprocess
import sys

import nbformat
import pytest

from course_lib import notebook
from tests.conftest import ROOT

LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
EXECUTED = LESSONS + SOLUTIONS


def _code_cells(path):
    nb = nbformat.read(path, as_version=4)
    return [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]


def _rel(path):
    return path.relative_to(ROOT).as_posix()


def test_lessons_are_numbered_from_00_without_gaps():
    numbers = [int(p.name[:2]) for p in LESSONS]
    assert numbers == list(range(len(numbers))) and len(numbers) >= 2, [p.name for p in LESSONS]
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", p.name) for p in LESSONS + SOLUTIONS)


def test_the_lesson_map_lists_every_lesson_with_its_title():
    titles = {}
    for path in LESSONS:
        heading = next(c.source for c in nbformat.read(path, as_version=4).cells
                       if c.cell_type == "markdown" and c.source.startswith("# "))
        titles[path.stem] = heading.splitlines()[0][2:]
    assert titles == notebook.LESSONS


def test_every_lesson_from_01_has_a_solutions_notebook():
    lessons = {p.name for p in LESSONS if not p.name.startswith("00_")}
    assert lessons == {p.name for p in SOLUTIONS}


@pytest.mark.parametrize("path", EXECUTED, ids=_rel)
def test_stored_executed_top_to_bottom(path):
    counts = [c.execution_count for c in _code_cells(path)]
    assert None not in counts, f"{_rel(path)}: code cells {[i for i, c in enumerate(counts) if c is None]} unexecuted"
    assert counts == list(range(1, len(counts) + 1)), f"{_rel(path)}: counts {counts} are not 1..N in order"


@pytest.mark.parametrize("path", EXECUTED, ids=_rel)
def test_no_stored_errors(path):
    for cell in _code_cells(path):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{_rel(path)}: stored error {errors[0].ename}: {errors[0].evalue}"


@pytest.mark.parametrize("path", LESSONS + SOLUTIONS + EXERCISES, ids=_rel)
def test_first_course_cell_calls_setup(path):
    cells = _code_cells(path)
    assert "colab-install" in cells[0].metadata.get("tags", []), f"{_rel(path)}: Colab cell is not first"
    assert re.search(r"^device = setup\(", cells[1].source, re.M), f"{_rel(path)}: second code cell must call setup()"


@pytest.mark.parametrize("path", LESSONS + SOLUTIONS, ids=_rel)
def test_every_cell_has_a_slide_type(path):
    nb = nbformat.read(path, as_version=4)
    missing = [i for i, c in enumerate(nb.cells) if "slide_type" not in c.metadata.get("slideshow", {})]
    assert not missing, f"{_rel(path)}: cells {missing} have no slideshow metadata"


@pytest.mark.parametrize("path", LESSONS, ids=_rel)
def test_lessons_point_to_their_exercises_and_cite_references(path):
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    assert "## References" in text, f"{_rel(path)}: no references section"
    if not path.name.startswith("00_"):
        # a relative Markdown link, which JupyterLab opens in a new tab (the browser test clicks one)
        link = f"](../exercises/{path.name})"
        assert link in text, f"{_rel(path)}: no relative link to exercises/{path.name}"
        assert (path.parent / ".." / "exercises" / path.name).resolve().is_file()


@pytest.mark.parametrize("path", LESSONS, ids=_rel)
def test_lessons_have_a_widget_and_a_figure(path):
    cells = _code_cells(path)
    outputs = [o for c in cells for o in c.outputs]
    mimes = {m for o in outputs for m in o.get("data", {})}
    assert "application/vnd.jupyter.widget-view+json" in mimes, f"{_rel(path)}: no widget"
    if not path.name.startswith("00_"):
        assert "application/vnd.plotly.v1+json" in mimes, f"{_rel(path)}: no plotly figure"
    ignored = [c for c in cells if "nbval-ignore-output" in c.metadata.get("tags", [])]
    assert len(ignored) < len(cells) / 2, f"{_rel(path)}: most cells are excluded from output comparison"


@pytest.mark.parametrize("path", EXERCISES, ids=_rel)
def test_exercise_notebooks_are_stored_clean(path):
    assert all(c.execution_count is None and not c.outputs for c in _code_cells(path))


def test_exercises_are_in_sync_with_solutions():
    result = subprocess.run([sys.executable, "tools/make_exercises.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, "run `make exercises`:\n" + result.stdout + result.stderr


def test_exercise_stubs_raise_with_the_exercise_number():
    stubs = [c.source for p in EXERCISES for c in _code_cells(p) if "raise NotImplementedError" in c.source]
    assert stubs, "no exercise stubs found"
    assert all(re.search(r"NotImplementedError\(['\"]Exercise \d+\.\d+: .+['\"]\)", s) for s in stubs)
    assert not any("### BEGIN SOLUTION" in s for s in stubs)
