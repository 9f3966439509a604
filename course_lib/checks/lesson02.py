"""Checks for the lesson 02 exercises (self-attention is low rank)."""

import numpy as np

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import lowrank


def _attention_matrix(seed, lead, n, s, sharpness=3.0):
    """A seeded row-stochastic P = softmax(sharpness · Z), Z ~ N(0, 1): ``(*lead, n, s)``."""
    scores = sharpness * np.random.default_rng(seed).standard_normal((*lead, n, s))
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


# --- Exercise 2.1: find the bug — a spectrum from eigenvalues ------------------------------
# The exercise shows a cumulative spectrum built from |eigenvalues| of P, right for symmetric
# matrices only, and asks for one that is right for every P.  Singular values by SVD or by the
# square roots of the smaller Gram matrix's eigenvalues (Eq. 2.3) are both right.

def _cumulative_with(*, values="svd", normalise="total", order="descending", cumulative=True):
    """Exercise 2.1's function, made with one slip in the values summed, their order or the sums."""
    def cumulative_spectrum(P):
        if values == "svd":
            sigma = np.linalg.svd(P, compute_uv=False)  # (..., r), descending
        elif values == "eigenvalues":  # the bug of the exercise: |λᵢ(P)|, largest first
            sigma = -np.sort(-np.abs(np.linalg.eigvals(P)), axis=-1)
        elif values == "eigvalsh-of-P":  # treats P as symmetric: LAPACK reads one triangle only
            sigma = -np.sort(-np.abs(np.linalg.eigvalsh(P)), axis=-1)
        else:  # the Gram route with one slip
            gram = P @ np.swapaxes(P, -1, -2)  # (..., n, n): the larger one when n > s
            if values == "gram" and P.shape[-2] > P.shape[-1]:
                gram = np.swapaxes(P, -1, -2) @ P  # (..., s, s): the smaller Gram matrix
            eigenvalues = np.linalg.eigvalsh(gram)  # (..., r), ascending
            sigma = {"gram-squared": eigenvalues[..., ::-1], "gram-ascending": np.sqrt(np.clip(eigenvalues, 0, None)),
                     "gram-larger-side": np.sqrt(np.clip(eigenvalues, 0, None))[..., ::-1],
                     "gram": np.sqrt(np.clip(eigenvalues, 0, None))[..., ::-1]}[values]
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
    Mistake("eigenvalues", _cumulative_with(values="eigenvalues"),
            "this is the bug: the eigenvalues of a non-symmetric P are not its singular values (the previous-token "
            "head has |λ| = 1, 0, …, 0 but σ = √2, 1, 1, 1, 1, 0). Use np.linalg.svd(P, compute_uv=False), or the "
            "square roots of the eigenvalues of P Pᵀ (Eq. 2.3)."),
    Mistake("eigvalsh-of-P", _cumulative_with(values="eigvalsh-of-P"),
            "np.linalg.eigvalsh assumes a symmetric matrix and reads one triangle of P only; an attention matrix is "
            "not symmetric. Its singular values are the square roots of the eigenvalues of P Pᵀ (Eq. 2.3), or "
            "np.linalg.svd(P, compute_uv=False)."),
    Mistake("gram-squared", _cumulative_with(values="gram-squared"),
            "you summed the squares σᵢ² — the eigenvalues of P Pᵀ, or np.linalg.svd's σ squared (the energy share "
            "of Eq. 2.6, a different curve) — and Eq. (2.2) sums the σᵢ themselves: take the square roots of the "
            "eigenvalues (Eq. 2.3), or use np.linalg.svd(P, compute_uv=False) as it comes, unsquared."),
    Mistake("gram-ascending", _cumulative_with(values="gram-ascending"),
            "the values are summed smallest first: c_k is the share of the k LARGEST. np.linalg.svd returns σ "
            "largest first — do not sort it ascending (np.sort) or reverse it — while np.linalg.eigvalsh returns "
            "eigenvalues in ascending order: reverse those (largest first) before the cumulative sum."),
    Mistake("gram-larger-side", _cumulative_with(values="gram-larger-side"),
            "for a tall P (n > s), P Pᵀ is n × n and has n − s zero eigenvalues too many: use Pᵀ P (s × s), the "
            "smaller Gram matrix, so that you return r = min(n, s) values."),
    Mistake("not-normalised", _cumulative_with(normalise=None),
            "the curve must end at 1: divide the cumulative sum by the total σ₁ + … + σᵣ (Eq. 2.2), keeping the "
            "last axis for broadcasting (sigma.sum(axis=-1, keepdims=True)), whichever way you got the σᵢ."),
    Mistake("not-cumulative", _cumulative_with(cumulative=False),
            "each entry is the share of the first k singular values together: take a cumulative sum (np.cumsum) "
            "along the last axis before dividing, whether the σᵢ came from np.linalg.svd or from P Pᵀ."),
    Mistake("normalised-by-largest", _cumulative_with(normalise="largest"),
            "the curve is divided by σ₁, the largest singular value (sigma[..., 0], or np.linalg.norm(P, 2)): "
            "divide by the total σ₁ + … + σᵣ instead, so that c_r = 1 (Eq. 2.2)."),
)


