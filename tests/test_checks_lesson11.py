"""Answers a learner writes for the exercises of lesson 11, other than the reference: each right one passes,
each classic slip fails named by its own hint, and a result of the wrong shape or kind says so."""

import numpy as np
import pytest
import torch

from course_lib import recall
from course_lib.checks import FAILED, NONFINITE_HINT, PASSED
from course_lib.checks.lesson11 import (
    CROSSING,
    MISTAKES_11_1,
    MISTAKES_11_2,
    MISTAKES_11_3,
    SUM_RULE_CROSSING,
    crossing,
    exercise_11_1,
    exercise_11_2,
    exercise_11_3,
    gated_delta_state,
)
from course_lib.numpy import delta
from course_lib.tasks import IGNORED


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


# --- 11.1: where one pass of the delta rule falls below half ------------------------------------------


def test_the_stored_crossings_are_measured_again():
    for d, n_pairs in CROSSING.items():
        assert crossing(d, 400, np.random.default_rng(0)) == n_pairs
    for d, n_pairs in SUM_RULE_CROSSING.items():
        assert crossing(d, 400, np.random.default_rng(0), rule="sum") == n_pairs


def by_hand_loop(d, draws, rng):
    """2d (at d = 32 the table is already below half there), measured with a written loop and distances."""
    n_pairs = 1
    while True:
        right = 0
        for _ in range(draws):
            keys, values = _unit(rng.standard_normal((n_pairs, d))), _unit(rng.standard_normal((n_pairs, d)))
            S = np.zeros((d, d))
            for k, v in zip(keys, values, strict=True):
                S += np.outer(k, v - S.T @ k)  # β = 1
            distances = ((keys @ S)[:, None, :] - values[None]) ** 2  # (N, N, e)
            right += int((distances.sum(-1).argmin(1) == np.arange(n_pairs)).sum())
        if right / (draws * n_pairs) < 0.5:
            return 2 * d, n_pairs
        n_pairs += 1


def float32_array(d, draws, rng):
    """1.5 d, measured in float32 with the library, returned as one array of two numbers."""
    n_pairs = 1
    while True:
        keys, values = (_unit(rng.standard_normal((draws, n_pairs, d))).astype(np.float32) for _ in range(2))
        _, S = delta.delta_rule_attention(keys, keys, values, np.ones((draws, n_pairs), np.float32), return_state=True)
        scores = keys @ S @ np.swapaxes(values, -1, -2)
        if np.mean(scores.argmax(-1) == np.arange(n_pairs)) < 0.5:
            return np.array([1.5 * d, n_pairs])
        n_pairs += 1


@pytest.mark.parametrize("answer", [exercise_11_1.reference, by_hand_loop, float32_array], ids=lambda f: f.__name__)
def test_right_answers_to_11_1_pass(answer):
    assert exercise_11_1(answer, verbose=False).status == PASSED


@pytest.mark.parametrize("mistake", MISTAKES_11_1, ids=lambda m: m.name)
def test_each_slip_of_11_1_is_named(mistake, capsys):
    result = exercise_11_1(mistake.fn)
    assert result.status == FAILED and result.mistake == mistake.name and mistake.hint in capsys.readouterr().out


def test_a_constant_right_only_at_d_16_is_not_scaled():
    result = exercise_11_1(lambda d, draws, rng: (29.0, crossing(d, draws, rng)), verbose=False)
    assert result.status == FAILED and result.mistake == "not-scaled-with-d" and "d = 24" in result.message


def test_the_ratio_n_over_d_is_told_to_return_n(capsys):
    result = exercise_11_1(lambda d, draws, rng: (1 + 0.30 / 0.35, crossing(d, draws, rng)))
    out = capsys.readouterr().out
    assert result.status == FAILED and result.mistake == "ratio-not-n"
    assert "return N, the number of pairs" in out and "not N." not in out  # not the constant-N hint's wording


def test_one_number_for_11_1_says_two_are_needed(capsys):
    result = exercise_11_1(lambda d, draws, rng: 1.86 * d)
    assert result.status == FAILED and "return (predicted, measured): 2 results" in capsys.readouterr().out


# --- 11.2: an overwrite-MQAR row and the sum rule's chance ----------------------------------------------


