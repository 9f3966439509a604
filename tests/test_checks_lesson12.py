"""Answers a learner writes for the exercises of lesson 12, other than the reference: each right one passes,
and each classic slip is named by its own hint."""

import numpy as np
import pytest

from course_lib.checks import FAILED, PASSED
from course_lib.checks.lesson12 import exercise_12_1, exercise_12_2, exercise_12_3

# --- 12.1: the WY keys ------------------------------------------------------------------------


def wy_by_solve(k, beta):
    """The matrix form: (I + tril(Diag(β) K Kᵀ, −1)) W = Diag(β) K, solved."""
    c = k.shape[-2]
    lower = np.eye(c) + np.tril(beta[..., :, None] * (k @ np.swapaxes(k, -1, -2)), -1)
    return np.linalg.solve(lower, beta[..., :, None] * k)


def wy_by_product(k, beta):
    """Multiply the factors out and read W off I − Kᵀ W one key at a time (w_r = what P_r adds)."""
    w = np.zeros_like(k)
    for index in np.ndindex(k.shape[:-2]):
        product = np.eye(k.shape[-1])
        for r in range(k.shape[-2]):
            kr, br = k[index][r], beta[index][r]
            w[index][r] = br * (kr @ product)  # P_r (P_{r-1}...P_1) = prev − β_r k_r (k_rᵀ prev)
            product = product - br * np.outer(kr, kr @ product)
    return w


def wy_scalar_loop(k, beta):
    """Two plain loops over r and t < r, for 2-D inputs and any leading dims via recursion."""
    if k.ndim > 2:
        return np.stack([wy_scalar_loop(ki, bi) for ki, bi in zip(k, beta, strict=True)])
    w = np.zeros_like(k)
    for r in range(len(k)):
        correction = np.zeros(k.shape[-1])
        for t in range(r):
            correction += (k[t] @ k[r]) * w[t]
        w[r] = beta[r] * (k[r] - correction)
    return w


@pytest.mark.parametrize("answer", [wy_by_solve, wy_by_product, wy_scalar_loop], ids=lambda f: f.__name__)
def test_right_wy_answers_pass(answer):
    assert exercise_12_1(answer, verbose=False).status == PASSED


# --- 12.2: the chunked decay that does not overflow ---------------------------------------------


def chunked_mask_after_exp(q, k, v, log_decay, chunk_size):
    """exp of every difference, then the mask: inf above the diagonal is discarded by where (right in NumPy)."""
    n = q.shape[-2]
    out = np.zeros(q.shape[:-1] + v.shape[-1:], dtype=np.result_type(q, v))
    state = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=out.dtype)
    for start in range(0, n, chunk_size):
        part = slice(start, min(start + chunk_size, n))
        qc, kc, vc = q[..., part, :], k[..., part, :], v[..., part, :]
        G = np.cumsum(log_decay[..., part], axis=-1)
        c = G.shape[-1]
        with np.errstate(over="ignore"):
            Gamma = np.where(np.tril(np.ones((c, c), bool)), np.exp(G[..., :, None] - G[..., None, :]), 0.0)
        out[..., part, :] = np.exp(G)[..., None] * (qc @ state) + ((qc @ np.swapaxes(kc, -1, -2)) * Gamma) @ vc
        state = (np.exp(G[..., -1])[..., None, None] * state
                 + np.swapaxes(kc * np.exp(G[..., -1:] - G)[..., None], -1, -2) @ vc)
    return out


def token_loop_in_float64(q, k, v, log_decay, chunk_size):
    """No chunks at all: the recurrence itself, in float64, cast back (right, if slow)."""
    state = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    out = np.zeros(q.shape[:-1] + v.shape[-1:])
    for t in range(q.shape[-2]):
        state = np.exp(log_decay[..., t].astype(np.float64))[..., None, None] * state \
            + k[..., t, :, None].astype(np.float64) * v[..., t, None, :]
        out[..., t, :] = np.einsum("...d,...de->...e", q[..., t, :], state)
    return out.astype(np.result_type(q, v))


@pytest.mark.parametrize("answer", [chunked_mask_after_exp, token_loop_in_float64], ids=lambda f: f.__name__)
def test_right_chunked_decay_answers_pass(answer):
    assert exercise_12_2(answer, verbose=False).status == PASSED


def test_the_starting_point_fails_as_the_split_exponent(capsys):
    from course_lib.checks.lesson12 import _chunked_with

    result = exercise_12_2(_chunked_with(split=True))
    assert result.status == FAILED and result.mistake == "split-exponent"
    assert "88.72" in capsys.readouterr().out


# --- 12.3: FLOPs ---------------------------------------------------------------------------


def flops_as_int(n, c, d, e):
    return int(2 * (n // c) * (2 * c * c * d + c * c * (d + e) // 2 + 3 * c * d * e + c * c * e))


def flops_per_token(n, c, d, e):
    per_token = 2 * c * d + c * (d + e) / 2 + c * e + 3 * d * e  # multiply-adds per token
    return 2.0 * n * per_token


@pytest.mark.parametrize("answer", [flops_as_int, flops_per_token], ids=lambda f: f.__name__)
def test_right_flop_counts_pass(answer):
    assert exercise_12_3(answer, verbose=False).status == PASSED
