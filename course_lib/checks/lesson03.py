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


# --- Exercise 3.3: the Johnson–Lindenstrauss dimension -------------------------------------

def _bound_with(*, log=math.log, denominator=lambda e: e**2 / 2 - e**3 / 3, rounding=math.ceil):
    """The exercise's function with one slip in the logarithm, the denominator or the rounding."""
    def jl_min_dim(n_points, eps):
        return rounding(4 * log(n_points) / denominator(eps))
    return jl_min_dim


MISTAKES_3_3 = (
    Mistake("log10", _bound_with(log=math.log10),
            "the bound uses the natural logarithm ln n (math.log or np.log), not log10."),
    Mistake("log2", _bound_with(log=math.log2),
            "the bound uses the natural logarithm ln n (math.log or np.log), not log2."),
    Mistake("truncated", _bound_with(rounding=math.floor),
            "k must be at least the bound: round *up* with math.ceil (int() and floor round down)."),
    Mistake("no-rounding", _bound_with(rounding=lambda x: x),
            "a dimension is a whole number: return math.ceil of the bound."),
    Mistake("no-cubic-term", _bound_with(denominator=lambda e: e**2 / 2),
            "the denominator is ε²/2 − ε³/3; dropping −ε³/3 gives a smaller, unproven k (Eq. 3.4)."),
    Mistake("eps-not-squared", _bound_with(denominator=lambda e: e / 2 - e**2 / 3),
            "the denominator is ε²/2 − ε³/3 (squared and cubed), not ε/2 − ε²/3."),
)


def _cases_3_3():
    return [
        ("n_points = 1000, eps = 0.1", (1000, 0.1), {}),
        ("n_points = 10**6, eps = 0.5", (10**6, 0.5), {}),
        ("n_points = 50, eps = 0.3", (50, 0.3), {}),
    ]


exercise_3_3 = Exercise("3.3", "the Johnson–Lindenstrauss dimension", jl.jl_min_dim, _cases_3_3, MISTAKES_3_3,
                        names=("k",), atol=0.0, rtol=0.0)

EXERCISES = [exercise_3_1, exercise_3_2, exercise_3_3]