def written_in_a_loop(n_pairs, n_writes, rng, *, n_keys=32, n_values=32):
    """Lists, built write by write: each key's first write at a random slot, the other slots rewrites."""
    keys = [int(k) for k in rng.choice(n_keys, n_pairs, replace=False)]
    firsts = set(rng.choice(n_writes, n_pairs, replace=False).tolist())
    order, tokens, holds, count = iter(rng.permutation(keys).tolist()), [], {}, {}
    for slot in range(n_writes):
        key = next(order) if slot in firsts else None
        if key is None:  # a rewrite: any of the N keys
            key = keys[int(rng.integers(n_pairs))]
        value = n_keys + int(rng.integers(n_values))
        tokens += [key, value]
        holds[key], count[key] = value, count.get(key, 0) + 1
    queries = [int(q) for q in rng.permutation(keys)]
    targets = [IGNORED] * (2 * n_writes) + [holds[q] for q in queries]
    return tokens + queries, targets, [1 / count[q] for q in queries]


def from_the_library(n_pairs, n_writes, rng, *, n_keys=32, n_values=32):
    """recall.overwrite_batch's row (torch tensors), seeded from the rng, and the chance from its tokens."""
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    tokens, targets = recall.overwrite_batch(1, n_pairs, n_writes, generator, n_keys=n_keys, n_values=n_values)
    written, queries = tokens[0, :2 * n_writes:2], tokens[0, 2 * n_writes:]
    chance = 1 / (written[None, :] == queries[:, None]).sum(1).double()
    return tokens[0], targets[0], chance


def balanced(n_pairs, n_writes, rng, *, n_keys=32, n_values=32):
    """Every key written W // N times or once more, shuffled: another distribution, the same invariants."""
    keys = rng.permutation(n_keys)[:n_pairs]
    which = rng.permutation(np.arange(n_writes) % n_pairs)  # (W,)
    values = n_keys + rng.integers(0, n_values, n_writes)
    written = keys[which]
    queries = rng.permutation(keys)
    latest = {k: values[written == k][-1] for k in keys}
    counts = np.array([(written == q).sum() for q in queries])
    tokens = np.concatenate([np.column_stack([written, values]).ravel(), queries])
    targets = np.concatenate([np.full(2 * n_writes, IGNORED), [latest[q] for q in queries]])
    return tokens.astype(np.int32), targets, (1 / counts).astype(np.float32)


@pytest.mark.parametrize("answer", [exercise_11_2.reference, written_in_a_loop, from_the_library, balanced],
                         ids=lambda f: f.__name__)
def test_right_generators_pass_11_2(answer):
    result = exercise_11_2(answer, verbose=False)
    assert result.status == PASSED, result.message


@pytest.mark.parametrize("mistake", MISTAKES_11_2, ids=lambda m: m.name)
def test_each_slip_of_11_2_is_named(mistake, capsys):
    result = exercise_11_2(mistake.fn)
    assert result.status == FAILED and result.mistake == mistake.name and mistake.hint in capsys.readouterr().out


def test_a_batch_of_one_row_says_the_shape(capsys):
    def batched(*args, **kwargs):
        tokens, targets, chance = exercise_11_2.reference(*args, **kwargs)
        return tokens[None], targets[None], chance

    result = exercise_11_2(batched)
    assert result.status == FAILED and "tokens: expected shape (56,), got shape (1, 56)" in capsys.readouterr().out


def test_float_tokens_and_a_nan_chance_are_reported(capsys):
    def floats(*args, **kwargs):
        tokens, targets, chance = exercise_11_2.reference(*args, **kwargs)
        return tokens.astype(float), targets, chance

    def zero_writes(*args, **kwargs):  # 1 / 0 for a key counted as never written
        tokens, targets, chance = exercise_11_2.reference(*args, **kwargs)
        return tokens, targets, np.where(chance == chance.min(), np.inf, chance)

    assert exercise_11_2(floats).status == FAILED and "expected integer token ids" in capsys.readouterr().out
    assert exercise_11_2(zero_writes).status == FAILED and NONFINITE_HINT in capsys.readouterr().out


# --- 11.3: gates chosen per token that keep every needle ---------------------------------------------------


def test_the_checks_recurrence_is_the_librarys():
    rng = np.random.default_rng(0)
    keys, values, state = _unit(rng.standard_normal((12, 6))), rng.standard_normal((12, 3)), rng.standard_normal((6, 3))
    beta, a = rng.uniform(0, 1, 12), rng.uniform(0.2, 1, 12)
    _, expected = delta.delta_rule_attention(keys, keys, values, beta, log_decay=np.log(a), initial_state=state,
                                             return_state=True)
    assert np.allclose(gated_delta_state(keys, values, beta, a, state), expected, atol=1e-12)


def forget_at_the_start(keys, values, is_needle, state):
    """Clear the state at the first token, whatever it is; a loop with a = 0 exactly."""
    beta, a = is_needle.astype(float), np.ones(len(is_needle))
    a[0] = 0.0
    S = state.copy()
    for k, v, b, g in zip(keys, values, beta, a, strict=True):
        S = g * S
        S = S + b * np.outer(k, v - S.T @ k)
    return beta, a, S


