"""Checks for the lesson 12 exercises (chunkwise-parallel gating and the delta rule)."""

import numpy as np

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import delta, gated


def _rng(seed):
    return np.random.default_rng(seed)


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


# --- Exercise 12.1: the WY representation's keys, by induction ---------------------------------
# P_c ⋯ P_1 = I − Σ_t k_t w_tᵀ = I − Kᵀ W for the delta rule's factors P_t = I − β_t k_t k_tᵀ.
# The lesson derives the values' recurrence (u_r) and states the matrix form W = T K; the learner
# derives w_r's own recurrence.

def _wy_reference(k, beta):
    """W = T K (Eq. 12.6): the library's UT transform applied to the keys."""
    return delta.ut_transform(k, beta) @ k  # (..., c, d)


def _wy_loop(*, beta_inside=True, recurse=True, sign=-1.0, scale_beta=True):
    """w_r = β_r (k_r − Σ_{t<r} (k_tᵀ k_r) w_t), with one slip (the defaults: none)."""

    def wy(k, beta):
        w = np.zeros_like(k)
        for r in range(k.shape[-2]):
            earlier = w[..., :r, :] if recurse else beta[..., :r, None] * k[..., :r, :]
            overlap = np.einsum("...td,...d->...t", k[..., :r, :], k[..., r, :])  # k_tᵀ k_r, t < r
            correction = np.einsum("...t,...td->...d", overlap, earlier)
            b = beta[..., r, None] if scale_beta else 1.0
            if beta_inside:
                w[..., r, :] = b * (k[..., r, :] + sign * correction)
            else:
                w[..., r, :] = b * k[..., r, :] + sign * correction
        return w
    return wy


MISTAKES_12_1 = (
    Mistake("no-beta", _wy_loop(scale_beta=False),
            "each factor is P_t = I − β_t k_t k_tᵀ: w_r carries β_r (with β = 1 your answer would be right)."),
    Mistake("beta-on-the-key-only", _wy_loop(beta_inside=False),
            "β_r multiplies the whole bracket, k_r − Σ_{t<r} (k_tᵀ k_r) w_t: it comes from P_r = I − β_r k_r k_rᵀ "
            "acting on everything the earlier factors left, not on k_r alone."),
    Mistake("first-order-only", _wy_loop(recurse=False),
            "the correction uses the earlier w_t, not β_t k_t: expanding P_r (I − Σ_{t<r} k_t w_tᵀ) leaves "
            "k_r k_rᵀ k_t w_tᵀ terms, so w_r depends on every earlier w (a recursion, not one product)."),
    Mistake("plus-sign", _wy_loop(sign=+1.0),
            "the correction is subtracted: β_r k_r k_rᵀ (I − Σ_{t<r} k_t w_tᵀ) = β_r k_r (k_r − Σ_{t<r} (k_rᵀ k_t) "
            "w_t)ᵀ."),
)


def _cases_12_1():
    cases = []
    for description, seed, shape, beta_range in (
            ("one chunk of 6 unit keys, d = 4, β in (0, 1)", 121, (6, 4), (0.0, 1.0)),
            ("one chunk of 16 unit keys, d = 8, β = 1 (pure overwrites)", 122, (16, 8), (1.0, 1.0)),
            ("one key: w_1 = β_1 k_1", 123, (1, 5), (0.2, 0.9)),
            ("batched (2, 3) chunks of 9 keys, d = 6", 124, (2, 3, 9, 6), (0.0, 1.0))):
        rng = _rng(seed)
        k = _unit(rng.standard_normal(shape))
        beta = rng.uniform(*beta_range, size=shape[:-1])
        cases.append((description, (k, beta), {}))
    return cases


exercise_12_1 = Exercise("12.1", "the WY representation's keys, by induction", _wy_reference, _cases_12_1,
                         MISTAKES_12_1, names=("W",), atol=1e-9, rtol=1e-7)


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


exercise_12_2 = Exercise("12.2", "find the bug in a chunked decay that overflows", _decay_reference, _cases_12_2,
                         MISTAKES_12_2, names=("output",), atol=1e-4, rtol=1e-4)


# --- Exercise 12.3: the chunked delta rule's FLOPs, then which chunk is fastest ---------------
# Count (2 FLOPs per multiply-add) the products of Eq. (12.7) over a sequence of n tokens in
# chunks of c: K Kᵀ and Q Kᵀ (c² d each), the triangular solve for W and U (half of a c × c by
# c × (d + e) product), W S, Q S and Kᵀ Ũ (c d e each), and the scores times Ũ (c² e).

def _flops(n, c, d, e, *, solve=0.5, state=True, gram=True, per_chunk=True, per_flop=2):
    chunks = n / c if per_chunk else 1
    products = c * c * d * (2 if gram else 1) + solve * c * c * (d + e) + c * c * e + (3 * c * d * e if state else 0)
    return float(per_flop * chunks * products)


def _flops_reference(n, c, d, e):
    return _flops(n, c, d, e)


MISTAKES_12_3 = (
    Mistake("solve-forgotten", lambda n, c, d, e: _flops(n, c, d, e, solve=0.0),
            "the UT transform costs a triangular solve per chunk: (I + tril(...))⁻¹ applied to c × (d + e) right-hand "
            "sides, half of a c × c product because the matrix is triangular."),
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
        ("n = 1,024, c = 16, d = 32, e = 64 (d ≠ e)", (1024, 16, 32, 64), {}),
        ("n = 4,096, c = 32, d = e = 64 (the benchmark's setting)", (4096, 32, 64, 64), {}),
        ("n = 4,096, c = 128, d = e = 64", (4096, 128, 64, 64), {}),
        ("n = 64, c = 64, d = 16, e = 8: one chunk", (64, 64, 16, 8), {}),
    ]


exercise_12_3 = Exercise("12.3", "the chunked delta rule's FLOPs", _flops_reference, _cases_12_3, MISTAKES_12_3,
                         names=("FLOPs",), atol=0.0, rtol=1e-9)

EXERCISES = [exercise_12_1, exercise_12_2, exercise_12_3]
