"""The delta rule, with and without a gate, in NumPy: the token loop and the chunked WY/UT form.

Implements notebooks 11 and 12.  DeltaNet (Schlag et al. 2021, arXiv 2102.11174; Yang et al. 2024,
arXiv 2406.06484) and Gated DeltaNet (Yang et al. 2025, arXiv 2412.06464):

    S_t = a_t (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ,   o_t = S_tᵀ q_t,

with a_t = 1 (DeltaNet, ``log_decay=None``) or exp(log_decay_t) (Gated DeltaNet).  Read as a
write: S_t = a_t S_{t-1} + β_t k_t (v_t - a_t S_{t-1}ᵀ k_t)ᵀ replaces the value stored under k_t
by v_t, in proportion β_t.  The state S is ``(..., d, e)``, keys × values, as in
flash-linear-attention.  Shapes: ``q, k (..., n, d)``, ``v (..., n, e)``, ``beta (..., n)`` in
[0, 1], ``log_decay (..., n)``.  In the chunked form ``c`` is the chunk length, ``i``, ``j`` and
``r`` positions in one chunk.  float16 inputs are computed in float32 and the output cast back.
"""

import warnings

import numpy as np

from course_lib import _validate
from course_lib.numpy.gated import DEFAULT_CHUNK_SIZE, _as_sequence, _prepare, masked_decay


def _prepare_beta(beta, k, lead, work):
    beta = np.asarray(beta)
    _validate.check_float("beta", beta, np.issubdtype(beta.dtype, np.floating))
    _validate.check_beta(beta, k, *((float(beta.min()), float(beta.max())) if beta.size else (0.0, 0.0)))
    return np.broadcast_to(beta, (*lead, k.shape[-2])).astype(work)


def _warn_key_norms(k, beta):
    """Warn when β‖k‖² > 2 somewhere: the update's eigenvalue 1 − β‖k‖² is then below −1."""
    product = beta * np.einsum("...nd,...nd->...n", k, k)  # (..., n)
    if product.size and product.max() > 2 * (1 + 1e-6):  # the slack: a unit key with β = 1 rounds to 1 ± ulp
        warnings.warn(_validate.key_norm_warning(float(product.max())), RuntimeWarning, stacklevel=3)


def _loop(q, k, v, beta, log_decay, state):
    """The recurrence one token at a time (the reference): decay, then write v_t under k_t in proportion β_t."""
    out = np.empty(v.shape, v.dtype)  # (..., n, e)
    for t in range(q.shape[-2]):
        if log_decay is not None:
            state = np.exp(log_decay[..., t])[..., None, None] * state  # a_t S_{t-1}
        stored = np.einsum("...d,...de->...e", k[..., t, :], state)  # what k_t reads now (..., e)
        state = state + beta[..., t, None, None] * k[..., t, :, None] * (v[..., t, None, :] - stored[..., None, :])
        out[..., t, :] = np.einsum("...d,...de->...e", q[..., t, :], state)  # S_tᵀ q_t
    return out, state


def ut_transform(k, beta, log_decay=None):
    """T = (I + tril(Diag(β) (Γ ⊙ K Kᵀ), -1))⁻¹ Diag(β) for one chunk. Notebook 12, Eq. (12.6).

    Γ_ij = exp(G_i − G_j) with G the cumulative log decay inside the chunk (Γ = 1 without decay).
    The matrix inverted is unit lower triangular: forward substitution, no pivoting needed (NumPy has
    no triangular solver, so a general solve is used and its result cut to the lower triangle).

    Args:
        k: ``(..., c, d)``; beta: ``(..., c)``; log_decay: ``(..., c)`` or None.

    Returns:
        ``T (..., c, c)``, lower triangular.
    """
    c = k.shape[-2]
    eye = np.eye(c, dtype=np.result_type(k, beta))  # in the inputs' dtype: a float64 eye would promote float32
    gram = k @ np.swapaxes(k, -1, -2)  # (..., c, c): k_iᵀ k_j
    if log_decay is not None:
        gram = gram * masked_decay(np.cumsum(log_decay, axis=-1))
    lower = eye + np.tril(beta[..., :, None] * gram, -1)  # (..., c, c), ones on the diagonal
    # NumPy has no triangular solver: a general (LU) solve leaves rounding of order 1e-17 above the diagonal.
    return np.tril(np.linalg.solve(lower, eye * beta[..., None, :]))  # (..., c, c)


