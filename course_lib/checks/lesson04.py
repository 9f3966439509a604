"""Checks for the lesson 04 exercises (Linformer)."""

import numpy as np

from course_lib.checks import Exercise, Mistake, run_check, to_numpy
from course_lib.numpy import linformer


def _case(seed, lead, n, d, e, k):
    rng = np.random.default_rng(seed)
    q, keys, v = (rng.standard_normal((*lead, n, c)) for c in (d, d, e))
    E, F = (rng.standard_normal((k, n)) / np.sqrt(k) for _ in range(2))  # N(0, 1/k), notebook 03
    return q, keys, v, E, F


def _softmax(scores, axis=-1):
    weights = np.exp(scores - scores.max(axis=axis, keepdims=True))
    return weights / weights.sum(axis=axis, keepdims=True)


# --- Exercise 4.1: the best fixed projection for the rows of P --------------------------------
# The learner derives the closed form: for an orthogonal projector Π = FᵀF of rank k,
# Σ_t ‖P_t − P_t Π‖² = Σ_t ‖P_t‖² − tr(Π M) with M = Σ_t P_tᵀ P_t, so the best F holds the top-k
# eigenvectors of M.  Any orthonormal basis of that subspace is right (signs, order, rotations),
# so the check compares the answer rotated into the library's basis, (F_ref Fᵀ) F: it equals
# F_ref exactly when F has orthonormal rows spanning the same subspace.

def best_fixed_projection(P, k):
    """The k × s projection with orthonormal rows that minimises Σ ‖P − P Fᵀ F‖² over the stack ``P (..., n, s)``."""
    rows = np.asarray(P, dtype=float).reshape(-1, P.shape[-1])  # (all rows, s): every leading dim stacked
    second_moment = rows.T @ rows  # (s, s) = Σ PᵀP over the stack
    _, vectors = np.linalg.eigh(second_moment)  # ascending eigenvalues
    return vectors[:, ::-1][:, :k].T  # (k, s): the top k as rows


def _top_eigenvectors(M, k):
    return np.linalg.eigh(M)[1][:, ::-1][:, :k].T


def _smallest(P, k):
    rows = P.reshape(-1, P.shape[-1])
    return np.linalg.eigh(rows.T @ rows)[1][:, :k].T  # eigh's first k: the smallest


def _eig_unsorted(P, k):
    rows = P.reshape(-1, P.shape[-1])
    vectors = np.linalg.eig(rows.T @ rows)[1]  # eigenvalues in LAPACK's order, not sorted
    return np.real(vectors[:, :k]).T


def _first_only(P, k):
    first = P.reshape(-1, *P.shape[-2:])[0]  # the first matrix of the stack
    return _top_eigenvectors(first.T @ first, k)


def _query_side(P, k):
    stack = P.reshape(-1, *P.shape[-2:])
    return _top_eigenvectors(np.einsum("tns,tms->nm", stack, stack), k)  # Σ P Pᵀ: the n query positions


def _mean_first(P, k):
    mean = P.reshape(-1, *P.shape[-2:]).mean(axis=0)  # (n, s): the matrices averaged before squaring
    return np.linalg.svd(mean)[2][:k]


def _centred(P, k):
    rows = P.reshape(-1, P.shape[-1])
    rows = rows - rows.mean(axis=0)  # a PCA of the rows around their mean
    return _top_eigenvectors(rows.T @ rows, k)


def _rows_normalised(P, k):
    rows = P.reshape(-1, P.shape[-1])
    rows = rows / np.linalg.norm(rows, axis=-1, keepdims=True)  # every row made a unit vector first
    return _top_eigenvectors(rows.T @ rows, k)


def _columns(P, k):
    return best_fixed_projection(P, k).T  # (s, k)


