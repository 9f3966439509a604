"""Checks for the lesson 03 exercises (random projections and the Johnson–Lindenstrauss lemma)."""

import copy
import math

import numpy as np

from course_lib.checks import FAILED, NOT_ATTEMPTED, PASSED, CheckResult, Exercise, Mistake, to_numpy
from course_lib.numpy import jl

# --- Exercise 3.1: a sparse JL projection of any density ----------------------------------
# The learner derives the scale c of the non-zero entries ±c from the variance 1/k, for a share
# `density` of non-zeros.  Many draws are right (rng.random, rng.choice, rng.integers …), so the
# check tests properties of the matrix, not one construction: the shape, the three values 0 and
# ±1/√(density·k), the share of non-zeros and of signs on large cases, and that every random
# number comes from the generator passed in.

def _sparse_reference(k, n, rng, density):
    return jl.sparse_projection(k, n, rng, density=density)


def _sparse_with(*, scale=lambda k, n, density: 1 / math.sqrt(density * k), zero_share=None, shape="kn",
                 source="rng", signs=True):
    """Exercise 3.1's function, made with one slip in the scale, the share of zeros, the shape or the randomness."""
    def projection(k, n, rng, density):
        size = (k, n) if shape == "kn" else (n, k)
        if source == "global":  # NumPy's global generator: another matrix on every call
            u = np.random.random(size)
        elif source == "fixed":  # a fresh generator of its own: the same matrix whatever rng is passed
            u = np.random.default_rng(0).random(size)
        else:
            u = rng.random(size)
        nonzero = density if zero_share is None else 1 - density
        sign = np.where(u < nonzero / 2, 1.0, -1.0) if signs else 1.0
        return np.where(u < nonzero, sign * scale(k, n, density), 0.0)
    return projection


MISTAKES_3_1 = (
    Mistake("scale-of-eq-3-3", _sparse_with(scale=lambda k, n, density: math.sqrt(3 / k)),
            "√(3/k) is Eq. (3.3)'s scale for density 1/3 only. An entry is ±c with probability `density`, so its "
            "variance is density·c²; setting that to 1/k gives c = 1/√(density·k)."),
    Mistake("scale-ignores-density", _sparse_with(scale=lambda k, n, density: 1 / math.sqrt(k)),
            "with only a share `density` of non-zero entries, each must be larger: the variance density·c² must "
            "equal 1/k, so c = 1/√(density·k), not 1/√k."),
    Mistake("scale-by-input-dim", _sparse_with(scale=lambda k, n, density: 1 / math.sqrt(density * n)),
            "scale by the target dimension k, not the input dimension n: each of the k output coordinates carries "
            "‖x‖²/k on average, so c = 1/√(density·k)."),
    Mistake("density-of-zeros", _sparse_with(zero_share=True),
            "`density` is the share of NON-zero entries: an entry is +c or −c with probability density/2 each, and 0 "
            "with probability 1 − density."),
    Mistake("no-negative-entries", _sparse_with(signs=False),
            "the non-zero entries are +c and −c with equal probability; with one sign only, E‖Rx‖² ≠ ‖x‖² "
            "(the entries' mean is not 0)."),
    Mistake("transposed", _sparse_with(shape="nk"),
            "R maps R^n to R^k: it has shape (k, n), one row per output coordinate."),
    Mistake("global-generator", _sparse_with(source="global"),
            "draw every random number from `rng`, the generator passed in (rng.random, rng.choice, …), not from "
            "np.random's global state: the same rng state must give the same R."),
    Mistake("ignores-rng", _sparse_with(source="fixed"),
            "your R does not depend on `rng`: a generator created inside the function gives the same matrix for "
            "every caller. Draw from the rng argument."),
)
_BY_NAME_3_1 = {mistake.name: mistake for mistake in MISTAKES_3_1}


def _cases_3_1():
    return [
        ("k = 4, n = 10, density 0.25", (4, 10, np.random.default_rng(31), 0.25), {}),
        ("k = 50, n = 400, density 0.1", (50, 400, np.random.default_rng(32), 0.1), {}),
        ("k = 120, n = 300, density 0.25", (120, 300, np.random.default_rng(33), 0.25), {}),
        ("k = 64, n = 32, density 1 (k > n is allowed; dense ±1/√k)", (64, 32, np.random.default_rng(34), 1.0), {}),
    ]


STATISTICS_MIN_ENTRIES = 10_000  # below this many entries the shares scatter too much to test


def _share_tolerance(p, size):
    # 5 binomial standard deviations (a false alarm has probability below 1e-6) plus a floor for p near 0 or 1
    return 5 * math.sqrt(p * (1 - p) / size) + 0.002