def _chunked(q, k, v, beta, log_decay, state, chunk_size):
    """The WY/UT form: per chunk one triangular solve, then three products with the state. Notebook 12, Eq. (12.7)."""
    n, out = q.shape[-2], np.empty(v.shape, v.dtype)
    for start in range(0, n, chunk_size):
        part = slice(start, min(start + chunk_size, n))
        qc, kc, vc, bc = q[..., part, :], k[..., part, :], v[..., part, :], beta[..., part]
        G = np.zeros(bc.shape, bc.dtype) if log_decay is None else np.cumsum(log_decay[..., part], axis=-1)
        T = ut_transform(kc, bc, None if log_decay is None else log_decay[..., part])  # (..., c, c)
        w = T @ (np.exp(G)[..., None] * kc)  # (..., c, d): W, the WY representation's keys
        u = T @ vc - w @ state  # (..., c, e): Ũ = U − W S, the values actually written
        scores = np.tril(qc @ np.swapaxes(kc, -1, -2)) * masked_decay(G)  # (..., c, c), j <= i
        out[..., part, :] = np.exp(G)[..., None] * (qc @ state) + scores @ u  # (..., c, e)
        last = G[..., -1:]  # (..., 1)
        state = np.exp(last)[..., None] * state + np.swapaxes(kc * np.exp(last - G)[..., None], -1, -2) @ u
    return out, state  # (..., n, e), (..., d, e)


def delta_rule_attention(q, k, v, beta, *, log_decay=None, chunk_size=DEFAULT_CHUNK_SIZE, initial_state=None,
                         return_state=False):
    """The (gated) delta rule. Notebook 11, Eq. (11.5); notebook 12, Eqs. (12.4)-(12.7); Yang et al. 2024, §3.

    S_t = a_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t; DeltaNet when
    ``log_decay`` is None, Gated DeltaNet otherwise.  Keys should be L2-normalised: a warning is
    raised where β‖k‖² > 2, since the update's eigenvalue 1 − β‖k‖² then leaves [−1, 1].

    Args:
        q, k: ``(..., n, d)``; v: ``(..., n, e)``; beta: ``(..., n)`` in [0, 1].
        log_decay: ``(..., n)``, ≤ 0 (one decay per head and token), or None.
        chunk_size: positions per chunk (need not divide n), or None for the token loop (the reference).
        initial_state: ``(..., d, e)`` to continue a sequence (None: zeros).
        return_state: also return the final state ``(..., d, e)`` (float32 for float16 inputs).

    Returns:
        ``o (..., n, e)`` in the dtype of ``v``, or ``(o, state)``.
    """
    q, k, v32, log_decay, state, channels = _prepare(q, k, v, log_decay, initial_state, chunk_size)
    _validate.check_decay_per_head(channels, k)
    beta = _prepare_beta(beta, k, k.shape[:-2], k.dtype)
    _warn_key_norms(k, beta)
    if chunk_size is None:
        out, state = _loop(q, k, v32, beta, log_decay, state)
    else:
        out, state = _chunked(q, k, v32, beta, log_decay, state, chunk_size)
    out = out.astype(np.result_type(v), copy=False)
    return (out, state) if return_state else out


def delta_rule_step(q_t, k_t, v_t, beta_t, state, *, log_decay_t=None):
    """One token of the (gated) delta rule. Notebook 11, Eq. (11.5).

    Args:
        q_t, k_t: ``(..., d)``; v_t: ``(..., e)``; beta_t: ``(...)`` in [0, 1]; log_decay_t: ``(...)`` ≤ 0, or None.
        state: ``(..., d, e)`` from the previous step, or None (zeros).  Never mutated.

    Returns:
        ``(o_t (..., e), state (..., d, e))``.
    """
    beta_t = np.asarray(beta_t)[..., None]  # (..., 1): a sequence of one token
    log_decay = None if log_decay_t is None else np.asarray(log_decay_t)[..., None]
    out, state = delta_rule_attention(*_as_sequence(q_t, k_t, v_t), beta_t, log_decay=log_decay, chunk_size=None,
                                      initial_state=state, return_state=True)
    return out[..., 0, :], state
