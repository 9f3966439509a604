"""course_lib.numpy.lowrank: spectra, the rank for an energy share, Eckart–Young truncation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from course_lib.numpy import lowrank


def _softmax_matrix(seed, lead, n, s, scale=1.0):
    scores = scale * np.random.default_rng(seed).standard_normal((*lead, n, s))
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


matrices = st.tuples(st.integers(0, 2), st.integers(1, 6), st.integers(1, 6)).flatmap(
    # Quarter-integers: tiny matrices without subnormal entries (whose squares underflow to 0).
    lambda shape: arrays(np.float64, ((2,) * shape[0]) + shape[1:], elements=st.integers(-40, 40).map(lambda i: i / 4)))


@settings(max_examples=60, deadline=None)
@given(matrices)
def test_singular_values_are_descending_and_match_the_frobenius_norm(P):
    sigma = lowrank.singular_values(P)
    assert sigma.shape == P.shape[:-2] + (min(P.shape[-2:]),)
    assert np.all(np.diff(sigma, axis=-1) <= 1e-9)
    assert np.all(sigma >= 0)
    np.testing.assert_allclose((sigma**2).sum(-1), (P**2).sum((-2, -1)), rtol=1e-9, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(matrices)
def test_cumulative_spectrum_is_monotone_and_ends_at_one(P):
    if np.any(np.all(P == 0, axis=(-2, -1))):
        with pytest.raises(ValueError, match="zero matrix"):
            lowrank.cumulative_spectrum(P)
        return
    for squared in (False, True):
        c = lowrank.cumulative_spectrum(P, squared=squared)
        assert np.all(c[..., -1] == 1.0)
        assert np.all(np.diff(c, axis=-1) >= -1e-12)
        assert np.all((c > 0) & (c <= 1 + 1e-12))


@settings(max_examples=60, deadline=None)
@given(matrices, st.data())
def test_eckart_young_error_is_the_tail_of_the_spectrum(P, data):
    k = data.draw(st.integers(1, min(P.shape[-2:])))
    sigma = lowrank.singular_values(P)
    approx = lowrank.best_rank_k(P, k)
    assert approx.shape == P.shape
    error = np.sqrt(((P - approx) ** 2).sum((-2, -1)))
    tail = np.sqrt((sigma[..., k:] ** 2).sum(-1))
    np.testing.assert_allclose(error, tail, atol=1e-7 * (1 + np.abs(P).max()))
    np.testing.assert_allclose(lowrank.truncation_error(P, k), tail, atol=1e-9 * (1 + np.abs(P).max()) ** 2)


def test_best_rank_k_has_rank_k_and_full_rank_returns_p():
    P = _softmax_matrix(0, (), 8, 6)
    for k in range(1, 7):
        assert np.linalg.matrix_rank(lowrank.best_rank_k(P, k)) == k
    np.testing.assert_allclose(lowrank.best_rank_k(P, 6), P, atol=1e-12)
    assert lowrank.truncation_error(P, 6) == 0


def test_no_random_rank_k_matrix_beats_eckart_young():
    P = _softmax_matrix(1, (), 10, 10, scale=3.0)
    best = lowrank.truncation_error(P, 3)
    rng = np.random.default_rng(2)
    for _ in range(50):
        other = rng.standard_normal((10, 3)) @ rng.standard_normal((3, 10))
        # the best multiple of `other` is still rank 3 and no closer than P_3
        scale = (P * other).sum() / (other * other).sum()
        assert np.linalg.norm(P - scale * other) >= best


def test_truncation_errors_relative_and_batched():
    P = _softmax_matrix(3, (2, 3), 7, 5)
    errors = lowrank.truncation_errors(P)
    assert errors.shape == (2, 3, 5)
    for k in range(1, 6):
        np.testing.assert_allclose(errors[..., k - 1], lowrank.truncation_error(P, k), atol=1e-12)
    relative = lowrank.truncation_error(P, 2, relative=True)
    np.testing.assert_allclose(relative, errors[..., 1] / np.linalg.norm(P, axis=(-2, -1)), rtol=1e-12)
    assert np.all(np.diff(errors, axis=-1) <= 1e-12)


def test_gram_method_matches_svd():
    P = _softmax_matrix(4, (3,), 64, 48, scale=2.0)
    np.testing.assert_allclose(lowrank.singular_values(P, method="gram"), lowrank.singular_values(P), atol=1e-6)
    np.testing.assert_allclose(lowrank.singular_values(P.swapaxes(-1, -2), method="gram"),
                               lowrank.singular_values(P), atol=1e-6)
    np.testing.assert_allclose(lowrank.cumulative_spectrum(P, method="gram"), lowrank.cumulative_spectrum(P),
                               atol=1e-5)


def test_rank_for_energy():
    P = np.diag([4.0, 3.0, 2.0, 1.0])  # cumulative: 0.4, 0.7, 0.9, 1.0
    assert lowrank.rank_for_energy(P, 0.4) == 1
    assert lowrank.rank_for_energy(P, 0.41) == 2
    assert lowrank.rank_for_energy(P, 0.9) == 3
    assert lowrank.rank_for_energy(P, 1.0) == 4
    # squared: 16, 25, 29, 30 of 30; 25/30 = 0.83
    assert lowrank.rank_for_energy(P, 0.8, squared=True) == 2
    assert lowrank.rank_for_energy(P, 0.8) == 3
    batch = _softmax_matrix(5, (4,), 9, 9)
    ranks = lowrank.rank_for_energy(batch, 0.5)
    assert ranks.shape == (4,) and np.issubdtype(ranks.dtype, np.integer)
    c = lowrank.cumulative_spectrum(batch)
    for i, r in enumerate(ranks):
        assert c[i, r - 1] >= 0.5 and (r == 1 or c[i, r - 2] < 0.5)


def test_uniform_attention_is_rank_one():
    P = np.full((16, 16), 1 / 16)
    assert lowrank.rank_for_energy(P, 0.999) == 1
    np.testing.assert_allclose(lowrank.singular_values(P)[0], 1.0)


@pytest.mark.parametrize("k", [0, -1, 5, 2.0, True, None])
def test_bad_rank_raises(k):
    P = np.eye(4)
    with pytest.raises(ValueError, match="k must be an integer between 1 and min"):
        lowrank.best_rank_k(P, k)
    with pytest.raises(ValueError, match="k must be an integer"):
        lowrank.truncation_error(P, k)


def test_bad_input_raises():
    with pytest.raises(ValueError, match=r"P must have shape \(\.\.\., n, s\)"):
        lowrank.singular_values(np.ones(3))
    with pytest.raises(TypeError, match="floating-point"):
        lowrank.singular_values(np.ones((3, 3), dtype=int))
    with pytest.raises(ValueError, match="method must be"):
        lowrank.singular_values(np.eye(3), method="qr")
    for energy in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"energy must be a share in \(0, 1\]"):
            lowrank.rank_for_energy(np.eye(3), energy)


@pytest.mark.parametrize("shape", [(8, 6, 3), (6, 8, 2), (10, 10, 12)])  # (n, s, e): tall, wide, e > r
def test_output_truncation_errors_against_explicit_p_k_v(shape):
    n, s, e = shape
    P = _softmax_matrix(6, (2,), n, s, scale=2.0)  # (2, n, s)
    V = np.random.default_rng(7).standard_normal((2, s, e))
    errors = lowrank.output_truncation_errors(P, V)
    assert errors.shape == (2, min(n, s))
    for k in range(1, min(n, s) + 1):
        explicit = np.linalg.norm(P @ V - lowrank.best_rank_k(P, k) @ V, axis=(-2, -1))
        np.testing.assert_allclose(errors[..., k - 1], explicit, atol=1e-10)
    relative = lowrank.output_truncation_errors(P, V, relative=True)
    np.testing.assert_allclose(relative, errors / np.linalg.norm(P @ V, axis=(-2, -1))[:, None], rtol=1e-12)
    np.testing.assert_allclose(lowrank.output_truncation_errors(P, V, method="gram"), errors, atol=1e-7)
    # Eq. (2.7): the output error is at most σ_{k+1} ‖V‖_F
    sigma = lowrank.singular_values(P)
    assert np.all(errors[..., :-1] <= sigma[..., 1:] * np.linalg.norm(V, axis=(-2, -1))[:, None] * (1 + 1e-9))


def test_output_truncation_errors_broadcast_one_v_and_reject_a_wrong_v():
    P = _softmax_matrix(8, (3,), 6, 6)
    V = np.random.default_rng(9).standard_normal((6, 2))
    np.testing.assert_allclose(lowrank.output_truncation_errors(P, V)[1], lowrank.output_truncation_errors(P[1], V))
    with pytest.raises(ValueError, match=r"V must have shape \(\.\.\., s, e\) with s = 6"):
        lowrank.output_truncation_errors(P, V[:5])
    with pytest.raises(ValueError, match="method must be"):
        lowrank.output_truncation_errors(P, V, method="qr")
