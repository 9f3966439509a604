"""Checks for the lesson 09 exercises (the paired test, signed weights, a crossover as an interval, choosing a
variant)."""

import math

import numpy as np

from course_lib import swap_in
from course_lib.bench import stored
from course_lib.checks import Exercise, Mistake

# --- Exercise 9.1: is one model better? The paired test on the same texts -------------------------

def _paired(found, reference_found, *, tosses="discordant", doubled=True, capped=True, swapped=False,
            counts="texts"):
    """(lost, gained, p) of McNemar's exact test (Section 9.4), with optional slips (the defaults: none)."""
    found, reference_found = np.asarray(found, bool), np.asarray(reference_found, bool)
    if counts == "totals":  # only the totals compared: the texts each model finds are forgotten
        difference = int(reference_found.sum()) - int(found.sum())
        lost, gained = max(difference, 0), max(-difference, 0)
    else:
        lost, gained = int(np.sum(reference_found & ~found)), int(np.sum(found & ~reference_found))
    n = lost + gained if tosses == "discordant" else len(found)
    tail = sum(math.comb(n, i) for i in range(min(lost, gained) + 1)) / 2**n
    p = 2 * tail if doubled else tail
    p = min(1.0, p) if capped else p
    return (gained, lost, p) if swapped else (lost, gained, p)


def _paired_reference(found, reference_found):
    result = swap_in.paired_retrieval(found, reference_found)
    return result["lost"], result["gained"], result["p"]


MISTAKES_9_1 = (
    Mistake("lost-and-gained-swapped", lambda *a: _paired(*a, swapped=True),
            "lost counts the texts the REFERENCE finds and the variant misses; gained the texts the variant finds "
            "and the reference misses. The arguments are (found, reference_found), in that order."),
    Mistake("every-text-a-toss", lambda *a: _paired(*a, tosses="all"),
            "the texts both models find, or both miss, say nothing about which is better: the coin is tossed "
            "only lost + gained times, not once per text."),
    Mistake("totals-only", lambda *a: _paired(*a, counts="totals"),
            "you compared the two totals: a paired test looks text by text. Two models with the same total can "
            "disagree on many texts; count lost (reference & ~found) and gained (found & ~reference) apart."),
    Mistake("one-sided", lambda *a: _paired(*a, doubled=False),
            "that is a one-sided p: the question is whether either model is better, so double the tail of the "
            "smaller count."),
    Mistake("p-above-one", lambda *a: _paired(*a, capped=False),
            "a p-value above 1: when lost = gained the doubled tail passes 1 (the middle term counts twice); "
            "cap it, min(1, 2 · tail)."),
)


def _found(rng, t, hits, agree):
    """Two (t,) boolean vectors: the reference finds ``hits`` texts; the variant agrees on about ``agree`` of them."""
    reference = rng.permutation(np.arange(t) < hits)
    flip = rng.random(t) > agree
    return reference ^ flip, reference


def _cases_9_1():
    rng = np.random.default_rng(91)
    return [
        ("48 texts, the variant loses 12 and gains 2", _twelve_two(), {}),
        ("48 texts, seeded disagreement", _found(rng, 48, 19, 0.8), {}),
        ("as many lost as gained (p = 1)", (np.array([1, 0, 1, 0, 1, 1], bool), np.array([0, 1, 1, 0, 1, 0], bool)),
         {}),
        ("no text on which they disagree", (np.array([1, 0, 0, 1], bool), np.array([1, 0, 0, 1], bool)), {}),
    ]


def _twelve_two():
    reference = np.arange(48) < 19  # the exact model finds 19 of 48
    found = reference.copy()
    found[:12] = False  # 12 of its texts lost
    found[40:42] = True  # 2 gained
    return found, reference


exercise_9_1 = Exercise("9.1", "is one model better? The paired test on the same texts", _paired_reference,
                        _cases_9_1, MISTAKES_9_1, names=("lost", "gained", "p"), atol=1e-12, rtol=1e-9)


# --- Exercise 9.2: signed weights — the output and its cancellation ---------------------------------

