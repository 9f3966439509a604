"""Checks for the lesson 07 exercises (transformers are RNNs)."""

import os
import site
import sys
import sysconfig

import numpy as np

from course_lib.checks import Exercise, Mistake, Requirement
from course_lib.numpy import linear

EPS = 1e-6  # the library's default: added to the normaliser


def _phi(x):
    return linear.elu_feature_map(x)


# --- Exercise 7.1: a prompt in one pass, and the state it leaves --------------------------------
# Serving a prompt: its outputs come from the parallel causal form (no loop over its tokens), and
# generation goes on from the state (S, Z) after its last token, one RNN step per new token.

def _prefill_reference(q, k, v):
    """The definition: the RNN of Eqs. (7.2)-(7.3) run over the prompt, one token at a time."""
    state, outputs = None, []
    for t in range(q.shape[-2]):
        out, state = linear.linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], state)
        outputs.append(out)
    return np.stack(outputs, axis=-2), *state  # (..., n, e), S (..., f, e), Z (..., f)


def _prefill(*, phi=_phi, keys="causal", normaliser="causal", transpose_state=False):
    """Exercise 7.1's function in parallel form, with one slip (the defaults: none)."""
    masks = {"causal": np.tril, "strict": lambda w: np.tril(w, k=-1), "all": lambda w: w}

    def prefill(q, k, v):
        phi_q, phi_k = phi(q), phi(k)  # (..., n, f)
        kernel = phi_q @ np.swapaxes(phi_k, -1, -2)  # (..., n, n)
        weights = masks[keys](kernel)
        total = masks[normaliser](kernel).sum(axis=-1, keepdims=True)  # (..., n, 1)
        S = np.swapaxes(phi_k, -1, -2) @ v  # (..., f, e)
        return weights @ v / (total + EPS), (np.swapaxes(S, -1, -2) if transpose_state else S), phi_k.sum(axis=-2)
    return prefill


MISTAKES_7_1 = (
    Mistake("future-leak", _prefill(keys="all", normaliser="all"),
            "position i attended to every prompt token, later ones included: a token being generated cannot "
            "see the tokens after it. Keep key j ≤ query i only (np.tril of the n × n kernel, or prefix sums)."),
    Mistake("future-in-the-normaliser", _prefill(normaliser="all"),
            "the numerator stops at key i but the normaliser sums phi(q_i)·phi(k_j) over the whole prompt: "
            "Z_i = Σ_{j ≤ i} phi(k_j), the same keys as the numerator, or the weights do not sum to 1."),
    Mistake("token-misses-itself", _prefill(keys="strict", normaliser="strict"),
            "token i attends to itself too (j ≤ i, Eq. 7.1): np.tril(..., k=-1) drops the diagonal."),
    Mistake("missing-feature-map", _prefill(phi=lambda x: x),
            "the queries and keys were used as they are: apply the feature map phi = elu + 1 to q and k "
            "(Eq. 7.1); without it the weights can be negative and the normaliser can be 0."),
    Mistake("state-transposed", _prefill(transpose_state=True),
            "S is (f, e), Σ_j phi(k_j) v_jᵀ = phi(K)ᵀ V, the shape linear_attention_step reads; you returned "
            "Vᵀ phi(K)."),
)


def _cases_7_1():
    return [
        ("a prompt of 6 tokens, d = e = 4", _sequence_case(71, (), 6, 4, 4), {}),
        ("a prompt of 9 tokens, d = 5, e = 3 (d ≠ e: S is (f, e))", _sequence_case(72, (), 9, 5, 3), {}),
        ("a prompt of 1 token", _sequence_case(73, (), 1, 3, 2), {}),
        ("batched (b, h) = (2, 3), a prompt of 7 tokens, d = 6, e = 4", _sequence_case(74, (2, 3), 7, 6, 4), {}),
    ]


_LIBRARY = os.path.dirname(os.path.dirname(os.path.abspath(linear.__file__)))  # course_lib/
# What Exercise 7.1 asks the learner to write: the library's causal forms (in either tree) and the check's own
# reference, which runs the RNN.  Calling one of them passes the values and teaches nothing.
_FORBIDDEN = frozenset({"causal_linear_attention", "causal_linear_attention_from_features",
                        "causal_linear_attention_reference", "chunked_causal_sums"})


