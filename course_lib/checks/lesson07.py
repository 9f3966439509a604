"""Checks for the lesson 07 exercises (transformers are RNNs)."""

import numpy as np

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import linear

EPS = 1e-6  # the library's default: added to the normaliser


def _phi(x):
    return linear.elu_feature_map(x)


def _state_case(seed, lead, d, e, t):
    """q_t, k_t, v_t at position t + 1 and the state (S, Z) after t earlier random tokens."""
    rng = np.random.default_rng(seed)
    keys, values = rng.standard_normal((*lead, t, d)), rng.standard_normal((*lead, t, e))
    S = np.einsum("...sf,...se->...fe", _phi(keys), values)  # (..., f, e)
    Z = _phi(keys).sum(axis=-2)  # (..., f)
    q_t, k_t, v_t = rng.standard_normal((*lead, d)), rng.standard_normal((*lead, d)), rng.standard_normal((*lead, e))
    return q_t, k_t, v_t, S, Z


# --- Exercise 7.1: one RNN step ------------------------------------------------------------

def _step_reference(q_t, k_t, v_t, S, Z):
    out, (S, Z) = linear.linear_attention_step(q_t, k_t, v_t, (S, Z))
    return out, S, Z


def _step(*, phi=_phi, old_normaliser=False, outer=lambda a, b: a[..., :, None] * b[..., None, :], norm=True):
    """The exercise's function, made with one slip."""
    def step(q_t, k_t, v_t, S, Z):
        phi_q, phi_k = phi(q_t), phi(k_t)
        new_S, new_Z = S + outer(phi_k, v_t), Z + phi_k
        numerator = np.einsum("...f,...fe->...e", phi_q, new_S)
        normaliser = np.einsum("...f,...f->...", phi_q, Z if old_normaliser else new_Z)
        return (numerator / (normaliser[..., None] + EPS) if norm else numerator), new_S, new_Z
    return step


MISTAKES_7_1 = (
    Mistake("old-normaliser", _step(old_normaliser=True),
            "the normaliser used Z from before this token: update Z ← Z + phi(k_t) first, then divide by "
            "phi(q_t)·Z with the new Z, as the numerator uses the new S (Eq. 7.3)."),
    Mistake("outer-product-order", _step(outer=lambda a, b: b[..., :, None] * a[..., None, :]),
            "S is (f, e): add the outer product phi(k_t) v_tᵀ (phi_k[..., :, None] * v_t[..., None, :]), "
            "not v_t phi(k_t)ᵀ, or the output mixes the wrong features and values."),
    Mistake("missing-feature-map", _step(phi=lambda x: x),
            "the queries and keys were used as they are: apply the feature map phi = elu + 1 to q_t and k_t "
            "(Eq. 7.1); without it the weights can be negative and the normaliser can be 0."),
    Mistake("missing-normaliser", _step(norm=False),
            "the output is the numerator phi(q_t) S alone: divide it by phi(q_t)·Z + eps (Eq. 7.3)."),
)


def _cases_7_1():
    return [
        ("after 20 tokens, d = e = 5", _state_case(73, (), 5, 5, 20), {}),
        ("first token (empty state), d = e = 4", _empty_case(71, (), 4, 4), {}),
        ("after 10 tokens, d = 4, e = 3 (d ≠ e: S is (f, e))", _state_case(72, (), 4, 3, 10), {}),
        ("batched (b, h) = (2, 3), after 7 tokens, d = 6, e = 4", _state_case(74, (2, 3), 6, 4, 7), {}),
    ]


def _empty_case(seed, lead, d, e):
    q_t, k_t, v_t, S, Z = _state_case(seed, lead, d, e, 1)
    return q_t, k_t, v_t, np.zeros_like(S), np.zeros_like(Z)


exercise_7_1 = Exercise("7.1", "one step of the linear-attention RNN", _step_reference, _cases_7_1, MISTAKES_7_1,
                        names=("out_t", "S", "Z"))


# --- Exercise 7.2: a state that forgets, and its parallel form ------------------------------
# S_t = γ S_{t-1} + phi(k_t) v_tᵀ and Z_t = γ Z_{t-1} + phi(k_t): the recurrence of notebook 07 with a
# decay γ (RetNet's retention has this form).  The learner derives the parallel form: query i weighs
# key j ≤ i by γ^(i - j) phi(q_i)·phi(k_j), a causal (n, n) decay matrix times the kernel.