MISTAKES_4_1 = (
    Mistake("eig-unsorted", _eig_unsorted,
            "np.linalg.eig returns the eigenvalues in no particular order (for the hard-attention case, in the order "
            "of the keys): sort them, order = np.argsort(eigenvalues)[::-1], and take vectors[:, order[:k]] — or use "
            "np.linalg.eigh, whose order is ascending."),
    Mistake("smallest-eigenvalues", _smallest,
            "np.linalg.eigh returns the eigenvalues in ASCENDING order, so its first k eigenvectors are the "
            "directions P uses least. Take the last k (the largest eigenvalues), e.g. vectors[:, ::-1][:, :k]."),
    Mistake("first-matrix-only", _first_only,
            "you fitted the first matrix of the stack only: that is the SVD-optimal map of one input. A fixed F "
            "serves every training matrix, so sum PᵀP over all leading dims (stack the rows: P.reshape(-1, s))."),
    Mistake("query-side", _query_side,
            "Σ P Pᵀ is n × n: it describes the query positions (the rows of P). F mixes the KEY positions, the "
            "columns of P: minimise ‖P − P FᵀF‖ with the s × s matrix Σ PᵀP."),
    Mistake("averaged-first", _mean_first,
            "you averaged the matrices before the fit: the error is a sum of squares, Σ‖P − PΠ‖², so it needs the "
            "second moment Σ PᵀP, not (mean P)ᵀ(mean P) — directions in which the inputs differ cancel in the mean."),
    Mistake("centred", _centred,
            "the error is that of P itself, not of P minus its mean row: a centred PCA drops the mean row, which "
            "every near-uniform row shares. Use the uncentred Σ PᵀP."),
    Mistake("rows-normalised-first", _rows_normalised,
            "you normalised each row of P (to unit length) before the fit: the objective Σ‖P_t − P_t Π‖² weighs "
            "each row by its own size, so a peaked row, with a large norm, counts more than a near-uniform one. "
            "Rescaling the rows changes M = Σ PᵀP and its top eigenvectors: use the rows as they are."),
    Mistake("columns-not-rows", _columns,
            "F holds the k directions as ROWS, shape (k, s), so that F K is (k, d); eigenvectors come back as the "
            "columns of eigh's second result: transpose them."),
)


def _attention_stack(seed, lead, n, spread):
    """Softmax rows with a shared structure (a few favourite key positions) plus noise, ``(*lead, n, n)``."""
    rng = np.random.default_rng(seed)
    favourite = rng.standard_normal(n) * 2.0  # every input likes the same key positions, a little
    scores = spread * rng.standard_normal((*lead, n, n)) + favourite
    return _softmax(scores)


def _hard_attention(counts):
    """One-hot rows: key j is the whole attention of counts[j] queries, ``(sum(counts), len(counts))``."""
    keys = np.repeat(np.arange(len(counts)), counts)  # (n,): the key each query attends to
    return np.eye(len(counts))[keys]


def _cases_4_1():
    return [
        ("one matrix P (8, 8), k = 2", (_attention_stack(410, (), 8, 1.5), 2), {}),
        ("a stack of 5 matrices (5, 10, 10), k = 3", (_attention_stack(411, (5,), 10, 1.5), 3), {}),
        ("passages × heads (3, 4, 12, 12), k = 4", (_attention_stack(412, (3, 4), 12, 2.0), 4), {}),
        ("n = 6 queries, s = 9 keys, a stack of 4, k = 3", (_softmax(np.random.default_rng(413).standard_normal(
            (4, 6, 9)) * 2.0), 3), {}),
        # Σ PᵀP is diagonal here, diag(3, 1, 6, 2, 5, 4): np.linalg.eig keeps that order, neither sorted way.
        ("hard attention: 21 queries, each on one of s = 6 keys (3, 1, 6, 2, 5, 4 times), k = 2",
         (_hard_attention([3, 1, 6, 2, 5, 4]), 2), {}),
    ]


def _in_reference_basis(fn):
    """``fn``'s F rotated into the library's basis, (F_ref Fᵀ) F; F itself when it cannot be (shape, NaN)."""
    def aligned(P, k):
        F = to_numpy(fn(P, k))
        reference = best_fixed_projection(P, k)
        if F.shape != reference.shape or not np.all(np.isfinite(F)):
            return F
        return reference @ F.T @ F  # (k, s): equals the reference iff F's rows are an orthonormal basis of its span
    return aligned


