"""Checks for the lesson 07 exercises (transformers are RNNs)."""

import numpy as np

from course_lib.checks import Exercise, Mistake, Requirement
from course_lib.checks._tracing import calls_forbidden, loop_grows
from course_lib.numpy import linear

EPS = 1e-6  # the library's default: added to the normaliser


def _phi(x):
    return linear.elu_feature_map(x)


# --- Exercise 7.1: a block of tokens from a carried state, in one pass ---------------------------
# Chunked prefill: a server that already holds the state (S, Z) of everything before (earlier blocks of
# the prompt, earlier turns of a chat) receives a block of c tokens. Their outputs are the RNN's, but the
# block is known in full: the state's contribution plus a causal c × c kernel inside the block, and the
# next state is the old one plus the block's sums. The definition is the RNN, one step per token.

def _block_reference(q, k, v, S, Z):
    """The definition: the RNN of Eqs. (7.2)-(7.3) run over the block, one token at a time, from (S, Z)."""
    state, outputs = (S, Z), []
    for t in range(q.shape[-2]):
        out, state = linear.linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], state)
        outputs.append(out)
    return np.stack(outputs, axis=-2), *state  # (..., c, e), S (..., f, e), Z (..., f)


def _block(*, phi=_phi, keys="causal", normaliser="causal", old_in_numerator=True, old_in_normaliser=True,
           carry=True, transpose_state=False):
    """Exercise 7.1's function in parallel form, with one slip (the defaults: none)."""
    masks = {"causal": np.tril, "strict": lambda w: np.tril(w, k=-1), "all": lambda w: w}

    def prefill(q, k, v, S, Z):
        phi_q, phi_k = phi(q), phi(k)  # (..., c, f)
        kernel = phi_q @ np.swapaxes(phi_k, -1, -2)  # (..., c, c)
        numerator = masks[keys](kernel) @ v + (phi_q @ S if old_in_numerator else 0.0)  # (..., c, e)
        total = masks[normaliser](kernel).sum(axis=-1)  # (..., c)
        if old_in_normaliser:
            total = total + np.einsum("...cf,...f->...c", phi_q, Z)
        S_new = np.swapaxes(phi_k, -1, -2) @ v + (S if carry else 0.0)  # (..., f, e)
        Z_new = phi_k.sum(axis=-2) + (Z if carry else 0.0)  # (..., f)
        return (numerator / (total[..., None] + EPS), np.swapaxes(S_new, -1, -2) if transpose_state else S_new,
                Z_new)
    return prefill


MISTAKES_7_1 = (
    Mistake("future-leak", _block(keys="all", normaliser="all"),
            "token i of the block attended to the whole block, later tokens included: a token cannot see the "
            "tokens after it. Inside the block keep key j ≤ query i only (np.tril of the c × c kernel)."),
    Mistake("future-in-the-normaliser", _block(normaliser="all"),
            "the numerator stops at key i but the normaliser sums phi(q_i)·phi(k_j) over the whole block: it "
            "runs over the same keys as the numerator (the earlier state and j ≤ i), or the weights do not sum to 1."),
    Mistake("token-misses-itself", _block(keys="strict", normaliser="strict"),
            "token i attends to itself too (j ≤ i, Eq. 7.1): np.tril(..., k=-1) drops the diagonal."),
    Mistake("missing-feature-map", _block(phi=lambda x: x),
            "the queries and keys were used as they are: apply the feature map phi = elu + 1 to q and k "
            "(Eq. 7.1); without it the weights can be negative and the normaliser can be 0."),
    Mistake("earlier-tokens-ignored", _block(old_in_numerator=False, old_in_normaliser=False),
            "the outputs read the block alone, as if it were the whole prompt: every token also sees everything "
            "before the block, which the state holds. Add phi(q_i)ᵀ S to the numerator and phi(q_i)·Z to the "
            "normaliser."),
    Mistake("earlier-tokens-missing-from-the-normaliser", _block(old_in_normaliser=False),
            "the numerator reads the carried S, but the normaliser counts the block's keys only: it needs "
            "phi(q_i)·Z as well, the same earlier keys as the numerator."),
    Mistake("state-not-carried", _block(carry=False),
            "the outputs are right, but the state you return holds the block's tokens only: the next block must "
            "also see everything before this one. Return S + Σ_j phi(k_j) v_jᵀ and Z + Σ_j phi(k_j)."),
    Mistake("state-transposed", _block(transpose_state=True),
            "S is (f, e), Σ_j phi(k_j) v_jᵀ = phi(K)ᵀ V, the shape linear_attention_step reads; you returned "
            "its transpose."),
)


def _sequence_case(seed, lead, n, d, e):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((*lead, n, d)), rng.standard_normal((*lead, n, d)), rng.standard_normal((*lead, n, e))


def _block_case(seed, lead, before, c, d, e):
    """A block of ``c`` tokens and the state (S, Z) that ``before`` earlier tokens left (zeros for none)."""
    q, k, v = _sequence_case(seed, lead, before + c, d, e)
    phi_k = _phi(k[..., :before, :])  # (..., before, f)
    S, Z = np.swapaxes(phi_k, -1, -2) @ v[..., :before, :], phi_k.sum(axis=-2)  # (..., f, e), (..., f)
    return q[..., before:, :], k[..., before:, :], v[..., before:, :], S, Z


