"""Grade a learner's exercise notebooks: run each in a fresh kernel and tabulate every check.

    python -m course_lib.grade [folder] [--json grades.json]     (or: make grade GRADE_DIR=folder)

Every ``NN_*.ipynb`` in the folder (default ``exercises/``) runs top to bottom in its own
``python3`` kernel, in memory (the learner's file is never rewritten), with the kernel's working
directory set to the folder.  One table follows: lesson, exercise, status (passed / failed /
not attempted / error) and, for a failure, the checker's hint; the same rows go to a JSON file.
The exit code is 0 only when every exercise passed.

How results are collected: one cell is put in front of the in-memory copy.  It wraps
``CheckResult.__init__`` of ``course_lib.checks`` *inside that kernel only*, so every result a
check cell creates is also appended, one JSON line each, to a temporary file this process reads
afterwards.  Printed text is never parsed.  The exercises each lesson must report come from
``course_lib.checks.lessonNN.EXERCISES``, so an exercise whose check never ran (an earlier cell
raised, the kernel died) is listed as "error" with the exception's one-line summary instead of
silently missing.  Cells keep running after an error, so one broken exercise does not hide the
others; a notebook that cannot run at all never stops the other notebooks.
"""

import argparse
import dataclasses
import importlib
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from course_lib.checks import FAILED, NOT_ATTEMPTED, PASSED

ERROR = "error"
STATUSES = (PASSED, FAILED, NOT_ATTEMPTED, ERROR)
# Per-cell limit: every lesson runs in well under 90 s, so a cell that takes longer is stuck.
CELL_TIMEOUT_S = 90
CHECK_CALL = re.compile(r"\bexercise_(\d+)_(\d+)\s*\(")

# The injected first cell: record every CheckResult the kernel creates (a JSON line each).
HOOK = """\
def _install_grade_hook(path):
    import json
    from course_lib.checks import CheckResult

    init = CheckResult.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        fields = {name: getattr(self, name) for name in ("exercise", "status", "message", "mistake")}
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(fields, default=str) + "\\n")

    CheckResult.__init__ = record


_install_grade_hook(RESULTS_PATH)
del _install_grade_hook
"""


@dataclasses.dataclass
class Grade:
    """One exercise's outcome in one notebook."""

    lesson: str  # the notebook's name without .ipynb, e.g. "01_attention_recap"
    exercise: str  # "1.1"
    status: str  # one of STATUSES
    hint: str = ""  # failed: the checker's hint; error: the exception's one-line summary
    title: str = ""
    message: str = ""  # everything the checker said


def expected_exercises(lesson):
    """``{number: title}`` of the exercises ``course_lib.checks.lessonNN`` defines for ``"NN_name"``."""
    try:
        module = importlib.import_module(f"course_lib.checks.lesson{lesson[:2]}")
    except ModuleNotFoundError:
        return {}
    return {exercise.number: exercise.title for exercise in module.EXERCISES}


def _first_line(text, limit=200):
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _hint(message):
    """The checker's ``hint:`` line, else its first line (e.g. "case 'x' raised TypeError: …")."""
    for line in message.splitlines():
        if line.strip().startswith("hint:"):
            return line.strip()[len("hint:"):].strip()
    return _first_line(message)


def execute(nb, folder, timeout=CELL_TIMEOUT_S):
    """Run ``nb`` (in memory) with the hook; return ``(records, fatal)``, fatal the one-line reason it stopped."""
    import nbformat
    from nbclient import NotebookClient

    with tempfile.TemporaryDirectory() as tmp:
        results = pathlib.Path(tmp) / "results.jsonl"
        nb.cells.insert(0, nbformat.v4.new_code_cell(HOOK.replace("RESULTS_PATH", repr(str(results)))))
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                record_timing=False, resources={"metadata": {"path": str(folder)}})
        fatal = None
        try:
            # The kernel process's own stderr is its log (transport warnings), not the learner's output.
            client.execute(stderr=subprocess.DEVNULL)
        except Exception as exc:  # a dead kernel, a stuck cell, no kernel: this notebook only
            fatal = f"{type(exc).__name__}: {_first_line(exc)}"
        hook = [out for out in nb.cells.pop(0).get("outputs", []) if out.get("output_type") == "error"]
        if hook and not fatal:  # e.g. course_lib not importable in the kernel: nothing can be collected
            fatal = f"the grading hook failed: {hook[0].get('ename')}: {_first_line(hook[0].get('evalue', ''))}"
        text = results.read_text(encoding="utf-8") if results.exists() else ""
    return [json.loads(line) for line in text.splitlines()], fatal


def cell_errors(nb):
    """``[(cell index, "Name: message")]`` for every cell that raised (the kernel's error outputs)."""
    return [(i, _summary(out, i)) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for out in cell.get("outputs", []) if out.get("output_type") == "error"]


def _summary(error, index):
    """``"SyntaxError: expected ':' (cell 7, line 2)"``: IPython's temporary file name left out."""
    text = f"{error.get('ename', 'Error')}: {_first_line(error.get('evalue', ''))}"
    where = re.search(r" \(\S+\.py, line (\d+)\)$", text)
    if where:
        return f"{text[:where.start()]} (cell {index + 1}, line {where[1]})"
    return f"{text} (cell {index + 1})"


