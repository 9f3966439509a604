"""Answers a learner writes for the exercises of lesson 12, other than the reference: each right one passes,
and each classic slip is named by its own hint."""

import numpy as np
import pytest

from course_lib.checks import FAILED, PASSED
from course_lib.checks.lesson12 import exercise_12_1, exercise_12_2, exercise_12_3
from course_lib.numpy import delta

# --- 12.1: Gated DeltaNet's W and U -------------------------------------------------------------


def wy_by_solve(k, v, beta, log_decay):
    """The matrix form: L X = Diag(β) [e^G ⊙ K, V] with L's entries β_r e^{G_r − G_t} k_rᵀ k_t below the diagonal."""
    c, G = k.shape[-2], np.cumsum(log_decay, axis=-1)
    diff = np.where(np.tril(np.ones((c, c), bool), -1), G[..., :, None] - G[..., None, :], -np.inf)
    lower = np.eye(c) + beta[..., :, None] * (k @ np.swapaxes(k, -1, -2)) * np.exp(diff)
    W = np.linalg.solve(lower, beta[..., :, None] * np.exp(G)[..., :, None] * k)
    return W, np.linalg.solve(lower, beta[..., :, None] * v)


def wy_by_recurrence(k, v, beta, log_decay):
    """One position at a time: ũ_r = β_r (v_r − e^{G_r} Sᵀ k_r − Σ_{t<r} e^{G_r − G_t} (k_tᵀ k_r) ũ_t), as U and W."""
    G = np.cumsum(log_decay, axis=-1)
    W, U = np.zeros_like(k), np.zeros_like(v)
    for r in range(k.shape[-2]):
        weight = np.exp(G[..., r, None] - G[..., :r]) * np.einsum("...td,...d->...t", k[..., :r, :], k[..., r, :])
        W[..., r, :] = beta[..., r, None] * (np.exp(G[..., r, None]) * k[..., r, :]
                                             - np.einsum("...t,...td->...d", weight, W[..., :r, :]))
        U[..., r, :] = beta[..., r, None] * (v[..., r, :] - np.einsum("...t,...te->...e", weight, U[..., :r, :]))
    return W, U


def wy_with_masked_decay(k, v, beta, log_decay):
    """The lesson's masked_decay for Γ (allowed: it is Eq. 12.2), the diagonal dropped, then a solve."""
    from course_lib.numpy.gated import masked_decay

    c, G = k.shape[-2], np.cumsum(log_decay, axis=-1)
    lower = np.eye(c) + beta[..., :, None] * (k @ np.swapaxes(k, -1, -2)) * masked_decay(G, inclusive=False)
    rhs = beta[..., :, None] * np.concatenate([np.exp(G)[..., :, None] * k, v], axis=-1)
    X = np.linalg.solve(lower, rhs)
    return X[..., : k.shape[-1]], X[..., k.shape[-1]:]


@pytest.mark.parametrize("answer", [wy_by_solve, wy_by_recurrence, wy_with_masked_decay], ids=lambda f: f.__name__)
def test_right_wy_answers_pass(answer):
    assert exercise_12_1(answer, verbose=False).status == PASSED


def test_a_call_into_the_library_fails_with_its_hint(capsys):
    def by_library(k, v, beta, log_decay):
        T = delta.ut_transform(k, beta, log_decay)
        return T @ (np.exp(np.cumsum(log_decay, axis=-1))[..., :, None] * k), T @ v

    result = exercise_12_1(by_library)
    assert result.status == FAILED and result.mistake == "calls-the-library"
    assert "calls ut_transform" in capsys.readouterr().out


# --- 12.2: the chunked decay that does not overflow ---------------------------------------------