def _signed(w, values, *, divide="signed", ratio="abs"):
    """The output of signed weights and each row's cancellation ratio (Eq. 9.2), with optional slips."""
    w, values = np.asarray(w, dtype=float), np.asarray(values, dtype=float)
    if divide == "relu":
        w = np.maximum(w, 0.0)
    z = w.sum(axis=-1)  # (..., n): the normaliser, a signed sum
    total = np.abs(w).sum(axis=-1)  # (..., n): Σ_j |w_ij|
    with np.errstate(divide="ignore", invalid="ignore"):  # a slip may divide by 0: its NaN is its answer
        out = (w @ values) / (np.abs(z) if divide == "abs" else z)[..., None]  # (..., n, e)
        cancel = {"abs": np.abs(z) / total, "signed": z / total, "sum-first": np.abs(z) / np.abs(z)}[ratio]
    return out, cancel


def _signed_reference(w, values):
    return _signed(w, values)


MISTAKES_9_2 = (
    Mistake("divided-by-abs", lambda *a: _signed(*a, divide="abs"),
            "a negative normaliser is harmless: w and z change sign together (E → −E leaves the output as it is), "
            "so divide by z itself; dividing by |z| flips every output whose z < 0."),
    Mistake("signed-ratio", lambda *a: _signed(*a, ratio="signed"),
            "the cancellation ratio is |z_i| / Σ_j |w_ij|, between 0 and 1: take the absolute value of z_i too "
            "(its sign says nothing, as the output shows)."),
    Mistake("sum-then-abs", lambda *a: _signed(*a, ratio="sum-first"),
            "Σ_j |w_ij| takes absolute values first, then sums; |Σ_j w_ij| is |z_i| itself, and the ratio is "
            "then always 1."),
    Mistake("dropped-negative-weights", lambda *a: _signed(*a, divide="relu"),
            "you clipped the negative weights: that is another attention, not the one Eq. (9.2) computes; keep "
            "the signed weights and measure how much they cancel."),
)


def _signed_case(rng, *lead, n, k, e):
    w = rng.standard_normal((*lead, n, k)) + 0.2  # mixed signs; some rows' sums are negative
    return w, rng.standard_normal((*lead, k, e))


def _cases_9_2():
    rng = np.random.default_rng(92)
    return [
        ("n = 6 queries, k = 4 projected keys, e = 3", _signed_case(rng, n=6, k=4, e=3), {}),
        ("n = 12, k = 5, e = 2", _signed_case(rng, n=12, k=5, e=2), {}),
        ("batched (2, 3), n = 8, k = 4, e = 5", _signed_case(rng, 2, 3, n=8, k=4, e=5), {}),
    ]


exercise_9_2 = Exercise("9.2", "signed weights: the output and its cancellation", _signed_reference, _cases_9_2,
                        MISTAKES_9_2, names=("output", "cancellation ratio"), atol=1e-9, rtol=1e-7)


# --- Exercise 9.3: a crossover read from a grid, as an interval ---------------------------------

def _interval(n, seconds_a, seconds_b, *, margin=1.0, slip=None):
    """``(n_low, n_high)``: a is not faster than b at n_low, faster at n_high and every larger measured n (Section
    9.2); ``(0, n[0])`` when a is faster at every measured n, ``(n[-1], inf)`` when not at the largest. Slips
    optional (the default: none)."""
    n, a, b = np.asarray(n), np.asarray(seconds_a, dtype=float), np.asarray(seconds_b, dtype=float)
    if slip == "swapped":  # "faster" read the wrong way round
        a, b = b, a
    faster = b > (1.0 if slip == "no-margin" else margin) * a  # (p,)
    if slip == "first-crossing":  # the first length at which a is faster, whether or not it stays so
        start = int(np.argmax(faster)) if faster.any() else None
    elif not faster[-1]:
        start = None
    else:
        slower = np.flatnonzero(~faster)
        start = int(slower[-1]) + 1 if len(slower) else 0
    if slip == "point":
        return math.inf if start is None else int(n[start])  # one length: where the grid says "faster from"
    if slip == "midpoint":  # a point between the two lengths: the grid cannot say where in between
        return math.inf if start is None else (0.0 if start == 0 else float(np.sqrt(n[start - 1] * n[start])))
    if start is None:
        return int(n[-1]), math.inf
    if start == 0:
        return 0, int(n[0])
    if slip == "next-pair":  # the first faster length and the one after it
        return int(n[start]), int(n[min(start + 1, len(n) - 1)])
    return int(n[start - 1]), int(n[start])


