"""Checks for the lesson 02 exercises (self-attention is low rank)."""

import numpy as np

from course_lib.checks import Exercise, Mistake, Requirement
from course_lib.checks._tracing import loop_grows
from course_lib.numpy import lowrank


def _attention_matrix(seed, lead, n, s, sharpness=3.0):
    """A seeded row-stochastic P = softmax(sharpness · Z), Z ~ N(0, 1): ``(*lead, n, s)``."""
    scores = sharpness * np.random.default_rng(seed).standard_normal((*lead, n, s))
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


# --- Exercise 2.1: the spectra of padded heads, all at once -----------------------------------
# Sentences of different lengths are padded to one n. Each head's attention matrix lives on its real
# tokens only: softmax over the real keys, and no row for a padded query. Zero rows and columns add only
# zero singular values, so one batched SVD of the masked n × n matrices gives every real block's spectrum,
# its cumulative curve reaching 1 at the block's length and staying there: no loop over the matrices.

PAD = 6.0  # the padding's scores: above most real ones (N(0, 2²)), so a padded key left in takes much weight


def _padded_scores(seed, lead, n, lengths):
    """Scores ``(*lead, n, n)`` with N(0, 2²) entries on the real block and ``PAD`` on every padded row or key."""
    scores = 2.0 * np.random.default_rng(seed).standard_normal((*lead, n, n))
    lengths = np.asarray(lengths).reshape(lead)
    real = np.arange(n) < lengths[..., None]  # (*lead, n)
    return np.where(real[..., :, None] & real[..., None, :], scores, PAD), lengths


def _masked_weights(scores, lengths, *, keys="masked", queries="zeroed", extra=0):
    """P over the real tokens, with one optional slip in the keys or queries it keeps (the defaults: none)."""
    n = scores.shape[-1]
    real = np.arange(n) < (np.asarray(lengths)[..., None] + extra)  # (..., n)
    if keys == "masked":
        kept = np.where(real[..., None, :], scores, -np.inf)
        weights = np.exp(kept - kept.max(axis=-1, keepdims=True))
        weights = weights / weights.sum(axis=-1, keepdims=True)
    else:  # softmax over every key, the padding's included
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = weights / weights.sum(axis=-1, keepdims=True)
        if keys == "zeroed-after":  # then the padded keys' columns zeroed: the rows no longer sum to 1
            weights = np.where(real[..., None, :], weights, 0.0)
    return np.where(real[..., :, None], weights, 0.0) if queries == "zeroed" else weights


def _padded_reference(scores, lengths):
    """P, then the cumulative spectrum of each real block by the library, one matrix at a time, padded with 1."""
    P = _masked_weights(scores, lengths)
    cumulative = np.ones(P.shape[:-1])  # (..., n)
    for index in np.ndindex(P.shape[:-2]):
        length = int(np.asarray(lengths)[index])
        cumulative[index][:length] = lowrank.cumulative_spectrum(P[index][:length, :length])
    return P, cumulative


def _padded_with(*, power=1, normalise=True, cumulative=True, tail=None, **mask):
    """Exercise 2.1's function in one batched SVD, with one slip (the defaults: none)."""
    def padded_spectrum(scores, lengths):
        P = _masked_weights(scores, lengths, **mask)
        sigma = np.linalg.svd(P, compute_uv=False) ** power  # (..., n): zeros after each real length
        summed = np.cumsum(sigma, axis=-1) if cumulative else sigma
        curve = summed / sigma.sum(axis=-1, keepdims=True) if normalise else summed
        if tail is not None:  # the curve cut at each length and padded with ``tail``
            curve = np.where(np.arange(P.shape[-1]) < np.asarray(lengths)[..., None], curve, tail)
        return P, curve
    return padded_spectrum


MISTAKES_2_1 = (
    Mistake("padded-keys-kept", _padded_with(keys="all"),
            "the softmax ran over every key, the padding's included: a query may only weigh real keys. Set the "
            "padded keys' scores to −inf (np.where) before the softmax, so each real row sums to 1 over real keys."),
    Mistake("padded-keys-zeroed-after-the-softmax", _padded_with(keys="zeroed-after"),
            "the padded keys were zeroed after the softmax, so the real rows no longer sum to 1 (the padding took "
            "its share first): mask the scores with −inf before the softmax, not the weights after it."),
    Mistake("padded-queries-kept", _padded_with(queries="kept"),
            "a padded query is no token: its row of P is 0, not a softmax over the real keys. Its row adds a "
            "singular value of its own and bends the curve."),
    Mistake("length-off-by-one", _padded_with(extra=1),
            "a length L means the tokens 0 … L − 1 are real: np.arange(n) < L, not <= L."),
    Mistake("energy-not-spectrum", _padded_with(power=2),
            "you summed σᵢ², the energy share; Eq. (2.2) sums the singular values σᵢ themselves."),
    Mistake("not-cumulative", _padded_with(cumulative=False),
            "each entry is the share of the first k singular values together: np.cumsum along the last axis "
            "before dividing by the total."),
    Mistake("not-normalised", _padded_with(normalise=False),
            "the curve must reach 1: divide the cumulative sum by each matrix's total σ₁ + … + σ_L "
            "(sigma.sum(axis=-1, keepdims=True))."),
    Mistake("tail-zeros", _padded_with(tail=0.0),
            "after its length L a head has no more singular values to add: its curve stays at 1 (the first k "
            "values hold everything for k ≥ L), it does not drop to 0."),
)


