"""Checks for the lesson 06 exercises (linear attention)."""

import numpy as np

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import linear

EPS = 1e-6  # the library's default: added to the normaliser (notebook 06)


def _case(seed, lead, n, d, e, scale=1.0):
    rng = np.random.default_rng(seed)
    return tuple(scale * rng.standard_normal((*lead, n, c)) for c in (d, d, e))


def _t(x):
    return np.swapaxes(x, -1, -2)


# --- Exercise 6.1: non-causal linear attention with its normaliser ---------------------------

def _noncausal_reference(q, k, v):
    phi_q, phi_k = linear.elu_feature_map(q), linear.elu_feature_map(k)  # (..., n, f), (..., s, f)
    kv_state = _t(phi_k) @ v  # (..., f, e)
    normaliser = phi_q @ phi_k.sum(axis=-2)[..., None]  # (..., n, 1)
    return kv_state, normaliser[..., 0], linear.linear_attention(q, k, v)


def _noncausal(*, map_keys=True, state=lambda phi_k, v: _t(phi_k) @ v, key_sum=lambda phi_k: phi_k.sum(axis=-2),
               normalise=True):
    """The exercise's function, made with one slip."""
    def attention(q, k, v):
        phi_q = linear.elu_feature_map(q)
        phi_k = linear.elu_feature_map(k) if map_keys else k
        kv_state = state(phi_k, v)
        normaliser = (phi_q @ key_sum(phi_k)[..., None])[..., 0]  # (..., n)
        numerator = phi_q @ kv_state  # (..., n, e)
        return kv_state, normaliser, numerator / (normaliser[..., None] + EPS) if normalise else numerator
    return attention


MISTAKES_6_1 = (
    Mistake("missing-normaliser", _noncausal(normalise=False),
            "the output is phi(q) S without the division: divide each row by its normaliser "
            "phi(q_i)·z (+ eps), or the weights do not sum to 1 (Eq. 6.2)."),
    Mistake("state-transposed", _noncausal(state=lambda phi_k, v: _t(v) @ phi_k),
            "the state is vᵀ phi(k), shape (e, f); contract over the key positions the other way round: "
            "S = phi(k)ᵀ v, shape (f, e), then phi(q) S (Eq. 6.2)."),
    Mistake("key-sum-over-features", _noncausal(key_sum=lambda phi_k: phi_k.sum(axis=-1)),
            "z summed phi(k) over its features (the last axis); z = Σ_j phi(k_j) sums over the key "
            "positions (axis -2) and has f entries."),
    Mistake("keys-not-mapped", _noncausal(map_keys=False),
            "the feature map was applied to q only: the kernel is phi(q)·phi(k), so map the keys too."),
)


def _cases_6_1():
    return [
        ("n = s = d = e = 6 (square, so every slip runs)", _case(61, (), 6, 6, 6), {}),
        ("n = s = 20, d = 4, e = 3", _case(62, (), 20, 4, 3), {}),
        ("batched (b, h) = (2, 3), n = s = 16, d = e = 8", _case(63, (2, 3), 16, 8, 8), {}),
    ]


exercise_6_1 = Exercise("6.1", "non-causal linear attention", _noncausal_reference, _cases_6_1, MISTAKES_6_1,
                        names=("kv_state", "normaliser", "output"))


# --- Exercise 6.2: causal linear attention by prefix sums -------------------------------------

def _causal_reference(q, k, v):
    phi_k = linear.elu_feature_map(k)  # (..., n, f)
    kv_states = np.cumsum(phi_k[..., :, None] * v[..., None, :], axis=-3)  # (..., n, f, e)
    key_sums = np.cumsum(phi_k, axis=-2)  # (..., n, f)
    return kv_states, key_sums, linear.causal_linear_attention(q, k, v)


def _exclusive(x, axis):
    """Sum of the entries strictly before each position: the off-by-one slip."""
    return np.cumsum(x, axis=axis) - x


def _everything(x, axis):
    """Every position gets the sum over all positions, the future included."""
    return np.broadcast_to(x.sum(axis=axis, keepdims=True), x.shape).copy()


def _causal(*, prefix=lambda x, axis: np.cumsum(x, axis=axis), state_axis=-3, normalise=True):
    """The exercise's function, made with one slip."""
    def attention(q, k, v):
        phi_q, phi_k = linear.elu_feature_map(q), linear.elu_feature_map(k)
        kv_states = prefix(phi_k[..., :, None] * v[..., None, :], state_axis)  # (..., n, f, e)
        key_sums = prefix(phi_k, -2)  # (..., n, f)
        numerator = np.einsum("...nf,...nfe->...ne", phi_q, kv_states)
        normaliser = np.einsum("...nf,...nf->...n", phi_q, key_sums)
        with np.errstate(invalid="ignore", divide="ignore"):  # an empty exclusive prefix gives 0 / eps
            return kv_states, key_sums, numerator / (normaliser[..., None] + EPS) if normalise else numerator
    return attention


