"""Answers a learner writes for exercise 9.3 (a crossover read from a grid, as an interval), other than the
reference: each right one passes, and each classic slip is named by its own hint."""

import math

import numpy as np
import pytest

from course_lib.bench import stored
from course_lib.checks import FAILED, PASSED
from course_lib.checks.lesson09 import exercise_9_3


def scan_from_the_top(n, seconds_a, seconds_b, *, margin=1.0):
    """Walk down from the largest n while a stays faster: the first length where it is not ends the walk."""
    if not seconds_b[-1] > margin * seconds_a[-1]:
        return int(n[-1]), math.inf
    i = len(n) - 1
    while i > 0 and seconds_b[i - 1] > margin * seconds_a[i - 1]:
        i -= 1
    return (0, int(n[0])) if i == 0 else (int(n[i - 1]), int(n[i]))


def with_the_library(n, seconds_a, seconds_b, *, margin=1.0):
    """stored.faster_from and stored.crossover, with the two ends of the grid spelled out."""
    start = stored.faster_from(n, seconds_a, seconds_b, margin=margin)
    if start is None:
        return int(n[-1]), float("inf")
    return stored.crossover(n, seconds_a, seconds_b, margin=margin) or (0, int(n[0]))


@pytest.mark.parametrize("answer", [scan_from_the_top, with_the_library])
def test_right_answers_pass(answer, capsys):
    assert exercise_9_3(answer).status == PASSED
    assert "Exercise 9.3: passed" in capsys.readouterr().out


def _faster(n, seconds_a, seconds_b, margin=1.0):
    return np.asarray(seconds_b) > margin * np.asarray(seconds_a)


def first_faster_length(n, seconds_a, seconds_b, *, margin=1.0):
    """Where the grid first says "faster from": one length, not an interval."""
    faster = _faster(n, seconds_a, seconds_b, margin)
    if not faster[-1]:
        return math.inf
    slower = np.flatnonzero(~faster)
    return int(n[slower[-1] + 1]) if len(slower) else int(n[0])


def geometric_mean_point(n, seconds_a, seconds_b, *, margin=1.0):
    """A point between the two bracketing lengths: more than the grid measured."""
    low, high = scan_from_the_top(n, seconds_a, seconds_b, margin=margin)
    return math.inf if math.isinf(high) else math.sqrt(low * high)


def first_crossing(n, seconds_a, seconds_b, *, margin=1.0):
    """The first pair at which a turns faster, though it is slower again later."""
    faster = _faster(n, seconds_a, seconds_b, margin)
    if not faster[-1]:
        return int(n[-1]), math.inf
    i = int(np.argmax(faster))
    return (0, int(n[0])) if i == 0 else (int(n[i - 1]), int(n[i]))


def one_pair_too_far(n, seconds_a, seconds_b, *, margin=1.0):
    """The first faster length and the next one: the wrong pair."""
    low, high = scan_from_the_top(n, seconds_a, seconds_b, margin=margin)
    if low == 0 or math.isinf(high):
        return low, high
    i = list(n).index(high)
    return high, int(n[min(i + 1, len(n) - 1)])


def faster_means_more_time(n, seconds_a, seconds_b, *, margin=1.0):
    return scan_from_the_top(n, seconds_b, seconds_a, margin=margin)


def margin_forgotten(n, seconds_a, seconds_b, *, margin=1.0):
    return scan_from_the_top(n, seconds_a, seconds_b)


@pytest.mark.parametrize("answer, mistake", [
    (first_faster_length, "point-not-interval"),
    (geometric_mean_point, "interpolated-point"),
    (first_crossing, "first-crossing"),
    (one_pair_too_far, "next-pair"),
    (faster_means_more_time, "faster-the-wrong-way"),
    (margin_forgotten, "ignores-margin"),
])
def test_each_slip_is_named(answer, mistake, capsys):
    result = exercise_9_3(answer)
    assert result.status == FAILED and result.mistake == mistake
    assert "hint:" in capsys.readouterr().out


def test_the_stored_grid_case_matches_the_lesson():
    # Section 9.2 prints FAVOR+ (m = 256) against SDPA as "1,024 … 2,048": the exercise's stored case agrees.
    grid = stored.load()
    n, t_performer, t_sdpa = stored.common(stored.series(grid, "performer", m=256), stored.series(grid, "sdpa"))
    assert scan_from_the_top(n, t_performer, t_sdpa) == stored.crossover(n, t_performer, t_sdpa)
