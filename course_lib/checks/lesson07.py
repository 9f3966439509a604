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


# --- Exercise 7.2: the RNN over a sequence equals the parallel causal form ------------------

def _loop_reference(q, k, v):
    return linear.causal_linear_attention(q, k, v)


def _loop(*, after_update=True, accumulate=True):
    """The exercise's function, made with one slip."""
    def loop(q, k, v):
        phi_q, phi_k = _phi(q), _phi(k)
        S = np.zeros((*q.shape[:-2], phi_k.shape[-1], v.shape[-1]))  # (..., f, e)
        Z = np.zeros((*q.shape[:-2], phi_k.shape[-1]))  # (..., f)
        outputs = []
        for t in range(q.shape[-2]):
            update_S = phi_k[..., t, :, None] * v[..., t, None, :]
            if not after_update:  # read the state before this token is added
                outputs.append(np.einsum("...f,...fe->...e", phi_q[..., t, :], S)
                               / (np.einsum("...f,...f->...", phi_q[..., t, :], Z)[..., None] + EPS))
            S, Z = (S + update_S, Z + phi_k[..., t, :]) if accumulate else (update_S, phi_k[..., t, :])
            if after_update:
                outputs.append(np.einsum("...f,...fe->...e", phi_q[..., t, :], S)
                               / (np.einsum("...f,...f->...", phi_q[..., t, :], Z)[..., None] + EPS))
        return np.stack(outputs, axis=-2)
    return loop


MISTAKES_7_2 = (
    Mistake("output-before-update", _loop(after_update=False),
            "each output was read before its own token entered the state: position t attends to j ≤ t, "
            "itself included; update S and Z first, then compute the output (the first output is then not 0)."),
    Mistake("state-not-accumulated", _loop(accumulate=False),
            "S and Z were replaced at each step instead of accumulated: S ← S + phi(k_t) v_tᵀ keeps every "
            "earlier token (Eq. 7.2)."),
)


def _sequence_case(seed, lead, n, d, e):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((*lead, n, d)), rng.standard_normal((*lead, n, d)), rng.standard_normal((*lead, n, e))


def _cases_7_2():
    return [
        ("n = 12, d = 4, e = 3", _sequence_case(75, (), 12, 4, 3), {}),
        ("n = 1 (one token)", _sequence_case(76, (), 1, 3, 2), {}),
        ("batched (b, h) = (2, 2), n = 16, d = e = 5", _sequence_case(77, (2, 2), 16, 5, 5), {}),
    ]


exercise_7_2 = Exercise("7.2", "the RNN over a sequence equals causal linear attention", _loop_reference,
                        _cases_7_2, MISTAKES_7_2, names=("outputs",))

EXERCISES = [exercise_7_1, exercise_7_2]