def library_with_log_decay(keys, values, is_needle, state):
    """The library's chunked form, forgetting by log a = −30 (a ≈ 1e-13) at the first needle, lists for the gates."""
    log_decay = np.zeros(len(is_needle))
    log_decay[np.argmax(is_needle)] = -30.0
    beta = is_needle.astype(float)
    _, S = delta.delta_rule_attention(keys, keys, values, beta, log_decay=log_decay, initial_state=state,
                                      return_state=True)
    return beta.tolist(), np.exp(log_decay).tolist(), S


def float32_writes_everything_first(keys, values, is_needle, state):
    """β = 1 at every token up to the first needle (all of it forgotten there), float32 throughout."""
    first = int(np.argmax(is_needle))
    beta = np.where(np.arange(len(is_needle)) <= first, 1.0, is_needle).astype(np.float32)
    a = np.ones(len(is_needle), np.float32)
    a[first] = 0.0
    S = state.astype(np.float32)
    for k, v, b, g in zip(keys.astype(np.float32), values.astype(np.float32), beta, a, strict=True):
        D = g * S
        S = D + b * np.outer(k, v - D.T @ k)
    return beta, a, S


@pytest.mark.parametrize("answer", [exercise_11_3.reference, forget_at_the_start, library_with_log_decay,
                                    float32_writes_everything_first], ids=lambda f: f.__name__)
def test_right_gates_pass_11_3(answer):
    result = exercise_11_3(answer, verbose=False)
    assert result.status == PASSED, result.message


@pytest.mark.parametrize("mistake", MISTAKES_11_3, ids=lambda m: m.name)
def test_each_slip_of_11_3_is_named(mistake, capsys):
    result = exercise_11_3(mistake.fn)
    assert result.status == FAILED and result.mistake == mistake.name and mistake.hint in capsys.readouterr().out


def test_a_step_slip_is_named_with_the_learners_own_gates():
    def gate_after_write_from_the_start(keys, values, is_needle, state):  # another gate choice, the same slip
        beta, a, _ = forget_at_the_start(keys, values, is_needle, state)
        return beta, a, gated_delta_state(keys, values, beta, a, state, slip="gate-after-write")

    result = exercise_11_3(gate_after_write_from_the_start, verbose=False)
    assert result.status == FAILED and result.mistake == "gate-after-write"  # caught where token 0 is a needle


def test_a_transposed_state_and_log_a_say_what_is_wrong(capsys):
    def transposed(*args):
        beta, a, S = exercise_11_3.reference(*args)
        return beta, a, S.T

    def log_a(*args):
        beta, a, S = exercise_11_3.reference(*args)
        return beta, np.log(np.maximum(a, np.exp(-30))), S

    assert exercise_11_3(transposed).status == FAILED
    assert "S: expected shape (8, 4), got shape (4, 8)" in capsys.readouterr().out
    assert exercise_11_3(log_a).status == FAILED and "return a itself, not log a" in capsys.readouterr().out


def test_the_step_without_erase_is_rejected_and_named(capsys):
    def gated_linear_attention(keys, values, is_needle, state):  # S ← a S + β k vᵀ, the learner's own loop
        beta, a, _ = forget_at_the_start(keys, values, is_needle, state)
        S = state.copy()
        for k, v, b, g in zip(keys, values, beta, a, strict=True):
            S = g * S + b * np.outer(k, v)
        return beta, a, S

    result = exercise_11_3(gated_linear_attention)
    out = capsys.readouterr().out
    assert result.status == FAILED and result.mistake == "no-erase"
    assert "written again at 20 with a new value" in out and "removes what k reads, β k kᵀ S" in out


def test_a_needle_key_written_again_must_hold_its_newest_value():
    *_, (description, (keys, values, is_needle, state), _) = exercise_11_3.cases()
    assert np.array_equal(keys[3], keys[20]) and not np.allclose(values[3], values[20])
    _, _, S = exercise_11_3.reference(keys, values, is_needle, state)
    assert np.allclose(keys[20] @ S, values[20]) and np.allclose(keys[[12, 33]] @ S, values[[12, 33]])
    for earlier in exercise_11_3.cases()[:-1]:  # the other cases: erasing changes nothing there
        keys, values, is_needle, state = earlier[1]
        beta, a, S = exercise_11_3.reference(keys, values, is_needle, state)
        assert np.allclose(S, gated_delta_state(keys, values, beta, a, state, slip="no-erase"))