def _cases_2_1():
    return [
        ("one head, n = 6, length 4", (*_padded_scores(21, (), 6, 4),), {}),
        ("3 heads, n = 8, lengths 8, 5, 1", (*_padded_scores(22, (3,), 8, [8, 5, 1]),), {}),
        ("batched (2, 3), n = 7, lengths 2 … 7",
         (*_padded_scores(23, (2, 3), 7, [[7, 2, 5], [3, 6, 4]]),), {}),
    ]


def _no_loop_over_matrices(candidate):
    """None when 32 matrices cost the answer as much Python work as 2 do: no loop over the stack."""
    small = _padded_scores(24, (2,), 8, [8, 5])
    large = _padded_scores(24, (32,), 8, np.arange(32) % 8 + 1)
    grows = loop_grows(candidate, small, large)
    if grows is None:
        return None
    return (f"for 32 matrices your function ran {grows[1]} lines and calls of Python code (its own, its helpers' "
            f"in any cell), for 2 matrices {grows[0]}: it loops over them.")


REQUIREMENTS_2_1 = (
    Requirement("loops-over-matrices", _no_loop_over_matrices,
                "the values are right, but the Python work grows with the number of matrices: a loop over them "
                "(each real block on its own). Rows and columns of zeros add only zero singular values: with the "
                "padding zeroed, one np.linalg.svd of the whole (..., n, n) stack gives every block's spectrum.",
                _padded_reference),
)

exercise_2_1 = Exercise("2.1", "the spectra of padded heads, all at once", _padded_reference, _cases_2_1,
                        MISTAKES_2_1, names=("P", "cumulative"), requirements=REQUIREMENTS_2_1)


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


# --- Exercise 2.3: one projection for every head: the best, and what sharing costs ------------
# Linformer may share one projection of the keys between the heads of a layer. The best rank-k P_h Π with one
# projection Π for every head is Eckart–Young for the heads stacked into one (h·n, s) matrix: Π projects on
# the top k eigenvectors of Σ_h P_hᵀ P_h, and its error is the root of the tail of that matrix's eigenvalues,
# without forming any P_h Π. Each head with its own best rank-k copy is the lower bound it pays against.

def _stacked(P):
    """``(..., h, n, s)`` → ``(..., h·n, s)``: the heads one above the other."""
    return P.reshape(*P.shape[:-3], P.shape[-3] * P.shape[-2], P.shape[-1])


def _shared_reference(P, k):
    stacked = _stacked(P)  # (..., h·n, s)
    _, _, vh = np.linalg.svd(stacked, full_matrices=False)  # (..., r, s)
    projector = np.swapaxes(vh[..., :k, :], -1, -2) @ vh[..., :k, :]  # (..., s, s)
    norm = np.linalg.norm(stacked, axis=(-2, -1))  # (...)
    shared = lowrank.truncation_error(stacked, k, relative=True) if k < min(stacked.shape[-2:]) else 0 * norm
    own = np.sqrt((np.linalg.norm(P - lowrank.best_rank_k(P, k), axis=(-2, -1)) ** 2).sum(axis=-1)) / norm
    return projector, shared, own