MISTAKES_6_2 = (
    Mistake("exclusive-prefix", _causal(prefix=_exclusive),
            "position i left itself out (an exclusive prefix, j < i): S_i = Σ_{j ≤ i} phi(k_j) v_jᵀ includes "
            "j = i, so use the inclusive cumulative sum (np.cumsum) (Eq. 6.4)."),
    Mistake("future-leak", _causal(prefix=_everything),
            "every position summed over all keys, the future included: that is the non-causal Eq. (6.2). "
            "Use cumulative sums over the positions so position i sees j ≤ i only."),
    Mistake("cumsum-over-features", _causal(state_axis=-2),
            "the states were summed along the feature axis f; the prefix runs over the positions n "
            "(axis -3 of the (..., n, f, e) outer products)."),
    Mistake("missing-normaliser", _causal(normalise=False),
            "the output is phi(q_i) S_i without the division by phi(q_i)·z_i (+ eps) (Eq. 6.4)."),
)


def _cases_6_2():
    return [
        ("n = 5, d = e = 5 (square, so every slip runs)", _case(64, (), 5, 5, 5), {}),
        ("n = 24, d = 4, e = 3", _case(65, (), 24, 4, 3), {}),
        ("batched (b, h) = (2, 2), n = 16, d = e = 6", _case(66, (2, 2), 16, 6, 6), {}),
    ]


exercise_6_2 = Exercise("6.2", "causal linear attention by prefix sums", _causal_reference, _cases_6_2, MISTAKES_6_2,
                        names=("kv_states", "key_sums", "output"))


# --- Exercise 6.3: a feature map that breaks positivity ---------------------------------------

def _positivity_reference(q, k, feature_map):
    phi_q, phi_k = feature_map(q), feature_map(k)  # (..., n, f), (..., s, f)
    normaliser = np.einsum("...nf,...f->...n", phi_q, phi_k.sum(axis=-2))  # (..., n)
    kernel = phi_q @ _t(phi_k)  # (..., n, s)
    return normaliser, np.mean(kernel < 0), np.mean(normaliser <= 0)


def _positivity(*, map_keys=True, bad=lambda z: z <= 0, fraction=np.mean):
    """The exercise's function, made with one slip."""
    def report(q, k, feature_map):
        phi_q = feature_map(q)
        phi_k = feature_map(k) if map_keys else k
        normaliser = np.einsum("...nf,...f->...n", phi_q, phi_k.sum(axis=-2))
        return normaliser, fraction(phi_q @ _t(phi_k) < 0), fraction(bad(normaliser))
    return report


MISTAKES_6_3 = (
    Mistake("counts-not-fractions", _positivity(fraction=np.sum),
            "return fractions (np.mean of the boolean arrays), not counts of entries or rows."),
    Mistake("keys-not-mapped", _positivity(map_keys=False),
            "the normaliser used the raw keys: it is phi(q_i)·Σ_j phi(k_j), with the feature map applied "
            "to the keys too."),
    Mistake("zero-normaliser-missed", _positivity(bad=lambda z: z < 0),
            "a normaliser of exactly 0 is broken too (relu of an all-negative query gives 0 / 0): count "
            "rows with normaliser <= 0, not < 0."),
)


def _relu_case():
    q, k, _ = _case(69, (), 64, 2, 1)  # d = 2: about a quarter of the queries are all negative
    return q, k, linear.relu_feature_map


def _cases_6_3():
    identity = lambda x: x  # noqa: E731 (the broken map under study)
    return [
        ("identity map, n = s = 32, d = 4", (*_case(67, (), 32, 4, 1)[:2], identity), {}),
        ("elu + 1, batched (2, 3), n = s = 12, d = 3", (*_case(68, (2, 3), 12, 3, 1)[:2], linear.elu_feature_map),
         {}),
        ("relu, n = s = 64, d = 2 (some queries all negative)", _relu_case(), {}),
    ]


exercise_6_3 = Exercise("6.3", "diagnose a feature map's normalisers", _positivity_reference, _cases_6_3,
                        MISTAKES_6_3, names=("normaliser", "negative_weights", "bad_rows"))

EXERCISES = [exercise_6_1, exercise_6_2, exercise_6_3]
