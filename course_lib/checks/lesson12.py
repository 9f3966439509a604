"""Checks for the lesson 12 exercises (chunkwise-parallel gating and the delta rule)."""

import numpy as np

from course_lib.checks import Exercise, Mistake, Requirement
from course_lib.checks._tracing import calls_forbidden, loop_grows
from course_lib.numpy import delta, gated


def _rng(seed):
    return np.random.default_rng(seed)


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


# --- Exercise 12.1: Gated DeltaNet's W and U — where the decay enters ---------------------------
# With a decay per head, S_r = a_r (I − β_r k_r k_rᵀ) S_{r−1} + β_r k_r v_rᵀ.  From a chunk's entering
# state S the values actually written are Ũ = U − W S (Eq. 12.7): the learner derives where e^{G}
# enters W, U and the triangular system, and builds them without the library's UT transform.

def _strict_decay(G):
    """exp(G_r − G_t) for t < r, 0 elsewhere: differences masked (−inf) before exp."""
    c = G.shape[-1]
    diff = G[..., :, None] - G[..., None, :]  # (..., c, c)
    return np.exp(np.where(np.tril(np.ones((c, c), bool), -1), diff, -np.inf))


def _gated_wy(*, decay_gram=True, decay_keys=True, decay_values=False, inclusive=True, sign=1.0, with_beta=True,
              diagonal=False):
    """W, U of one Gated DeltaNet chunk, with one slip (the defaults: none)."""

    def wy(k, v, beta, log_decay):
        G = np.cumsum(log_decay, axis=-1) - (0.0 if inclusive else log_decay)  # (..., c)
        c = k.shape[-2]
        with np.errstate(over="ignore"):
            gamma = _strict_decay(sign * G) if decay_gram else np.tril(np.ones((c, c)), -1)
        if diagonal:  # masked_decay's default keeps j = i, where e^{G_r - G_r} = 1: L's diagonal becomes 1 + β_r‖k_r‖²
            gamma = gamma + np.eye(c)
        lower = np.eye(c) + beta[..., :, None] * (k @ np.swapaxes(k, -1, -2)) * gamma  # (..., c, c)
        scale = beta[..., :, None] if with_beta else 1.0
        decay = np.exp(G)[..., :, None]  # (..., c, 1)
        W = np.linalg.solve(lower, scale * (decay * k if decay_keys else k))
        U = np.linalg.solve(lower, scale * (decay * v if decay_values else v))
        return W, U
    return wy


def _gated_wy_reference(k, v, beta, log_decay):
    """The library's UT transform with the decay (Eq. 12.6 with Γ): W = T (e^G ⊙ K), U = T V."""
    T = delta.ut_transform(k, beta, log_decay)  # (..., c, c)
    return T @ (np.exp(np.cumsum(log_decay, axis=-1))[..., :, None] * k), T @ v


MISTAKES_12_1 = (
    Mistake("keys-not-decayed", _gated_wy(decay_keys=False),
            "key r reads the entering state after it has decayed by e^{G_r} (G_r = Σ_{s≤r} log a_s): the part of Ũ "
            "that depends on S is T (e^{G} ⊙ K) S, so W = T (e^{G} ⊙ K), not T K."),
    Mistake("gram-not-decayed", _gated_wy(decay_gram=False),
            "an earlier write ũ_t has decayed by e^{G_r − G_t} when key r reads it: the entries below the diagonal "
            "of the triangular system are β_r e^{G_r − G_t} k_rᵀ k_t (the Γ of Eq. 12.2, diagonal excluded), not "
            "DeltaNet's β_r k_rᵀ k_t."),
    Mistake("decay-exclusive", _gated_wy(inclusive=False),
            "a_r decays the state *before* the write at r (S_r = a_r (I − β_r k_r k_rᵀ) S_{r−1} + β_r k_r v_rᵀ): "
            "G_r = Σ_{s≤r} log a_s includes log a_r — np.cumsum, not the cumulative sum shifted by one."),
    Mistake("values-decayed", _gated_wy(decay_values=True),
            "v_r is written at position r and has not decayed yet: U = T V. The decay enters through what the keys "
            "read — the entering state (W) and the earlier writes (the system's entries) — never the values."),
    Mistake("decay-reversed", _gated_wy(sign=-1.0),
            "older writes have decayed more: the factor for t < r is e^{G_r − G_t} ≤ 1 (G falls along the chunk), "
            "not e^{G_t − G_r} ≥ 1."),
    Mistake("diagonal-in-the-system", _gated_wy(diagonal=True),
            "the system's decayed products of keys stop below the diagonal (t < r): a write does not read itself, so "
            "L's diagonal is 1, not 1 + β_r‖k_r‖². masked_decay(G) keeps the diagonal (j ≤ i, as the outputs need); "
            "here use masked_decay(G, inclusive=False), or np.tril(…, −1)."),
    Mistake("beta-missing", _gated_wy(with_beta=False),
            "T = (I + tril(Diag(β) (Γ ⊙ K Kᵀ), −1))⁻¹ Diag(β): both W and U carry β_r on the right-hand side, as "
            "each write does (β_r k_r (v_r − …)ᵀ)."),
)


