"""The notebook harness really compares outputs: a tampered stored output fails nbval.

Runs lesson 00 twice under nbval in a scratch copy: once as stored (must pass), once with
one stored output changed (must fail, naming the cell).  A harness that compares nothing
would pass both; one that always fails would fail both.
"""

import shutil
import subprocess
import sys

import nbformat
import pytest

from tests.conftest import ROOT

LESSON = ROOT / "notebooks" / "00_welcome.ipynb"


def _nbval(path):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbval", str(path),
                           "--nbval-sanitize-with", str(ROOT / "tools" / "nbval_sanitize.cfg")],
                          cwd=path.parent, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_tampered_output_fails_and_the_stored_one_passes(tmp_path):
    copy = tmp_path / LESSON.name
    shutil.copy(LESSON, copy)
    stored = _nbval(copy)
    assert stored.returncode == 0, stored.stdout[-3000:]

    nb = nbformat.read(copy, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.execution_count
                and any(o.output_type == "stream" for o in c.outputs))
    stream = next(o for o in cell.outputs if o.output_type == "stream")
    stream.text = stream.text.replace("device=", "device=tampered-")
    assert "tampered" in stream.text
    nbformat.write(nb, copy)
    tampered = _nbval(copy)
    assert tampered.returncode != 0, "nbval accepted a tampered stored output"
    assert "tampered" in tampered.stdout