def _sparse_problem(R, k, n, density):
    """The first property R fails, as ``(mistake name or None, message)``; None when R has them all."""
    if R.shape != (k, n):
        if R.shape == (n, k):
            return "transposed", f"  R has shape {R.shape}, expected (k, n) = {(k, n)}."
        return None, f"  R has shape {R.shape}, expected (k, n) = {(k, n)}."
    bad = ~np.isfinite(R)
    if bad.any():
        n_nan = int(np.isnan(R).sum())
        what = " and ".join(f"{count} {kind}" for count, kind in ((n_nan, "NaN"), (int(bad.sum()) - n_nan, "inf"))
                            if count)
        first = tuple(int(i) for i in np.unravel_index(np.flatnonzero(bad)[0], R.shape))
        return "non-finite", (f"  R: {what} value(s) where the library's are finite (the first at index {first})"
                              f"\n  hint: every entry is 0 or ±1/√(density·k), finite for any density in (0, 1]: "
                              f"check what you divide by.")
    c = 1 / math.sqrt(density * k)
    magnitudes = np.abs(R[R != 0])
    if magnitudes.size == 0:
        return ("density-of-zeros" if density == 1 else None), "  every entry of R is 0."
    if not np.allclose(magnitudes, magnitudes[0], rtol=1e-9, atol=0):
        return None, (f"  R takes {np.unique(magnitudes.round(12)).size} different non-zero magnitudes (from "
                      f"{magnitudes.min():.4g} to {magnitudes.max():.4g}); a sparse projection has three values, "
                      f"0 and ±c with c = 1/√(density·k) = {c:.6g}.")
    got = magnitudes[0]
    if not math.isclose(got, c, rel_tol=1e-9):
        slips = {"scale-of-eq-3-3": math.sqrt(3 / k), "scale-ignores-density": 1 / math.sqrt(k),
                 "scale-by-input-dim": 1 / math.sqrt(density * n)}
        slip = next((name for name, value in slips.items() if math.isclose(got, value, rel_tol=1e-9)), None)
        return slip, f"  the non-zero entries of R are ±{got:.6g}, expected ±1/√(density·k) = ±{c:.6g}."
    if R.size < STATISTICS_MIN_ENTRIES:
        return None
    share = np.count_nonzero(R) / R.size
    if abs(share - density) > _share_tolerance(density, R.size):
        slip = "density-of-zeros" if abs(share - (1 - density)) <= _share_tolerance(density, R.size) else None
        return slip, f"  {share:.3f} of the entries of R are non-zero, expected density = {density}."
    positive = np.count_nonzero(R > 0) / np.count_nonzero(R)
    if abs(positive - 0.5) > _share_tolerance(0.5, np.count_nonzero(R)):
        slip = "no-negative-entries" if positive == 1 else None
        return slip, f"  {positive:.3f} of the non-zero entries are positive, expected half of them."
    return None


class _SparseProjectionExercise(Exercise):
    """Exercise 3.1's check: properties of R on every case, then that R comes from ``rng`` alone."""

    def __call__(self, candidate, *, verbose=True):
        result = self._check(candidate)
        if verbose:
            print(result)
        return result

    def _call(self, candidate, description, args):
        try:
            return to_numpy(candidate(*copy.deepcopy(args))), None
        except NotImplementedError:
            return None, CheckResult(self.number, NOT_ATTEMPTED, "  the function still raises NotImplementedError: "
                                     "replace the stub with your code, then run this cell again.")
        except Exception as exc:  # a learner's bug: report it, keep the notebook running
            return None, CheckResult(self.number, FAILED, f"  case '{description}' raised {type(exc).__name__}: {exc}")

    def _failed(self, description, problem):
        name, message = problem
        mistake = _BY_NAME_3_1.get(name)
        text = f"  case '{description}':\n{message}" + (f"\n  hint: {mistake.hint}" if mistake else "")
        return CheckResult(self.number, FAILED, text, name)

    def _check(self, candidate):
        for description, args, _ in self.cases():
            R, stop = self._call(candidate, description, args)
            if stop is not None:
                return stop
            problem = _sparse_problem(R, *args[:2], args[3])
            if problem is not None:
                return self._failed(description, problem)
        k, n, density = 30, 40, 0.25
        same = [self._call(candidate, "the same rng state twice", (k, n, np.random.default_rng(35), density))
                for _ in range(2)]
        other = self._call(candidate, "another rng state", (k, n, np.random.default_rng(36), density))
        if not np.array_equal(same[0][0], same[1][0]):
            return self._failed("two generators in the same state", (
                "global-generator", "  two calls with generators in the same state returned different matrices."))
        if np.array_equal(same[0][0], other[0]):
            return self._failed("two generators in different states", (
                "ignores-rng", "  generators in different states returned the same matrix."))
        return CheckResult(self.number, PASSED, f"  {len(self.cases())} seeded cases have the shape, the values "
                           f"0 and ±1/√(density·k), the share of non-zeros and of signs; the same rng state gives "
                           f"the same R.")