def _cases_12_1():
    cases = []
    for description, seed, lead, c, d, e, rate in (
            ("one chunk of 6, d = 4, e = 3, log a in (−0.6, −0.2)", 121, (), 6, 4, 3, 0.4),
            ("a gate of exactly 1 (log a = 0): DeltaNet's W = T K, U = T V", 122, (), 8, 5, 2, 0.0),
            ("one chunk of 16, d = 8, e = 6, strong decays (log a ≈ −2)", 123, (), 16, 8, 6, 2.0),
            ("batched (2, 3) chunks of 9, d = 6, e = 4", 124, (2, 3), 9, 6, 4, 0.3)):
        rng = _rng(seed)
        k = _unit(rng.standard_normal((*lead, c, d)))
        v = rng.standard_normal((*lead, c, e))
        beta = rng.uniform(0.1, 1.0, (*lead, c))
        log_decay = -rate * rng.uniform(0.5, 1.5, (*lead, c))
        cases.append((description, (k, v, beta, log_decay), {}))
    return cases


# What Exercise 12.1 asks the learner to build: the library's UT transform and delta rule (either tree), and the
# check's own reference.  masked_decay (Eq. 12.2, built in §12.1) may be used.
_FORBIDDEN_12_1 = frozenset({"ut_transform", "delta_rule_attention", "delta_rule_step", "delta_product_attention",
                             "delta_product_step", "channel_scores", "_forward_substitution", "_chunked", "_loop"})


def _wy_calls_no_library(candidate):
    return calls_forbidden(candidate, _cases_12_1()[0][1], _FORBIDDEN_12_1)


REQUIREMENTS_12_1 = (
    Requirement("calls-the-library", _wy_calls_no_library,
                "the values are right, but they come from the library's UT transform (or delta rule), the "
                "computation this exercise asks you to derive. Write the triangular system yourself: L = I + the "
                "entries below the diagonal, β_r e^{G_r − G_t} k_rᵀ k_t, and solve L X = Diag(β) (…) with "
                "np.linalg.solve, or substitute forward one position at a time.",
                _gated_wy_reference),
)

exercise_12_1 = Exercise("12.1", "Gated DeltaNet's W and U: where the decay enters", _gated_wy_reference,
                         _cases_12_1, MISTAKES_12_1, names=("W", "U"), atol=1e-9, rtol=1e-7,
                         requirements=REQUIREMENTS_12_1)


# --- Exercise 12.2: find the bug in a chunked decay that overflows ----------------------------
# The lesson's overflowing version splits e^{G_i − G_j} into e^{G_i} · e^{−G_j}; the learner writes
# the chunked form that exponentiates only masked differences (Eqs. 12.1-12.3).

def _decay_reference(q, k, v, log_decay, chunk_size):
    return gated.gated_linear_attention(q, k, v, log_decay, chunk_size=None)  # the token loop: the definition


