"""The notebook harness really compares outputs: a tampered stored output or figure fails nbval.

Runs lesson 03 under nbval in a scratch copy, as ``make notebooks`` does (sanitiser and figure
plugin): once as stored (must pass), once with four stored outputs changed — a printed line,
a renamed trace, a curve moved by 1 %, and a curve moved by one part in a million, below a
figure's precision.  The first three cells must fail, by name; the fourth must pass.  A
harness that compares nothing would pass all four; one that compares bits would fail all four.
The comparison rules themselves are tested on small figures first.
"""

import base64
import json
import os
import re
import shutil
import subprocess
import sys

import nbformat
import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from tests.conftest import ROOT
from tools.nbval_figures import FIGURE, RTOL, figure_differences

LESSON = ROOT / "notebooks" / "03_johnson_lindenstrauss.ipynb"


def _figure(y, name="measured", title="error against k"):
    fig = go.Figure(go.Scatter(x=np.arange(len(y)), y=np.asarray(y, dtype=float), name=name))
    fig.update_layout(title=title)
    return json.loads(pio.to_json(fig))  # as stored in a notebook: typed arrays in base64


def test_the_same_figure_passes_and_sub_precision_noise_is_ignored():
    y = np.array([0.25, 0.125, 3.0, 1e-17])
    assert figure_differences(_figure(y), _figure(y)) == []
    # one part in a million, and noise at 1e-17 next to values of order 1: not what a reader sees
    assert figure_differences(_figure(y), _figure(y * (1 + 1e-6) + [0, 0, 0, 2e-17])) == []


def test_moved_values_renamed_traces_and_changed_titles_fail():
    y = np.array([0.25, 0.125, 3.0])
    moved = figure_differences(_figure(y), _figure(y * (1 + 10 * RTOL)))
    assert len(moved) == 1 and "'measured'.y" in moved[0] and "3 of 3 values" in moved[0], moved
    assert any("'measured'" in d and "'renamed'" in d for d in figure_differences(_figure(y), _figure(y, "renamed")))
    assert figure_differences(_figure(y), _figure(y, title="another claim"))
    assert figure_differences(_figure(y), _figure(np.append(y, 1.0)))
    assert figure_differences(_figure(y), _figure([0.25, np.nan, 3.0]))


def _nbval(path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tools.nbval_figures",
                           "-q", "-rf", "--nbval", str(path),
                           "--nbval-sanitize-with", str(ROOT / "tools" / "nbval_sanitize.cfg")],
                          cwd=path.parent, env=env, capture_output=True, text=True, timeout=300)


def _scale_first_trace(output, factor):
    trace = output.data[FIGURE]["data"][0]
    y = trace["y"]
    values = np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]) * factor
    y["bdata"] = base64.b64encode(values.astype(y["dtype"]).tobytes()).decode()


@pytest.mark.slow
def test_a_tampered_output_or_figure_fails_and_the_stored_one_passes(tmp_path):
    copy = tmp_path / LESSON.name
    shutil.copy(LESSON, copy)
    stored = _nbval(copy)
    assert stored.returncode == 0, stored.stdout[-3000:]

    nb = nbformat.read(copy, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    with_figure = [i for i, c in enumerate(code) if any(FIGURE in o.get("data", {}) for o in c.outputs)]
    # figures whose first trace stores y as a typed array, the form every course builder writes
    curves = [i for i in with_figure if any(isinstance(o.data[FIGURE]["data"][0].get("y"), dict)
                                            for o in code[i].outputs if FIGURE in o.get("data", {}))]
    with_stream = [i for i, c in enumerate(code) if i not in with_figure
                   and any(o.output_type == "stream" for o in c.outputs)]
    renamed, moved, noise = curves[:3]
    printed = with_stream[-1]
    stream = next(o for o in code[printed].outputs if o.output_type == "stream")
    stream.text = "tampered " + stream.text
    first = next(o for o in code[renamed].outputs if FIGURE in o.get("data", {}))
    first.data[FIGURE]["data"][0]["name"] = "a renamed trace"
    _scale_first_trace(next(o for o in code[moved].outputs if FIGURE in o.get("data", {})), 1.01)
    _scale_first_trace(next(o for o in code[noise].outputs if FIGURE in o.get("data", {})), 1 + 1e-6)
    nbformat.write(nb, copy)

    tampered = _nbval(copy)
    assert tampered.returncode != 0, "nbval accepted tampered stored outputs"
    failed = {int(m) for m in re.findall(r"FAILED \S+::Cell (\d+)", tampered.stdout)}
    assert failed == {printed, renamed, moved}, (failed, tampered.stdout[-3000:])
    assert "a renamed trace" in tampered.stdout and "tampered" in tampered.stdout
