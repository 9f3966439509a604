"""Checks for the lesson 09 exercises (putting it together: crossovers and choosing a variant)."""

import math

import numpy as np

from course_lib.checks import Exercise, Mistake

# --- Exercise 9.1: the crossover n from a timing table ----------------------------------------

def _crossover(n, t_variant, t_reference, *, first=False, log_n=True, direction=1, interpolate=True):
    """The n from which the variant stays faster (Eq. 9.4), made with optional slips."""
    n, t_variant, t_reference = (np.asarray(x, dtype=float) for x in (n, t_variant, t_reference))
    slower = t_variant >= t_reference  # (points,)
    if not slower.any():
        return float(n[0])  # faster at every measured n: the crossover is at or below the grid
    if slower[-1]:
        return math.inf  # still slower at the largest n: no crossover in the data
    if first:
        i = int(np.argmin(slower)) - 1  # the slip: the point before the first faster one
        if i < 0:
            return float(n[0])
    else:
        i = int(np.nonzero(slower)[0][-1])  # the last point where the variant is not faster
    r = np.log(t_variant[i : i + 2] / t_reference[i : i + 2])  # (2,): ≥ 0, then < 0
    if not interpolate:
        return float(n[i + 1])
    x = np.log(n[i : i + 2]) if log_n else n[i : i + 2]
    share = r[0] / (r[0] - r[1]) if direction == 1 else -r[1] / (r[0] - r[1])
    cross = x[0] + share * (x[1] - x[0])
    return float(np.exp(cross) if log_n else cross)


def _crossover_reference(n, t_variant, t_reference):
    return _crossover(n, t_variant, t_reference)


MISTAKES_9_1 = (
    Mistake("first-crossing", lambda *a: _crossover(*a, first=True),
            "you took the first n where the variant is faster; a noisy early point can dip below and rise "
            "again. The crossover is after the LAST point where the variant is not faster."),
    Mistake("no-interpolation", lambda *a: _crossover(*a, interpolate=False),
            "you returned the grid point after the crossing; interpolate between the two points around it "
            "where log(t_variant / t_reference) changes sign."),
    Mistake("linear-in-n", lambda *a: _crossover(*a, log_n=False),
            "you interpolated linearly in n; timings are power laws in n, so interpolate in log n (the "
            "grid is log-spaced: n doubles from point to point)."),
    Mistake("wrong-direction", lambda *a: _crossover(*a, direction=-1),
            "the interpolation weight is measured from the wrong end: the fraction of the way from n_i is "
            "r_i / (r_i − r_(i+1)) with r = log(t_variant / t_reference)."),
)


def _cases_9_1():
    n = [256, 512, 1024, 2048, 4096, 8192]
    exact = [0.002, 0.009, 0.04, 0.17, 0.7, 2.9]
    return [
        ("a clean crossing between 1024 and 2048", (n, [0.01, 0.02, 0.05, 0.09, 0.18, 0.36], exact), {}),
        ("a noisy dip at n = 512, then the real crossing", (n, [0.004, 0.008, 0.06, 0.1, 0.2, 0.4], exact), {}),
        ("never faster", (n[:3], [1.0, 2.0, 4.0], exact[:3]), {}),
        ("faster everywhere", (n[:3], [0.001, 0.002, 0.004], exact[:3]), {}),
    ]


exercise_9_1 = Exercise("9.1", "the crossover n from a timing table", _crossover_reference, _cases_9_1,
                        MISTAKES_9_1, names=("crossover_n",), atol=1e-6, rtol=1e-6)


# --- Exercise 9.2: choose a variant for a budget -----------------------------------------------

