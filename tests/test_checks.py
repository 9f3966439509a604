"""Every exercise checker: the reference passes, a stub is "not attempted", each mistake fails
with its own hint — so a learner's classic slip is named, not just flagged."""

import pytest

from course_lib.checks import FAILED, NOT_ATTEMPTED, PASSED, all_exercises

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
    result = exercise(exercise.reference)
    assert result.status == PASSED, result.message
    assert f"Exercise {exercise.number}: passed" in capsys.readouterr().out


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
    assert "output: expected shape" in text and "got" in text and "max |difference| 1" in text
