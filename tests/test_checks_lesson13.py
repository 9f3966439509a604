"""Answers a learner writes for the exercises of lesson 13, other than the reference: each right construction
passes (the check runs it through the library), and each classic slip is named by its own hint."""

import numpy as np
import pytest

from course_lib.checks import FAILED, PASSED
from course_lib.checks.lesson13 import FAMILIES, exercise_13_1, exercise_13_2, exercise_13_3

# --- 13.1: parity from the empty state --------------------------------------------------------


def parity_in_two_dimensions(bits):
    """d = 2, a key along e₂, the first write along e₂ with value ±3: any unit key and readable value will do."""
    bits = np.asarray(bits)
    n = bits.shape[-1]
    k = np.broadcast_to([0.0, 1.0], (*bits.shape, 2)).copy()
    q = k.copy()
    v = np.zeros((*bits.shape, 1))
    beta = 2.0 * bits
    v[..., 0, 0] = 3.0 * (1 - 2 * bits[..., 0])
    beta[..., 0] = 1.0
    assert n > 0
    return q, k, v, beta


def parity_with_a_slanted_key(bits):
    """A unit key off the axes: a reflection along any unit key flips what was written along it."""
    bits = np.asarray(bits)
    key = np.array([0.6, 0.8])
    k = np.broadcast_to(key, (*bits.shape, 2)).copy()
    v = np.zeros((*bits.shape, 1))
    beta = 2.0 * bits
    v[..., 0, 0] = 1.0 - 2.0 * bits[..., 0]
    beta[..., 0] = 1.0
    return k / 1.0, k, v, beta  # the query reads along the key: kᵀ S = ±1


@pytest.mark.parametrize("answer", [parity_in_two_dimensions, parity_with_a_slanted_key], ids=lambda f: f.__name__)
def test_right_parity_heads_pass(answer):
    assert exercise_13_1(answer, verbose=False).status == PASSED


def test_a_head_that_copies_the_answer_into_values_still_runs_through_the_library():
    def overwrite_with_the_answer(bits):  # β = 1 every token, v = ±1 from the true parity: also tracks parity
        bits = np.asarray(bits)
        parity = np.cumsum(bits, axis=-1) % 2
        ones = np.ones((*bits.shape, 1))
        return ones, ones, (1.0 - 2.0 * parity)[..., None], np.ones(bits.shape)

    assert exercise_13_1(overwrite_with_the_answer, verbose=False).status == PASSED  # computed, not recurrent: ok


# --- 13.2: the fewest reflections a token for Z_m ------------------------------------------------


def rotated_mirrors(m):
    """Any two mirrors π/m apart, in either order, tilted by any angle."""
    if m == 2:
        return np.array([[0.0, 1.0]]), np.array([2.0])
    angles = 0.3 + np.array([np.pi / m, 0.0])
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1), np.array([2.0, 2.0])


def test_other_mirrors_pass():
    assert exercise_13_2(rotated_mirrors, verbose=False).status == PASSED


def test_a_rotation_with_m_two_reflections_everywhere_is_not_the_fewest(capsys):
    def always_two(m):
        angles = np.array([0.0, np.pi / m])
        return np.stack([np.cos(angles), np.sin(angles)], axis=-1), np.array([2.0, 2.0])

    result = exercise_13_2(always_two)
    assert result.status == FAILED and "m = 2" in capsys.readouterr().out


# --- 13.3: which families track parity -------------------------------------------------------


def test_answers_as_python_scalars_pass():
    answers = {family: (i >= 5, 1.0 if i == 0 else (-1.0 if i >= 5 else 0.0)) for i, family in enumerate(FAMILIES)}
    assert exercise_13_3(lambda family: answers[family], verbose=False).status == PASSED


def test_all_false_fails():
    assert exercise_13_3(lambda family: (False, 0.0), verbose=False).status == FAILED