def _previous_token_head(seed, n):
    """A head that attends mostly to the token before (the first token to itself): softmax(6·shift + Z)."""
    shift = np.eye(n, k=-1)
    shift[0, 0] = 1.0
    scores = 6 * shift + np.random.default_rng(seed).standard_normal((n, n))
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def _cases_2_1():
    return [
        ("a previous-token head, n = s = 6", (_previous_token_head(20, 6),), {}),
        ("P (6, 6)", (_attention_matrix(21, (), 6, 6),), {}),
        ("P (8, 5), more queries than keys", (_attention_matrix(22, (), 8, 5),), {}),
        ("batched P (2, 3, 7, 7)", (_attention_matrix(23, (2, 3), 7, 7),), {}),
    ]


exercise_2_1 = Exercise("2.1", "find the bug: a cumulative spectrum that is right for every P",
                        lowrank.cumulative_spectrum, _cases_2_1, MISTAKES_2_1, names=("cumulative",))


# --- Exercise 2.2: the rank for a given error, read off the spectrum ------------------------
# The smallest k whose best rank-k copy is within a relative Frobenius error `tol` of P, without
# building any P_k: by Eckart–Young (Eq. 2.6) the error is the root of the tail of σᵢ², so the k
# is not the rank of Eq. (2.4), which adds the plain σᵢ.  Looping over k with P_k built is right too.

def _relative_tail(sigma, power=2):
    """(..., r): for k = 1 … r, (Σ_{i>k} σᵢ^power / Σᵢ σᵢ^power), the part of the spectrum P_k leaves out."""
    weights = sigma**power
    after = np.cumsum(weights[..., ::-1], axis=-1)[..., ::-1]  # (..., r): Σ_{i>=k}
    after = np.concatenate([after[..., 1:], np.zeros_like(after[..., :1])], axis=-1)  # (..., r): Σ_{i>k}
    return after / weights.sum(axis=-1, keepdims=True)


def _rank_for_error_reference(P, tol):
    sigma = np.linalg.svd(P, compute_uv=False)  # (..., r), largest first
    error = np.sqrt(_relative_tail(sigma))  # (..., r): ‖P − P_k‖_F / ‖P‖_F, Eq. (2.6)
    return (error > tol).sum(axis=-1) + 1  # the error falls with k: count the k that miss, plus one


