"""The delta rule, with and without a gate, and DeltaProduct, in NumPy: the token loop and the chunked WY/UT form.

Implements notebooks 11-13.  DeltaNet (Schlag et al. 2021, arXiv 2102.11174; Yang et al. 2024,
arXiv 2406.06484), Gated DeltaNet (Yang et al. 2025, arXiv 2412.06464) and Kimi Delta Attention
(Kimi Team 2025, arXiv 2510.26692):

    S_t = (I - β_t k_t k_tᵀ) Diag(a_t) S_{t-1} + β_t k_t v_tᵀ,   o_t = S_tᵀ q_t,

with a_t = 1 (DeltaNet, ``log_decay=None``), one exp(log_decay_t) per head (Gated DeltaNet) or one
per key channel (Kimi Delta Attention).  Read as a write: S_t = A S_{t-1} + β_t k_t (v_t - (A S_{t-1})ᵀ k_t)ᵀ
with A = Diag(a_t) replaces the value stored under k_t by v_t, in proportion β_t.  β_t in [0, 2]:
above 1 the update has the eigenvalue 1 - β_t < 0 along k_t, a reflection at β_t = 2 (Grazzi et al.
2025, arXiv 2411.12537).  DeltaProduct (Siems et al. 2025, arXiv 2502.10297) takes n_h such steps a
token.  The state S is ``(..., d, e)``, keys × values, as in flash-linear-attention.  Shapes:
``q, k (..., n, d)``, ``v (..., n, e)``, ``beta (..., n)``, ``log_decay (..., n)`` or ``(..., n, d)``.
In the chunked form ``c`` is the chunk length, ``i``, ``j`` and ``r`` positions in one chunk.
float16 inputs are computed in float32 and the output cast back.
"""

import warnings

import numpy as np

from course_lib import _validate
from course_lib.numpy.gated import DEFAULT_CHUNK_SIZE, _as_sequence, _prepare, channel_scores, masked_decay


def _prepare_beta(beta, k, lead, work):
    beta = np.asarray(beta)
    _validate.check_float("beta", beta, np.issubdtype(beta.dtype, np.floating))
    _validate.check_beta(beta, k, *((float(beta.min()), float(beta.max())) if beta.size else (0.0, 0.0)))
    return np.broadcast_to(beta, (*lead, k.shape[-2])).astype(work)


def _warn_key_norms(k, beta):
    """Warn when β‖k‖² > 2 somewhere: the update's eigenvalue 1 − β‖k‖² is then below −1."""
    product = beta * np.einsum("...nd,...nd->...n", k, k)  # (..., n)
    if product.size and product.max() > 2 * (1 + 1e-6):  # the slack: a unit key with β = 2 rounds to 2 ± ulp
        warnings.warn(_validate.key_norm_warning(float(product.max())), RuntimeWarning, stacklevel=3)


def _per_channel(log_decay, k):
    """``log_decay (..., c)`` → ``(..., c, 1)`` (it then broadcasts over the channels); ``(..., c, d)`` as it is."""
    return log_decay if log_decay.ndim == k.ndim else log_decay[..., None]


def _loop(q, k, v, beta, log_decay, state):
    """The recurrence one token at a time (the reference): decay, then write v_t under k_t in proportion β_t."""
    out = np.empty(v.shape, v.dtype)  # (..., n, e)
    for t in range(q.shape[-2]):
        if log_decay is not None:
            state = np.exp(_per_channel(log_decay, k)[..., t, :, None]) * state  # Diag(a_t) S_{t-1}
        stored = np.einsum("...d,...de->...e", k[..., t, :], state)  # what k_t reads now (..., e)
        state = state + beta[..., t, None, None] * k[..., t, :, None] * (v[..., t, None, :] - stored[..., None, :])
        out[..., t, :] = np.einsum("...d,...de->...e", q[..., t, :], state)  # S_tᵀ q_t
    return out, state