exercise_3_1 = _SparseProjectionExercise("3.1", "a sparse JL projection of any density", _sparse_reference,
                                         _cases_3_1, MISTAKES_3_1, names=("R",))


# --- Exercise 3.2: predict Theorem 1's error before measuring it ---------------------------
# The root-mean-square of Eq. (3.6) over draws of a Gaussian R: each entry of the gap is a sum of
# k independent products of two correlated Gaussians, Var = (‖w_i‖² ‖v‖² + (w_i·v)²) / k, so
# E‖P Rᵀ R v − P v‖² = (‖P‖²_F ‖v‖² + ‖P v‖²) / k and the answer is √((A² + 1) / k).

def _fro(P, ord=None):
    return np.linalg.norm(P, ord=ord, axis=(-2, -1))


def _predicted_reference(P, v, k):
    exact = np.linalg.norm(np.einsum("...ns,...s->...n", P, v), axis=-1)  # (...): ‖P v‖
    mean_square = (_fro(P) ** 2 * np.linalg.norm(v, axis=-1) ** 2 + exact**2) / k
    return np.sqrt(mean_square) / exact


def _predicted_with(*, cross=1.0, factor=1.0, over_k=lambda k: np.sqrt(k), relative=True, p_norm=None,
                    whole_stack=False, root="sqrt"):
    """Exercise 3.2's function, made with one slip in the variance, its 1/k, the norm or the scale."""
    def predicted_error(P, v, k):
        exact = np.linalg.norm(np.einsum("...ns,...s->...n", P, v), axis=-1)
        p_fro = np.linalg.norm(P) if whole_stack else _fro(P, p_norm)
        mean_square = (factor * p_fro**2 * np.linalg.norm(v, axis=-1) ** 2 + cross * exact**2) / over_k(k) ** 2
        if root == "none":  # the square root left out: E‖gap‖² / ‖P v‖
            return mean_square / exact
        if root == "relative-mean-square":  # the mean square over ‖P v‖²: (A² + 1) / k
            return mean_square / exact**2
        rms = np.sqrt(mean_square)
        return rms / exact if relative else rms
    return predicted_error


MISTAKES_3_2 = (
    Mistake("no-square-root", _predicted_with(root="none"),
            "the square root is missing: (‖P‖²_F ‖v‖² + ‖P v‖²) / k is the mean of the squared gap ‖P Rᵀ R v − P v‖²; "
            "take its root, then divide by ‖P v‖."),
    Mistake("mean-square-relative", _predicted_with(root="relative-mean-square"),
            "(A² + 1)/k is the mean square of the relative error: Eq. (3.6)'s root-mean-square error is its square "
            "root, √((A² + 1) / k)."),
    Mistake("no-covariance-term", _predicted_with(cross=0.0),
            "the two factors (R w_i)_r and (R v)_r are correlated: Var(ab) = Var a · Var b + Cov(a, b)², and the "
            "covariance term adds (w_i·v)² per row, ‖P v‖² in all, under the root."),
    Mistake("chi-square-variance", _predicted_with(factor=2.0, cross=0.0),
            "2/k is the variance of ‖R x‖²/‖x‖², the case w = v; for two different vectors Var⟨R w, R v⟩ = "
            "(‖w‖² ‖v‖² + (w·v)²)/k, which equals 2‖w‖⁴/k only when w = v."),
    Mistake("std-over-k", _predicted_with(over_k=lambda k: k),
            "the k rows of R contribute independent terms: their variances add, so the variance is ∝ 1/k and the "
            "root-mean-square error ∝ 1/√k, not 1/k."),
    Mistake("absolute", _predicted_with(relative=False),
            "Eq. (3.6) is relative: divide the root-mean-square error by ‖P v‖."),
    Mistake("spectral-norm", _predicted_with(p_norm=2),
            "the rows add up: Σᵢ ‖w_i‖² is ‖P‖²_F, the Frobenius norm (np.linalg.norm(P, axis=(-2, -1))), "
            "not the spectral norm ord=2."),
    Mistake("norm-of-the-stack", _predicted_with(whole_stack=True),
            "np.linalg.norm(P) without an axis takes one norm of the whole stack of matrices: use "
            "np.linalg.norm(P, axis=(-2, -1)) for each matrix's ‖P‖_F (and axis=-1 for vectors)."),
)


def _softmax_rows(scores):
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))  # max subtracted: no overflow
    return weights / weights.sum(axis=-1, keepdims=True)


