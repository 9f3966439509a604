"""Answers a learner writes for the exercises of lesson 13, other than the reference: each right construction
passes (the check runs it through the library), and each classic slip is named by its own hint."""

import itertools

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


def _head(bits, *, d=1, scale=1.0, first_beta=1.0, first_value=1.0, beta_one=2.0, sign=1.0):
    """q, k = scale e1 (q = sign e1), the first token writes ±first_value with first_beta, 1-bits reflect."""
    bits = np.asarray(bits)
    k = np.zeros((*bits.shape, d))
    k[..., 0] = scale
    q = np.zeros((*bits.shape, d))
    q[..., 0] = sign
    v = np.zeros((*bits.shape, 1))
    v[..., 0, 0] = sign * first_value * (1 - 2 * bits[..., 0])
    beta = beta_one * bits
    beta[..., 0] = first_beta
    return q, k, v, beta


RIGHT_13_1 = {
    "first-beta-two-half-value": lambda b: _head(b, first_beta=2.0, first_value=0.5),
    "three-dimensions": lambda b: _head(b, d=3),
    "value-three": lambda b: _head(b, first_value=3.0),
    "query-minus-key-value-negated": lambda b: _head(b, sign=-1.0),
    "float-bits": lambda b: _head(np.asarray(b, np.float32)),
    "key-two-beta-half": lambda b: _head(b, scale=2.0, first_beta=0.25, beta_one=0.5),
}


@pytest.mark.parametrize("name", RIGHT_13_1)
def test_other_right_parity_heads_pass(name):
    assert exercise_13_1(RIGHT_13_1[name], verbose=False).status == PASSED


def overwrite_with_the_answer(bits):  # β = 1 every token, v = ±1 from the true parity: not a recurrence
    bits = np.asarray(bits)
    parity = np.cumsum(bits, axis=-1) % 2
    ones = np.ones((*bits.shape, 1))
    return ones, ones, (1.0 - 2.0 * parity)[..., None], np.ones(bits.shape)


def parity_in_the_query(bits):  # the state holds +1, the query carries the answer
    bits = np.asarray(bits)
    q = (1.0 - 2.0 * (np.cumsum(bits, axis=-1) % 2))[..., None]
    k = np.ones((*bits.shape, 1))
    v = np.zeros((*bits.shape, 1))
    v[..., 0, 0] = 1.0
    beta = np.zeros(bits.shape)
    beta[..., 0] = 1.0
    return q, k, v, beta


@pytest.mark.parametrize("cheat", [overwrite_with_the_answer, parity_in_the_query], ids=lambda f: f.__name__)
def test_a_head_fed_the_answer_fails_the_locality_rule(cheat):
    result = exercise_13_1(cheat, verbose=False)
    assert result.status == FAILED and result.mistake == "reads-the-answer"


@pytest.mark.parametrize("wrong, name", [
    (lambda b: _head(b, first_value=1.0 - 2.0 * np.asarray(b)[..., 0]), "first-write-ignores-the-first-bit"),  # v₁ = +1
    (lambda b: _head(b, first_value=-1.0), "inverted-read-out"),
    (lambda b: _head(b, scale=2.0), "non-unit-keys"),
    (lambda b: _head(b, scale=0.5, first_value=4.0), "non-unit-keys"),
    (lambda b: _head(b, first_value=0.1), "too-faint-to-read"),
], ids=["first-bit-ignored", "inverted", "key-two", "key-half", "faint"])
# keys of length 2 with β = 2 make β‖k‖² = 8: the library warns and the state overflows, as a learner sees
@pytest.mark.filterwarnings("ignore:keys with beta", "ignore:overflow encountered", "ignore:invalid value encountered")
def test_more_parity_slips_are_named(wrong, name):
    assert exercise_13_1(wrong, verbose=False).mistake == name


def test_a_zero_query_is_named_not_taken_for_an_empty_state():
    def zero_query(bits):
        q, k, v, beta = _head(bits)
        return 0 * q, k, v, beta

    assert exercise_13_1(zero_query, verbose=False).mistake == "zero-query"


def test_the_empty_state_hint_does_not_give_the_answer(capsys):
    def no_first_write(bits):
        bits = np.asarray(bits)
        ones = np.ones((*bits.shape, 1))
        return ones, ones, np.zeros((*bits.shape, 1)), 2.0 * bits

    assert exercise_13_1(no_first_write).mistake == "empty-state"
    out = capsys.readouterr().out
    assert "before the first reflection" in out and "β = 1, v = ±1" not in out


# --- 13.2: the fewest reflections a token for Z_m ------------------------------------------------


def rotated_mirrors(m):
    """Any two mirrors π/m apart, in either order, tilted by any angle."""
    if m == 2:
        return np.array([[0.0, 1.0]]), np.array([2.0])
    angles = 0.3 + np.array([np.pi / m, 0.0])
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1), np.array([2.0, 2.0])


def test_other_mirrors_pass():
    assert exercise_13_2(rotated_mirrors, verbose=False).status == PASSED


