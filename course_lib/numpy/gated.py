"""Decay and gates on the linear-attention state, in NumPy: the token loop and the chunked form.

Implements notebooks 11 and 12.  One recurrence covers RetNet (a constant decay per head; Sun et
al. 2023, arXiv 2307.08621), Mamba-2 and simple GLA (a decay per head and token; Dao & Gu 2024,
arXiv 2405.21060) and GLA (a decay per channel; Yang et al. 2024, arXiv 2312.06635):

    S_t = Diag(a_t) S_{t-1} + k_t v_tᵀ,   o_t = S_tᵀ q_t,   a_t = exp(log_decay_t) in (0, 1].

The state S is ``(..., d, e)``, keys × values, as in flash-linear-attention (papers often write
its transpose).  There is no normaliser and no 1/√d inside: the caller scales q.  Shapes:
``q, k (..., n, d)``, ``v (..., n, e)``, ``log_decay (..., n)`` (per head) or ``(..., n, d)``
(per channel).  In the chunked form ``c`` is the chunk length, ``c'`` a sub-chunk's, and ``i``, ``j``
are query and key positions in one chunk.  float16 inputs are computed in float32 and the output cast
back.
"""

import numpy as np

from course_lib import _validate
from course_lib._shared import RECURRENT_CHUNK_SIZE as DEFAULT_CHUNK_SIZE  # here and in numpy.delta
from course_lib._shared import SUB_CHUNK_SIZE


def _work_dtype(*xs):
    """float64 stays float64; float16 is computed in float32 (a float16 running sum stalls at 2048)."""
    return np.promote_types(np.result_type(*xs), np.float32)


def _check_arrays(names, xs, finite=True):
    """Each a floating-point array, and (unless ``finite`` is False) free of NaN and inf; returned as arrays."""
    arrays = [np.asarray(x) for x in xs]
    for name, x in zip(names, arrays, strict=True):
        _validate.check_float(name, x, np.issubdtype(x.dtype, np.floating))
        if finite and x.size:  # a min or max is NaN when any value is
            _validate.check_finite(name, float(x.min()), float(x.max()))
    return arrays


def _prepare(q, k, v, log_decay, initial_state, chunk_size, decay_name="log_decay"):
    """Check the arguments; return them broadcast to one leading shape, in the work dtype, and the decay's kind."""
    q, k, v = _check_arrays(("q", "k", "v"), (q, k, v))
    _validate.check_recurrence(q, k, v)
    _validate.check_chunk_size(chunk_size)
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    channels = False
    if log_decay is not None:
        (log_decay,) = _check_arrays((decay_name,), (log_decay,), finite=False)  # check_log_decay says why
        channels = _validate.per_channel(log_decay, k, decay_name)
        if log_decay.size:
            lowest, largest = float(log_decay.min()), float(log_decay.max())
            _validate.check_log_decay(decay_name, largest, bool(np.isfinite([lowest, largest]).all()))
        lead = np.broadcast_shapes(lead, log_decay.shape[:-2] if channels else log_decay.shape[:-1])
    n, d, e = k.shape[-2], k.shape[-1], v.shape[-1]
    if initial_state is not None:
        (initial_state,) = _check_arrays(("initial_state",), (initial_state,))
        _validate.check_state("initial_state", initial_state, lead, d, e)
    work = _work_dtype(q, k, v)
    q, k, v = (np.broadcast_to(x, (*lead, n, x.shape[-1])).astype(work) for x in (q, k, v))
    if log_decay is not None:
        log_decay = np.broadcast_to(log_decay, (*lead, n, d) if channels else (*lead, n)).astype(work)
    state = np.zeros((*lead, d, e), work) if initial_state is None else np.broadcast_to(initial_state,
                                                                                        (*lead, d, e)).astype(work)
    return q, k, v, log_decay, state, channels


def _decay(state, log_decay_t, channels):
    """Diag(a_t) S: a per-channel decay scales the state's rows (keys), one per head scales all of it."""
    a = np.exp(log_decay_t)
    return state * (a[..., :, None] if channels else a[..., None, None])  # (..., d, e)


