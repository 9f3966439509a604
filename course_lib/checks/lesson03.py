"""Checks for the lesson 03 exercises (random projections and the Johnson–Lindenstrauss lemma)."""

import math

import numpy as np

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import jl

# --- Exercise 3.1: a Gaussian JL projection matrix -----------------------------------------
# The matrix is random, so the check hands the learner's function a generator in a known state
# and compares with the library drawing from the same state: the exercise asks for one call,
# rng.standard_normal((k, n)), which makes the answer deterministic.


def _gaussian_reference(k, n, rng):
    return jl.gaussian_projection(k, n, rng)


def _gaussian_scaled(scale):
    """The exercise's function with the entries scaled by ``scale(k, n)`` instead of 1/√k."""
    def projection(k, n, rng):
        return rng.standard_normal((k, n)) * scale(k, n)
    return projection


def _gaussian_transposed(k, n, rng):
    return rng.standard_normal((n, k)) / np.sqrt(k)


MISTAKES_3_1 = (
    Mistake("variance-one", _gaussian_scaled(lambda k, n: 1.0),
            "the entries have variance 1, so ‖Rx‖² is about k‖x‖²: divide by √k to get variance 1/k (Eq. 3.2)."),
    Mistake("std-one-over-k", _gaussian_scaled(lambda k, n: 1.0 / k),
            "the entries have standard deviation 1/k, i.e. variance 1/k²: the *variance* is 1/k, "
            "so divide by √k, not by k."),
    Mistake("scaled-by-input-dim", _gaussian_scaled(lambda k, n: 1.0 / math.sqrt(n)),
            "the entries are scaled by 1/√n (the input dimension): each of the k output coordinates "
            "should carry ‖x‖²/k on average, so scale by 1/√k."),
    Mistake("wrong-axis", _gaussian_transposed,
            "R has shape (n, k): it must map R^n to R^k, so draw shape (k, n) — k rows, one per output coordinate."),
)


def _cases_3_1():
    return [
        ("k = 4, n = 10", (4, 10, np.random.default_rng(31)), {}),
        ("k = 16, n = 6 (k > n is allowed)", (16, 6, np.random.default_rng(32)), {}),
        ("k = 25, n = 300", (25, 300, np.random.default_rng(33)), {}),
    ]


exercise_3_1 = Exercise("3.1", "a Gaussian JL projection matrix", _gaussian_reference, _cases_3_1,
                        MISTAKES_3_1, names=("R",), atol=1e-12, rtol=1e-9)


# --- Exercise 3.2: the distortion of every pairwise distance -------------------------------

def _pairs(X):
    i, j = np.triu_indices(len(X), k=1)
    return X[i] - X[j]  # (pairs, n)


def _distortion_with(*, power=2, absolute=True, inverted=False, all_pairs=False):
    """The exercise's function with one slip in the ratio, the sign or the pairs."""
    def distortion(X, R):
        if all_pairs:
            diffs = (X[:, None, :] - X[None, :, :]).reshape(-1, X.shape[1])  # (points², n), i = j included
        else:
            diffs = _pairs(X)
        before = np.linalg.norm(diffs, axis=-1) ** power
        after = np.linalg.norm(diffs @ R.T, axis=-1) ** power
        with np.errstate(divide="ignore", invalid="ignore"):  # i = j pairs give 0/0, as the learner would get
            ratio = before / after if inverted else after / before
        return np.abs(ratio - 1) if absolute else ratio - 1
    return distortion


MISTAKES_3_2 = (
    Mistake("distances-not-squared", _distortion_with(power=1),
            "the lemma bounds *squared* distances: compare ‖R(x_i − x_j)‖² with ‖x_i − x_j‖² (Eq. 3.1)."),
    Mistake("no-absolute-value", _distortion_with(absolute=False),
            "a pair that shrinks is distorted as much as one that stretches: take |ratio − 1|."),
    Mistake("ratio-inverted", _distortion_with(inverted=True),
            "the ratio is upside down: projected over original, ‖R(x_i − x_j)‖² / ‖x_i − x_j‖²."),
    Mistake("every-ordered-pair", _distortion_with(all_pairs=True),
            "each pair counts once: only i < j, in the order of np.triu_indices(len(X), k=1) "
            "(i = j gives 0/0 and j > i repeats every pair)."),
)