def _rank_for_error_with(*, measure="frobenius", shift=1):
    """Exercise 2.2's function, made with one slip in the error it reads off the spectrum, or in the count."""
    def rank_for_error(P, tol):
        sigma = np.linalg.svd(P, compute_uv=False)  # (..., r)
        error = {"frobenius": np.sqrt(_relative_tail(sigma)),
                 "sum-of-sigmas": _relative_tail(sigma, power=1),  # 1 − c_k of Eq. (2.2)
                 "squared": _relative_tail(sigma),  # the squared relative error, compared with tol
                 "spectral": np.concatenate([sigma[..., 1:], np.zeros_like(sigma[..., :1])], axis=-1)
                 / sigma[..., :1],  # σ_{k+1} / σ₁
                 "absolute": np.sqrt(_relative_tail(sigma) * (sigma**2).sum(axis=-1, keepdims=True)),
                 "tail-from-k": np.sqrt(np.cumsum((sigma**2)[..., ::-1], axis=-1)[..., ::-1]
                                        / (sigma**2).sum(axis=-1, keepdims=True))}[measure]
        return (error > tol).sum(axis=-1) + shift
    return rank_for_error


MISTAKES_2_2 = (
    Mistake("sum-of-sigmas", _rank_for_error_with(measure="sum-of-sigmas"),
            "1 − c_k of Eq. (2.2) adds the plain σᵢ; the Frobenius error squares them (Eq. 2.6): "
            "‖P − P_k‖_F / ‖P‖_F = √(Σ_{i>k} σᵢ² / Σᵢ σᵢ²). The two measures of the tail differ."),
    Mistake("squared-error", _rank_for_error_with(measure="squared"),
            "Σ_{i>k} σᵢ² / Σᵢ σᵢ² is the squared relative error: take its square root before comparing with tol "
            "(or compare it with tol²)."),
    Mistake("spectral-norm", _rank_for_error_with(measure="spectral"),
            "σ_{k+1}/σ₁ is the relative error in the spectral norm; the Frobenius error adds the whole tail: "
            "√(Σ_{i>k} σᵢ²) / √(Σᵢ σᵢ²) (Eq. 2.6)."),
    Mistake("not-relative", _rank_for_error_with(measure="absolute"),
            "the error is relative: divide ‖P − P_k‖_F = √(Σ_{i>k} σᵢ²) by ‖P‖_F = √(Σᵢ σᵢ²)."),
    Mistake("tail-from-k", _rank_for_error_with(measure="tail-from-k"),
            "P_k keeps σ₁ … σ_k: its error is the tail after k, Σ_{i>k} σᵢ², without σ_k itself."),
    Mistake("index-not-rank", _rank_for_error_with(shift=0),
            "you returned an index counted from 0: the rank k is the number of k that miss the target, plus one."),
)


def _cases_2_2():
    return [
        ("P (20, 20), sharpness 4, tol 0.3", (_attention_matrix(24, (), 20, 20, sharpness=4.0), 0.3), {}),
        ("batched P (4, 16, 16), tol 0.2", (_attention_matrix(22, (4,), 16, 16), 0.2), {}),
        ("batched P (2, 3, 10, 8): more queries than keys, tol 0.5",
         (_attention_matrix(23, (2, 3), 10, 8, sharpness=2.0), 0.5), {}),
        ("diag(4, 3, 2, 1): errors 0.683, 0.408, 0.183, 0; tol 0.25", (np.diag([4.0, 3.0, 2.0, 1.0]), 0.25), {}),
    ]


exercise_2_2 = Exercise("2.2", "the rank for a given error, read off the spectrum", _rank_for_error_reference,
                        _cases_2_2, MISTAKES_2_2, names=("rank",))


# --- Exercise 2.3: the output needs at most e directions ----------------------------------
# Two relative errors of a rank-k output: P_k V (the best copy of P, applied to V) and the best
# rank-k copy of the output P V itself.  The second is 0 from k = e on, since rank(PV) <= e.