def _loop(q, k, v, log_decay, state, channels):
    """The recurrence one token at a time (the reference): O(n·d·e) time, one state in memory."""
    out = np.empty(v.shape, v.dtype)  # (..., n, e)
    for t in range(q.shape[-2]):
        state = _decay(state, log_decay[..., t, :] if channels else log_decay[..., t], channels)
        state = state + k[..., t, :, None] * v[..., t, None, :]  # + k_t v_tᵀ (..., d, e)
        out[..., t, :] = np.einsum("...d,...de->...e", q[..., t, :], state)  # S_tᵀ q_t
    return out, state


def masked_decay(G, inclusive=True):
    """exp(G_i - G_j) for j ≤ i (j < i unless ``inclusive``), 0 above: the differences masked *before* exp.

    Notebook 12, Eq. (12.2).  ``G (..., c)`` → ``(..., c, c)``; per channel, pass ``G`` as
    ``(..., d, c)`` for ``(..., d, c, c)``.  Every exponent that reaches exp is ≤ 0: nothing overflows.
    """
    G = np.asarray(G)
    c = G.shape[-1]
    allowed = np.tril(np.ones((c, c), bool), 0 if inclusive else -1)  # (c, c), j <= i
    diff = G[..., :, None] - G[..., None, :]  # (..., c, c): G_i - G_j
    return np.exp(np.where(allowed, diff, -np.inf))  # exp(-inf) = 0 above the diagonal


def channel_scores(q, k, G, sub=SUB_CHUNK_SIZE):
    """A chunk's scores Σ_d q_id k_jd exp(G_id − G_jd), j ≤ i, by sub-chunks. Notebook 12; Yang et al. 2024, §4.

    A decay per channel cannot leave the sum over d as one matmul, and its masked (c, c, d) decays
    cost d times the memory of a decay per head.  So the chunk is cut into sub-chunks of c': a
    sub-chunk's queries meet the earlier keys in one matmul, both rescaled to G at the sub-chunk's
    first position r (G_i − G_r ≤ 0 for its queries, G_r − G_j ≤ 0 for earlier keys, as G falls along
    the chunk: no factor overflows); only inside a sub-chunk are the (c', c', d) decays masked and
    exponentiated.

    Args:
        q, k: ``(..., c, d)``; G: ``(..., c, d)``, the cumulative log decay from the chunk's start.
        sub: positions per sub-chunk (the last may be shorter).

    Returns:
        ``(..., c, c)``, zero above the diagonal.
    """
    c = q.shape[-2]
    scores = np.zeros((*np.broadcast_shapes(q.shape[:-2], k.shape[:-2], G.shape[:-2]), c, c), np.result_type(q, k, G))
    for start in range(0, c, sub):
        rows, first = slice(start, start + sub), G[..., start:start + 1, :]  # (..., 1, d): G_r
        q_rel = q[..., rows, :] * np.exp(G[..., rows, :] - first)  # (..., c', d): exponents ≤ 0
        k_rel = k[..., :start, :] * np.exp(first - G[..., :start, :])  # (..., r, d): exponents ≤ 0
        scores[..., rows, :start] = q_rel @ np.swapaxes(k_rel, -1, -2)  # (..., c', r): the earlier sub-chunks
        weights = masked_decay(np.swapaxes(G[..., rows, :], -1, -2))  # (..., d, c', c'): inside the sub-chunk
        scores[..., rows, rows] = np.einsum("...id,...jd,...dij->...ij", q[..., rows, :], k[..., rows, :], weights,
                                            optimize=True)
    return scores


