"""Checks for the lesson 11 exercises (what a fixed state remembers)."""

import numpy as np

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import delta, gated


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _pairs(seed, n_pairs, d, e):
    """``n_pairs`` random unit keys ``(N, d)`` and unit values ``(N, e)``."""
    rng = np.random.default_rng(seed)
    return _unit(rng.standard_normal((n_pairs, d))), _unit(rng.standard_normal((n_pairs, e)))


# --- Exercise 11.1: the sum rule's retrieval error, predicted and measured ---------------------
# S = Σ_j k_j v_jᵀ read with k_i gives v_i plus Σ_{j≠i} (k_iᵀk_j) v_j: N − 1 cross-talk terms, each
# of mean square 1/d for random unit keys, so the expected squared error is (N − 1)/d.

def _sum_rule_error(keys, values, *, count_itself=False, root=True, inverted=False, subtract=True, rms=True):
    """Exercise 11.1's answer with one slip (the defaults: none)."""
    n_pairs, d = keys.shape
    ratio = (n_pairs - (0 if count_itself else 1)) / d
    ratio = 1 / ratio if inverted else ratio
    predicted = float(np.sqrt(ratio) if root else ratio)
    state = keys.T @ values  # (d, e): Eq. (11.1)
    errors = np.linalg.norm(keys @ state - (values if subtract else 0), axis=-1)  # (N,): ‖Sᵀk_i − v_i‖
    measured = float(np.sqrt(np.mean(errors ** 2)) if rms else np.mean(errors))
    return predicted, measured


def _reference_11_1(keys, values):
    return _sum_rule_error(keys, values)


MISTAKES_11_1 = (
    Mistake("counts-itself", lambda keys, values: _sum_rule_error(keys, values, count_itself=True),
            "the stored pair k_i v_iᵀ is the signal, not noise: N − 1 other pairs talk across, so the mean square "
            "is (N − 1)/d, not N/d."),
    Mistake("no-square-root", lambda keys, values: _sum_rule_error(keys, values, root=False),
            "(N − 1)/d is the expected *squared* error; the RMS error is its square root."),
    Mistake("inverted", lambda keys, values: _sum_rule_error(keys, values, inverted=True),
            "the error grows with the number of pairs and shrinks with the key dimension: sqrt((N − 1)/d), not "
            "sqrt(d/(N − 1))."),
    Mistake("readout-not-error", lambda keys, values: _sum_rule_error(keys, values, subtract=False),
            "measured: the error is the read-out minus the stored value, ‖Sᵀk_i − v_i‖; you measured the read-out's "
            "own size."),
    Mistake("mean-of-norms", lambda keys, values: _sum_rule_error(keys, values, rms=False),
            "measured: the prediction is a root *mean square*: sqrt(mean_i ‖Sᵀk_i − v_i‖²), not the mean of the "
            "norms (which is smaller)."),
)


def _cases_11_1():
    return [
        ("N = 2 pairs, d = 16, e = 16", _pairs(111, 2, 16, 16), {}),
        ("N = 64 pairs, d = 32, e = 32 (N = 2d)", _pairs(112, 64, 32, 32), {}),
        ("N = 10 pairs, d = 64, e = 8 (e ≠ d)", _pairs(113, 10, 64, 8), {}),
        ("N = 1 pair, d = 4: nothing to talk across", _pairs(114, 1, 4, 3), {}),
    ]


exercise_11_1 = Exercise("11.1", "the sum rule's retrieval error, predicted and measured", _reference_11_1,
                         _cases_11_1, MISTAKES_11_1, names=("predicted", "measured"))


# --- Exercise 11.2: the delta rule's write ----------------------------------------------------
# S ← S + β k (v − Sᵀk)ᵀ: one step of gradient descent on ½‖Sᵀk − v‖² with step size β (Eq. 11.4).

def _reference_11_2(state, k, v, beta):
    return delta.delta_rule_step(k, k, v, beta, state)[1]  # the library's step: (o_t, S_t)


def _sum_write(state, k, v, beta):
    return state + beta * np.outer(k, v)


def _sign_flipped(state, k, v, beta):
    return state + beta * np.outer(k, state.T @ k - v)


def _untransposed_read(state, k, v, beta):
    return state + beta * np.outer(k, v - state @ k)


def _beta_on_write_only(state, k, v, beta):
    return state + beta * np.outer(k, v) - np.outer(k, state.T @ k)


