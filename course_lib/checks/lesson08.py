"""Checks for the lesson 08 exercises (FAVOR+: positive random features, Lemma 2, the stabiliser trap)."""

import numpy as np

from course_lib.checks import Exercise, Mistake, run_check
from course_lib.numpy import full, performer


def _gaussians(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


# --- Exercise 8.1: positive random features ---------------------------------------------------

def _positive_reference(x, omega):
    phi = performer.positive_features(x, omega)  # (..., n, f)
    return phi, phi @ np.swapaxes(phi, -1, -2)  # (..., n, n): estimates of exp(x_iᵀx_j)


def _positive(*, half_norm=-0.5, divide=True):
    """The exercise's function, made with one slip."""
    def features(x, omega):
        m = omega.shape[-2]
        phi = np.exp(x @ omega.T + half_norm * np.sum(x * x, axis=-1, keepdims=True))  # (..., n, f)
        phi = phi / np.sqrt(m) if divide else phi
        return phi, phi @ np.swapaxes(phi, -1, -2)
    return features


MISTAKES_8_1 = (
    Mistake("missing-half-norm", _positive(half_norm=0.0),
            "phi(x) = exp(ωᵀx − ‖x‖²/2) / √m: without the − ‖x‖²/2 term E[phi(x)·phi(y)] is "
            "exp(xᵀy + ‖x‖²/2 + ‖y‖²/2), not exp(xᵀy) (Eq. 8.4, Lemma 1)."),
    Mistake("plus-half-norm", _positive(half_norm=0.5),
            "the norm term has the wrong sign: subtract ‖x‖²/2 (it is exp(‖x‖²/2) only in the trig features)."),
    Mistake("norm-not-halved", _positive(half_norm=-1.0),
            "the norm term is −‖x‖²/2, half the squared norm: with −‖x‖² the estimate is exp(xᵀy − ‖x‖²/2 − "
            "‖y‖²/2), too small by exp(−(‖x‖² + ‖y‖²)/2) (Eq. 8.4, Lemma 1: E[exp(ωᵀx)] = exp(‖x‖²/2))."),
    Mistake("missing-1/sqrt(m)", _positive(divide=False),
            "divide by √m: phi(x)·phi(y) averages m terms, so each feature carries 1/√m (the estimate is "
            "m times too large otherwise)."),
)


def _cases_8_1():
    return [
        ("n = 4, d = 3, m = 5", (0.5 * _gaussians(81, 4, 3), _gaussians(82, 5, 3)), {}),
        ("n = 10, d = 8, m = 16", (0.3 * _gaussians(83, 10, 8), _gaussians(84, 16, 8)), {}),
        ("batched (2, 3), n = 6, d = 4, m = 8", (0.5 * _gaussians(85, 2, 3, 6, 4), _gaussians(86, 8, 4)), {}),
    ]


exercise_8_1 = Exercise("8.1", "positive random features", _positive_reference, _cases_8_1, MISTAKES_8_1,
                        names=("phi", "kernel_estimate"))


# --- Exercise 8.2: how many features? Lemma 2, predicted then measured --------------------------

def _needed(x, y, rel_error, *, z_for_positive=True, square=True, relative=True, rounding=np.ceil, half=True,
            trig_relative=True):
    """m for a relative RMS error ``rel_error`` on exp(xᵀy) (Eq. 8.3), made with optional slips."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    z_sq, delta_sq = np.sum((x + y) ** 2, axis=-1), np.sum((x - y) ** 2, axis=-1)  # (...,)
    sm = np.exp(np.sum(x * y, axis=-1))  # the kernel value
    target = rel_error**2 if square else rel_error
    positive = np.expm1(z_sq if z_for_positive else delta_sq)  # MSE_+ / SM² = (e^‖z‖² − 1) / m
    trig = np.exp(z_sq) * sm**-4 * (1 - np.exp(-delta_sq)) ** 2 / (2 if half else 1)  # MSE_trig / SM², times m
    if not relative:
        positive, trig = positive * sm**2, trig * sm**2
    elif not trig_relative:  # the positive MSE divided by SM², the trig one left absolute
        trig = trig * sm**2
    return rounding(positive / target).astype(np.int64), rounding(trig / target).astype(np.int64)


def _needed_reference(x, y, rel_error):
    return _needed(x, y, rel_error)


MISTAKES_8_2 = (
    Mistake("delta-for-positive", lambda *a: _needed(*a, z_for_positive=False),
            "positive features: Lemma 2's MSE grows with e^‖z‖², z = x + y (not Δ = x − y): "
            "MSE_+ / SM² = (e^‖z‖² − 1) / m."),
    Mistake("error-not-squared", lambda *a: _needed(*a, square=False),
            "rel_error is a relative RMS error: the relative MSE it allows is rel_error², so m ≥ (e^‖z‖² − 1) / "
            "rel_error²."),
    Mistake("absolute-error", lambda *a: _needed(*a, relative=False),
            "Eq. (8.3) gives the MSE; the target is relative to the kernel value, so divide by SM(x, y)² = "
            "exp(2 xᵀy) first."),
    Mistake("trig-not-relative", lambda *a: _needed(*a, trig_relative=False),
            "m_positive is right, but the trig MSE of Eq. (8.3) was not divided by SM(x, y)² = exp(2 xᵀy): the "
            "target is relative for both estimators. Divided, exp(‖z‖²) SM⁻⁴ = exp(‖Δ‖²) and the trig relative "
            "MSE is (1 − exp(−‖Δ‖²))² exp(‖Δ‖²) / (2m) = (cosh ‖Δ‖² − 1) / m."),
    Mistake("trig-without-half", lambda *a: _needed(*a, half=False),
            "the trig MSE of Eq. (8.3) has 1 / (2m): m frequencies give 2m features (sin and cos)."),
    Mistake("rounded-down", lambda *a: _needed(*a, rounding=np.floor),
            "the smallest m whose error is at most rel_error: round up (np.ceil), rounding down misses the target."),
    Mistake("rounded-to-nearest", lambda *a: _needed(*a, rounding=np.round),
            "np.round (or int(x + 0.5)) rounds to the NEAREST integer: whenever it rounds down, that m misses the "
            "target. The smallest m with an error at most rel_error is the next integer up: np.ceil."),
)


def _pairs(seed, *lead, d, scale):
    rng = np.random.default_rng(seed)
    return scale * rng.standard_normal((*lead, d)), scale * rng.standard_normal((*lead, d))


def _cases_8_2():
    return [
        ("one pair, d = 4", (*_pairs(821, d=4, scale=0.5), 0.1), {}),
        ("one pair, d = 16, a small kernel value", (np.full(16, 0.3), np.full(16, -0.25), 0.2), {}),
        ("5 pairs, d = 8", (*_pairs(822, 5, d=8, scale=0.4), 0.05), {}),
        ("batched (2, 3) pairs, d = 16", (*_pairs(823, 2, 3, d=16, scale=0.3), 0.1), {}),
    ]


exercise_8_2 = Exercise("8.2", "how many features? (Lemma 2)", _needed_reference, _cases_8_2, MISTAKES_8_2,
                        names=("m_positive", "m_trig"), atol=0, rtol=0)


# --- Exercise 8.3: a test that catches the stabiliser trap ----------------------------------------

def _one_ahead(q, k, v):
    """Causal softmax attention that also sees the next position: a future leak of one step."""
    scores = q @ k.T / np.sqrt(q.shape[-1])  # (n, s)
    scores = np.where(np.triu(np.ones_like(scores, dtype=bool), k=2), -np.inf, scores)  # j ≤ i + 1 allowed
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True) @ v


class _Attention:
    """One attention of the leak suite: ``fn(q, k, v)`` and whether it really leaks the future."""

    def __init__(self, name, fn, leaks):
        self.name, self.fn, self.leaks = name, fn, leaks

    def __call__(self, q, k, v):
        return self.fn(q, k, v)


def _suite(omega):
    """The attentions a leak test is run on, the ones that leak without the trap first."""
    return (
        _Attention("causal FAVOR+, causal-safe stabiliser",
                   lambda q, k, v: performer.performer_attention(q, k, v, omega, causal=True, chunk_size=None), False),
        _Attention("non-causal FAVOR+", lambda q, k, v: performer.performer_attention(q, k, v, omega), True),
        _Attention("causal softmax seeing one position ahead", _one_ahead, True),
        _Attention("causal softmax", lambda q, k, v: full.softmax_attention(q, k, v, causal=True), False),
        _Attention("causal FAVOR+, global-max stabiliser (the trap)",
                   lambda q, k, v: performer._global_max_causal_attention(q, k, v, omega), True),
    )


LEAK = 1e-6  # a change of the past outputs above this counts as a leak (exact attention changes by 0)


def _leak_reference(attention, q, k, v, omega, t):
    before = attention(q, k, v)
    k_new, v_new = k.copy(), v.copy()
    row = np.argmax(np.linalg.norm(omega, axis=1))
    k_new[t:] = omega[row] * q.shape[-1] ** 0.25  # y = k d^(-1/4) = ω_row: the largest exponent a key can reach
    v_new[t:] = -v_new[t:] + 1.0
    return float(np.abs(attention(q, k_new, v_new)[:t] - before[:t]).max())


def _leak(*, keys=True, positions="before", copy=True):
    """The exercise's function, made with one slip."""
    def future_leak(attention, q, k, v, omega, t):
        k_new, v_new = (k.copy(), v.copy()) if copy else (k, v)
        if keys:
            row = np.argmax(np.linalg.norm(omega, axis=1))
            k_new[t:] = omega[row] * q.shape[-1] ** 0.25
        else:
            k_new[t:] = 10 * np.random.default_rng(0).standard_normal(k_new[t:].shape)  # large, but no large exponent
        v_new[t:] = -v_new[t:] + 1.0
        before = attention(q, k, v)
        after = attention(q, k_new, v_new)
        stop = {"before": t, "with-t": t + 1, "all": len(q)}[positions]
        return float(np.abs(after[:stop] - before[:stop]).max())
    return future_leak


MISTAKES_8_3 = (
    Mistake("misses-the-trap", _leak(keys=False),
            "your test misses the global-max trap: it leaks only when a future key raises the largest key "
            "exponent ωᵀy − ‖y‖²/2 = ‖ω‖²/2 − ‖y − ω‖²/2. Changed values, or large random keys (−‖y‖²/2 wins), "
            "never do; make the future keys y = ω_r, i.e. k = ω_r · d^(1/4) for the longest row ω_r."),
    Mistake("positions-that-may-change", _leak(positions="with-t"),
            "you compared outputs that are allowed to change: output t sees key t. Compare only the outputs at "
            "positions 0 … t − 1 (out[:t])."),
    Mistake("changed-in-place", _leak(copy=False),
            "you changed k and v in place, so the 'before' call already saw the new future: copy them first "
            "(k.copy(), v.copy()) and change the copies."),
)


def _leak_cases():
    cases = []
    for seed, (n, d, m, t) in enumerate(((24, 16, 32, 18), (16, 8, 16, 10), (40, 16, 64, 30))):
        rng = np.random.default_rng(830 + seed)
        q, k, v = (0.5 * rng.standard_normal((n, d)) for _ in range(3))
        omega = performer.random_matrix(m, d, rng)
        cases += [(f"{attention.name}; n = {n}, d = {d}, m = {m}, future from t = {t}", (attention, q, k, v, omega, t),
                   {}) for attention in _suite(omega)]
    return cases


def _detects(future_leak):
    """The learner's test as a verdict: 1.0 for "it leaks", 0.0 for "it does not" (NaN and inf pass through)."""
    def verdict(attention, q, k, v, omega, t):
        change = float(future_leak(attention, q, k, v, omega, t))
        return change if not np.isfinite(change) else float(change > LEAK)
    return verdict


def _truth(attention, q, k, v, omega, t):
    return float(attention.leaks)


class _LeakExercise(Exercise):
    """Exercise 8.3's check: the learner writes a test; it is run on attentions that do and do not leak.

    Any change of the future that reveals every leak passes (several answers are right): the
    check compares the test's verdict with the truth, not the numbers it returns.
    """

    def __call__(self, candidate, *, verbose=True):
        mistakes = [Mistake(m.name, _detects(m.fn), m.hint) for m in self.mistakes]
        return run_check(self.number, _detects(candidate), _truth, self.cases(), names=self.names,
                         mistakes=mistakes, atol=0, rtol=0, verbose=verbose)


exercise_8_3 = _LeakExercise("8.3", "a test that catches the stabiliser trap", _leak_reference, _leak_cases,
                             MISTAKES_8_3, names=("leak found (1) or not (0)",))

EXERCISES = [exercise_8_1, exercise_8_2, exercise_8_3]
