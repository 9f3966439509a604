"""Lesson 04's stored fit and its tool: the best fixed projection, the trivial baselines, the curves."""

import numpy as np
import pytest

from course_lib import data_path
from course_lib.checks.lesson04 import best_fixed_projection
from tools import fit_projections


def _softmax_rows(rng, shape, spread):
    scores = spread * rng.standard_normal(shape)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def test_the_best_fixed_projection_beats_every_other_fixed_projection_on_its_training_matrices():
    rng = np.random.default_rng(0)
    P = _softmax_rows(rng, (6, 16, 16), 2.0)  # six training matrices
    k = 4
    F = best_fixed_projection(P, k)
    np.testing.assert_allclose(F @ F.T, np.eye(k), atol=1e-12)  # orthonormal rows

    def loss(G):
        return float(np.sum((P - P @ G.T @ G) ** 2))

    for _ in range(200):  # random orthonormal k-frames never do better
        G = np.linalg.qr(rng.standard_normal((16, k)))[0].T
        assert loss(F) <= loss(G) + 1e-12
    tool = fit_projections
    second_moment = tool.second_moment(*(_qk_for(P)))
    np.testing.assert_allclose(second_moment, np.einsum("tns,tnu->su", P, P), rtol=1e-10)


def _qk_for(P):
    """q, k whose attention weights are exactly P (one head, d = s): q = log P, k = √d · I."""
    import torch

    n, s = P.shape[-2:]
    q = torch.from_numpy(np.log(P))[:, None]  # (t, 1, n, s): scores log P give softmax P
    k = torch.eye(s, dtype=torch.float64).expand(len(P), 1, s, s) * np.sqrt(s)  # q kᵀ / √s = log P
    return q, k


def test_the_tools_top_eigenvectors_match_the_exercise_reference():
    rng = np.random.default_rng(1)
    P = _softmax_rows(rng, (3, 10, 10), 1.5)
    rows = P.reshape(-1, 10)
    tool_F = fit_projections.top_eigenvectors(rows.T @ rows, 3)
    np.testing.assert_allclose(tool_F.T @ tool_F, best_fixed_projection(P, 3).T @ best_fixed_projection(P, 3),
                               atol=1e-10)  # the same subspace


@pytest.fixture(scope="module")
def stored():
    return np.load(data_path("learned_projections.npz"))


def test_stored_fit_holds_the_baselines_the_reference_and_the_curves(stored):
    methods = [str(m) for m in stored["methods"]]
    error = dict(zip(methods, stored["heldout_errors"].mean(axis=-1).T, strict=True))  # method -> (k,)
    np.testing.assert_allclose(error["output zero"], 1.0)
    assert np.all(error["uniform attention (mean of V)"] < 1)
    assert np.all(error["learned E, F"] < error["uniform attention (mean of V)"])
    assert np.all(error["SVD-optimal for P (needs P)"] < error["best fixed for P (needs P)"])  # per input wins
    p_fixed, p_own = stored["p_errors"].mean(axis=-1).T  # (k,) each: ‖P − P Π‖ / ‖P‖ held out
    assert np.all(p_own < p_fixed)
    steps = stored["heldout_curve_steps"]
    assert steps[0] == 0 and stored["heldout_curves"].shape == stored["train_curves"].shape == (len(stored["ks"]),
                                                                                                len(steps))
    assert stored["rms_curves"].shape[1] == steps[-1]  # one training loss per step
    assert stored["layers_heldout_errors"].shape == (len(stored["layers"]), len(methods), 12)


def test_the_fit_tool_runs_end_to_end(tmp_path):
    out = tmp_path / "fit.npz"
    fit_projections.main(["--layer", "2", "--k", "16", "--layers", "2", "--k-layers", "16", "--n", "64", "--train", "2",
                  "--heldout", "1", "--steps", "4", "--eval-every", "2", "--out", str(out)])
    result = np.load(out)
    assert result["heldout_errors"].shape == (1, len(result["methods"]), 12)
    assert list(result["heldout_curve_steps"]) == [0, 2, 4] and result["rms_curves"].shape == (1, 4)
