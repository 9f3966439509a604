"""The solution → exercise generator on small hand-made notebooks."""

import nbformat
import pytest

from tools import make_exercises


def _solution(source, tags=()):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = list(tags)
    cell.execution_count, cell.outputs = 3, [nbformat.v4.new_output("stream", text="hi")]
    nb.cells = [cell]
    return nb


def test_solution_region_becomes_a_stub_with_the_task():
    source = ("# Exercise 7.2: the prefix sum\n"
              "def prefix(x):\n"
              "    ### BEGIN SOLUTION\n"
              "    return x.cumsum()\n"
              "    ### END SOLUTION\n")
    nb = make_exercises.make_exercise(_solution(source), "exercises/07_x.ipynb")
    stub = nb.cells[-1]
    assert stub.source == ("# Exercise 7.2: the prefix sum\n"
                           "def prefix(x):\n"
                           "    # YOUR CODE HERE\n"
                           "    raise NotImplementedError('Exercise 7.2: the prefix sum')")
    assert stub.outputs == [] and stub.execution_count is None
    assert nb.cells[0].metadata["tags"] == ["colab-badge"] and "exercises/07_x.ipynb" in nb.cells[0].source


def test_solutions_only_cells_are_dropped():
    nb = make_exercises.make_exercise(_solution("print('answer')", tags=["solutions-only"]), "exercises/07_x.ipynb")
    assert all("answer" not in c.source for c in nb.cells)


@pytest.mark.parametrize("source, match", [
    ("def f():\n    ### BEGIN SOLUTION\n    pass\n    ### END SOLUTION", "must start with '# Exercise N.M"),
    ("# Exercise 1.1: x\n### BEGIN SOLUTION\npass", "never closed"),
    ("# Exercise 1.1: x\npass\n### END SOLUTION", "without"),
])
def test_malformed_markers_are_reported(source, match):
    with pytest.raises(make_exercises.SolutionFormatError, match=match):
        make_exercises.make_exercise(_solution(source), "exercises/01_x.ipynb")
