"""``python -m course_lib.grade``: real kernels grade real notebooks; two runs, shared by every test.

The mixed folder holds an untouched exercise notebook (every exercise "not attempted"), a
solution with one wrong answer ("failed" with the checker's hint), a solution with a syntax
error in one exercise (that exercise "error", the rest of the notebook still graded) and a file
that is not a notebook (its exercises "error", the other notebooks still graded).  The solution
run grades one untouched solution notebook: every exercise passes and the exit code is 0.
"""

import ast
import contextlib
import importlib
import io
import json

import nbformat
import pytest

from course_lib import grade
from tests.conftest import ROOT

SYNTAX_ERROR = "this line is not Python"


def _exercises(lesson):
    """The exercises ``course_lib.checks.lessonNN`` defines, in order."""
    return importlib.import_module(f"course_lib.checks.lesson{lesson}").EXERCISES


def _replace_solution(nb, number, body):
    """Replace the lines between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` of exercise ``number``."""
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith(f"# Exercise {number}:"))
    lines = cell.source.splitlines()
    begin = next(i for i, line in enumerate(lines) if line.strip() == "### BEGIN SOLUTION")
    end = next(i for i, line in enumerate(lines) if line.strip() == "### END SOLUTION")
    indent = lines[begin][:len(lines[begin]) - len(lines[begin].lstrip())]
    function = next(node for node in ast.walk(ast.parse(cell.source)) if isinstance(node, ast.FunctionDef)
                    and node.lineno <= begin < node.end_lineno)
    lines[begin + 1:end] = [indent + line for line in body(function)]
    cell.source = "\n".join(lines)


def _wrong_answer(lesson, exercise):
    """A body that makes the exercise's first classic slip, by calling the checker's own model of it."""
    def body(function):
        args = function.args
        params = ", ".join([arg.arg for arg in args.args] + [f"{arg.arg}={arg.arg}" for arg in args.kwonlyargs])
        return [f"from course_lib.checks.lesson{lesson} import EXERCISES  # a wrong answer, made on purpose",
                f"return EXERCISES[{_exercises(lesson).index(exercise)}].mistakes[0].fn({params})"]
    return body


def _copy(source_dir, name, tmp, number=None, body=None):
    nb = nbformat.read(ROOT / source_dir / name, as_version=4)
    if number:
        _replace_solution(nb, number, body)
    nbformat.write(nb, tmp / name)


def _run_main(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = grade.main(argv)
    return code, out.getvalue()


# Lesson 05's first exercise gets a wrong answer, lesson 01's second a syntax error.
WRONG, BROKEN = _exercises("05")[0], _exercises("01")[1]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """One graded run over four notebooks: exit code, printed table, JSON, and the folder."""
    tmp = tmp_path_factory.mktemp("mixed")
    _copy("solutions", "01_attention_recap.ipynb", tmp, BROKEN.number, lambda function: [SYNTAX_ERROR])
    _copy("exercises", "02_low_rank.ipynb", tmp)
    (tmp / "03_johnson_lindenstrauss.ipynb").write_text("<<<<<<< a merge conflict, not JSON")
    _copy("solutions", "05_parameter_sharing.ipynb", tmp, WRONG.number, _wrong_answer("05", WRONG))
    code, text = _run_main([str(tmp), "--json", str(tmp / "grades.json")])
    data = json.loads((tmp / "grades.json").read_text())
    return code, text, data, tmp


def _status(data):
    return {row["exercise"]: row for row in data["exercises"]}


def _numbers(lesson):
    return [exercise.number for exercise in _exercises(lesson)]


@pytest.mark.slow
def test_untouched_exercises_are_not_attempted_and_the_run_fails(mixed):
    code, _, data, _ = mixed
    rows = _status(data)
    assert code == 1
    assert [rows[n]["status"] for n in _numbers("02")] == ["not attempted"] * len(_numbers("02"))


@pytest.mark.slow
def test_a_wrong_answer_fails_with_its_hint(mixed):
    _, text, data, _ = mixed
    rows = _status(data)
    hint = WRONG.mistakes[0].hint
    assert (rows[WRONG.number]["status"], rows[WRONG.number]["hint"]) == ("failed", hint)
    assert all(rows[n]["status"] == "passed" for n in _numbers("05") if n != WRONG.number)
    assert f"{WRONG.number:<8}  failed         {hint}" in text


@pytest.mark.slow
def test_a_notebook_that_raises_is_reported_and_the_rest_is_graded(mixed):
    _, _, data, _ = mixed
    rows = _status(data)
    assert rows[BROKEN.number]["status"] == "error"
    assert rows[BROKEN.number]["hint"].startswith("SyntaxError: "), rows[BROKEN.number]
    assert "(cell " in rows[BROKEN.number]["hint"]  # where to look, in one line
    # Cells after the error still ran: the notebook's other exercises are graded.
    assert all(rows[n]["status"] == "passed" for n in _numbers("01") if n != BROKEN.number)
    for number in _numbers("03"):  # expected from course_lib.checks.lesson03, though nothing ran
        assert rows[number]["status"] == "error" and "cannot read the notebook" in rows[number]["hint"]


@pytest.mark.slow
def test_table_and_json_list_every_exercise_once_in_lesson_order(mixed):
    _, text, data, tmp = mixed
    expected = [*_numbers("01"), *_numbers("02"), *_numbers("03"), *_numbers("05")]
    assert [row["exercise"] for row in data["exercises"]] == expected
    passed = len(_numbers("01")) + len(_numbers("05")) - 2
    errors = len(_numbers("03")) + 1
    summary = {"passed": passed, "failed": 1, "not attempted": len(_numbers("02")), "error": errors}
    assert data["summary"] == summary
    assert text.splitlines()[0].split() == ["lesson", "exercise", "status", "hint"]
    assert f"{len(expected)} exercises: " + ", ".join(f"{v} {k}" for k, v in summary.items()) in text
    # The learner's file is graded in memory, never rewritten (no injected cell).
    stored = (tmp / "01_attention_recap.ipynb").read_text()
    assert SYNTAX_ERROR in stored and "_install_grade_hook" not in stored


@pytest.mark.slow
def test_solutions_pass_and_exit_zero(tmp_path, monkeypatch):
    (tmp_path / "01_attention_recap.ipynb").write_bytes((ROOT / "solutions" / "01_attention_recap.ipynb").read_bytes())
    monkeypatch.chdir(tmp_path)  # the JSON goes to grades.json in the current directory by default
    code, text = _run_main([str(tmp_path)])
    data = json.loads((tmp_path / "grades.json").read_text())
    assert code == 0, text
    assert [(r["exercise"], r["status"]) for r in data["exercises"]] == [(n, "passed") for n in _numbers("01")]


def test_an_empty_folder_is_refused(tmp_path, capsys):
    assert grade.main([str(tmp_path)]) == 2
    assert "no NN_*.ipynb notebooks" in capsys.readouterr().err


def test_hint_is_the_checkers_hint_line_else_its_first_line():
    assert grade._hint("  case 'a' differs:\n  x: expected 1\n  hint: divide by √d.") == "divide by √d."
    assert grade._hint("  case 'a' raised TypeError: bad\n") == "case 'a' raised TypeError: bad"