def _forward_substitution(lower, rhs):
    """Solve ``lower X = rhs`` for a unit lower triangular ``lower (..., c, c)``, row by row: row i needs rows < i."""
    x = np.array(np.broadcast_to(rhs, (*lower.shape[:-1], rhs.shape[-1])))  # (..., c, f), a writable copy
    for i in range(1, lower.shape[-1]):
        x[..., i, :] -= (lower[..., i, None, :i] @ x[..., :i, :])[..., 0, :]
    return x


def ut_transform(k, beta, log_decay=None):
    """T = (I + tril(Diag(β) (Γ ⊙ K Kᵀ), -1))⁻¹ Diag(β) for one chunk. Notebook 12, Eq. (12.6).

    Γ_ij = exp(G_i − G_j) with G the cumulative log decay inside the chunk (Γ = 1 without decay);
    per channel, Γ moves inside the product: Σ_d k_id k_jd exp(G_id − G_jd).  The matrix inverted is
    unit lower triangular: forward substitution, no pivoting, T exactly lower triangular.

    Args:
        k: ``(..., c, d)``; beta: ``(..., c)``; log_decay: ``(..., c)``, ``(..., c, d)`` or None.

    Returns:
        ``T (..., c, c)``, lower triangular.
    """
    c = k.shape[-2]
    eye = np.eye(c, dtype=np.result_type(k, beta))  # in the inputs' dtype: a float64 eye would promote float32
    if log_decay is None:
        gram = k @ np.swapaxes(k, -1, -2)  # (..., c, c): k_iᵀ k_j
    elif log_decay.ndim == k.ndim:
        gram = channel_scores(k, k, np.cumsum(log_decay, axis=-2))  # GLA's sub-chunks
    else:
        gram = k @ np.swapaxes(k, -1, -2) * masked_decay(np.cumsum(log_decay, axis=-1))
    lower = eye + np.tril(beta[..., :, None] * gram, -1)  # (..., c, c), ones on the diagonal
    return _forward_substitution(lower, eye * beta[..., None, :])  # (..., c, c)


def _chunked(q, k, v, beta, log_decay, state, chunk_size):
    """The WY/UT form: per chunk one triangular solve, then three products with the state. Notebook 12, Eq. (12.7)."""
    n, out = q.shape[-2], np.empty(v.shape, v.dtype)
    channels = log_decay is not None and log_decay.ndim == k.ndim
    for start in range(0, n, chunk_size):
        part = slice(start, min(start + chunk_size, n))
        qc, kc, vc, bc = q[..., part, :], k[..., part, :], v[..., part, :], beta[..., part]
        gc = None if log_decay is None else log_decay[..., part, :] if channels else log_decay[..., part]
        T = ut_transform(kc, bc, gc)  # (..., c, c)
        G = np.zeros((*bc.shape, 1), bc.dtype) if gc is None else np.cumsum(_per_channel(gc, kc), axis=-2)
        w = T @ (np.exp(G) * kc)  # (..., c, d): W, the WY representation's keys; G (..., c, d|1) ≤ 0
        u = T @ vc - w @ state  # (..., c, e): Ũ = U − W S, the values actually written
        if channels:
            scores = channel_scores(qc, kc, G)  # (..., c, c), j <= i: GLA's sub-chunks
        else:
            scores = qc @ np.swapaxes(kc, -1, -2) * masked_decay(G[..., 0])  # (..., c, c), j <= i
        out[..., part, :] = (np.exp(G) * qc) @ state + scores @ u  # (..., c, e)
        last = G[..., -1:, :]  # (..., 1, d|1): the chunk's total log decay
        state = np.swapaxes(np.exp(last), -1, -2) * state + np.swapaxes(kc * np.exp(last - G), -1, -2) @ u
    return out, state  # (..., n, e), (..., d, e)