def _outer_transposed(state, k, v, beta):
    return state + beta * np.outer(v - state.T @ k, k)


MISTAKES_11_2 = (
    Mistake("sum-rule", _sum_write,
            "that is the sum rule, S + β k vᵀ: it adds v on top of whatever k already reads. The delta rule writes "
            "the *difference* v − Sᵀk, the error of the current read-out."),
    Mistake("sign-flipped", _sign_flipped,
            "a gradient step goes *against* the gradient k (Sᵀk − v)ᵀ: S + β k (v − Sᵀk)ᵀ."),
    Mistake("untransposed-read", _untransposed_read,
            "S is (d, e), keys × values: the value stored under k is Sᵀk (shape e), not S k."),
    Mistake("beta-on-write-only", _beta_on_write_only,
            "β scales the whole correction, the erase k (Sᵀk)ᵀ as well as the write k vᵀ: S + β k (v − Sᵀk)ᵀ."),
    Mistake("outer-transposed", _outer_transposed,
            "the update is k (v − Sᵀk)ᵀ, a (d, e) outer product: key first, value second."),
)


def _cases_11_2():
    rng = np.random.default_rng(112)
    cases = []
    for description, d, e, beta in (("d = e = 4, β = 0.5", 4, 4, 0.5), ("d = 5, e = 3, β = 1", 5, 3, 1.0),
                                     ("d = 6, e = 6, β = 0.1", 6, 6, 0.1), ("d = 3, e = 2, β = 0", 3, 2, 0.0)):
        state = rng.standard_normal((d, e))
        cases.append((description, (state, _unit(rng.standard_normal(d)), rng.standard_normal(e), beta), {}))
    return cases


exercise_11_2 = Exercise("11.2", "the delta rule's write", _reference_11_2, _cases_11_2, MISTAKES_11_2,
                         names=("state",))


# --- Exercise 11.3: the bug in a gated update -------------------------------------------------
# S_t = a_t S_{t-1} + k_t v_tᵀ, o_t = S_tᵀ q_t (Eq. 11.3 with one decay per head): forget first, then write,
# then read.

def _reference_11_3(state, q, k, v, a):
    return gated.gated_linear_attention_step(q, k, v, np.log(a), state)  # (o_t (e,), S_t (d, e))


def _gated(*, after=False, on_query=False, read_first=False, complement=False):
    """Exercise 11.3's step with one slip (the defaults: none)."""
    def step(state, q, k, v, a):
        factor = 1 - a if complement else a
        if after:
            new = factor * (state + np.outer(k, v))
        elif on_query:
            new = state + np.outer(k, v)
        else:
            new = factor * state + np.outer(k, v)
        read = factor * state if read_first else new
        return read.T @ (factor * q if on_query else q), new
    return step


MISTAKES_11_3 = (
    Mistake("decay-after-write", _gated(after=True),
            "the decay is applied after the write, a (S + k vᵀ): the new pair is then decayed before it is ever "
            "read. Forget first, then write: a S + k vᵀ."),
    Mistake("decay-on-query", _gated(on_query=True),
            "the decay scales the query, not the state: that only rescales today's read-out, and the old pairs "
            "never fade. Multiply the state: S ← a S + k vᵀ."),
    Mistake("read-before-write", _gated(read_first=True),
            "the output read the state before this token's write: o_t = S_tᵀ q_t uses the state *after* k_t v_tᵀ."),
    Mistake("one-minus-a", _gated(complement=True),
            "a is what is kept (a = 1: nothing forgotten, linear attention), not what is forgotten: a S, not "
            "(1 − a) S."),
)


def _cases_11_3():
    rng = np.random.default_rng(113)
    cases = []
    for description, d, e, a in (("d = e = 4, a = 0.9", 4, 4, 0.9), ("d = 5, e = 3, a = 0.5", 5, 3, 0.5),
                                 ("d = 3, e = 2, a = 1 (no decay)", 3, 2, 1.0)):
        state = rng.standard_normal((d, e))
        q, k = rng.standard_normal(d), _unit(rng.standard_normal(d))
        cases.append((description, (state, q, k, rng.standard_normal(e), a), {}))
    return cases


exercise_11_3 = Exercise("11.3", "the bug in a gated update", _reference_11_3, _cases_11_3, MISTAKES_11_3,
                         names=("output", "state"))

EXERCISES = [exercise_11_1, exercise_11_2, exercise_11_3]