# Where Python's own modules and installed packages (NumPy, torch, …) live: their code is not the answer's,
# and its line count may depend on the sizes (np.einsum's path search with optimize=True does).
_INSTALLED = tuple(sorted({os.path.abspath(path) + os.sep for path in (
    *(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")),
    *site.getsitepackages(), site.getusersitepackages())}))


def _in_library(code):
    return os.path.abspath(code.co_filename).startswith(_LIBRARY + os.sep)


def _installed(code):
    """True for code from the standard library or an installed package other than course_lib."""
    filename = code.co_filename
    if filename.startswith("<frozen"):
        return True
    return not _in_library(code) and os.path.abspath(filename).startswith(_INSTALLED)


def _answers(code):
    """True for the answer's code: its function and any helper, in any notebook cell or file of its own."""
    return not _in_library(code) and not _installed(code)


def _forbidden(code):
    """The name of the library function ``code`` is, if the exercise asks for it to be written; else None."""
    if not _in_library(code):
        return None
    if code.co_name in _FORBIDDEN:
        return code.co_name
    if os.path.basename(os.path.dirname(os.path.abspath(code.co_filename))) == "checks":
        return f"the check's own {code.co_name}"
    return None


def _traced(candidate, n):
    """One call of ``candidate`` on a prompt of ``n`` tokens, traced: ``(Python work, forbidden calls)``.

    The work counts the lines the answer's own code runs — its function and the helpers it defines, in any
    cell — and the Python calls made from it or from the library (a C-level ``map`` over a library step, or
    over ``np.outer``, still makes one call per token). Lines and calls inside NumPy, torch or the standard
    library are not counted: they are the same for any length, except where they search (``np.einsum``'s path).
    """
    work, forbidden, own = 0, [], getattr(candidate, "__code__", None)

    def lines(frame, event, arg):
        nonlocal work
        work += event == "line"
        return lines

    def calls(frame, event, arg):
        nonlocal work
        caller = frame.f_back
        work += caller is not None and not _installed(caller.f_code)
        name = None if frame.f_code is own else _forbidden(frame.f_code)  # what it calls, not itself
        if name is not None and name not in forbidden:
            forbidden.append(name)
        return lines if _answers(frame.f_code) else None

    args = _sequence_case(75, (), n, 3, 2)
    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        candidate(*args)
    finally:
        sys.settrace(previous)
    return work, forbidden


def _no_library_call(candidate):
    """None when the answer calls none of the library functions that compute what the exercise asks for."""
    _, forbidden = _traced(candidate, 4)
    if not forbidden:
        return None
    return f"your function calls {forbidden[0]} from course_lib."  # the first: the others are inside it


def _no_loop(candidate):
    """None when the answer does as much Python work for a long prompt as for a short one: no loop over tokens."""
    (short, _), (long, _) = _traced(candidate, 4), _traced(candidate, 64)
    if long <= short + 8:  # a parallel answer: the same lines and calls whatever the length
        return None
    return (f"for a prompt of 64 tokens your function ran {long} lines and calls of Python code (its own, its "
            f"helpers' in any cell), for 4 tokens {short}: it loops over the prompt's positions.")


def _prefill_by_library(q, k, v):
    """The right values, with the outputs from the library's causal linear attention."""
    phi_k = _phi(k)  # (..., n, f)
    return linear.causal_linear_attention(q, k, v), np.swapaxes(phi_k, -1, -2) @ v, phi_k.sum(axis=-2)


REQUIREMENTS_7_1 = (
    Requirement("calls-the-library", _no_library_call,
                "the outputs are right, but they come from the library's causal linear attention (or the check's "
                "reference), the function this exercise asks you to write. Build them from elu_feature_map and "
                "NumPy: the causal n × n kernel (np.tril) or prefix sums (np.cumsum), then S and Z as sums over "
                "the prompt.",
                _prefill_by_library),
    Requirement("loops-over-positions", _no_loop,
                "the outputs are right, but they come from a loop over the prompt's tokens, the RNN of Section "
                "7.1 (in your function or in a helper it calls). A prompt is known in full: write Eq. (7.1) for "
                "every position at once (the causal n × n kernel, or prefix sums), and the state after n tokens "
                "as one sum over them.",
                _prefill_reference),
)

exercise_7_1 = Exercise("7.1", "a prompt in one pass, and the state it leaves", _prefill_reference, _cases_7_1,
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


def _sequence_case(seed, lead, n, d, e):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((*lead, n, d)), rng.standard_normal((*lead, n, d)), rng.standard_normal((*lead, n, e))


exercise_7_2 = Exercise("7.2", "a state that forgets: the parallel form of a decayed recurrence", _decay_reference,
                        _cases_7_2, MISTAKES_7_2, names=("decay", "outputs"))

EXERCISES = [exercise_7_1, exercise_7_2]
