"""Answers a learner writes for the exercises of lesson 11, other than the reference: each right one passes,
and each slip a reader is likely to make fails, named by its own hint where the check models it."""

import numpy as np

from course_lib.checks import FAILED, PASSED
from course_lib.checks.lesson11 import exercise_11_1, exercise_11_2, exercise_11_3

# --- 11.1: the sum rule's error, predicted and measured ---------------------------------------


def error_by_cross_talk(keys, values):
    """Measured from Eq. (11.2) term by term: the overlaps of every key with the others."""
    n_pairs, d = keys.shape
    overlaps = keys @ keys.T - np.eye(n_pairs)  # (N, N): k_iᵀk_j, the diagonal removed
    cross_talk = overlaps @ values  # (N, e): Σ_{j≠i} (k_iᵀk_j) v_j
    return ((n_pairs - 1) / d) ** 0.5, float(np.sqrt((cross_talk ** 2).sum() / n_pairs))


def error_with_einsum(keys, values):
    state = np.einsum("nd,ne->de", keys, values)
    errors = np.einsum("nd,de->ne", keys, state) - values
    return np.sqrt((len(keys) - 1) / keys.shape[1]), np.sqrt(np.einsum("ne,ne->", errors, errors) / len(keys))


def error_predicted_by_dimension_count(keys, values):
    """A slip the check does not model by name: N/(d - 1)."""
    n_pairs, d = keys.shape
    errors = keys @ (keys.T @ values) - values
    return (n_pairs / (d - 1)) ** 0.5, float(np.sqrt(np.mean((errors ** 2).sum(axis=1))))


def test_right_answers_to_11_1_pass():
    for answer in (error_by_cross_talk, error_with_einsum):
        assert exercise_11_1(answer, verbose=False).status == PASSED, answer.__name__


def test_a_wrong_prediction_fails_11_1():
    result = exercise_11_1(error_predicted_by_dimension_count, verbose=False)
    assert result.status == FAILED and "predicted" in result.message


# --- 11.2: the delta rule's write ---------------------------------------------------------------


def write_expanded(S, k, v, beta):
    """Eq. (11.5) as printed: (I − β k kᵀ) S + β k vᵀ."""
    return (np.eye(len(k)) - beta * np.outer(k, k)) @ S + beta * np.outer(k, v)


def write_by_gradient(S, k, v, beta):
    gradient = k[:, None] * (S.T @ k - v)[None, :]  # (d, e): Eq. (11.4)
    return S - beta * gradient


def write_in_place(S, k, v, beta):
    S += beta * np.outer(k, v - S.T @ k)  # the check hands each call its own copy
    return S


def test_right_answers_to_11_2_pass():
    for answer in (write_expanded, write_by_gradient, write_in_place):
        assert exercise_11_2(answer, verbose=False).status == PASSED, answer.__name__


def test_erasing_the_whole_key_direction_with_beta_on_the_write_is_named():
    def erase_then_write(S, k, v, beta):
        S = S - np.outer(k, k) @ S  # erased in full, whatever β
        return S + beta * np.outer(k, v)

    result = exercise_11_2(erase_then_write, verbose=False)
    assert result.status == FAILED and result.mistake == "beta-on-write-only"


# --- 11.3: the bug in a gated update --------------------------------------------------------------


def gated_with_einsum(S, q, k, v, a):
    new = a * S + np.einsum("d,e->de", k, v)
    return np.einsum("d,de->e", q, new), new


def gated_from_log(S, q, k, v, a):
    new = np.exp(np.log(a)) * S + k[:, None] * v[None, :]
    return q @ new, new


def test_right_answers_to_11_3_pass():
    for answer in (gated_with_einsum, gated_from_log):
        assert exercise_11_3(answer, verbose=False).status == PASSED, answer.__name__


def test_the_buggy_step_of_the_exercise_is_named():
    def buggy(S, q, k, v, a):  # the statement's code
        S = S + np.outer(k, v)
        return S.T @ (a * q), S

    result = exercise_11_3(buggy, verbose=False)
    assert result.status == FAILED and result.mistake == "decay-on-query"
