"""Checks for the lesson 02 exercises (self-attention is low rank)."""

import numpy as np

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import lowrank


def _attention_matrix(seed, lead, n, s, sharpness=3.0):
    """A seeded row-stochastic P = softmax(sharpness · Z), Z ~ N(0, 1): ``(*lead, n, s)``."""
    scores = sharpness * np.random.default_rng(seed).standard_normal((*lead, n, s))
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


# --- Exercise 2.1: the normalised cumulative spectrum --------------------------------------

def _cumulative_with(*, power=1, normalise="total", order="descending", cumulative=True):
    """Exercise 2.1's function, made with one slip."""
    def cumulative_spectrum(P):
        sigma = np.linalg.svd(P, compute_uv=False) ** power  # (..., r), descending
        if order == "ascending":
            sigma = sigma[..., ::-1]
        summed = np.cumsum(sigma, axis=-1) if cumulative else sigma
        if normalise == "total":
            return summed / sigma.sum(axis=-1, keepdims=True)
        if normalise == "largest":
            return summed / sigma.max(axis=-1, keepdims=True)
        return summed
    return cumulative_spectrum


MISTAKES_2_1 = (
    Mistake("not-normalised", _cumulative_with(normalise=None),
            "the curve must end at 1: divide the cumulative sum by the total σ₁ + … + σᵣ (Eq. 2.2)."),
    Mistake("normalised-by-largest", _cumulative_with(normalise="largest"),
            "divide by the sum of all singular values, not by the largest one σ₁ (Eq. 2.2)."),
    Mistake("squared", _cumulative_with(power=2),
            "Eq. (2.2) sums the singular values σᵢ themselves, as the Linformer figure does, not σᵢ²."),
    Mistake("ascending", _cumulative_with(order="ascending"),
            "add the singular values largest first: c_k is the share of the k largest (sort descending)."),
    Mistake("not-cumulative", _cumulative_with(cumulative=False),
            "each entry is the share of the first k singular values together: take a cumulative sum (np.cumsum)."),
)


def _cases_2_1():
    return [
        ("P (6, 6)", (_attention_matrix(21, (), 6, 6),), {}),
        ("P (8, 5), more queries than keys", (_attention_matrix(22, (), 8, 5),), {}),
        ("batched P (2, 3, 7, 7)", (_attention_matrix(23, (2, 3), 7, 7),), {}),
    ]


exercise_2_1 = Exercise("2.1", "the normalised cumulative spectrum of P", lowrank.cumulative_spectrum,
                        _cases_2_1, MISTAKES_2_1, names=("cumulative",))


# --- Exercise 2.2: the rank that holds a share of the spectrum ------------------------------

def _rank_with(*, power=1, shift=1, strict=False, normalise=True):
    """Exercise 2.2's function, made with one slip."""
    def rank_for_energy(P, energy):
        sigma = np.linalg.svd(P, compute_uv=False) ** power  # (..., r)
        cumulative = np.cumsum(sigma, axis=-1)
        if normalise:
            cumulative = cumulative / sigma.sum(axis=-1, keepdims=True)
        short = (cumulative <= energy) if strict else (cumulative < energy)
        return np.minimum(short.sum(axis=-1) + shift, sigma.shape[-1])
    return rank_for_energy


MISTAKES_2_2 = (
    Mistake("off-by-one", _rank_with(shift=0),
            "c_k is stored at index k - 1: the rank is the number of c_k below the share plus one."),
    Mistake("squared", _rank_with(power=2),
            "use the same normalisation as Eq. (2.2), the plain singular values σᵢ, not σᵢ²."),
    Mistake("not-normalised", _rank_with(normalise=False),
            "compare the normalised cumulative spectrum (ending at 1) with the share, not the raw sums."),
    Mistake("strict", _rank_with(strict=True),
            "the rank is the smallest k with c_k ≥ share: a c_k equal to the share is already enough."),
)


def _cases_2_2():
    return [
        ("batched P (4, 12, 12), share 0.9", (_attention_matrix(31, (4,), 12, 12), 0.9), {}),
        ("batched P (2, 3, 10, 8), share 0.5", (_attention_matrix(32, (2, 3), 10, 8), 0.5), {}),
        ("diag(4, 3, 2, 1): c = 0.4, 0.7, 0.9, 1; share 0.9", (np.diag([4.0, 3.0, 2.0, 1.0]), 0.9), {}),
    ]


exercise_2_2 = Exercise("2.2", "the rank that holds a share of the spectrum", lowrank.rank_for_energy,
                        _cases_2_2, MISTAKES_2_2, names=("rank",))


# --- Exercise 2.3: the best rank-k approximation and its error -----------------------------

def _best_reference(P, k):
    return lowrank.best_rank_k(P, k), lowrank.truncation_error(P, k)


def _best_with(*, keep=lambda k, r: slice(0, k), use_sigma=True, error_from=lambda k: k, sqrt=True):
    """Exercise 2.3's function, made with one slip."""
    def best_rank_k(P, k):
        u, sigma, vh = np.linalg.svd(P, full_matrices=False)
        kept = keep(k, sigma.shape[-1])
        scale = sigma[..., None, kept] if use_sigma else 1.0
        approx = (u[..., :, kept] * scale) @ vh[..., kept, :]
        tail = (sigma[..., error_from(k):] ** 2).sum(axis=-1)
        return approx, np.sqrt(tail) if sqrt else tail
    return best_rank_k


MISTAKES_2_3 = (
    Mistake("smallest", _best_with(keep=lambda k, r: slice(r - k, r)),
            "keep the k largest singular values (the first k, as SVD returns them descending), not the last k."),
    Mistake("off-by-one", _best_with(keep=lambda k, r: slice(0, k - 1), error_from=lambda k: k - 1),
            "a rank-k copy keeps k terms σᵢ uᵢ vᵢᵀ, i = 1 … k (Python's slice :k)."),
    Mistake("no-sigma", _best_with(use_sigma=False),
            "each kept term is σᵢ uᵢ vᵢᵀ: scale the columns of U_k by the singular values (Eq. 2.5)."),
    Mistake("error-squared", _best_with(sqrt=False),
            "the Frobenius error is the square root of the tail sum σ²_{k+1} + … + σ²ᵣ (Eq. 2.6)."),
    Mistake("error-includes-k", _best_with(error_from=lambda k: k - 1),
            "the error sums the singular values that were dropped, σ_{k+1} onwards, not σ_k."),
)


def _cases_2_3():
    return [
        ("P (6, 6), k = 2", (_attention_matrix(41, (), 6, 6), 2), {}),
        ("P (7, 5), k = 3", (_attention_matrix(42, (), 7, 5), 3), {}),
        ("batched P (2, 2, 6, 6), k = 1", (_attention_matrix(43, (2, 2), 6, 6), 1), {}),
    ]


exercise_2_3 = Exercise("2.3", "the best rank-k approximation and its error", _best_reference, _cases_2_3,
                        MISTAKES_2_3, names=("P_k", "error"))

EXERCISES = [exercise_2_1, exercise_2_2, exercise_2_3]