def _chunked_with(*, split=False, inclusive=True, decay_query=True, carry="last"):
    """Chunked decayed linear attention (one decay per head) with one slip (the defaults: none)."""

    def attention(q, k, v, log_decay, chunk_size):
        with np.errstate(over="ignore", invalid="ignore"):  # the split form's inf and NaN are its point
            return _chunked_loop(q, k, v, log_decay, chunk_size)

    def _chunked_loop(q, k, v, log_decay, chunk_size):
        n = q.shape[-2]
        out = np.zeros(q.shape[:-1] + v.shape[-1:], dtype=np.result_type(q, v))
        state = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=out.dtype)
        for start in range(0, n, chunk_size):
            part = slice(start, min(start + chunk_size, n))
            qc, kc, vc = q[..., part, :], k[..., part, :], v[..., part, :]
            G = np.cumsum(log_decay[..., part], axis=-1)  # (..., c)
            c = G.shape[-1]
            below = np.tril(np.ones((c, c), bool), 0 if inclusive else -1)
            if split:
                decay_ij = np.where(below, np.exp(G)[..., :, None] * np.exp(-G)[..., None, :], 0.0)
            else:
                decay_ij = np.exp(np.where(below, G[..., :, None] - G[..., None, :], -np.inf))
            scores = (qc @ np.swapaxes(kc, -1, -2)) * decay_ij
            carried = np.exp(G)[..., None] * (qc @ state) if decay_query else qc @ state
            out[..., part, :] = carried + scores @ vc
            end = G[..., -1:] if carry == "last" else G[..., :1]
            state = np.exp(end)[..., None] * state + np.swapaxes(kc * np.exp(end - G)[..., None], -1, -2) @ vc
        return out
    return attention


MISTAKES_12_2 = (
    Mistake("split-exponent", _chunked_with(split=True),
            "e^{G_i}·e^{−G_j} is the starting point's bug: e^{−G_j} passes 3.4e38 once the chunk's cumulative log "
            "decay passes 88.72 in float32, and inf·0 = NaN. Subtract first, mask (−inf above the diagonal), then "
            "exp."),
    Mistake("diagonal-dropped", _chunked_with(inclusive=False),
            "o_i includes its own key (j ≤ i, Eq. 12.1): the mask keeps the diagonal, where e^{G_i − G_i} = 1."),
    Mistake("carried-state-not-decayed", _chunked_with(decay_query=False),
            "the state that enters the chunk has decayed by e^{G_i} by position i (Eq. 12.1): multiply q_i Sᵀ by it."),
    Mistake("state-decayed-to-the-first-position", _chunked_with(carry="first"),
            "the state leaving a chunk has decayed over the whole chunk: e^{G_c} with G_c the last cumulative "
            "log decay, and each write k_j v_jᵀ by e^{G_c − G_j} (Eq. 12.3)."),
)


def _cases_12_2():
    cases = []
    for description, seed, (lead, n, d, e), rate, chunk, dtype in (
            ("n = 20, chunk 8, gentle decay (log a ≈ −0.1), float64", 221, ((), 20, 4, 3), 0.1, 8, np.float64),
            ("n = 50, chunk 16, chunks that do not divide n, float64", 222, ((2,), 50, 5, 4), 0.5, 16, np.float64),
            ("n = 256, chunk 64, log a ≈ −3 per token, float32: the split form overflows", 223, ((2,), 256, 8, 8),
             3.0, 64, np.float32),
            ("n = 128, chunk 128, log a = −30 per token (a decay of 1e-13), float32", 224, ((), 128, 4, 4), 30.0,
             128, np.float32)):
        rng = _rng(seed)
        q, k = (rng.standard_normal((*lead, n, d)) / np.sqrt(d) for _ in range(2))
        v = rng.standard_normal((*lead, n, e))
        log_decay = -rate * rng.uniform(0.5, 1.5, size=(*lead, n))
        cases.append((description, tuple(x.astype(dtype) for x in (q, k, v, log_decay)) + (chunk,), {}))
    return cases


def _decay_case(seed, n, chunk, rate, dtype):
    """One unbatched case of Exercise 12.2: (q, k, v, log_decay, chunk_size)."""
    rng = _rng(seed)
    q, k = (rng.standard_normal((n, 4)) / 2 for _ in range(2))
    v = rng.standard_normal((n, 3))
    return tuple(x.astype(dtype) for x in (q, k, v, -rate * rng.uniform(0.5, 1.5, n))) + (chunk,)


# What Exercise 12.2 asks the learner to write: the library's gated recurrence and its masked decay (either tree), and
# the check's own reference.
_FORBIDDEN_12_2 = frozenset({"gated_linear_attention", "gated_linear_attention_step", "masked_decay", "channel_scores",
                             "delta_rule_attention", "_chunked", "_loop"})


