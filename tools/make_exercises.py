"""Generate ``exercises/NN_*.ipynb`` from ``solutions/NN_*.ipynb``, the single source.

In a solution notebook, a code cell that holds an exercise starts with the comment
``# Exercise N.M: what to do`` and wraps the answer in ``### BEGIN SOLUTION`` /
``### END SOLUTION``.  The generator replaces each region with a stub that raises
``NotImplementedError("Exercise N.M: what to do")``, drops cells tagged ``solutions-only``,
clears every output and writes the Colab head for the exercise's own path.

    python tools/make_exercises.py           write exercises/
    python tools/make_exercises.py --check   exit 1 if exercises/ is out of sync
"""

import argparse
import copy
import pathlib
import re
import sys

import nbformat

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import nbhead  # noqa: E402

ROOT = nbhead.ROOT
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
TITLE = re.compile(r"^#\s*Exercise\s+(\d+\.\d+):\s*(.+?)\s*$")


class SolutionFormatError(ValueError):
    """A solution cell whose markers cannot be turned into a stub."""


def stub_source(source, where):
    """The cell's source with every solution region replaced by a stub."""
    lines = source.splitlines()
    title = TITLE.match(lines[0]) if lines else None
    if title is None:
        raise SolutionFormatError(f"{where}: a cell with {BEGIN} must start with '# Exercise N.M: task'")
    message = f"Exercise {title.group(1)}: {title.group(2)}"
    out, inside = [], False
    for line in lines:
        marker = line.strip()
        if marker.startswith(BEGIN):
            if inside:
                raise SolutionFormatError(f"{where}: nested {BEGIN}")
            indent = line[: len(line) - len(line.lstrip())]
            out += [f"{indent}# YOUR CODE HERE", f"{indent}raise NotImplementedError({message!r})"]
            inside = True
        elif marker.startswith(END):
            if not inside:
                raise SolutionFormatError(f"{where}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise SolutionFormatError(f"{where}: {BEGIN} is never closed")
    return "\n".join(out)


def make_exercise(solution, relpath):
    """The exercise notebook (a new object) generated from a solution notebook."""
    nb = copy.deepcopy(solution)
    nb.cells = [c for c in nb.cells if "solutions-only" not in c.get("metadata", {}).get("tags", [])]
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if BEGIN in cell.source or END in cell.source:
            cell.source = stub_source(cell.source, f"{relpath} cell {index}")
        cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
    return nbhead.apply_head(nb, relpath)


def pairs():
    """``(solution path, exercise path)`` for every solution notebook."""
    for solution in sorted((ROOT / "solutions").glob("*.ipynb")):
        yield solution, ROOT / "exercises" / solution.name


def rendered(solution_path, exercise_path):
    nb = make_exercise(nbformat.read(solution_path, as_version=4), exercise_path.relative_to(ROOT).as_posix())
    return nbformat.writes(nb) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report differences, write nothing")
    args = parser.parse_args(argv)
    expected = {ex: rendered(sol, ex) for sol, ex in pairs()}
    stale = [ex for ex, text in expected.items() if not ex.exists() or ex.read_text() != text]
    extra = sorted(set((ROOT / "exercises").glob("*.ipynb")) - set(expected))
    if args.check:
        for path in stale:
            print(f"out of sync with solutions/: {path.relative_to(ROOT)}")
        for path in extra:
            print(f"no solution notebook for: {path.relative_to(ROOT)}")
        return 1 if (stale or extra) else 0
    (ROOT / "exercises").mkdir(exist_ok=True)
    for path in stale:
        path.write_text(expected[path])
        print(f"wrote {path.relative_to(ROOT)}")
    for path in extra:
        path.unlink()
        print(f"removed {path.relative_to(ROOT)} (its solution notebook is gone)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