def _cases_3_2():
    rng = np.random.default_rng(34)
    return [
        ("4 points in R^3, k = 2", (rng.standard_normal((4, 3)), rng.standard_normal((2, 3)) / np.sqrt(2)), {}),
        ("12 points in R^50, Gaussian R with k = 8",
         (rng.standard_normal((12, 50)), jl.gaussian_projection(8, 50, rng)), {}),
        ("30 points in R^200, sparse R with k = 40",
         (rng.standard_normal((30, 200)) * 3 + 1, jl.sparse_projection(40, 200, rng)), {}),
    ]


exercise_3_2 = Exercise("3.2", "the distortion of every pairwise distance", jl.pairwise_distortion, _cases_3_2,
                        MISTAKES_3_2, names=("distortion",))


# --- Exercise 3.3: Theorem 1's error and its amplification factor -------------------------
# The learner returns two numbers for a given P, v and R: the relative error of Eq. (3.6) and the
# factor ‖P‖_F ‖v‖ / ‖P v‖ of Eq. (3.9) that separates it from the JL scale of Eq. (3.8).

def _theorem1_reference(P, v, R):
    return jl.projected_attention_error(P, v, R), jl.amplification_factor(P, v)


def _theorem1_with(*, lift=lambda P, v, R: P @ (R.T @ (R @ v)), error_scale="pv", p_norm="fro",
                   inverted=False):
    """The exercise's function with one slip in the projection, the error's scale or the factor."""
    def theorem1_error(P, v, R):
        exact = P @ v  # (n,)
        gap = np.linalg.norm(lift(P, v, R) - exact)
        scale = {"pv": np.linalg.norm(exact), "jl": np.linalg.norm(P) * np.linalg.norm(v), "none": 1.0}[error_scale]
        factor = np.linalg.norm(P, p_norm) * np.linalg.norm(v) / np.linalg.norm(exact)
        return gap / scale, 1 / factor if inverted else factor
    return theorem1_error


MISTAKES_3_3 = (
    Mistake("output-axis", _theorem1_with(lift=lambda P, v, R: R.T @ (R @ (P @ v))),
            "R projects the key/value axis s, between P and v: P Rᵀ R v, not Rᵀ R P v (which squeezes "
            "the n output positions instead)."),
    Mistake("error-on-jl-scale", _theorem1_with(error_scale="jl"),
            "Theorem 1's error is relative to ‖P v‖ (Eq. 3.6); dividing by ‖P‖_F ‖v‖ gives the JL-scale "
            "error, which is smaller by exactly the amplification factor."),
    Mistake("absolute-error", _theorem1_with(error_scale="none"),
            "the error is relative: divide ‖P Rᵀ R v − P v‖ by ‖P v‖ (Eq. 3.6)."),
    Mistake("spectral-norm", _theorem1_with(p_norm=2),
            "the factor uses the Frobenius norm ‖P‖_F (all entries squared, np.linalg.norm(P)), the sum "
            "of the row norms ‖w_i‖² of Eq. (3.8) — not the spectral norm np.linalg.norm(P, 2)."),
    Mistake("factor-inverted", _theorem1_with(inverted=True),
            "the factor is upside down: ‖P‖_F ‖v‖ / ‖P v‖, which is at least 1 by Cauchy–Schwarz."),
)


def _softmax_rows(scores):
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))  # max subtracted: no overflow
    return weights / weights.sum(axis=-1, keepdims=True)


def _cases_3_3():
    rng = np.random.default_rng(35)
    return [
        ("n = s = 16, k = 8, centred v",
         (_softmax_rows(2 * rng.standard_normal((16, 16))), rng.standard_normal(16),
          jl.gaussian_projection(8, 16, rng)), {}),
        ("n = 24 queries, s = 40 keys, k = 12",
         (_softmax_rows(rng.standard_normal((24, 40))), rng.standard_normal(40), jl.gaussian_projection(12, 40, rng)),
         {}),
        ("n = s = 64, k = 32, v with an offset",
         (_softmax_rows(3 * rng.standard_normal((64, 64))), 1 + rng.standard_normal(64),
          jl.gaussian_projection(32, 64, rng)), {}),
    ]


exercise_3_3 = Exercise("3.3", "Theorem 1's error and its amplification factor", _theorem1_reference, _cases_3_3,
                        MISTAKES_3_3, names=("error", "amplification"))

EXERCISES = [exercise_3_1, exercise_3_2, exercise_3_3]
