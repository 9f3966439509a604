"""The exercise round trip in a real kernel: untouched stubs report "not attempted" and the
notebook runs to the end; a wrong answer fails with a hint; the solution passes."""

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT

EXERCISE = ROOT / "exercises" / "01_attention_recap.ipynb"


def _run(nb, tmp_path):
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.slow
def test_untouched_then_wrong_answer(tmp_path):
    nb = nbformat.read(EXERCISE, as_version=4)
    out = _run(nb, tmp_path)
    for number in ("1.1", "1.2", "1.3"):
        assert f"Exercise {number}: not attempted" in out

    nb = nbformat.read(EXERCISE, as_version=4)
    stub = next(c for c in nb.cells if c.cell_type == "code" and "Exercise 1.2:" in c.source)
    stub.source = stub.source.replace(
        "    # YOUR CODE HERE\n    raise NotImplementedError('Exercise 1.2: what h heads cost')",
        "    d = d_model / n_heads\n    return n_heads * 4 * n * n * d, n * n  # one P for all heads: a classic slip")
    assert "raise NotImplementedError" not in stub.source
    out = _run(nb, tmp_path)
    assert "Exercise 1.2: failed" in out
    assert "hint: each head has its own scores and its own softmax" in out
    assert "Exercise 1.1: not attempted" in out and "Exercise 1.3: not attempted" in out