def _decay_matrix(n, gamma, *, shift=0, sign=1, causal=True):
    """``(n, n)``: γ^(sign·(i − j) + shift) where key j ≤ query i, else 0; not causal: γ^|i − j| everywhere."""
    distance = np.arange(n)[:, None] - np.arange(n)[None, :]  # (n, n): i − j
    if not causal:
        return float(gamma) ** np.abs(distance)
    with np.errstate(divide="ignore"):  # 0 ** (a negative power): only the reversed slip makes one
        return np.where(distance >= 0, float(gamma) ** (sign * np.maximum(distance, 0) + shift), 0.0)


def _recurrence(q, k, v, gamma):
    """The outputs of the decayed recurrence, one position at a time (the definition)."""
    phi_q, phi_k = _phi(q), _phi(k)
    S = np.zeros((*q.shape[:-2], phi_k.shape[-1], v.shape[-1]))  # (..., f, e)
    Z = np.zeros((*q.shape[:-2], phi_k.shape[-1]))  # (..., f)
    outputs = []
    for t in range(q.shape[-2]):
        S = gamma * S + phi_k[..., t, :, None] * v[..., t, None, :]
        Z = gamma * Z + phi_k[..., t, :]
        outputs.append(np.einsum("...f,...fe->...e", phi_q[..., t, :], S)
                       / (np.einsum("...f,...f->...", phi_q[..., t, :], Z)[..., None] + EPS))
    return np.stack(outputs, axis=-2)  # (..., n, e)


def _decay_reference(q, k, v, gamma):
    return _decay_matrix(q.shape[-2], gamma), _recurrence(q, k, v, gamma)


def _decayed(*, shift=0, sign=1, causal=True, decay_normaliser=True):
    """Exercise 7.2's function in parallel form, with one slip (the defaults: none)."""
    def attention(q, k, v, gamma):
        decay = _decay_matrix(q.shape[-2], gamma, shift=shift, sign=sign, causal=causal)  # (n, n)
        kernel = _phi(q) @ np.swapaxes(_phi(k), -1, -2)  # (..., n, n)
        weights = decay * kernel
        plain = np.tril(kernel) if causal else kernel
        normaliser = (weights if decay_normaliser else plain).sum(axis=-1)  # (..., n)
        with np.errstate(invalid="ignore", over="ignore"):
            return decay, weights @ v / (normaliser[..., None] + EPS)
    return attention


MISTAKES_7_2 = (
    Mistake("decay-off-by-one", _decayed(shift=1),
            "token t enters the state undecayed (S_t = γ S_{t−1} + phi(k_t) v_tᵀ), so key j reaches query i with "
            "weight γ^(i − j): γ⁰ = 1 for the token itself, not γ^(i − j + 1)."),
    Mistake("normaliser-not-decayed", _decayed(decay_normaliser=False),
            "Z decays like S (Z_t = γ Z_{t−1} + phi(k_t)): the normaliser is the row sum of the *decayed* weights "
            "γ^(i − j) phi(q_i)·phi(k_j), or the output is no longer an average."),
    Mistake("decay-reversed", _decayed(sign=-1),
            "older keys have been multiplied by γ more often: the weight is γ^(i − j) with i the query and j ≤ i "
            "the key, so it shrinks with the distance (γ < 1); γ^(j − i) grows with it."),
    Mistake("no-causal-mask", _decayed(causal=False),
            "the decay matrix must be 0 above the diagonal (j > i): query i never sees a later key. γ^|i − j| "
            "everywhere lets the future in."),
)


def _cases_7_2():
    return [
        ("n = 6, d = e = 3, γ = 0.5", (*_sequence_case(78, (), 6, 3, 3), 0.5), {}),
        ("γ = 1: plain causal linear attention, n = 8, d = 4, e = 3", (*_sequence_case(79, (), 8, 4, 3), 1.0), {}),
        ("γ = 0: each position sees only itself, n = 5, d = e = 2", (*_sequence_case(80, (), 5, 2, 2), 0.0), {}),
        ("batched (b, h) = (2, 2), n = 12, d = e = 4, γ = 0.9", (*_sequence_case(77, (2, 2), 12, 4, 4), 0.9), {}),
    ]


def _sequence_case(seed, lead, n, d, e):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((*lead, n, d)), rng.standard_normal((*lead, n, d)), rng.standard_normal((*lead, n, e))


exercise_7_2 = Exercise("7.2", "a state that forgets: the parallel form of a decayed recurrence", _decay_reference,
                        _cases_7_2, MISTAKES_7_2, names=("decay", "outputs"))

EXERCISES = [exercise_7_1, exercise_7_2]