def _two_mirrors(m, apart, beta=(2.0, 2.0), scale=1.0):
    angles = np.array([0.0, apart])
    return scale * np.stack([np.cos(angles), np.sin(angles)], axis=-1), np.array(beta)


def test_a_rotation_with_m_two_reflections_everywhere_is_not_the_fewest(capsys):
    result = exercise_13_2(lambda m: _two_mirrors(m, np.pi / m))  # m = 2: two reflections π/2 apart, −I
    out = capsys.readouterr().out
    assert result.mistake == "not-the-fewest" and "for m = 2 one reflection has order 2" in out
    assert "does nothing" not in out


def _first_m2(wrong):
    return lambda m: (np.array([[1.0, 0.0]]), np.array([2.0])) if m == 2 else wrong(m)


@pytest.mark.parametrize("wrong", {
    "beta-1.9": lambda m: _two_mirrors(m, np.pi / m, beta=(1.9, 1.9)),
    "degrees": lambda m: _two_mirrors(m, 180.0 / m),
    "transposed": lambda m: (_two_mirrors(m, np.pi / m)[0].T.copy(), np.array([2.0, 2.0])),
    "non-unit": lambda m: _two_mirrors(m, np.pi / m, scale=2.0),
}.items(), ids=lambda item: item[0])
# A transposed or non-unit key makes beta ||k||^2 > 2: the library warns and the state overflows, as a learner sees
@pytest.mark.filterwarnings("ignore:keys with beta", "ignore:overflow encountered", "ignore:invalid value encountered")
def test_other_failures_get_the_diagnostic_not_the_projection_hint(wrong, capsys):
    result = exercise_13_2(_first_m2(wrong[1]))
    out = capsys.readouterr().out
    assert result.status == FAILED and result.mistake == "not-order-m" and "spectral radius" in out


def test_projections_at_another_angle_get_the_projection_hint():
    result = exercise_13_2(_first_m2(lambda m: _two_mirrors(m, 0.4, beta=(1.0, 1.0))), verbose=False)
    assert result.mistake == "projections"


# --- 13.3: which families track parity -------------------------------------------------------


def test_answers_as_python_scalars_pass():
    lowest = (1.0, 0.0, 0.0, 0.0, 0.0, -1.0, -1.0, 0.5)
    answers = {family: (i >= 5, lowest[i]) for i, family in enumerate(FAMILIES)}
    assert exercise_13_3(lambda family: answers[family], verbose=False).status == PASSED


def test_all_false_fails():
    assert exercise_13_3(lambda family: (False, 0.0), verbose=False).status == FAILED


def test_strings_are_reported_not_raised(capsys):
    result = exercise_13_3(lambda family: ("True", "-1"))
    assert result.status == FAILED and "must return numbers" in capsys.readouterr().out


@pytest.mark.parametrize("slip, name", [((6, (True, 0.0)), "rotation-stays-right-of-zero"),
                                        ((4, (True, 0.0)), "products-of-projections-track"),
                                        ((5, (True, -2.0)), "delta-lowest-minus-two"),
                                        ((3, (False, -1.0)), "gated-delta-lowest-minus-one")])
def test_reviewers_wrong_answers_are_named(slip, name):
    from course_lib.checks.lesson13 import _ANSWERS

    def answer(family):
        return slip[1] if FAMILIES.index(family) == slip[0] else _ANSWERS[family]

    assert exercise_13_3(answer, verbose=False).mistake == name


@pytest.mark.parametrize("slip, name", [((2, (True, -1.0)), "settling-family-tracks"),
                                        ((0, (True, 1.0)), "settling-family-tracks"),
                                        ((7, (False, -1.0)), "cycling-family-cannot-track"),
                                        ((1, (False, -1.0)), "lowest-decay"),
                                        ((2, (False, -1.0)), "lowest-delta-beta-one"),
                                        ((5, (True, 0.0)), "lowest-delta-beta-two"),
                                        ((7, (True, 1.0)), "lowest-small-angle"),
                                        ((7, (True, -1.0)), "lowest-small-angle")])
def test_answers_no_single_slip_predicts_are_named_by_what_is_wrong(slip, name):
    from course_lib.checks.lesson13 import _ANSWERS

    def answer(family):
        return slip[1] if FAMILIES.index(family) == slip[0] else _ANSWERS[family]

    assert exercise_13_3(answer, verbose=False).mistake == name


def test_every_wrong_answer_to_one_family_gets_a_named_hint():
    from course_lib.checks.lesson13 import _ANSWERS

    for index, family in enumerate(FAMILIES):
        for wrong in itertools.product((True, False), (1.0, 0.5, 0.0, -0.5, -1.0, -2.0)):
            if wrong == _ANSWERS[family]:
                continue

            def answer(f, index=index, wrong=wrong):
                return wrong if FAMILIES.index(f) == index else _ANSWERS[f]

            result = exercise_13_3(answer, verbose=False)
            assert result.status == FAILED and result.mistake is not None, (family, wrong)