def chunked_with_clipped_exponent(q, k, v, log_decay, chunk_size):
    """exp(min(G_i − G_j, 0)), then np.tril: no exponent above 0 reaches exp (right in another form)."""
    n = q.shape[-2]
    out = np.zeros(q.shape[:-1] + v.shape[-1:], dtype=np.result_type(q, v))
    state = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=out.dtype)
    for start in range(0, n, chunk_size):
        part = slice(start, min(start + chunk_size, n))
        qc, kc, vc = q[..., part, :], k[..., part, :], v[..., part, :]
        G = np.cumsum(log_decay[..., part], axis=-1)
        Gamma = np.tril(np.exp(np.minimum(G[..., :, None] - G[..., None, :], 0.0)))
        scores = np.einsum("...id,...jd->...ij", qc, kc) * Gamma
        out[..., part, :] = np.exp(G)[..., None] * (qc @ state) + scores @ vc
        state = (np.exp(G[..., -1])[..., None, None] * state
                 + np.einsum("...jd,...j,...je->...de", kc, np.exp(G[..., -1:] - G), vc))
    return out


@pytest.mark.parametrize("answer", [chunked_with_clipped_exponent], ids=lambda f: f.__name__)
def test_right_chunked_decay_answers_pass(answer):
    assert exercise_12_2(answer, verbose=False).status == PASSED


def test_the_starting_point_fails_as_the_split_exponent(capsys):
    from course_lib.checks.lesson12 import _chunked_with

    result = exercise_12_2(_chunked_with(split=True))
    assert result.status == FAILED and result.mistake == "split-exponent"
    assert "88.72" in capsys.readouterr().out


def test_exp_then_where_fails_citing_section_12_2(capsys):
    from course_lib.checks.lesson12 import _exp_then_where

    result = exercise_12_2(_exp_then_where)
    assert result.status == FAILED and result.mistake == "exp-then-where"
    assert "§12.2" in capsys.readouterr().out


def test_a_token_loop_that_ignores_chunk_size_fails(capsys):
    def token_loop_in_float64(q, k, v, log_decay, chunk_size):
        state = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
        out = np.zeros(q.shape[:-1] + v.shape[-1:])
        for t in range(q.shape[-2]):
            state = np.exp(log_decay[..., t].astype(np.float64))[..., None, None] * state \
                + k[..., t, :, None].astype(np.float64) * v[..., t, None, :]
            out[..., t, :] = np.einsum("...d,...de->...e", q[..., t, :], state)
        return out.astype(np.result_type(q, v))

    result = exercise_12_2(token_loop_in_float64)
    assert result.status == FAILED and result.mistake == "never-forms-a-chunk"
    assert "never forms a chunk" in capsys.readouterr().out


def test_a_library_call_fails(capsys):
    from course_lib.numpy import gated

    result = exercise_12_2(lambda q, k, v, log_decay, chunk_size: gated.gated_linear_attention(
        q, k, v, log_decay, chunk_size=chunk_size))
    assert result.status == FAILED and result.mistake == "calls-the-library"


# --- 12.3: FLOPs ---------------------------------------------------------------------------


def flops_as_int(n, c, d, e):
    return int(2 * (n // c) * (2 * c * c * d + c * c * (d + e) // 2 + 3 * c * d * e + c * c * e))


def flops_per_token(n, c, d, e):
    per_token = 2 * c * d + c * (d + e) / 2 + c * e + 3 * d * e  # multiply-adds per token
    return 2.0 * n * per_token


@pytest.mark.parametrize("answer", [flops_as_int, flops_per_token], ids=lambda f: f.__name__)
def test_right_flop_counts_pass(answer):
    assert exercise_12_3(answer, verbose=False).status == PASSED


def test_an_explicit_inverse_gets_its_own_hint(capsys):
    def with_inverse(n, c, d, e):
        return 2.0 * (n / c) * (2 * c * c * d + c**3 + c * c * (d + e) + 3 * c * d * e + c * c * e)

    result = exercise_12_3(with_inverse)
    assert result.status == FAILED and result.mistake == "explicit-inverse"
    assert "never forms the inverse" in capsys.readouterr().out
