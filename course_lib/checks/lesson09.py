"""Checks for the lesson 09 exercises (Eckart–Young truncation of P, signed weights, choosing a variant)."""

import numpy as np

from course_lib.checks import Exercise, Mistake

# --- Exercise 9.1: the best rank-k attention matrix (Eckart–Young) ------------------------------

def _truncated_reference(P, v, k):
    u, sigma, vt = np.linalg.svd(P, full_matrices=False)  # P = U Σ Vᵀ, singular values descending
    P_k = (u[..., :, :k] * sigma[..., None, :k]) @ vt[..., :k, :]  # (..., n, s): the top k terms
    return P_k, P_k @ v  # (..., n, e)


def _smallest_directions(P, v, k):
    vt = np.linalg.svd(P, full_matrices=False)[2][..., -k:, :]  # the k SMALLEST singular directions
    P_k = P @ np.swapaxes(vt, -1, -2) @ vt
    return P_k, P_k @ v


def _left_on_the_right(P, v, k):
    u = np.linalg.svd(P, full_matrices=False)[0][..., :, :k]  # (..., n, k): left singular vectors
    P_k = P @ u @ np.swapaxes(u, -1, -2)  # only defined for n = s, and wrong
    return P_k, P_k @ v


def _truncated_values(P, v, k):
    u, sigma, vt = np.linalg.svd(v, full_matrices=False)
    v_k = (u[..., :, :k] * sigma[..., None, :k]) @ vt[..., :k, :]  # the best rank-k V instead
    return P, P @ v_k


def _top_k_keys(P, v, k):
    strongest = np.argsort(-np.linalg.norm(P, axis=-2), axis=-1)[..., :k]  # (..., k): the most attended keys
    keep = np.zeros(P.shape[:-2] + P.shape[-1:], dtype=bool)
    np.put_along_axis(keep, strongest, True, axis=-1)
    P_k = np.where(keep[..., None, :], P, 0.0)
    return P_k, P_k @ v


MISTAKES_9_1 = (
    Mistake("smallest-directions", _smallest_directions,
            "you kept the k SMALLEST singular directions: np.linalg.svd returns them in descending order (keep "
            "the first k), np.linalg.eigh in ascending order (keep the last k)."),
    Mistake("left-on-the-right", _left_on_the_right,
            "P U_k U_kᵀ mixes the two sides: U's columns live in query space. Keep P's top-k terms, "
            "U_k Σ_k V_kᵀ — equivalently P V_k V_kᵀ or U_k U_kᵀ P."),
    Mistake("truncated-values", _truncated_values,
            "you truncated V, not P: Eckart–Young's rank-k truncation is of the attention matrix P; return "
            "P_k and P_k v."),
    Mistake("top-k-keys", _top_k_keys,
            "keeping the k most attended keys is a choice of k positions; the best rank-k matrix keeps k "
            "directions, mixtures of all s positions (the truncated SVD)."),
)


def _softmax_rows(rng, *shape, scale=2.0):
    scores = scale * rng.standard_normal(shape)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def _cases_9_1():
    rng = np.random.default_rng(91)
    return [
        ("n = s = 6, k = 2", (_softmax_rows(rng, 6, 6), rng.standard_normal((6, 3)), 2), {}),
        ("n = s = 10, k = 4", (_softmax_rows(rng, 10, 10), rng.standard_normal((10, 4)), 4), {}),
        ("batched (2, 3), n = s = 8, k = 3", (_softmax_rows(rng, 2, 3, 8, 8), rng.standard_normal((2, 3, 8, 5)), 3),
         {}),
        ("n = 5 queries, s = 7 keys, k = 2", (_softmax_rows(rng, 5, 7), rng.standard_normal((7, 3)), 2), {}),
    ]


exercise_9_1 = Exercise("9.1", "the best rank-k attention matrix (Eckart–Young)", _truncated_reference, _cases_9_1,
                        MISTAKES_9_1, names=("P_k", "output"), atol=1e-8, rtol=1e-6)


# --- Exercise 9.2: signed weights — the output and its cancellation ---------------------------------

def _signed(w, values, *, divide="signed", ratio="abs"):
    """The output of signed weights and each row's cancellation ratio (Eq. 9.2), with optional slips."""
    w, values = np.asarray(w, dtype=float), np.asarray(values, dtype=float)
    if divide == "relu":
        w = np.maximum(w, 0.0)
    z = w.sum(axis=-1)  # (..., n): the normaliser, a signed sum
    total = np.abs(w).sum(axis=-1)  # (..., n): Σ_j |w_ij|
    with np.errstate(divide="ignore", invalid="ignore"):  # a slip may divide by 0: its NaN is its answer
        out = (w @ values) / (np.abs(z) if divide == "abs" else z)[..., None]  # (..., n, e)
        cancel = {"abs": np.abs(z) / total, "signed": z / total, "sum-first": np.abs(z) / np.abs(z)}[ratio]
    return out, cancel


def _signed_reference(w, values):
    return _signed(w, values)


MISTAKES_9_2 = (
    Mistake("divided-by-abs", lambda *a: _signed(*a, divide="abs"),
            "a negative normaliser is harmless: w and z change sign together (E → −E leaves the output as it is), "
            "so divide by z itself; dividing by |z| flips every output whose z < 0."),
    Mistake("signed-ratio", lambda *a: _signed(*a, ratio="signed"),
            "the cancellation ratio is |z_i| / Σ_j |w_ij|, between 0 and 1: take the absolute value of z_i too "
            "(its sign says nothing, as the output shows)."),
    Mistake("sum-then-abs", lambda *a: _signed(*a, ratio="sum-first"),
            "Σ_j |w_ij| takes absolute values first, then sums; |Σ_j w_ij| is |z_i| itself, and the ratio is "
            "then always 1."),
    Mistake("dropped-negative-weights", lambda *a: _signed(*a, divide="relu"),
            "you clipped the negative weights: that is another attention, not the one Eq. (9.2) computes; keep "
            "the signed weights and measure how much they cancel."),
)