def _output_reference(P, V, k):
    output = P @ V  # (..., n, e)
    norm = np.linalg.norm(output, axis=(-2, -1))  # (...)
    via_p = lowrank.output_truncation_errors(P, V)[..., k - 1] / norm  # Eq. (2.8)
    rank = min(output.shape[-2:])
    best = lowrank.truncation_errors(output)[..., k - 1] / norm if k < rank else np.zeros_like(norm)
    return via_p, best


def _output_with(*, best_from="output", scale="output", keep=lambda k: k, first="output", order="fro",
                 whole_stack=False):
    """Exercise 2.3's function, made with one slip in what is truncated, the norm or the scale."""
    def norm(x):
        return np.linalg.norm(x) if whole_stack else np.linalg.norm(x, ord=order, axis=(-2, -1))

    def output_errors(P, V, k):
        output = P @ V  # (..., n, e)
        P_k = lowrank.best_rank_k(P, keep(k)) if keep(k) >= 1 else np.zeros_like(P)
        if best_from == "output":
            kept = min(keep(k), min(output.shape[-2:]))
            best_copy = lowrank.best_rank_k(output, kept) if kept >= 1 else np.zeros_like(output)
        else:  # the copy of P, applied to V, taken for the best output
            best_copy = P_k @ V
        via_p = norm(P - P_k) / norm(P) if first == "P" else norm(output - P_k @ V)
        best = norm(output - best_copy)
        if scale == "output":
            return (via_p if first == "P" else via_p / norm(output)), best / norm(output)
        return via_p, best
    return output_errors


MISTAKES_2_3 = (
    Mistake("best-output-from-P", _output_with(best_from="P"),
            "the best rank-k output is the truncated SVD of the output PV itself (Eckart–Young for the n × e matrix "
            "PV): P_k V has rank at most k too, but it is the best copy of P, not of PV."),
    Mistake("error-of-P", _output_with(first="P"),
            "the first number is the error of the output, ‖PV − P_k V‖_F / ‖PV‖_F, not Eq. (2.6)'s error of P: "
            "V weighs the directions of P unequally, so the two differ."),
    Mistake("absolute", _output_with(scale=None),
            "both errors are relative: divide by ‖PV‖_F."),
    Mistake("off-by-one", _output_with(keep=lambda k: k - 1),
            "a rank-k copy keeps k terms σᵢ uᵢ vᵢᵀ, i = 1 … k (Python's slice :k)."),
    Mistake("spectral-norm", _output_with(order=2),
            "use the Frobenius norm, np.linalg.norm(x, axis=(-2, -1)) (the default for one matrix), not ord=2, "
            "the largest singular value."),
    Mistake("norm-of-the-stack", _output_with(whole_stack=True),
            "np.linalg.norm(x) without an axis takes one norm of the whole stack of matrices: pass "
            "axis=(-2, -1) to get one error per matrix, shape (...)."),
)


def _values(seed, lead, s, e):
    return np.random.default_rng(seed).standard_normal((*lead, s, e))


def _cases_2_3():
    return [
        ("P (8, 8), V (8, 3), k = 2", (_attention_matrix(41, (), 8, 8), _values(51, (), 8, 3), 2), {}),
        ("P (8, 8), V (8, 3), k = 5 > e", (_attention_matrix(42, (), 8, 8), _values(52, (), 8, 3), 5), {}),
        ("P (6, 9), V (9, 4), k = 3", (_attention_matrix(43, (), 6, 9), _values(53, (), 9, 4), 3), {}),
        ("batched P (2, 3, 7, 7), V (2, 3, 7, 2), k = 1",
         (_attention_matrix(44, (2, 3), 7, 7), _values(54, (2, 3), 7, 2), 1), {}),
    ]


exercise_2_3 = Exercise("2.3", "the error of a rank-k output: P_k V against the best copy of PV", _output_reference,
                        _cases_2_3, MISTAKES_2_3, names=("error of P_k V", "error of the best rank-k output"))

EXERCISES = [exercise_2_1, exercise_2_2, exercise_2_3]
