"""Checks for the lesson 05 exercises (Linformer parameter sharing)."""

import numpy as np

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import linformer, lowrank

# --- Exercise 5.1: count the distinct projection matrices ---------------------------------

def _count_reference(n_layers, n_heads, sharing):
    return linformer.count_projection_matrices(n_layers, n_heads, sharing)


def _count_with(counts):
    """The exercise's function built from a table ``sharing -> f(L, h)`` that holds one slip."""
    def count(n_layers, n_heads, sharing):
        return counts[sharing](n_layers, n_heads)
    return count


_RIGHT = {"none": lambda L, h: 2 * L * h, "headwise": lambda L, h: 2 * L, "key-value": lambda L, h: L,
          "layerwise": lambda L, h: 1}

MISTAKES_5_1 = (
    Mistake("e-and-f-once", _count_with({**_RIGHT, "none": lambda L, h: L * h, "headwise": lambda L, h: L}),
            "without key-value sharing every head (or layer) has TWO matrices, E for the keys and F for the "
            "values: count both (2·L·h for 'none', 2·L for 'headwise')."),
    Mistake("forgot-layers", _count_with({**_RIGHT, "none": lambda L, h: 2 * h, "headwise": lambda L, h: 2,
                                          "key-value": lambda L, h: 1}),
            "the count is for the whole model: every one of the L layers has its own projections unless the "
            "sharing is 'layerwise' — multiply by n_layers."),
    Mistake("key-value-as-headwise", _count_with({**_RIGHT, "key-value": lambda L, h: 2 * L}),
            "key-value sharing goes one step beyond headwise: E = F, so each layer keeps ONE matrix (L in all)."),
    Mistake("layerwise-keeps-e-and-f", _count_with({**_RIGHT, "layerwise": lambda L, h: 2}),
            "layerwise sharing uses one matrix for every layer, every head, keys AND values: the count is 1."),
)


def _cases_5_1():
    return [(f"{L} layers, {h} heads, sharing={mode!r}", (L, h, mode), {})
            for L, h in ((12, 12), (3, 4)) for mode in linformer.SHARING_MODES]


exercise_5_1 = Exercise("5.1", "count the distinct projection matrices", _count_reference, _cases_5_1,
                        MISTAKES_5_1, names=("count",))


# --- Exercise 5.2: the best rank-k error of the reversal permutation (Eq. 5.5) -------------

def reversal_matrix(n):
    """The anti-diagonal permutation J ``(n, n)``: the attention that reverses a sequence."""
    return np.eye(n)[::-1]


def _reversal_reference(n, k):
    J = reversal_matrix(n)
    return lowrank.singular_values(J), lowrank.truncation_error(J, k, relative=True)


def _reversal_with(error_of):
    """The exercise's function with the right singular values and a slipped error ``error_of(n, k)``."""
    def reversal_error(n, k):
        return np.ones(n), error_of(n, k)
    return reversal_error


MISTAKES_5_2 = (
    Mistake("not-square-rooted", _reversal_with(lambda n, k: 1 - k / n),
            "that is the squared error: ‖J − J_k‖_F is the square ROOT of the sum of the dropped σ² (Eq. 2.5)."),
    Mistake("not-relative", _reversal_with(lambda n, k: np.sqrt(n - k)),
            "that is the absolute error ‖J − J_k‖_F; divide by ‖J‖_F = √n for the relative one."),
    Mistake("share-kept", _reversal_with(lambda n, k: np.sqrt(k / n)),
            "that is the share of J the k kept directions hold; the error is what the n − k dropped ones hold."),
    Mistake("spectral-norm", _reversal_with(lambda n, k: float(k < n)),
            "that is the error in the spectral norm (the largest dropped σ, 1 here); Eq. (5.5) uses the "
            "Frobenius norm, which adds up every dropped σ²."),
)


def _cases_5_2():
    return [("n = 8, k = 2", (8, 2), {}), ("n = 32, k = 8", (32, 8), {}), ("n = 12, k = 9", (12, 9), {}),
            ("n = 6, k = 6", (6, 6), {})]


exercise_5_2 = Exercise("5.2", "the best rank-k error of the reversal permutation", _reversal_reference,
                        _cases_5_2, MISTAKES_5_2, names=("singular values", "relative error"))

EXERCISES = [exercise_5_1, exercise_5_2]