def _cases_3_2():
    rng = np.random.default_rng(36)
    return [
        ("n = s = 16, mean-zero v, k = 8",
         (_softmax_rows(2 * rng.standard_normal((16, 16))), rng.standard_normal(16), 8), {}),
        ("n = 24 queries, s = 40 keys, k = 12",
         (_softmax_rows(rng.standard_normal((24, 40))), rng.standard_normal(40), 12), {}),
        ("batched P (2, 3, 10, 10), v (2, 3, 10), k = 5",
         (_softmax_rows(3 * rng.standard_normal((2, 3, 10, 10))), rng.standard_normal((2, 3, 10)), 5), {}),
        ("n = s = 32, v with an offset, k = 64 > s",
         (_softmax_rows(rng.standard_normal((32, 32))), 1 + rng.standard_normal(32), 64), {}),
    ]


exercise_3_2 = Exercise("3.2", "predict Theorem 1's error before measuring it", _predicted_reference, _cases_3_2,
                        MISTAKES_3_2, names=("predicted error",))


# --- Exercise 3.3: how many rows Theorem 1's construction needs for a target error --------
# Exercise 3.2's root-mean-square error √((A² + 1) / k), A = ‖P‖_F ‖v‖ / ‖P v‖ (Eq. 3.9), solved for k:
# the smallest k at which the predicted error is at most `target`.  Set beside Theorem 1's
# k = 5 ln n / (ε² − ε³) it shows the factor (A² + 1) / (5 ln n) by which the construction falls short.

def _amplification_squared(P, v, p_norm=None):
    exact = np.linalg.norm(np.einsum("...ns,...s->...n", P, v), axis=-1)  # (...): ‖P v‖
    return (_fro(P, p_norm) * np.linalg.norm(v, axis=-1) / exact) ** 2  # (...): A²


def _rows_reference(P, v, target):
    # whole numbers as floats (what np.ceil returns); an integer answer compares equal
    return np.ceil((_amplification_squared(P, v) + 1) / target**2)


def _rows_with(*, numerator=lambda a2: a2 + 1, target_power=2, rounding=np.ceil, p_norm=None):
    """Exercise 3.3's function, made with one slip in the variance, the power of the target or the rounding."""
    def rows_needed(P, v, target):
        return rounding(numerator(_amplification_squared(P, v, p_norm)) / target**target_power).astype(int)
    return rows_needed


MISTAKES_3_3 = (
    Mistake("no-covariance-term", _rows_with(numerator=lambda a2: a2),
            "the mean square of the relative error is (A² + 1)/k, not A²/k: the covariance term of exercise 3.2 "
            "adds ‖P v‖² under the root, 1 after dividing by ‖P v‖²."),
    Mistake("target-not-squared", _rows_with(target_power=1),
            "the error falls like 1/√k, so k grows like 1/target²: k = ⌈(A² + 1) / target²⌉."),
    Mistake("rounded-down", _rows_with(rounding=np.floor),
            "round up (np.ceil): k rows give an error at most the target only from (A² + 1)/target² on; int() and "
            "np.floor cut below it (and np.round does half of the time)."),
    Mistake("jl-scale", _rows_with(numerator=lambda a2: 1 + 1 / a2),
            "the target is relative to ‖P v‖ (Eq. 3.6), not to the JL scale ‖P‖_F ‖v‖: the mean square is "
            "(A² + 1)/k with A = ‖P‖_F ‖v‖ / ‖P v‖, which is at least 1."),
    Mistake("amplification-not-squared", _rows_with(numerator=lambda a2: np.sqrt(a2) + 1),
            "the variance holds A², not A: k = ⌈(A² + 1) / target²⌉ with A = ‖P‖_F ‖v‖ / ‖P v‖."),
    Mistake("spectral-norm", _rows_with(p_norm=2),
            "A uses the Frobenius norm ‖P‖_F (np.linalg.norm(P, axis=(-2, -1))), the sum of the rows' ‖w_i‖², "
            "not the spectral norm ord=2."),
)


def _cases_3_3():
    rng = np.random.default_rng(37)
    return [
        ("n = s = 16, mean-zero v, target 0.5",
         (_softmax_rows(2 * rng.standard_normal((16, 16))), rng.standard_normal(16), 0.5), {}),
        ("n = 24 queries, s = 40 keys, target 0.3",
         (_softmax_rows(rng.standard_normal((24, 40))), rng.standard_normal(40), 0.3), {}),
        ("batched P (2, 3, 12, 12), v (2, 3, 12), target 0.25",
         (_softmax_rows(3 * rng.standard_normal((2, 3, 12, 12))), rng.standard_normal((2, 3, 12)), 0.25), {}),
        ("n = s = 32, v with an offset, target 0.1",
         (_softmax_rows(rng.standard_normal((32, 32))), 1 + rng.standard_normal(32), 0.1), {}),
    ]


exercise_3_3 = Exercise("3.3", "how many rows Theorem 1's construction needs for a target error", _rows_reference,
                        _cases_3_3, MISTAKES_3_3, names=("rows",))

EXERCISES = [exercise_3_1, exercise_3_2, exercise_3_3]