def _choose(times, peaks, causal_ok, fixed_length, *, need_causal, variable_length, memory_cap,
            check_memory=True, check_causal=True, check_length=True, by="time", strict=False):
    """Index of the fastest variant that meets every constraint (Section 9.5), or -1; optional slips."""
    times, peaks = np.asarray(times, dtype=float), np.asarray(peaks, dtype=float)
    ok = np.ones(len(times), dtype=bool)
    if check_memory:
        ok &= (peaks < memory_cap) if strict else (peaks <= memory_cap)
    if check_causal and need_causal:
        ok &= np.asarray(causal_ok, dtype=bool)
    if check_length and variable_length:
        ok &= ~np.asarray(fixed_length, dtype=bool)
    if not ok.any():
        return -1
    key = times if by == "time" else peaks
    return int(np.flatnonzero(ok)[np.argmin(key[ok])])


def _choose_reference(times, peaks, causal_ok, fixed_length, *, need_causal, variable_length, memory_cap):
    return _choose(times, peaks, causal_ok, fixed_length, need_causal=need_causal,
                   variable_length=variable_length, memory_cap=memory_cap)


def _slip(**slip):
    return lambda *a, **kw: _choose(*a, **kw, **slip)


MISTAKES_9_2 = (
    Mistake("ignores-memory", _slip(check_memory=False),
            "the pick exceeds the memory cap: drop every variant whose peak memory is above memory_cap first."),
    Mistake("ignores-causal", _slip(check_causal=False),
            "a decoder needs causal attention: Linformer (and any non-causal variant) mixes future keys into "
            "every projected key, so it is out when need_causal is True."),
    Mistake("ignores-fixed-length", _slip(check_length=False),
            "with variable lengths a fixed-length variant is out: Linformer's E has n_max columns, fixed at "
            "training time."),
    Mistake("strict-cap", _slip(strict=True),
            "a variant that uses exactly memory_cap bytes fits the budget: compare with <=, not <."),
    Mistake("least-memory", _slip(by="memory"),
            "you picked the variant with the least memory; among those within the budget pick the fastest."),
)

# The variants of Section 9.5's table at n = 8192, CPU (times in s, peaks in MiB): exact, SDPA,
# Linformer, linear, causal linear (chunked), FAVOR+.
_TIMES = [2.9, 1.1, 0.12, 0.08, 0.25, 0.4]
_PEAKS = [2100.0, 20.0, 40.0, 30.0, 35.0, 90.0]
_CAUSAL = [True, True, False, False, True, False]
_FIXED = [False, False, True, False, False, False]


def _cases_9_2():
    table = (_TIMES, _PEAKS, _CAUSAL, _FIXED)
    return [
        ("encoder, fixed length, 64 MiB", table, dict(need_causal=False, variable_length=False, memory_cap=64.0)),
        ("decoder, 64 MiB", table, dict(need_causal=True, variable_length=True, memory_cap=64.0)),
        ("decoder, 30 MiB", table, dict(need_causal=True, variable_length=True, memory_cap=30.0)),
        ("encoder, variable length, exactly 30 MiB", table,
         dict(need_causal=False, variable_length=True, memory_cap=30.0)),
        ("encoder, fixed length, 4 GiB", ([2.9, 1.1, 0.12], [2100.0, 20.0, 40.0], [True, True, False],
                                         [False, False, True]),
         dict(need_causal=False, variable_length=False, memory_cap=4096.0)),
        ("encoder, variable length, 64 MiB, Linformer fastest", ([2.9, 1.1, 0.05, 0.08, 0.25, 0.4], *table[1:]),
         dict(need_causal=False, variable_length=True, memory_cap=64.0)),
        ("nothing fits", table, dict(need_causal=True, variable_length=False, memory_cap=10.0)),
        ("decoder, 3 GiB: exact or SDPA by time", ([2.9, 1.1], [2100.0, 20.0], [True, True], [False, False]),
         dict(need_causal=True, variable_length=False, memory_cap=3072.0)),
    ]


exercise_9_2 = Exercise("9.2", "choose a variant for a budget", _choose_reference, _cases_9_2, MISTAKES_9_2,
                        names=("index",), atol=0, rtol=0)

EXERCISES = [exercise_9_1, exercise_9_2]