def _chunked(q, k, v, log_decay, state, channels, chunk_size):
    """Chunk by chunk: the masked c × c interactions inside, the state across. Notebook 12, Eqs. (12.1)-(12.3)."""
    n, out = q.shape[-2], np.empty(v.shape, v.dtype)
    for start in range(0, n, chunk_size):
        part = slice(start, min(start + chunk_size, n))
        qc, kc, vc, gc = q[..., part, :], k[..., part, :], v[..., part, :], log_decay[..., part, :] if channels \
            else log_decay[..., part]
        G = np.cumsum(gc, axis=-2 if channels else -1)  # (..., c[, d]): log of the decay since the chunk began
        if channels:
            scores = channel_scores(qc, kc, G)  # (..., c, c): sub-chunks, never a (c, c, d) tensor
            out[..., part, :] = (qc * np.exp(G)) @ state + scores @ vc  # (..., c, e)
            last = G[..., -1:, :]  # (..., 1, d)
            state = np.exp(last[..., 0, :, None]) * state + np.swapaxes(kc * np.exp(last - G), -1, -2) @ vc
        else:
            scores = (qc @ np.swapaxes(kc, -1, -2)) * masked_decay(G)  # (..., c, c)
            out[..., part, :] = np.exp(G)[..., None] * (qc @ state) + scores @ vc  # (..., c, e)
            last = G[..., -1:]  # (..., 1)
            state = np.exp(last)[..., None] * state + np.swapaxes(kc * np.exp(last - G)[..., None], -1, -2) @ vc
    return out, state  # (..., n, e), (..., d, e)


def gated_linear_attention(q, k, v, log_decay, *, chunk_size=DEFAULT_CHUNK_SIZE, initial_state=None,
                           return_state=False):
    """Linear attention with a decay or gate on the state. Notebook 11, Eq. (11.3); notebook 12, Eqs. (12.1)-(12.3).

    S_t = Diag(a_t) S_{t-1} + k_t v_tᵀ and o_t = S_tᵀ q_t with a_t = exp(log_decay_t): no
    normaliser and no 1/√d (the caller scales).  The chunked form exponentiates only masked
    differences of cumulative log decays, so a decay of e^-30 per token stays finite.  A decay per
    channel is chunked by sub-chunks (``channel_scores``; Yang et al. 2024, §4).

    Args:
        q, k: ``(..., n, d)``; v: ``(..., n, e)``.
        log_decay: ``(..., n)`` (one decay per head and token) or ``(..., n, d)`` (one per channel), ≤ 0.
        chunk_size: positions per chunk (need not divide n), or None for the token loop (the reference).
        initial_state: ``(..., d, e)`` to continue a sequence (None: zeros).
        return_state: also return the final state ``(..., d, e)`` (in the work dtype: float32 for float16).

    Returns:
        ``o (..., n, e)`` in the dtype of ``v``, or ``(o, state)``.
    """
    q, k, v32, log_decay, state, channels = _prepare(q, k, v, log_decay, initial_state, chunk_size)
    run = _loop if chunk_size is None else _chunked
    out, state = run(q, k, v32, log_decay, state, channels, *(() if chunk_size is None else (chunk_size,)))
    out = out.astype(np.result_type(v), copy=False)
    return (out, state) if return_state else out


def gated_linear_attention_step(q_t, k_t, v_t, log_decay_t, state):
    """One token of the gated recurrence: S ← Diag(a_t) S + k_t v_tᵀ, o_t = Sᵀ q_t. Notebook 11, Eq. (11.3).

    Args:
        q_t, k_t: ``(..., d)``; v_t: ``(..., e)``; log_decay_t: ``(...)`` or ``(..., d)``, ≤ 0.
        state: ``(..., d, e)`` from the previous step, or None (zeros).  Never mutated.

    Returns:
        ``(o_t (..., e), state (..., d, e))``.
    """
    q, k, v, log_decay, state, channels = _prepare(*_as_sequence(q_t, k_t, v_t), np.asarray(log_decay_t)[..., None]
                                                   if np.ndim(log_decay_t) < np.ndim(k_t) else
                                                   np.asarray(log_decay_t)[..., None, :], state, None, "log_decay_t")
    out, state = _loop(q, k, v, log_decay, state, channels)
    return out[..., 0, :].astype(np.result_type(v_t), copy=False), state


def _as_sequence(*xs):
    """One token ``(..., dim)`` as a sequence of length 1 ``(..., 1, dim)``, after a check of its rank."""
    for name, x in zip(("q_t", "k_t", "v_t"), xs, strict=False):
        if np.ndim(x) < 1:
            raise ValueError(f"{name} must have shape (..., dim) (one position, no sequence axis), got a scalar.")
    return tuple(np.asarray(x)[..., None, :] for x in xs)
