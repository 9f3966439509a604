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


@pytest.mark.slow
def test_exercise_7_1_rule_holds_across_cells(tmp_path):
    # In a kernel each cell is a file of its own: a loop in a helper defined in another cell, or a call into
    # the library's causal form, must still be caught; a parallel helper in another cell must still pass.
    nb = nbformat.read(ROOT / "exercises" / "07_transformers_are_rnns.ipynb", as_version=4)
    stub_index = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "Exercise 7.1:" in c.source)
    helpers = nbformat.v4.new_code_cell(
        "def run_rnn(q, k, v, S, Z):\n"
        "    state, outputs = (S, Z), []\n"
        "    for t in range(q.shape[-2]):\n"
        "        out, state = linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], state)\n"
        "        outputs.append(out)\n"
        "    return np.stack(outputs, axis=-2), *state\n\n\n"
        "def block_part(phi_q, phi_k, v):\n"
        "    weights = np.tril(phi_q @ np.swapaxes(phi_k, -1, -2))\n"
        "    return weights @ v, weights.sum(axis=-1)\n")
    answers = nbformat.v4.new_code_cell(
        "from course_lib.numpy.linear import chunked_causal_sums\n\n\n"
        "def prefill_block(q, k, v, S, Z):\n"
        "    return run_rnn(q, k, v, S, Z)\n\n\n"
        "def finish(phi_q, phi_k, v, S, Z, numerator, normaliser):\n"
        "    normaliser = normaliser + np.einsum('...cf,...f->...c', phi_q, Z)\n"
        "    return ((numerator + phi_q @ S) / (normaliser[..., None] + 1e-6), S + np.swapaxes(phi_k, -1, -2) @ v,\n"
        "            Z + phi_k.sum(axis=-2))\n\n\n"
        "def prefill_by_library(q, k, v, S, Z):\n"
        "    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)\n"
        "    return finish(phi_q, phi_k, v, S, Z, *chunked_causal_sums(phi_q, phi_k, v, q.shape[-2]))\n\n\n"
        "def prefill_parallel(q, k, v, S, Z):\n"
        "    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)\n"
        "    return finish(phi_q, phi_k, v, S, Z, *block_part(phi_q, phi_k, v))\n")
    checks = nbformat.v4.new_code_cell("exercise_7_1(prefill_by_library)\nexercise_7_1(prefill_parallel)\n")
    nb.cells[stub_index:stub_index + 1] = [helpers, answers]
    nb.cells.insert(stub_index + 3, checks)  # after the notebook's own check of prefill_block
    nb.cells = [c for c in nb.cells if "Exercise 7.2:" not in c.source and "exercise_7_2(" not in c.source]
    out = _run(nb, tmp_path)
    assert "Exercise 7.1: failed" in out and "it loops over the block's positions" in out
    assert "calls chunked_causal_sums from course_lib." in out
    assert "Exercise 7.1: passed" in out
