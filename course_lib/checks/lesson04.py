"""Checks for the lesson 04 exercises (Linformer)."""

import numpy as np

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import jl, linformer


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


def _unstable_softmax(scores, axis=-1):
    with np.errstate(over="ignore", invalid="ignore"):  # the slip itself: exp overflows to inf, inf/inf is NaN
        weights = np.exp(scores)
        return weights / weights.sum(axis=axis, keepdims=True)


def _head(*, project=lambda proj, x: proj @ x, values=True, scale=lambda d, k: d ** -0.5, axis=-1, same=False,
          softmax=_softmax):
    """The exercise's function, made with one slip."""
    def head(q, k, v, E, F):
        projected_keys = project(E, k)
        projected_values = project(E if same else F, v) if values else v
        scores = q @ np.swapaxes(projected_keys, -1, -2) * scale(q.shape[-1], E.shape[-2])
        weights = softmax(scores, axis)
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
    Mistake("softmax-overflow", _head(softmax=_unstable_softmax),
            "the softmax overflowed: exp of a score above ~709 is inf in float64, and inf / inf is NaN. "
            "Subtract each row's maximum score before exp; softmax is unchanged by that shift."),
)


def _cases_4_1():
    return [
        ("n = s = d = e = k = 6 (square, so every slip runs)", _case(41, (), 6, 6, 6, 6), {}),
        ("n = s = 12, d = 4, e = 3, k = 5", _case(42, (), 12, 4, 3, 5), {}),
        ("batched (b, h) = (2, 3), n = s = 16, d = e = 8, k = 4", _case(43, (2, 3), 16, 8, 8, 4), {}),
        ("large scores (q and k times 30, scores up to ~10³), n = s = 8, d = e = 4, k = 3", _large_case(), {}),
    ]


def _large_case():
    q, keys, v, E, F = _case(47, (), 8, 4, 4, 3)
    return 30 * q, 30 * keys, v, E, F  # scores of several hundred to a few thousand: exp overflows


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


# --- Exercise 4.3: Theorem 1's error on two scales --------------------------------------------

def _theorem1_reference(P, v, R):
    """Relative error, JL-scale error and amplification of P Rᵀ R v ≈ P v. Notebook 03, Eqs. (3.6) and (3.8)."""
    exact = P @ v  # (n,)
    error = np.linalg.norm(P @ R.T @ (R @ v) - exact)
    relative = jl.projected_attention_error(P, v, R)
    scale = np.linalg.norm(P) * np.linalg.norm(v)  # ‖P‖_F ‖v‖: the scale a JL guarantee is relative to
    return relative, error / scale, scale / np.linalg.norm(exact)


def _theorem1(*, p_norm=lambda P: np.linalg.norm(P), v_norm=lambda v: np.linalg.norm(v), divide_by=None,
              invert=False, square=False):
    """The exercise's function, made with one slip."""
    def errors(P, v, R):
        exact = P @ v
        error = np.linalg.norm(P @ R.T @ (R @ v) - exact)
        norm_exact = np.linalg.norm(exact) if divide_by is None else divide_by(P, v)
        if square:
            error, norm_exact = error ** 2, norm_exact ** 2
        scale = p_norm(P) * v_norm(v)
        amplification = norm_exact / scale if invert else scale / norm_exact
        return error / norm_exact, error / scale, amplification
    return errors


MISTAKES_4_3 = (
    Mistake("spectral-norm", _theorem1(p_norm=lambda P: np.linalg.norm(P, 2)),
            "‖P‖ here is the Frobenius norm, the root of the sum of the rows' squared norms ‖P_i‖² "
            "(np.linalg.norm(P)); the spectral norm (np.linalg.norm(P, 2)) is only the largest singular value."),
    Mistake("inverted-amplification", _theorem1(invert=True),
            "the amplification is ‖P‖_F ‖v‖ / ‖P v‖, which is at least 1 (Cauchy–Schwarz, row by row): "
            "relative error = amplification × JL-scale error."),
    Mistake("relative-to-v", _theorem1(divide_by=lambda P, v: np.linalg.norm(v)),
            "the relative error divides by ‖P v‖, the size of the exact output, not by ‖v‖."),
    Mistake("squared-norms", _theorem1(square=True),
            "these are ratios of norms, not of squared norms: take the square root of the sums of squares."),
)


def _attention_case(seed, n, k, spread, offset):
    rng = np.random.default_rng(seed)
    scores = spread * rng.standard_normal((n, n))  # a small spread: near-uniform rows
    P = np.exp(scores - scores.max(axis=-1, keepdims=True))
    P /= P.sum(axis=-1, keepdims=True)  # (n, s), rows sum to 1
    v = rng.standard_normal(n)
    v = v - v.mean() + offset  # offset 0: a centred value column, as in notebook 03
    return P, v, rng.standard_normal((k, n)) / np.sqrt(k)  # R ~ N(0, 1/k)


def _cases_4_3():
    return [
        ("n = s = 64, k = 16, peaked rows (score spread 3), centred v", _attention_case(48, 64, 16, 3.0, 0.0), {}),
        ("n = s = 128, k = 32, near-uniform rows (spread 0.3), centred v", _attention_case(49, 128, 32, 0.3, 0.0), {}),
        ("n = s = 32, k = 8, spread 1, v offset by 2", _attention_case(50, 32, 8, 1.0, 2.0), {}),
    ]


exercise_4_3 = Exercise("4.3", "Theorem 1's error on two scales and the amplification between them",
                        _theorem1_reference, _cases_4_3, MISTAKES_4_3,
                        names=("relative_error", "jl_scale_error", "amplification"))

EXERCISES = [exercise_4_1, exercise_4_2, exercise_4_3]
