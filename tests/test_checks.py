"""Every exercise checker: the reference passes, a stub is "not attempted", each mistake fails
with its own hint — so a learner's classic slip is named, not just flagged."""

import dataclasses

import pytest

from course_lib.checks import FAILED, NONFINITE_HINT, NOT_ATTEMPTED, PASSED, all_exercises

EXERCISES = all_exercises()


def _stub(*args, **kwargs):
    raise NotImplementedError("Exercise: stub")


def test_lessons_have_two_to_four_exercises_each():
    per_lesson = {}
    for exercise in EXERCISES:
        per_lesson.setdefault(exercise.number.split(".")[0], []).append(exercise.number)
    for lesson, numbers in per_lesson.items():
        assert 2 <= len(numbers) <= 4, f"lesson {lesson} has exercises {numbers}"
    assert len({e.number for e in EXERCISES}) == len(EXERCISES), "duplicate exercise numbers"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.number)
def test_reference_passes(exercise, capsys):
    # A requirement beyond equal results (10.4: linear memory) is one the library's dense reference
    # breaks on purpose; the solutions notebook's answer meets it (nbval compares its "passed").
    result = dataclasses.replace(exercise, requirements=())(exercise.reference)
    assert result.status == PASSED, result.message
    assert f"Exercise {exercise.number}: passed" in capsys.readouterr().out


@pytest.mark.parametrize("exercise, requirement", [(e, r) for e in EXERCISES for r in e.requirements],
                         ids=lambda x: getattr(x, "number", getattr(x, "name", "")))
def test_an_answer_that_breaks_a_requirement_fails_with_its_hint(exercise, requirement, capsys):
    result = exercise(requirement.example)
    assert result.status == FAILED and result.mistake == requirement.name
    out = capsys.readouterr().out
    assert "every case agrees with the library, but" in out and requirement.hint in out


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.number)
def test_untouched_stub_is_not_attempted(exercise, capsys):
    result = exercise(_stub)
    assert result.status == NOT_ATTEMPTED and not result
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("exercise, mistake",
                         [(e, m) for e in EXERCISES for m in e.mistakes],
                         ids=lambda x: getattr(x, "number", getattr(x, "name", "")))
def test_each_mistake_fails_with_its_hint(exercise, mistake, capsys):
    result = exercise(mistake.fn)
    assert result.status == FAILED, f"{exercise.number}: mistake {mistake.name!r} passed the check"
    assert result.mistake == mistake.name, f"{exercise.number}: {mistake.name!r} reported as {result.mistake!r}"
    assert mistake.hint in capsys.readouterr().out


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.number)
def test_a_crashing_answer_fails_and_says_why(exercise, capsys):
    def broken(*args, **kwargs):
        raise ValueError("shapes do not align")

    result = exercise(broken)
    assert result.status == FAILED
    assert "ValueError: shapes do not align" in capsys.readouterr().out


def test_a_wrong_answer_without_a_known_mistake_shows_expected_and_got(capsys):
    exercise = next(e for e in EXERCISES if e.number == "1.1")

    def off(q, k, v, causal=False):
        weights, out = exercise.reference(q, k, v, causal)
        return weights, out + 1.0

    result = exercise(off)
    text = capsys.readouterr().out
    assert result.status == FAILED and result.mistake is None
    assert "output (shape (5, 3)): largest difference at index" in text and "(|difference| 1)" in text
    assert "15 of 15 entries differ" in text


def _poison(result, value):
    """``result`` with its first floating-point entry replaced by ``value`` (NaN or inf); None if it has none."""
    import numpy as np
    import torch

    if isinstance(result, (tuple, list)):
        for i, item in enumerate(result):
            poisoned = _poison(item, value)
            if poisoned is not None:
                return type(result)([*result[:i], poisoned, *result[i + 1:]])
        return None
    if isinstance(result, torch.Tensor) and result.is_floating_point() and result.numel():
        out = result.detach().clone()
        out.view(-1)[-1] = value
        return out
    if isinstance(result, np.ndarray) and np.issubdtype(result.dtype, np.floating) and result.size:
        out = result.copy()
        out.reshape(-1)[-1] = value
        return out
    if isinstance(result, float):
        return value
    return None


def _poisoned(exercise, value):
    def candidate(*args, **kwargs):
        return _poison(exercise.reference(*args, **kwargs), value)
    return candidate


def _first_result(exercise):
    description, args, kwargs = exercise.cases()[0]
    return exercise.reference(*args, **kwargs)


FLOAT_EXERCISES = [e for e in EXERCISES if _poison(_first_result(e), float("nan")) is not None]