def _cases_7_1():
    return [
        ("a block of 6 tokens after 10, d = e = 4", _block_case(71, (), 10, 6, 4, 4), {}),
        ("a block of 5 after 7, d = 5, e = 3 (d ≠ e: S is (f, e))", _block_case(72, (), 7, 5, 5, 3), {}),
        ("the first block: 4 tokens, an empty state", _block_case(73, (), 0, 4, 3, 2), {}),
        ("a block of 1 token after 20", _block_case(76, (), 20, 1, 3, 3), {}),
        ("batched (b, h) = (2, 3), a block of 7 after 5, d = 6, e = 4", _block_case(74, (2, 3), 5, 7, 6, 4), {}),
    ]


# What Exercise 7.1 asks the learner to write: the library's causal forms (in either tree) and the check's own
# reference, which runs the RNN.  Calling one of them gives the values and teaches nothing.
_FORBIDDEN = frozenset({"causal_linear_attention", "causal_linear_attention_from_features",
                        "causal_linear_attention_reference", "chunked_causal_sums"})


def _no_library_call(candidate):
    """None when the answer calls none of the library functions that compute what the exercise asks for."""
    return calls_forbidden(candidate, _block_case(75, (), 3, 4, 3, 2), _FORBIDDEN)


def _no_loop(candidate):
    """None when the answer does as much Python work for a long block as for a short one: no loop over tokens."""
    grows = loop_grows(candidate, _block_case(75, (), 3, 4, 3, 2), _block_case(75, (), 3, 64, 3, 2))
    if grows is None:
        return None
    return (f"for a block of 64 tokens your function ran {grows[1]} lines and calls of Python code (its own, its "
            f"helpers' in any cell), for 4 tokens {grows[0]}: it loops over the block's positions.")


def _block_by_library(q, k, v, S, Z):
    """The right values, with the block's own part from the library's chunked causal sums."""
    phi_q, phi_k = _phi(q), _phi(k)  # (..., c, f)
    within, within_total = linear.chunked_causal_sums(phi_q, phi_k, v, q.shape[-2])
    total = within_total + np.einsum("...cf,...f->...c", phi_q, Z)
    return ((within + phi_q @ S) / (total[..., None] + EPS), S + np.swapaxes(phi_k, -1, -2) @ v,
            Z + phi_k.sum(axis=-2))


REQUIREMENTS_7_1 = (
    Requirement("calls-the-library", _no_library_call,
                "the values are right, but part of them comes from the library's causal linear attention (or the "
                "check's reference), the computation this exercise asks you to write. Build it from "
                "elu_feature_map and NumPy: the carried state's part, phi(Q) S and phi(Q) Z, plus the causal "
                "c × c kernel of the block (np.tril).",
                _block_by_library),
    Requirement("loops-over-positions", _no_loop,
                "the values are right, but they come from a loop over the block's tokens, the RNN of Section 7.1 "
                "(in your function or in a helper it calls). The block is known in full: what the earlier tokens "
                "give every position is one product with the carried state, what the block gives is one causal "
                "c × c kernel, and the next state is the old one plus one sum over the block.",
                _block_reference),
)

exercise_7_1 = Exercise("7.1", "a block of tokens from a carried state, in one pass", _block_reference, _cases_7_1,
                        MISTAKES_7_1, names=("outputs", "S", "Z"), requirements=REQUIREMENTS_7_1)


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


def _masked_power(n, gamma):
    """γ^(i − j) over the whole square, then times the causal mask: 0 ** (negative) = inf, and inf · 0 = NaN."""
    distance = np.arange(n)[:, None] - np.arange(n)[None, :]  # (n, n): i − j
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(gamma) ** distance * (distance >= 0)


def _decayed(*, shift=0, sign=1, causal=True, decay_normaliser=True, mask="where"):
    """Exercise 7.2's function in parallel form, with one slip (the defaults: none)."""
    def attention(q, k, v, gamma):
        decay = (_masked_power(q.shape[-2], gamma) if mask == "multiply"
                 else _decay_matrix(q.shape[-2], gamma, shift=shift, sign=sign, causal=causal))  # (n, n)
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
    Mistake("negative-power-masked-by-multiplying", _decayed(mask="multiply"),
            "NaN at γ = 0: above the diagonal i − j is negative, and 0 ** (a negative power) is inf; multiplying "
            "by the causal mask then gives inf · 0 = NaN. Never raise γ to a negative power: select with "
            "np.where(i >= j, γ ** np.maximum(i − j, 0), 0), or np.tril the matrix of non-negative exponents."),
)


def _cases_7_2():
    return [
        ("n = 6, d = e = 3, γ = 0.5", (*_sequence_case(78, (), 6, 3, 3), 0.5), {}),
        ("γ = 1: plain causal linear attention, n = 8, d = 4, e = 3", (*_sequence_case(79, (), 8, 4, 3), 1.0), {}),
        ("γ = 0: each position sees only itself, n = 5, d = e = 2", (*_sequence_case(80, (), 5, 2, 2), 0.0), {}),
        ("batched (b, h) = (2, 2), n = 12, d = e = 4, γ = 0.9", (*_sequence_case(77, (2, 2), 12, 4, 4), 0.9), {}),
    ]


exercise_7_2 = Exercise("7.2", "a state that forgets: the parallel form of a decayed recurrence", _decay_reference,
                        _cases_7_2, MISTAKES_7_2, names=("decay", "outputs"))

EXERCISES = [exercise_7_1, exercise_7_2]
