"""Checks for the lesson 04 exercises (Linformer)."""

import numpy as np

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import linformer


def _case(seed, lead, n, d, e, k):
    rng = np.random.default_rng(seed)
    q, keys, v = (rng.standard_normal((*lead, n, c)) for c in (d, d, e))
    E, F = (rng.standard_normal((k, n)) / np.sqrt(k) for _ in range(2))  # N(0, 1/k), notebook 03
    return q, keys, v, E, F


def _softmax(scores, axis=-1):
    weights = np.exp(scores - scores.max(axis=axis, keepdims=True))
    return weights / weights.sum(axis=axis, keepdims=True)


# --- Exercise 4.1: a Linformer head in NumPy -------------------------------------------------

def _head_reference(q, k, v, E, F):
    projected_keys = linformer.project_sequence(E, k)  # (..., k, d)
    projected_values = linformer.project_sequence(F, v)  # (..., k, e)
    weights = linformer.linformer_weights(q, k, E)  # (..., n, k)
    return projected_keys, projected_values, weights, linformer.linformer_attention(q, k, v, E, F)


def _head(*, project=lambda proj, x: proj @ x, values=True, scale=lambda d, k: d ** -0.5, axis=-1, same=False):
    """The exercise's function, made with one slip."""
    def head(q, k, v, E, F):
        projected_keys = project(E, k)
        projected_values = project(E if same else F, v) if values else v
        scores = q @ np.swapaxes(projected_keys, -1, -2) * scale(q.shape[-1], E.shape[-2])
        weights = _softmax(scores, axis)
        return projected_keys, projected_values, weights, weights @ projected_values
    return head


MISTAKES_4_1 = (
    Mistake("feature-axis", _head(project=lambda proj, x: x @ np.swapaxes(proj, -1, -2)),
            "E mixed the d features of each position (x Eᵀ); Linformer mixes positions: project along "
            "the sequence axis, E k with E (k, s) and k (s, d) (Eq. 4.2)."),
    Mistake("only-keys-projected", _head(values=False),
            "only the keys were projected; the values must be projected too, F v (Eq. 4.4), or P̄ (n, k) "
            "cannot multiply them."),
    Mistake("E-for-values", _head(same=True),
            "the values were projected with E; Linformer has a second matrix F for them (Eq. 4.4)."),
    Mistake("missing-scale", _head(scale=lambda d, k: 1.0),
            "the scores are not scaled: divide q (E k)ᵀ by √d, the head dim (Eq. 4.3)."),
    Mistake("scale-by-k", _head(scale=lambda d, k: k ** -0.5),
            "the scores are divided by √k; the scale stays 1/√d, the head dim, as in exact attention (Eq. 4.3)."),
    Mistake("softmax-over-queries", _head(axis=-2),
            "the softmax runs over the query axis; normalise over the k projected keys (the last axis)."),
)


def _cases_4_1():
    return [
        ("n = s = d = e = k = 6 (square, so every slip runs)", _case(41, (), 6, 6, 6, 6), {}),
        ("n = s = 12, d = 4, e = 3, k = 5", _case(42, (), 12, 4, 3, 5), {}),
        ("batched (b, h) = (2, 3), n = s = 16, d = e = 8, k = 4", _case(43, (2, 3), 16, 8, 8, 4), {}),
    ]


exercise_4_1 = Exercise("4.1", "a Linformer head in NumPy", _head_reference, _cases_4_1, MISTAKES_4_1,
                        names=("projected_keys", "projected_values", "weights", "output"))


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


def _cases_4_2():
    return [
        ("b = 2, lengths 10 and 6 of s = 10, d = 4, e = 3, k = 4, padding rows = 5.0",
         *_padded(44, (10, 6), 10, 4, 3, 4, 5.0)),
        ("b = 3, lengths 12, 7 and 3 of s = 12, d = e = 6, k = 5, padding rows = 5.0",
         *_padded(45, (12, 7, 3), 12, 6, 6, 5, 5.0)),
        ("b = 2, lengths 8 and 5 of s = 8, d = e = 4, k = 3, padding rows = NaN",
         *_padded(46, (8, 5), 8, 4, 4, 3, np.nan)),
    ]


exercise_4_2 = Exercise("4.2", "Linformer attention with a key-padding mask", _masked_reference, _cases_4_2,
                        MISTAKES_4_2, names=("output",))


# --- Exercise 4.3: counting the cost ----------------------------------------------------------

def _cost_reference(n, s, d, e, k):
    """FLOPs (2 per multiply-add) of the matrix products: exact attention, then Linformer. Eq. (4.5)."""
    exact = 2 * n * s * d + 2 * n * s * e  # q kᵀ, P v
    projections = 2 * k * s * d + 2 * k * s * e  # E k, F v
    return exact, projections + 2 * n * k * d + 2 * n * k * e  # + q (E k)ᵀ, P̄ (F v)


def _cost(*, factor=2, projections=True, values=True, k_power=1):
    """The exercise's function, made with one slip in the count."""
    def cost(n, s, d, e, k):
        kk = k ** k_power
        exact = factor * n * s * (d + e)
        proj = factor * kk * s * (d + (e if values else 0)) if projections else 0
        return exact, proj + factor * n * kk * (d + e)
    return cost


MISTAKES_4_3 = (
    Mistake("multiply-adds", _cost(factor=1),
            "these are multiply-adds; count FLOPs: 2 per multiply-add (a multiply and an add)."),
    Mistake("projections-free", _cost(projections=False),
            "the projections E k and F v are matrix products too: 2·k·s·d + 2·k·s·e more FLOPs."),
    Mistake("one-projection", _cost(values=False),
            "both k and v are projected: count F v (2·k·s·e) as well as E k (2·k·s·d)."),
    Mistake("quadratic-in-k", _cost(k_power=2),
            "each product has one factor k, not k²: e.g. q (E k)ᵀ is (n, d)·(d, k), 2·n·k·d FLOPs."),
)


def _cases_4_3():
    return [
        ("n = s = 4096, d = e = 64, k = 128", (4096, 4096, 64, 64, 128), {}),
        ("n = 512, s = 1024, d = 32, e = 48, k = 64", (512, 1024, 32, 48, 64), {}),
        ("n = s = 10, d = 3, e = 5, k = 2", (10, 10, 3, 5, 2), {}),
    ]


exercise_4_3 = Exercise("4.3", "count the cost of exact and Linformer attention", _cost_reference, _cases_4_3,
                        MISTAKES_4_3, names=("exact_flops", "linformer_flops"), atol=0, rtol=0)

EXERCISES = [exercise_4_1, exercise_4_2, exercise_4_3]