class _SubspaceExercise(Exercise):
    """Exercise 4.1's check: any orthonormal basis of the optimal subspace passes."""

    def __call__(self, candidate, *, verbose=True):
        mistakes = [Mistake(m.name, _in_reference_basis(m.fn), m.hint) for m in self.mistakes]
        return run_check(self.number, _in_reference_basis(candidate), _in_reference_basis(self.reference),
                         self.cases(), names=self.names, mistakes=mistakes, atol=self.atol, rtol=self.rtol,
                         verbose=verbose)


exercise_4_1 = _SubspaceExercise("4.1", "the best fixed projection for the rows of P", best_fixed_projection,
                                 _cases_4_1, MISTAKES_4_1, names=("F, rotated into the library's basis",),
                                 atol=1e-8, rtol=1e-6)


# --- Exercise 4.2: the padding mask done right ----------------------------------------------

def _masked_reference(q, k, v, E, F, key_mask):
    return linformer.linformer_attention(q, k, v, E, F, key_mask=key_mask)


def _masked(*, zero=lambda x, m: np.where(m[..., None], x, 0.0), keys=True, values=True):
    """The exercise's function, made with one slip in how padded positions are removed."""
    def attention(q, k, v, E, F, key_mask):
        key_mask = np.asarray(key_mask)
        projected_keys = E @ (zero(k, key_mask) if keys else k)  # (..., k, d)
        projected_values = F @ (zero(v, key_mask) if values else v)  # (..., k, e)
        weights = _softmax(q @ np.swapaxes(projected_keys, -1, -2) / np.sqrt(q.shape[-1]))
        return weights @ projected_values
    return attention


MISTAKES_4_2 = (
    Mistake("multiply-by-mask", _masked(zero=lambda x, m: x * m[..., None]),
            "x * mask keeps NaN and inf in padded rows (0 × NaN is NaN): select with "
            "np.where(mask[..., None], x, 0.0) instead."),
    Mistake("mask-ignored", _masked(keys=False, values=False),
            "the padded keys and values were projected too: E mixes them into every projected key. Zero "
            "the padded rows of k and v (key_mask False) before projecting."),
    Mistake("values-not-zeroed", _masked(values=False),
            "the padded values still enter F v: zero the padded rows of v too, not only those of k."),
    Mistake("keys-not-zeroed", _masked(keys=False),
            "the padded keys still enter E k: zero the padded rows of k too, not only those of v."),
    Mistake("inverted-mask", _masked(zero=lambda x, m: np.where(m[..., None], 0.0, x)),
            "key_mask is True where the key is a real token: keep those rows and zero the others."),
)


def _padded(seed, lengths, n, d, e, k, fill):
    q, keys, v, E, F = _case(seed, (len(lengths),), n, d, e, k)
    key_mask = np.arange(n)[None, :] < np.asarray(lengths)[:, None]  # (b, s)
    keys[~key_mask], v[~key_mask] = fill, fill  # what a padded batch may hold in its padding rows
    return (q, keys, v, E, F, key_mask), {}


def _one_padded(seed, length, n, d, e, k, fill):
    (q, keys, v, E, F, key_mask), _ = _padded(seed, (length,), n, d, e, k, fill)
    return (q[0], keys[0], v[0], E, F, key_mask[0]), {}  # no batch dim: (n, d), (s,) mask


def _cases_4_2():
    return [
        ("one sequence (no batch dim), length 7 of s = 10, d = 4, e = 3, k = 4, padding rows = 5.0",
         *_one_padded(43, 7, 10, 4, 3, 4, 5.0)),
        ("b = 2, lengths 10 and 6 of s = 10, d = 4, e = 3, k = 4, padding rows = 5.0",
         *_padded(44, (10, 6), 10, 4, 3, 4, 5.0)),
        ("b = 3, lengths 12, 7 and 3 of s = 12, d = e = 6, k = 5, padding rows = 5.0",
         *_padded(45, (12, 7, 3), 12, 6, 6, 5, 5.0)),
        ("b = 2, lengths 8 and 5 of s = 8, d = e = 4, k = 3, padding rows = NaN",
         *_padded(46, (8, 5), 8, 4, 4, 3, np.nan)),
    ]