def _interval_reference(n, seconds_a, seconds_b, *, margin=1.0):
    start = stored.faster_from(n, seconds_a, seconds_b, margin=margin)
    if start is None:
        return int(n[-1]), math.inf
    interval = stored.crossover(n, seconds_a, seconds_b, margin=margin)
    return (0, int(n[0])) if interval is None else interval


def _interval_slip(slip):
    return lambda *a, **kw: _interval(*a, **kw, slip=slip)


MISTAKES_9_3 = (
    Mistake("point-not-interval", _interval_slip("point"),
            "a grid measures some lengths, not all: the crossover lies somewhere between the last measured n at "
            "which a is not faster and the first from which it stays faster. Return both, (n_low, n_high), not "
            "one length."),
    Mistake("interpolated-point", _interval_slip("midpoint"),
            "an interpolated point (a mean of the two lengths) claims more than the grid measured: return the "
            "interval (n_low, n_high) itself."),
    Mistake("first-crossing", _interval_slip("first-crossing"),
            "the wrong pair of lengths: a must become AND stay faster. Where the times cross back and forth "
            "(noise, or a kernel switch) the interval is the one after the LAST length at which a is not faster "
            "— scan from the largest n down."),
    Mistake("next-pair", _interval_slip("next-pair"),
            "the wrong pair of lengths: n_low is the last measured n at which a is NOT faster, the one just "
            "before n_high, not the length after it."),
    Mistake("faster-the-wrong-way", _interval_slip("swapped"),
            "a is faster where seconds_a < seconds_b (it takes less time); you compared the other way round."),
    Mistake("ignores-margin", _interval_slip("no-margin"),
            "with a margin, a counts as faster only where seconds_b > margin * seconds_a: a win by 5 % is no win "
            "when margin = 1.5."),
)


def _grid_case(rng, lengths, cross_at, *, noise=0.0, flip_at=None):
    """Times of a variant a (about linear in n) and b (about quadratic) that cross near ``cross_at``."""
    n = np.asarray(lengths)
    a = 1e-6 * n * cross_at
    b = 1e-6 * n.astype(float) ** 2
    a = a * np.exp(noise * rng.standard_normal(len(n)))
    if flip_at is not None:  # one length at which a is slower again: a crossing that does not stay
        a[flip_at] = 1.5 * b[flip_at]
    return n, a, b


def _cases_9_3():
    rng = np.random.default_rng(93)
    lengths = 2 ** np.arange(5, 15)  # 32 … 16,384
    grid = stored.load()
    n_perf, t_perf, t_sdpa = stored.common(stored.series(grid, "performer", m=256), stored.series(grid, "sdpa"))
    return [
        ("one clean crossing between 1,024 and 2,048", _grid_case(rng, lengths, 1500), {}),
        ("crosses back once: faster at 512, slower at 1,024, faster from 2,048", _grid_case(
            rng, lengths, 400, flip_at=5), {}),
        ("the stored grid: FAVOR+ (m = 256) against SDPA", (n_perf, t_perf, t_sdpa), {}),
        ("faster at every measured n", _grid_case(rng, lengths, 10), {}),
        ("not faster at the largest n", _grid_case(rng, lengths, 50000), {}),
        ("margin 1.5: faster by half at least", _grid_case(rng, lengths, 700, noise=0.05), {"margin": 1.5}),
    ]


exercise_9_3 = Exercise("9.3", "a crossover read from a grid, as an interval", _interval_reference, _cases_9_3,
                        MISTAKES_9_3, names=("n_low", "n_high"), atol=0, rtol=0)


# --- Exercise 9.4: choose a variant for a budget -----------------------------------------------

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


MISTAKES_9_4 = (
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


def _cases_9_4():
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


exercise_9_4 = Exercise("9.4", "choose a variant for a budget", _choose_reference, _cases_9_4, MISTAKES_9_4,
                        names=("index",), atol=0, rtol=0)

EXERCISES = [exercise_9_1, exercise_9_2, exercise_9_3, exercise_9_4]
