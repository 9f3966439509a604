"""Checks for the lesson 08 exercises (FAVOR+: a tight causal-safe stabiliser, Lemma 2, the stabiliser trap)."""

import numpy as np

from course_lib.checks import Exercise, Mistake, Requirement, run_check, to_numpy
from course_lib.numpy import full, performer


def _gaussians(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


# --- Exercise 8.1: the tightest causal-safe stabiliser: a running maximum ------------------------
# The library's causal shift is a bound on every possible key exponent, max_r ‖ω_r‖²/2: it reads no key, but
# keys far from every ω sit hundreds below it and their features underflow to 0.  The tightest shift that
# reads no future key is the largest exponent so far, M_i = max_{j ≤ i, r} a_jr; it differs between queries,
# so the sums carried from earlier positions are rescaled by exp(M_{i-1} − M_i) whenever it rises.

def _exponents(q, k, omega, *, half_norm=True, scaled=True):
    """Query projections ``(..., n, m)`` and key exponents a_jr = ω_rᵀy − ‖y‖²/2 ``(..., n, m)``, y = k d^(-1/4)."""
    scale = q.shape[-1] ** -0.25 if scaled else 1.0
    x, y = q * scale, k * scale
    exponents = y @ omega.T - (0.5 * np.sum(y * y, axis=-1, keepdims=True) if half_norm else 0.0)
    return x @ omega.T, exponents


def _logsumexp(x, axis):
    top = x.max(axis=axis, keepdims=True)  # finite here: every exponent is
    return np.log(np.exp(x - top).sum(axis=axis)) + np.squeeze(top, axis=axis)


def _causal_log_attention(projections, exponents, v):
    """The output in log space, exact: log w_ij = logsumexp_r (ω_rᵀx_i + a_jr) over the keys j ≤ i."""
    log_w = _logsumexp(projections[..., :, None, :] + exponents[..., None, :, :], axis=-1)  # (..., n, s)
    n = log_w.shape[-1]
    log_w = np.where(np.tril(np.ones((n, n), dtype=bool)), log_w, -np.inf)
    weights = np.exp(log_w - log_w.max(axis=-1, keepdims=True))  # the diagonal is finite: the max is too
    return weights @ v / weights.sum(axis=-1, keepdims=True)


def _running_max_reference(q, k, v, omega):
    projections, exponents = _exponents(q, k, omega)
    shift = np.maximum.accumulate(exponents.max(axis=-1), axis=-1)  # (..., n): M_i, keys j ≤ i only
    return shift, _causal_log_attention(projections, exponents, v)


def _shifted(*, half_norm=True, scaled=True, shift="running", rescale=True, per_feature=False):
    """Exercise 8.1's function with one slip (the defaults: none), in the quadratic form of the weights."""
    def attention(q, k, v, omega):
        projections, exponents = _exponents(q, k, omega, half_norm=half_norm, scaled=scaled)
        largest = exponents if per_feature else exponents.max(axis=-1, keepdims=True)  # (..., n, m or 1)
        if shift == "global":  # the trap: the future's keys included
            M = np.broadcast_to(largest.max(axis=-2, keepdims=True), largest.shape)
        elif shift == "before":  # keys j < i: the position's own key left out
            M = np.concatenate([np.full_like(largest[..., :1, :], -np.inf),
                                np.maximum.accumulate(largest, axis=-2)[..., :-1, :]], axis=-2)
        else:
            M = np.maximum.accumulate(largest, axis=-2)  # (..., n, m or 1)
        phi_q = np.exp(projections - projections.max(axis=-1, keepdims=True))  # (..., n, m)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if rescale:  # every key a query sees carries that query's shift M_i
                phi_k = np.exp(exponents[..., None, :, :] - M[..., :, None, :])  # (..., n, s, m)
            else:  # each key shifted by the maximum at its own position, never rescaled
                phi_k = np.broadcast_to(np.exp(exponents - M)[..., None, :, :], (*M.shape[:-2], M.shape[-2],
                                                                                 *exponents.shape[-2:]))
            weights = np.tril(np.einsum("...nm,...nsm->...ns", phi_q, phi_k))  # (..., n, s)
            output = weights @ v / weights.sum(axis=-1, keepdims=True)
        return (M if per_feature else M[..., 0]), output
    return attention


MISTAKES_8_1 = (
    Mistake("global-max", _shifted(shift="global"),
            "your shift is the largest exponent over the whole sequence: position i then reads keys after it, the "
            "trap of Section 8.6 (a large future key shrinks every earlier feature; against float underflow or an "
            "eps the past outputs change). Take the maximum over the keys j ≤ i only (np.maximum.accumulate)."),
    Mistake("own-key-left-out", _shifted(shift="before"),
            "query i sees key i too: the running maximum runs over j ≤ i, the position's own key included "
            "(the first position's shift is its own key's largest exponent, not −inf)."),
    Mistake("shift-not-rescaled", _shifted(rescale=False),
            "each key was shifted by the maximum at its own position and kept so: a shift cancels only when every "
            "key a query sees carries the same one. When the running maximum rises from M_{i−1} to M_i, rescale "
            "the sums carried so far by exp(M_{i−1} − M_i) (≤ 1: nothing overflows)."),
    Mistake("per-feature-shift", _shifted(per_feature=True),
            "one shift per position, shared by all m features: exp(−M_i) then factors out of the numerator and the "
            "normaliser. A different shift per feature r reweights the features and changes the kernel estimate."),
    Mistake("missing-half-norm", _shifted(half_norm=False),
            "a key's exponent is ω_rᵀy − ‖y‖²/2 (Eq. 8.4): without −‖y‖²/2 the features estimate "
            "exp(xᵀy + ‖y‖²/2), not exp(xᵀy), and the shift is wrong too."),
    Mistake("not-scaled", _shifted(scaled=False),
            "FAVOR+ estimates exp(qᵀk / √d): map x = q d^(-1/4) and y = k d^(-1/4), not q and k (Eq. 8.6)."),
)


def _favor_case(seed, lead, n, d, e, m, key_norm=None):
    rng = np.random.default_rng(seed)
    q, k = 0.5 * rng.standard_normal((*lead, n, d)), 0.5 * rng.standard_normal((*lead, n, d))
    if key_norm is not None:  # every key of this norm: exponents near −‖y‖²/2, far below the library's bound
        k = key_norm * k / np.linalg.norm(k, axis=-1, keepdims=True)
    return q, k, rng.standard_normal((*lead, n, e)), performer.random_matrix(m, d, rng)


FAR = 100.0  # ‖k‖ = 100 at d = 16: ‖y‖ = 50, a = ωᵀy − 1250 ≤ 4 · 50 − 1250 < −745: exp(a) underflows to 0


def _cases_8_1():
    return [
        ("n = 6, d = 4, e = 3, m = 8", _favor_case(811, (), 6, 4, 3, 8), {}),
        ("n = 12, d = 8, e = 4, m = 16", _favor_case(812, (), 12, 8, 4, 16), {}),
        ("n = 1 (one position)", _favor_case(813, (), 1, 4, 2, 4), {}),
        ("batched (2, 3), n = 9, d = 4, e = 2, m = 8", _favor_case(814, (2, 3), 9, 4, 2, 8), {}),
        (f"keys of norm {FAR:g}, n = 10, d = 16, m = 16: the library's causal shift underflows here",
         _favor_case(815, (), 10, 16, 3, 16, key_norm=FAR), {}),
    ]


def _past_moves(candidate):
    """None when new future keys leave the past outputs as they were; else a line saying how far they moved."""
    q, k, v, omega = _favor_case(816, (), 12, 16, 3, 16, key_norm=FAR)
    t, row = 8, np.argmax(np.linalg.norm(omega, axis=1))
    future = k.copy()
    future[t:] = omega[row] * q.shape[-1] ** 0.25  # y = ω_row: the largest exponent any key can reach
    before, after = to_numpy(candidate(q, k, v, omega)[1])[:t], to_numpy(candidate(q, future, v, omega)[1])[:t]
    with np.errstate(invalid="ignore"):
        moved = np.abs(after - before).max()
    if np.all(np.isfinite(after)) and moved <= 1e-12 * max(1.0, np.abs(before).max()):
        return None
    bad = int(np.count_nonzero(~np.isfinite(after)))
    how = f"made {bad} of them NaN or inf" if bad else f"moved them by up to {moved:.3g}"
    return f"changing the keys from position {t} on {how}, at positions 0 … {t - 1}: they read the future."


def _global_max_output(q, k, v, omega):
    """The right shift returned, but the output computed with the maximum over the whole sequence."""
    shift, _ = _running_max_reference(q, k, v, omega)
    projections, exponents = _exponents(q, k, omega)
    phi_q = np.exp(projections - projections.max(axis=-1, keepdims=True))
    phi_k = np.exp(exponents - exponents.max(axis=(-1, -2), keepdims=True))  # the future sets the scale
    with np.errstate(invalid="ignore"):
        weights = np.tril(phi_q @ np.swapaxes(phi_k, -1, -2))
        return shift, weights @ v / weights.sum(axis=-1, keepdims=True)


REQUIREMENTS_8_1 = (
    Requirement("reads-future-keys", _past_moves,
                "the shift you return is right, but the outputs use another one that reads keys after the query "
                "(a maximum over the whole sequence): with past keys far below the future's, their features "
                "underflow. Shift the keys query i sees by M_i, the maximum over j ≤ i, and rescale what is "
                "carried when it rises.",
                _global_max_output),
)

exercise_8_1 = Exercise("8.1", "the tightest causal-safe stabiliser: a running maximum", _running_max_reference,
                        _cases_8_1, MISTAKES_8_1, names=("shift", "output"), requirements=REQUIREMENTS_8_1)


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