def _why_missing(number, nb, errors, fatal):
    """The one-line reason exercise ``number`` reported nothing: the first error before its check cell."""
    calls = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
             for match in CHECK_CALL.finditer(cell.source) if f"{match[1]}.{match[2]}" == number]
    if not calls:
        return fatal or f"no cell calls exercise_{number.replace('.', '_')}(...)"
    check = calls[-1]
    earlier = [i for i, cell in enumerate(nb.cells[:check])
               if cell.cell_type == "code" and CHECK_CALL.search(cell.source)]
    since = earlier[-1] if earlier else -1
    for start in (since, -1):  # first an error since the previous check cell, then any earlier one
        reason = next((summary for i, summary in errors if start < i <= check), None)
        if reason:
            return reason
    return fatal or "its check cell ran but reported nothing"


def grade_notebook(path, timeout=CELL_TIMEOUT_S):
    """Run the notebook at ``path``; one ``Grade`` per expected (or reported) exercise, in order."""
    import nbformat

    path = pathlib.Path(path)
    lesson = path.stem
    expected = expected_exercises(lesson)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # not a notebook (truncated upload, merge conflict): every exercise errs
        return [Grade(lesson, number, ERROR, f"cannot read the notebook: {_first_line(exc)}", title)
                for number, title in expected.items()]
    records, fatal = execute(nb, path.parent, timeout)
    reported = {r["exercise"]: r for r in records}  # a check run twice: its last result counts
    errors = cell_errors(nb)
    grades = []
    for number in [*expected, *sorted(set(reported) - set(expected))]:
        title = expected.get(number, "")
        if number in reported:
            record = reported[number]
            hint = _hint(record["message"] or "") if record["status"] == FAILED else ""
            grades.append(Grade(lesson, number, record["status"], hint, title, record["message"] or ""))
        else:
            grades.append(Grade(lesson, number, ERROR, _why_missing(number, nb, errors, fatal), title))
    return grades


def notebooks(folder):
    """The lesson notebooks ``NN_*.ipynb`` in ``folder`` (or the one notebook ``folder`` names), sorted."""
    folder = pathlib.Path(folder)
    if folder.suffix == ".ipynb":
        return [folder]
    return sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))


def grade_folder(folder, timeout=CELL_TIMEOUT_S, progress=None):
    """Grades of every lesson notebook in ``folder``; ``progress`` (a file) gets one line per notebook."""
    grades, paths = [], notebooks(folder)
    for i, path in enumerate(paths, start=1):
        start = time.perf_counter()
        found = grade_notebook(path, timeout)
        grades += found
        if progress:
            counts = ", ".join(f"{sum(g.status == s for g in found)} {s}" for s in STATUSES
                               if any(g.status == s for g in found))
            print(f"[{i}/{len(paths)}] {path.name}: {counts or 'no exercises'} "
                  f"({time.perf_counter() - start:.1f} s)", file=progress, flush=True)
    return grades


def summary(grades):
    """``{status: count}`` for every status, in the order of ``STATUSES``."""
    return {status: sum(g.status == status for g in grades) for status in STATUSES}


def table(grades):
    """The report: one line per exercise, then the totals."""
    width = max([len("lesson"), *(len(g.lesson) for g in grades)])
    lines = [f"{'lesson':<{width}}  {'exercise':<8}  {'status':<13}  hint"]
    lines += [f"{g.lesson:<{width}}  {g.exercise:<8}  {g.status:<13}  {g.hint}".rstrip() for g in grades]
    counts = summary(grades)
    lines.append(f"{len(grades)} exercises: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES))
    return lines


def write_json(grades, path, folder):
    """Write ``{"folder", "summary", "exercises": [...]}`` to ``path``."""
    data = {"folder": str(folder), "summary": summary(grades), "exercises": [dataclasses.asdict(g) for g in grades]}
    pathlib.Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv=None):
    """The ``python -m course_lib.grade`` command; 0 when every exercise passed, 1 otherwise, 2 on bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.grade", description="Run a learner's exercise notebooks (every NN_*.ipynb in "
        "FOLDER), each in a fresh kernel, and report every exercise: passed, failed (with the hint), not "
        "attempted, or error (the notebook raised before the check ran). Exit code 0 only when all passed.")
    parser.add_argument("folder", nargs="?", default="exercises", help="folder of notebooks, or one notebook "
                        "(default: exercises)")
    parser.add_argument("--json", default="grades.json", help="where to write the results (default: grades.json)")
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT_S, help="seconds allowed per cell")
    args = parser.parse_args(argv)
    if not notebooks(args.folder):
        print(f"grade: no NN_*.ipynb notebooks in {args.folder}", file=sys.stderr)
        return 2
    grades = grade_folder(args.folder, args.timeout, progress=sys.stderr)
    print("\n".join(table(grades)))
    write_json(grades, args.json, args.folder)
    print(f"wrote {args.json}")
    return 0 if grades and all(g.status == PASSED for g in grades) else 1


if __name__ == "__main__":
    sys.exit(main())
