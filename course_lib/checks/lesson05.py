"""Checks for the lesson 05 exercises (Linformer parameter sharing)."""

import numpy as np

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import full, linformer

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


# --- Exercise 5.2: one Linformer head with a padding mask (NumPy) -------------------------

def _head_reference(q, k, v, E, F, key_mask):
    weights = linformer.linformer_weights(q, k, E, key_mask=key_mask)
    return weights, linformer.linformer_attention(q, k, v, E, F, key_mask=key_mask)


def _head_with(*, zero_keys=True, zero_values=True, scale=True, feature_axis=False):
    """The exercise's function, made with one slip."""
    def head(q, k, v, E, F, key_mask):
        s = k.shape[-2]
        keep = key_mask[:, None]  # (s, 1)
        k = np.where(keep, k, 0.0) if zero_keys else k
        v = np.where(keep, v, 0.0) if zero_values else v
        if feature_axis:  # E applied to the d features of each key, not to the s positions
            k_bar, v_bar = (k @ E[:, :s].T).T, (v @ F[:, :s].T).T  # (k, d) only when d = s
        else:
            k_bar, v_bar = E[:, :s] @ k, F[:, :s] @ v  # (k, d), (k, e)
        scores = q @ k_bar.T / (np.sqrt(q.shape[-1]) if scale else 1.0)  # (n, k)
        weights = full.masked_softmax(scores)
        return weights, weights @ v_bar
    return head


MISTAKES_5_2 = (
    Mistake("padding-ignored", _head_with(zero_keys=False, zero_values=False),
            "the padded keys and values were projected too: E mixes every position into every projected key, "
            "so zero the rows where key_mask is False BEFORE projecting (masking afterwards is too late)."),
    Mistake("padded-values-kept", _head_with(zero_values=False),
            "the keys were cleaned but the values were not: F v also mixes the padded rows — zero them in v too."),
    Mistake("feature-axis", _head_with(feature_axis=True),
            "E was applied along the feature axis (k @ E.T); Linformer projects the SEQUENCE axis: E[:, :s] @ k "
            "turns s positions into k mixtures, each still a d-dimensional key."),
    Mistake("missing-scale", _head_with(scale=False),
            "the scores are not scaled: divide q (E k)ᵀ by √d before the softmax, as in exact attention."),
)


def _head_case(seed, n, s, n_max, k, d, e, n_real):
    rng = np.random.default_rng(seed)
    q, keys, v = rng.standard_normal((n, d)), rng.standard_normal((s, d)), rng.standard_normal((s, e))
    E, F = rng.standard_normal((2, k, n_max)) / np.sqrt(k)
    key_mask = np.arange(s) < n_real  # (s,)
    keys[~key_mask], v[~key_mask] = 5.0, -5.0  # what a padding token's key and value could look like
    return q, keys, v, E, F, key_mask


def _cases_5_2():
    return [
        ("n = s = d = e = 6, k = 3, the last 2 keys padded", _head_case(51, 6, 6, 6, 3, 6, 6, 4), {}),
        ("n = 4, s = 7, n_max = 10, k = 3, d = 3, e = 2, the last 3 keys padded",
         _head_case(52, 4, 7, 10, 3, 3, 2, 4), {}),
        ("n = s = 5, n_max = 8, k = 4, d = 2, e = 3, no padding", _head_case(53, 5, 5, 8, 4, 2, 3, 5), {}),
    ]


exercise_5_2 = Exercise("5.2", "a Linformer head with a padding mask (NumPy)", _head_reference, _cases_5_2,
                        MISTAKES_5_2, names=("weights", "output"))

EXERCISES = [exercise_5_1, exercise_5_2]