exercise_4_2 = Exercise("4.2", "Linformer attention with a key-padding mask", _masked_reference, _cases_4_2,
                        MISTAKES_4_2, names=("output",))


# --- Exercise 4.3: derive the cost, then predict the crossover ----------------------------------

def attention_flops(b, h, n, s, d, e, k):
    """``(exact, linformer)`` FLOPs of one attention call, 2 per multiply-add. Notebook 04, Eq. (4.5).

    b batches × h heads; n queries, s keys; head dims d (queries, keys) and e (values); Linformer
    projects the s positions to k with one E and one F shared by the heads (each head projects its own K, V).
    """
    exact = 2.0 * b * h * n * s * (d + e)  # Q Kᵀ and P V
    projections = 2.0 * b * h * k * s * (d + e)  # E K and F V, every head its own K and V
    return exact, projections + 2.0 * b * h * n * k * (d + e)  # Q K̄ᵀ and P̄ V̄


def _flops_with(*, per_mac=2.0, projections=True, heads_project=True, square=False, widths=lambda d, e: d + e,
                batch=True):
    def flops(b, h, n, s, d, e, k):
        b = b if batch else 1
        s_used = n if square else s
        exact = per_mac * b * h * n * s_used * widths(d, e)
        proj = per_mac * b * (h if heads_project else 1) * k * s_used * widths(d, e) if projections else 0.0
        return exact, proj + per_mac * b * h * n * k * widths(d, e)
    return flops


MISTAKES_4_3 = (
    # Before the multiply-add slip: in the case b = 2, a dropped b also halves every count.
    Mistake("batch-forgotten", _flops_with(batch=False),
            "these are the FLOPs of one sequence: a call on b sequences does every product b times, so multiply "
            "both counts by b (Eq. 4.5 counts one sequence of one head)."),
    Mistake("one-flop-per-multiply-add", _flops_with(per_mac=1.0),
            "a multiply-add is 2 FLOPs (Eq. 4.5): an (a × b)(b × c) product costs 2·a·b·c."),
    Mistake("projections-forgotten", _flops_with(projections=False),
            "E K and F V are matrix products too: 2·k·s·d + 2·k·s·e per head. Without them Linformer would beat "
            "exact attention at every n > k, and the crossover moves."),
    Mistake("projections-once", _flops_with(heads_project=False),
            "E is shared by the heads, but every head has its own K and V: E K and F V are computed h times."),
    Mistake("n-for-s", _flops_with(square=True),
            "the keys have s positions, the queries n: Q Kᵀ is (n × d)(d × s), E K is (k × s)(s × d). Use s where "
            "the products run over the keys."),
    Mistake("d-for-both", _flops_with(widths=lambda d, e: 2 * d),
            "the values have their own width e: P V and F V cost 2·n·s·e and 2·k·s·e, not 2·n·s·d."),
)


def _cases_4_3():
    return [
        ("one head, n = s = 64, d = e = 16, k = 8", (1, 1, 64, 64, 16, 16, 8), {}),
        ("b = 2, h = 4, n = 128 queries, s = 256 keys, d = 32, e = 16, k = 32", (2, 4, 128, 256, 32, 16, 32), {}),
        ("b = 1, h = 8, n = s = 4096, d = e = 64, k = 128 (the stored grid)", (1, 8, 4096, 4096, 64, 64, 128), {}),
        ("b = 3, h = 2, n = 50, s = 20, d = 8, e = 24, k = 5", (3, 2, 50, 20, 8, 24, 5), {}),
    ]


exercise_4_3 = Exercise("4.3", "the cost of exact and Linformer attention", attention_flops, _cases_4_3, MISTAKES_4_3,
                        names=("exact FLOPs", "Linformer FLOPs"), atol=0, rtol=1e-12)

EXERCISES = [exercise_4_1, exercise_4_2, exercise_4_3]