def _shared_with(*, gram="stacked", power=2, start=1, relative=True, own="pooled"):
    """Exercise 2.3's function from the Gram matrix, with one slip (the defaults: none)."""
    def shared_projection(P, k):
        if gram == "summed-heads":  # the heads added, not stacked: one (n, s) matrix
            total = P.sum(axis=-3)
            G = np.swapaxes(total, -1, -2) @ total
        elif gram == "left":  # the queries' side: Σ_h P_h P_hᵀ, (n, n)
            G = (P @ np.swapaxes(P, -1, -2)).sum(axis=-3)
        else:
            G = (np.swapaxes(P, -1, -2) @ P).sum(axis=-3)  # (..., s, s): Σ_h P_hᵀ P_h
        eigenvalues, vectors = np.linalg.eigh(G)  # ascending
        eigenvalues = np.clip(eigenvalues[..., ::-1], 0, None)  # (..., s), largest first
        top = vectors[..., ::-1][..., :k]  # (..., s, k)
        projector = top @ np.swapaxes(top, -1, -2)
        if gram == "mean-of-projectors":
            _, _, vh = np.linalg.svd(P, full_matrices=False)  # (..., h, r, s): each head's own top k
            projector = (np.swapaxes(vh[..., :k, :], -1, -2) @ vh[..., :k, :]).mean(axis=-3)
        total_energy = (P**2).sum(axis=(-3, -2, -1))  # (...): ‖P‖_F² of the stack
        if gram in ("stacked", "left"):
            weights = np.sqrt(eigenvalues) ** power  # σᵢ^power of the stacked matrix
            denominator = weights.sum(axis=-1) if relative else 1.0
            tail = weights[..., k + start - 1:].sum(axis=-1) / denominator
            shared = np.sqrt(tail) if power == 2 else tail
        else:  # the error of the projector made, measured on the stack
            left = P - P @ projector[..., None, :, :]
            shared = np.sqrt((left**2).sum(axis=(-3, -2, -1)) / (total_energy if relative else 1.0))
        sigma = np.linalg.svd(P, compute_uv=False)  # (..., h, r)
        head_tail = (sigma[..., k:] ** 2).sum(axis=-1)  # (..., h): each head's own best error²
        if own == "pooled":
            own_error = np.sqrt(head_tail.sum(axis=-1) / (total_energy if relative else 1.0))
        else:  # each head's relative error, averaged
            own_error = np.sqrt(head_tail / (sigma**2).sum(axis=-1)).mean(axis=-1)
        return projector, shared, own_error
    return shared_projection


MISTAKES_2_3 = (
    Mistake("heads-added-not-stacked", _shared_with(gram="summed-heads"),
            "the heads were added into one n × s matrix: its best projection serves their sum, not each head. The "
            "error to make small is Σ_h ‖P_h − P_h Π‖_F², the error of the heads stacked one above the other, "
            "(h·n, s): its right singular vectors, or the eigenvectors of Σ_h P_hᵀ P_h."),
    Mistake("queries-side", _shared_with(gram="left"),
            "the projection acts on the keys, the columns of P (P_h Π, Π of size s × s): build it from "
            "Σ_h P_hᵀ P_h, not from Σ_h P_h P_hᵀ (the queries' side)."),
    Mistake("mean-of-the-heads-projections", _shared_with(gram="mean-of-projectors"),
            "the average of each head's best projection is no projection at all (not of rank k, Π² ≠ Π) and not "
            "the best shared one: Eckart–Young applied to the stacked heads gives it, the top k eigenvectors of "
            "Σ_h P_hᵀ P_h."),
    Mistake("sigmas-not-squared", _shared_with(power=1),
            "the Frobenius error squares the singular values (Eq. 2.6): √(Σ_{i>k} σᵢ² / Σᵢ σᵢ²) of the stacked "
            "matrix, i.e. the eigenvalues λᵢ = σᵢ² of Σ_h P_hᵀ P_h summed as they are."),
    Mistake("tail-from-k", _shared_with(start=0),
            "a rank-k projection keeps σ₁ … σ_k: the error is the tail after k, Σ_{i>k}, without σ_k itself."),
    Mistake("not-relative", _shared_with(relative=False),
            "both errors are relative: divide by ‖P‖_F of the whole stack, √(Σ_h ‖P_h‖_F²)."),
    Mistake("own-errors-averaged", _shared_with(own="averaged"),
            "the two errors must be measured alike: the heads' own best errors pooled, √(Σ_h ‖P_h − P_h,k‖_F²) / "
            "√(Σ_h ‖P_h‖_F²), not the average of each head's relative error."),
)


def _cases_2_3():
    return [
        ("3 heads, P (3, 6, 6), k = 2", (_attention_matrix(41, (3,), 6, 6), 2), {}),
        ("2 heads, P (2, 8, 5): more queries than keys, k = 3", (_attention_matrix(42, (2,), 8, 5), 3), {}),
        ("batched (2, 4) heads of (7, 7), k = 1", (_attention_matrix(43, (2, 4), 7, 7), 1), {}),
        ("4 heads of (6, 9), k = 4", (_attention_matrix(44, (4,), 6, 9, sharpness=2.0), 4), {}),
    ]


exercise_2_3 = Exercise("2.3", "one projection for every head: the best, and what sharing costs", _shared_reference,
                        _cases_2_3, MISTAKES_2_3, names=("projector", "shared error", "own error"))


EXERCISES = [exercise_2_1, exercise_2_2, exercise_2_3]