def _signed_case(rng, *lead, n, k, e):
    w = rng.standard_normal((*lead, n, k)) + 0.2  # mixed signs; some rows' sums are negative
    return w, rng.standard_normal((*lead, k, e))


def _cases_9_2():
    rng = np.random.default_rng(92)
    return [
        ("n = 6 queries, k = 4 projected keys, e = 3", _signed_case(rng, n=6, k=4, e=3), {}),
        ("n = 12, k = 5, e = 2", _signed_case(rng, n=12, k=5, e=2), {}),
        ("batched (2, 3), n = 8, k = 4, e = 5", _signed_case(rng, 2, 3, n=8, k=4, e=5), {}),
    ]


exercise_9_2 = Exercise("9.2", "signed weights: the output and its cancellation", _signed_reference, _cases_9_2,
                        MISTAKES_9_2, names=("output", "cancellation ratio"), atol=1e-9, rtol=1e-7)


# --- Exercise 9.3: choose a variant for a budget -----------------------------------------------

def _choose(times, peaks, causal_ok, fixed_length, *, need_causal, variable_length, memory_cap,
            check_memory=True, check_causal=True, check_length=True, by="time", strict=False):
    """Index of the fastest variant that meets every constraint (Section 9.5), or -1; optional slips."""
    times, peaks = np.asarray(times, dtype=float), np.asarray(peaks, dtype=float)
    ok = np.ones(len(times), dtype=bool)
    if check_memory:
        ok &= (peaks < memory_cap) if strict else (peaks <= memory_cap)
    if check_causal and need_causal:
        ok &= np.asarray(causal_ok, dtype=bool)
    if check_length and variable_length:
        ok &= ~np.asarray(fixed_length, dtype=bool)
    if not ok.any():
        return -1
    key = times if by == "time" else peaks
    return int(np.flatnonzero(ok)[np.argmin(key[ok])])


def _choose_reference(times, peaks, causal_ok, fixed_length, *, need_causal, variable_length, memory_cap):
    return _choose(times, peaks, causal_ok, fixed_length, need_causal=need_causal,
                   variable_length=variable_length, memory_cap=memory_cap)


def _slip(**slip):
    return lambda *a, **kw: _choose(*a, **kw, **slip)


MISTAKES_9_3 = (
    Mistake("ignores-memory", _slip(check_memory=False),
            "the pick exceeds the memory cap: drop every variant whose peak memory is above memory_cap first."),
    Mistake("ignores-causal", _slip(check_causal=False),
            "a decoder needs causal attention: Linformer (and any non-causal variant) mixes future keys into "
            "every projected key, so it is out when need_causal is True."),
    Mistake("ignores-fixed-length", _slip(check_length=False),
            "with variable lengths a fixed-length variant is out: Linformer's E has n_max columns, fixed at "
            "training time."),
    Mistake("strict-cap", _slip(strict=True),
            "a variant that uses exactly memory_cap bytes fits the budget: compare with <=, not <."),
    Mistake("least-memory", _slip(by="memory"),
            "you picked the variant with the least memory; among those within the budget pick the fastest."),
)

# The variants of Section 9.5's table at n = 8192, CPU (times in s, peaks in MiB): exact, SDPA,
# Linformer, linear, causal linear (chunked), FAVOR+.
_TIMES = [2.9, 1.1, 0.12, 0.08, 0.25, 0.4]
_PEAKS = [2100.0, 20.0, 40.0, 30.0, 35.0, 90.0]
_CAUSAL = [True, True, False, False, True, False]
_FIXED = [False, False, True, False, False, False]


def _cases_9_3():
    table = (_TIMES, _PEAKS, _CAUSAL, _FIXED)
    return [
        ("encoder, fixed length, 64 MiB", table, dict(need_causal=False, variable_length=False, memory_cap=64.0)),
        ("decoder, 64 MiB", table, dict(need_causal=True, variable_length=True, memory_cap=64.0)),
        ("decoder, 30 MiB", table, dict(need_causal=True, variable_length=True, memory_cap=30.0)),
        ("encoder, variable length, exactly 30 MiB", table,
         dict(need_causal=False, variable_length=True, memory_cap=30.0)),
        ("encoder, fixed length, 4 GiB", ([2.9, 1.1, 0.12], [2100.0, 20.0, 40.0], [True, True, False],
                                         [False, False, True]),
         dict(need_causal=False, variable_length=False, memory_cap=4096.0)),
        ("encoder, variable length, 64 MiB, Linformer fastest", ([2.9, 1.1, 0.05, 0.08, 0.25, 0.4], *table[1:]),
         dict(need_causal=False, variable_length=True, memory_cap=64.0)),
        ("nothing fits", table, dict(need_causal=True, variable_length=False, memory_cap=10.0)),
        ("decoder, 3 GiB: exact or SDPA by time", ([2.9, 1.1], [2100.0, 20.0], [True, True], [False, False]),
         dict(need_causal=True, variable_length=False, memory_cap=3072.0)),
    ]


exercise_9_3 = Exercise("9.3", "choose a variant for a budget", _choose_reference, _cases_9_3, MISTAKES_9_3,
                        names=("index",), atol=0, rtol=0)

EXERCISES = [exercise_9_1, exercise_9_2, exercise_9_3]