def test_nearly_every_exercise_returns_floats():
    # The NaN checks below cover every exercise whose result holds a float; the others return
    # integers, booleans, strings or modules, which cannot hold a NaN (2.2's ranks, 8.2's feature counts, 9.3's
    # interval of grid lengths, ...).
    assert len(FLOAT_EXERCISES) >= len(EXERCISES) - 7, [e.number for e in EXERCISES if e not in FLOAT_EXERCISES]


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("exercise", FLOAT_EXERCISES, ids=lambda e: e.number)
def test_a_non_finite_answer_is_named_first(exercise, value, capsys):
    # A learner's overflow: one entry NaN (or inf) where the library's result is finite.  The
    # message must say so and give the overflow hint, never "|difference| 0".
    result = exercise(_poisoned(exercise, value))
    text = capsys.readouterr().out
    assert result.status == FAILED, f"{exercise.number}: a {value} entry passed the check"
    kind = "NaN" if value != value else "inf"
    assert f"1 {kind} value(s) where the library's are finite" in text, text
    assert NONFINITE_HINT in text or result.mistake is not None, text
    assert "|difference| 0)" not in text, text


def _one_row_more(result):
    """``result`` with a row appended to its first array along axis 0: a shape that need not broadcast."""
    import numpy as np
    import torch

    if isinstance(result, (tuple, list)):
        for i, item in enumerate(result):
            grown = _one_row_more(item)
            if grown is not None:
                return type(result)([*result[:i], grown, *result[i + 1:]])
        return None
    if isinstance(result, torch.Tensor) and result.dim() >= 1 and result.shape[0] >= 2:
        return torch.cat([result, result[:1]])
    if isinstance(result, np.ndarray) and result.ndim >= 1 and result.shape[0] >= 2:
        return np.concatenate([result, result[:1]])
    return None


GROWABLE = [e for e in EXERCISES if _one_row_more(_first_result(e)) is not None]


@pytest.mark.parametrize("exercise", GROWABLE, ids=lambda e: e.number)
def test_a_wrong_shape_fails_the_check_without_raising(exercise):
    # A state that keeps one row too many ((K, d) where (K - 1, d) is expected, exercise 14.2) does not broadcast
    # against the library's: the check must fail and say so, never raise from inside its hints.
    def candidate(*args, **kwargs):
        return _one_row_more(exercise.reference(*args, **kwargs))

    result = exercise(candidate)  # raising here fails the test
    assert result.status == FAILED, f"{exercise.number}: a result with one row too many passed"


def test_an_unbatched_answer_gets_the_batched_hint(capsys):
    import numpy as np

    exercise = next(e for e in EXERCISES if e.number == "1.1")

    def unbatched(q, k, v, causal=False):  # k.T reverses every axis: right for 2-D inputs only
        scores = q @ k.T / np.sqrt(q.shape[-1])
        if causal:
            scores = np.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights = weights / weights.sum(-1, keepdims=True)
        return weights, weights @ v

    result = exercise(unbatched)
    assert result.status == FAILED and "works without leading dimensions" in capsys.readouterr().out


def test_lesson10_names_the_classic_linearizing_mistakes():
    # The slips of distilling softmax into linear attention, each modelled with its own hint:
    # a feature map that is not non-negative, the wrong axis, normalising over queries, padded
    # keys left in, and training on the held-out passages.
    from course_lib.checks import lesson10

    names = {m.name for e in lesson10.EXERCISES for m in e.mistakes}
    assert {"not-non-negative", "summed-over-queries", "normalised-over-queries", "padded-keys-not-masked",
            "trained-on-the-heldout-passages"} <= names
    assert all(len(e.mistakes) >= 3 for e in lesson10.EXERCISES)


def test_the_memory_requirement_tells_a_linear_answer_from_a_dense_one():
    # 10.4's budget (16 MiB at n = 4,096) against what each form needs there: the dense weights take
    # n² float64 = 128 MiB at least; a form that keeps (n, 2w + 1) scores and (f, e) states, under 1 MiB.
    import numpy as np

    from course_lib.checks import lesson10

    def scores_only(q, k, v, phi_q, phi_k, window, gamma):
        return np.empty((*q.shape[:-1], 2 * window + 1)), np.empty(v.shape)  # what a linear answer holds

    args = lesson10._window_case(420, (), lesson10.LONG_N, 4, 4, 3, window=3, gamma=0.5)
    assert lesson10._peak_bytes(lesson10._window_reference, *args) > 128 * 2**20 > lesson10.BUDGET
    assert lesson10._peak_bytes(scores_only, *args) < 2**20 < lesson10.BUDGET
    assert lesson10._linear_memory(scores_only) is None