def _decay_calls_no_library(candidate):
    return calls_forbidden(candidate, _decay_case(225, 12, 4, 0.5, np.float64), _FORBIDDEN_12_2)


def _exp_overflows(candidate):
    """None when no ``np.exp`` inside the answer turns a finite exponent into inf on a float32 case of strong decays."""
    overflowed, exp = [], np.exp

    def watched_exp(x, *args, **kwargs):
        with np.errstate(over="ignore"):
            result = exp(x, *args, **kwargs)
        if np.any(np.isinf(result) & np.isfinite(x)):
            overflowed.append(float(np.max(np.where(np.isfinite(x), x, -np.inf))))
        return result

    np.exp = watched_exp
    try:
        candidate(*_decay_case(226, 128, 64, 3.0, np.float32))
    finally:
        np.exp = exp
    if not overflowed:
        return None
    return (f"on 128 float32 tokens in chunks of 64 with log a ≈ −3, np.exp overflowed inside your function (an "
            f"exponent of {overflowed[0]:.4g}, above 88.72).")


def _chunks_formed(candidate):
    """None when one chunk of 64 tokens costs the answer as much Python work as one chunk of 8 (no loop over tokens)."""
    grows = loop_grows(candidate, _decay_case(227, 8, 8, 0.5, np.float64), _decay_case(227, 64, 64, 0.5, np.float64))
    if grows is None:
        return None
    return (f"with the whole sequence as one chunk (chunk_size = n), your function ran {grows[1]} lines and calls of "
            f"Python code for n = 64 and {grows[0]} for n = 8: it loops over tokens, or ignores chunk_size.")


def _decay_by_library(q, k, v, log_decay, chunk_size):
    return gated.gated_linear_attention(q, k, v, log_decay, chunk_size=chunk_size)


def _exp_then_where(q, k, v, log_decay, chunk_size):
    """The right values from exp of every difference, then np.where: inf above the diagonal, discarded."""
    n, d, e = q.shape[-2], q.shape[-1], v.shape[-1]
    out, state = np.zeros(q.shape[:-1] + (e,), np.result_type(q, v)), np.zeros(q.shape[:-2] + (d, e))
    for start in range(0, n, chunk_size):
        part = slice(start, min(start + chunk_size, n))
        qc, kc, vc, G = q[..., part, :], k[..., part, :], v[..., part, :], np.cumsum(log_decay[..., part], axis=-1)
        below = np.tril(np.ones((G.shape[-1], G.shape[-1]), bool))
        Gamma = np.where(below, np.exp(G[..., :, None] - G[..., None, :]), 0.0)  # exp first: overflows above
        out[..., part, :] = np.exp(G)[..., None] * (qc @ state) + ((qc @ np.swapaxes(kc, -1, -2)) * Gamma) @ vc
        last = G[..., -1:]
        state = np.exp(last)[..., None] * state + np.swapaxes(kc * np.exp(last - G)[..., None], -1, -2) @ vc
    return out


def _token_loop(q, k, v, log_decay, chunk_size):
    """The right values from the recurrence, one token at a time: chunk_size ignored."""
    state = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    out = np.zeros(q.shape[:-1] + v.shape[-1:], np.result_type(q, v))
    for t in range(q.shape[-2]):
        state = np.exp(log_decay[..., t])[..., None, None] * state + k[..., t, :, None] * v[..., t, None, :]
        out[..., t, :] = np.einsum("...d,...de->...e", q[..., t, :], state)
    return out


REQUIREMENTS_12_2 = (
    Requirement("calls-the-library", _decay_calls_no_library,
                "the values are right, but they come from the library's gated linear attention (or its masked_decay), "
                "the computation this exercise asks you to write. Fix the starting point's exponent instead.",
                _decay_by_library),
    Requirement("exp-then-where", _exp_overflows,
                "the values are right, but exp overflows before np.where discards the result: §12.2 ('Masking after "
                "exp is not enough') — in a model the backward pass multiplies the discarded branch's gradient, 0, "
                "by inf and every parameter gets NaN. Mask the exponent first (−inf above the diagonal), then exp: "
                "every exponent that reaches exp is ≤ 0.",
                _exp_then_where),
    Requirement("never-forms-a-chunk", _chunks_formed,
                "the values are right, but your function never forms a chunk: it steps through the tokens (or uses "
                "a chunk size of its own). Eqs. (12.1)-(12.3) take chunk_size tokens at a time: one c × c product "
                "inside a chunk, one state update between chunks (§12.1).",
                _token_loop),
)