def delta_rule_attention(q, k, v, beta, *, log_decay=None, chunk_size=DEFAULT_CHUNK_SIZE, initial_state=None,
                         return_state=False):
    """The (gated) delta rule. Notebook 11, Eq. (11.5); notebook 12, Eqs. (12.4)-(12.7); Yang et al. 2024, §3.

    S_t = (I − β_t k_t k_tᵀ) Diag(a_t) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t: DeltaNet when
    ``log_decay`` is None, Gated DeltaNet with one decay per head, Kimi Delta Attention (Kimi Team
    2025, arXiv 2510.26692) with one per key channel.  β in [0, 2]: above 1 the update reflects
    (negative eigenvalues; Grazzi et al. 2025).  Keys should be L2-normalised: a warning is raised
    where β‖k‖² > 2, since the update's eigenvalue 1 − β‖k‖² then leaves [−1, 1].

    Args:
        q, k: ``(..., n, d)``; v: ``(..., n, e)``; beta: ``(..., n)`` in [0, 2].
        log_decay: ``(..., n)`` (one decay per head and token) or ``(..., n, d)`` (one per key channel),
            ≤ 0, or None.
        chunk_size: positions per chunk (need not divide n), or None for the token loop (the reference).
        initial_state: ``(..., d, e)`` to continue a sequence (None: zeros).
        return_state: also return the final state ``(..., d, e)`` (float32 for float16 inputs).

    Returns:
        ``o (..., n, e)`` in the dtype of ``v``, or ``(o, state)``.
    """
    q, k, v32, log_decay, state, _ = _prepare(q, k, v, log_decay, initial_state, chunk_size)
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
        q_t, k_t: ``(..., d)``; v_t: ``(..., e)``; beta_t: ``(...)`` in [0, 2].
        state: ``(..., d, e)`` from the previous step, or None (zeros).  Never mutated.
        log_decay_t: ``(...)`` (per head) or ``(..., d)`` (per key channel), ≤ 0, or None.

    Returns:
        ``(o_t (..., e), state (..., d, e))``.
    """
    beta_t = np.asarray(beta_t)[..., None]  # (..., 1): a sequence of one token
    out, state = delta_rule_attention(*_as_sequence(q_t, k_t, v_t), beta_t, log_decay=_one_position(log_decay_t, k_t),
                                      chunk_size=None, initial_state=state, return_state=True)
    return out[..., 0, :], state


def _one_position(log_decay_t, k_t):
    """A step's decay as a sequence of one token: ``(...)`` → ``(..., 1)``, ``(..., d)`` → ``(..., 1, d)``."""
    if log_decay_t is None:
        return None
    log_decay_t = np.asarray(log_decay_t)
    return log_decay_t[..., None, :] if log_decay_t.ndim == np.ndim(k_t) else log_decay_t[..., None]


# --- DeltaProduct: n_h delta-rule steps a token (notebook 13) ----------------------------------

def _householder_steps(q, log_decay, n_householder):
    """q and the decay spread over each token's n_h steps: q at the last step, the decay at the first, zeros between.

    ``q (..., n, d)`` → ``(..., n·n_h, d)``; ``log_decay (..., n)`` or ``(..., n, d)`` → ``(..., n·n_h[, d])``.
    """
    n, d = q.shape[-2:]
    before = np.zeros((*q.shape[:-1], n_householder - 1, d), q.dtype)  # (..., n, n_h - 1, d)
    q_steps = np.concatenate([before, q[..., None, :]], axis=-2).reshape(*q.shape[:-2], n * n_householder, d)
    if log_decay is None:
        return q_steps, None
    log_decay = np.asarray(log_decay)
    if _validate.per_channel(log_decay, q):  # (..., n, d) → (..., n, n_h, d): log 1 = 0 after the first step
        after = np.zeros((*log_decay.shape[:-1], n_householder - 1, d), log_decay.dtype)
        steps = np.concatenate([log_decay[..., None, :], after], axis=-2)
        return q_steps, steps.reshape(*log_decay.shape[:-2], n * n_householder, d)
    after = np.zeros((*log_decay.shape, n_householder - 1), log_decay.dtype)  # (..., n, n_h - 1)
    steps = np.concatenate([log_decay[..., None], after], axis=-1)  # (..., n, n_h)
    return q_steps, steps.reshape(*log_decay.shape[:-1], n * n_householder)