exercise_12_2 = Exercise("12.2", "find the bug in a chunked decay that overflows", _decay_reference, _cases_12_2,
                         MISTAKES_12_2, names=("output",), atol=1e-4, rtol=1e-4, requirements=REQUIREMENTS_12_2)


# --- Exercise 12.3: the chunked delta rule's FLOPs, then which chunk is fastest ---------------
# Count (2 FLOPs per multiply-add) the products of Eq. (12.7) over a sequence of n tokens in
# chunks of c: K Kᵀ and Q Kᵀ (c² d each), the triangular solve for W and U (half of a c × c by
# c × (d + e) product), W S, Q S and Kᵀ Ũ (c d e each), and the scores times Ũ (c² e).

def _flops(n, c, d, e, *, solve=0.5, state=True, gram=True, per_chunk=True, per_flop=2, inverse=False):
    chunks = n / c if per_chunk else 1
    solve_work = c**3 + c * c * (d + e) if inverse else solve * c * c * (d + e)  # inverse: c³, then T [K V] in full
    products = c * c * d * (2 if gram else 1) + solve_work + c * c * e + (3 * c * d * e if state else 0)
    return float(per_flop * chunks * products)


def _flops_reference(n, c, d, e):
    return _flops(n, c, d, e)


MISTAKES_12_3 = (
    Mistake("solve-forgotten", lambda n, c, d, e: _flops(n, c, d, e, solve=0.0),
            "the UT transform costs a triangular solve per chunk: (I + tril(...))⁻¹ applied to c × (d + e) right-hand "
            "sides, half of a c × c product because the matrix is triangular."),
    Mistake("explicit-inverse", lambda n, c, d, e: _flops(n, c, d, e, inverse=True),
            "the count never forms the inverse: the chunk needs only W and U, and forward substitution applies "
            "(I + tril(...))⁻¹ to the c × (d + e) right-hand sides directly (the library's PyTorch form solves for "
            "them at once), half of a c × c by c × (d + e) product. An explicit inverse (about c³ multiply-adds) "
            "followed by full products T K and T V counts work that this solve does not do."),
    Mistake("solve-counted-in-full", lambda n, c, d, e: _flops(n, c, d, e, solve=1.0),
            "the matrix is lower triangular: forward substitution does half of a full c × c product's multiply-adds."),
    Mistake("state-products-forgotten", lambda n, c, d, e: _flops(n, c, d, e, state=False),
            "three products per chunk touch the d × e state: W S, Q S and Kᵀ Ũ, c·d·e multiply-adds each."),
    Mistake("one-chunk-only", lambda n, c, d, e: _flops(n, c, d, e, per_chunk=False),
            "that is one chunk's count: a sequence of n tokens has n / c chunks."),
    Mistake("multiply-adds-not-flops", lambda n, c, d, e: _flops(n, c, d, e, per_flop=1),
            "the course counts 2 FLOPs per multiply-add (a multiply and an add), as the benchmark harness does."),
    Mistake("gram-forgotten", lambda n, c, d, e: _flops(n, c, d, e, gram=False),
            "two c × c products with the keys per chunk: K Kᵀ (for the UT transform) and Q Kᵀ (for the scores)."),
)


def _cases_12_3():
    return [
        ("n = 1,024, c = 16, d = 32, e = 48 (d ≠ e)", (1024, 16, 32, 48), {}),  # e ≠ 2d: c²e/2 ≠ c²d, slips stay apart
        ("n = 4,096, c = 32, d = e = 64 (the benchmark's setting)", (4096, 32, 64, 64), {}),
        ("n = 4,096, c = 128, d = e = 64", (4096, 128, 64, 64), {}),
        ("n = 64, c = 64, d = 16, e = 8: one chunk", (64, 64, 16, 8), {}),
    ]


exercise_12_3 = Exercise("12.3", "the chunked delta rule's FLOPs", _flops_reference, _cases_12_3, MISTAKES_12_3,
                         names=("FLOPs",), atol=0.0, rtol=1e-9)

EXERCISES = [exercise_12_1, exercise_12_2, exercise_12_3]