def delta_product_attention(q, k, v, beta, *, n_householder, log_decay=None, chunk_size=DEFAULT_CHUNK_SIZE,
                            initial_state=None, return_state=False):
    """DeltaProduct: n_h delta-rule steps a token. Notebook 13; Siems et al. 2025, arXiv 2502.10297, Eq. (3).

    For token t: S ← Diag(a_t) S, then S ← (I − β_{t,j} k_{t,j} k_{t,j}ᵀ) S + β_{t,j} k_{t,j} v_{t,j}ᵀ for
    j = 1 … n_h, and o_t = Sᵀ q_t after the last step: the transition is a product of n_h generalised
    Householder matrices.  Computed as the delta rule over the n·n_h steps, token-major as
    flash-linear-attention lays them out, with the decay on each token's first step (zero log decay on
    the others) and q on its last (zero queries elsewhere read outputs nobody keeps): every n_h-th
    output is o_t.  Exact, and the chunked delta rule's speed at n·n_h positions.

    Args:
        q: ``(..., n, d)``; k: ``(..., n·n_h, d)``; v: ``(..., n·n_h, e)``; beta: ``(..., n·n_h)`` in [0, 2].
        n_householder: n_h, the steps a token (1: the delta rule).
        log_decay: ``(..., n)`` (per head) or ``(..., n, d)`` (per key channel), ≤ 0, once a token; or None.
        chunk_size: steps per chunk, or None for the token loop.  initial_state, return_state: as
            :func:`delta_rule_attention`.

    Returns:
        ``o (..., n, e)`` in the dtype of ``v``, or ``(o, state (..., d, e))``.
    """
    q, k, v, beta = (np.asarray(x) for x in (q, k, v, beta))
    _validate.check_householder(n_householder, q, k, v, beta)
    q_steps, decay_steps = _householder_steps(q, log_decay, n_householder)
    out, state = delta_rule_attention(q_steps, k, v, beta, log_decay=decay_steps, chunk_size=chunk_size,
                                      initial_state=initial_state, return_state=True)
    out = out[..., n_householder - 1::n_householder, :]  # (..., n, e): the output after each token's last step
    return (out, state) if return_state else out


def delta_product_step(q_t, k_t, v_t, beta_t, state, *, log_decay_t=None):
    """One token of DeltaProduct: a decay, then n_h delta-rule steps. Notebook 13; Siems et al. 2025.

    Args:
        q_t: ``(..., d)``; k_t: ``(..., n_h, d)``; v_t: ``(..., n_h, e)``; beta_t: ``(..., n_h)`` in [0, 2].
        state: ``(..., d, e)`` from the previous step, or None (zeros).  Never mutated.
        log_decay_t: ``(...)`` (per head) or ``(..., d)`` (per key channel), ≤ 0, or None.

    Returns:
        ``(o_t (..., e), state (..., d, e))``.
    """
    (q,) = _as_sequence(q_t)  # (..., 1, d)
    k_t = np.asarray(k_t)
    if k_t.ndim < 2:
        raise ValueError(f"k_t must have shape (..., n_householder, d), one key per step, got {k_t.shape}.")
    n_householder = k_t.shape[-2]
    out, state = delta_product_attention(q, k_t, v_t, beta_t, n_householder=n_householder,
                                         log_decay=_one_position(log_decay_t, q_t), chunk_size=None,
                                         initial_state=state, return_state=True)
    return out[..., 0, :], state
