"""The delta rule, with and without a gate, and DeltaProduct, in PyTorch: the port of ``course_lib.numpy.delta``.

Implements notebooks 11-13; Yang et al. 2024 (arXiv 2406.06484) and 2025 (arXiv 2412.06464), Kimi
Delta Attention (arXiv 2510.26692), DeltaProduct (arXiv 2502.10297).
S_t = (I - β_t k_t k_tᵀ) Diag(a_t) S_{t-1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t, β_t in [0, 2]; the state
is ``(..., d, e)`` (keys × values).  Same names and signatures as the NumPy tree; any device, autograd.
float16/bfloat16 inputs are computed in float32 (the triangular solve included: it loses accuracy
in low precision with large chunks) and the output cast back.

What is parallel and what is not: every chunk's UT transform (one batched triangular solve), its
W and U, and its masked c × c scores are computed for all chunks at once; only the state crosses
chunks in a Python loop, three small products per chunk.  Shapes inside: leading dims flattened
into L, ``g`` chunks of ``c`` positions.
"""

import warnings

import torch

from course_lib import _validate
from course_lib.torch.gated import (
    DEFAULT_CHUNK_SIZE,
    _as_sequence,
    _check_tensors,
    _prepare,
    channel_scores,
    chunk,
    masked_decay,
)


def _prepare_beta(beta, k, work):
    _check_tensors(("beta",), (beta,))
    if beta.numel():
        _validate.check_beta(beta, k, beta.min().item(), beta.max().item())
    else:
        _validate.check_beta(beta, k, 0.0, 0.0)
    return beta.to(work).expand(*k.shape[:-1])


def _warn_key_norms(k, beta):
    """Warn when β‖k‖² > 2 somewhere: the update's eigenvalue 1 − β‖k‖² is then below −1."""
    if not k.numel():
        return
    largest = (beta * (k * k).sum(-1)).max().item()
    if largest > 2 * (1 + 1e-6):  # the slack: a unit key with β = 2 rounds to 2 ± ulp
        warnings.warn(_validate.key_norm_warning(largest), RuntimeWarning, stacklevel=3)


def _per_channel(log_decay, k):
    """``log_decay (..., c)`` → ``(..., c, 1)`` (it then broadcasts over the channels); ``(..., c, d)`` as it is."""
    return log_decay if log_decay.dim() == k.dim() else log_decay[..., None]


def _loop(q, k, v, beta, log_decay, state):
    """The recurrence one token at a time (the reference): decay, then write v_t under k_t in proportion β_t."""
    outs = []
    for t in range(q.shape[-2]):
        if log_decay is not None:
            state = torch.exp(_per_channel(log_decay, k)[..., t, :, None]) * state  # Diag(a_t) S_{t-1}
        stored = torch.einsum("...d,...de->...e", k[..., t, :], state)  # what k_t reads now (..., e)
        state = state + beta[..., t, None, None] * k[..., t, :, None] * (v[..., t, None, :] - stored[..., None, :])
        outs.append(torch.einsum("...d,...de->...e", q[..., t, :], state))  # S_tᵀ q_t
    return torch.stack(outs, dim=-2), state  # (..., n, e), (..., d, e)


def ut_transform(k, beta, log_decay=None):
    """T = (I + tril(Diag(β) (Γ ⊙ K Kᵀ), -1))⁻¹ Diag(β) for each chunk. Notebook 12, Eq. (12.6).

    Args:
        k: ``(..., c, d)``; beta: ``(..., c)``; log_decay: ``(..., c)``, ``(..., c, d)`` or None.

    Returns:
        ``T (..., c, c)``, lower triangular: one triangular solve, no pivoting.
    """
    c = k.shape[-2]
    eye = torch.eye(c, dtype=k.dtype, device=k.device)
    if log_decay is None:
        gram = k @ k.transpose(-1, -2)  # (..., c, c)
    elif log_decay.dim() == k.dim():
        gram = channel_scores(k, k, torch.cumsum(log_decay, dim=-2))  # GLA's sub-chunks
    else:
        gram = k @ k.transpose(-1, -2) * masked_decay(torch.cumsum(log_decay, dim=-1))
    lower = eye + (beta[..., :, None] * gram).tril(-1)  # (..., c, c), ones on the diagonal
    return torch.linalg.solve_triangular(lower, torch.diag_embed(beta), upper=False, unitriangular=True)


def _gated_chunk_terms(qc, kc, log_decay, k, chunk_size):
    """A decayed chunk's c × c scores and gram, and its decayed q and k. Notebook 12, Eqs. (12.6)-(12.7).

    ``qc, kc (L, g, c, d)``; ``log_decay (..., n)`` or ``(..., n, d)``.  Every exponent is ≤ 0: masked
    differences inside a chunk, and G or G_last − G, where G (L, g, c, d|1) is the cumulative log decay.
    """
    n, d = k.shape[-2:]
    channels = log_decay.dim() == k.dim()
    G = torch.cumsum(chunk(_per_channel(log_decay, k).reshape(-1, n, d if channels else 1), chunk_size), dim=2)
    if channels:  # padding has log decay 0, a = 1, and zero keys
        scores, gram = channel_scores(qc, kc, G), channel_scores(kc, kc, G)  # (L, g, c, c), j <= i: sub-chunks
    else:
        causal = masked_decay(G[..., 0])  # (L, g, c, c): exp(G_i − G_j), j <= i
        scores, gram = (qc @ kc.transpose(-1, -2)) * causal, (kc @ kc.transpose(-1, -2)) * causal
    last = G[:, :, -1:]  # (L, g, 1, d|1): each chunk's total log decay
    q_from_start, k_from_start = qc * torch.exp(G), kc * torch.exp(G)  # (L, g, c, d): decayed since the chunk began
    k_to_end = kc * torch.exp(last - G)  # (L, g, c, d): decayed from its position to the chunk's end
    return scores, gram, q_from_start, k_from_start, k_to_end, torch.exp(last).transpose(-1, -2)  # (L, g, d|1, 1)


def _chunked(q, k, v, beta, log_decay, state, chunk_size):
    """The WY/UT form: all chunks' solves at once, then the state chunk by chunk. Notebook 12, Eq. (12.7)."""
    lead, n, d, e = q.shape[:-2], q.shape[-2], q.shape[-1], v.shape[-1]
    chunk_size = max(1, min(chunk_size, n))  # a sequence shorter than a chunk is one chunk of its length: no padding
    qc, kc, vc = (chunk(x.reshape(-1, n, x.shape[-1]), chunk_size) for x in (q, k, v))  # (L, g, c, d|e)
    bc = chunk(beta.reshape(-1, n), chunk_size)  # (L, g, c); padding has β = 0: it writes nothing
    c = chunk_size
    if log_decay is None:
        causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        scores, gram = (qc @ kc.transpose(-1, -2)).masked_fill(~causal, 0.0), kc @ kc.transpose(-1, -2)  # (L, g, c, c)
        q_decayed, k_decayed, k_to_end, decays = qc, kc, kc, [None] * qc.shape[1]
    else:
        scores, gram, q_decayed, k_decayed, k_to_end, chunk_decay = _gated_chunk_terms(qc, kc, log_decay, k, c)
        decays = chunk_decay.unbind(1)
    lower = (bc[..., :, None] * gram).tril(-1) + torch.eye(c, dtype=q.dtype, device=q.device)  # (L, g, c, c)
    # T [ΓK, V] = L⁻¹ Diag(β) [ΓK, V]: one solve for W and U together, Eq. (12.6)
    rhs = torch.cat([k_decayed, vc], dim=-1)  # (L, g, c, d + e)
    wu = torch.linalg.solve_triangular(lower, bc[..., None] * rhs, upper=False, unitriangular=True)
    w, u = wu[..., :d], wu[..., d:]  # (L, g, c, d), (L, g, c, e)
    outs = []
    state = state.reshape(-1, d, e)  # (L, d, e)
    # unbind, not [:, g]: the backward of one unbind stacks the chunks' gradients once, while each
    # [:, g] would write its gradient into a zero tensor of the whole sequence (quadratic in n)
    for u_g, w_g, q_g, s_g, k_g, a_g in zip(u.unbind(1), w.unbind(1), q_decayed.unbind(1), scores.unbind(1),
                                            k_to_end.unbind(1), decays, strict=True):
        written = torch.baddbmm(u_g, w_g, state, alpha=-1)  # (L, c, e): Ũ = U − W S, what this chunk writes
        outs.append(torch.baddbmm(s_g @ written, q_g, state))  # (L, c, e): Q S + tril(Q Kᵀ) Ũ
        state = state if a_g is None else a_g * state  # Diag(a) S, a the chunk's total decay per key channel
        state = torch.baddbmm(state, k_g.transpose(-1, -2), written)  # (L, d, e): S + Kᵀ Ũ
    out = torch.stack(outs, dim=1).reshape(-1, qc.shape[1] * c, e)[:, :n]  # (L, n, e)
    return out.reshape(*lead, n, e), state.reshape(*lead, d, e)


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
        return_state: also return the final state ``(..., d, e)`` (float32 for half-precision inputs).

    Returns:
        ``o (..., n, e)`` in the dtype of ``v``, or ``(o, state)``.
    """
    dtype = v.dtype
    q, k, v, log_decay, state, _ = _prepare(q, k, v, log_decay, initial_state, chunk_size)
    beta = _prepare_beta(beta, k, k.dtype)
    _warn_key_norms(k, beta)
    if q.shape[-2] == 0:  # no tokens: an empty output, and the state as it came in (as the NumPy loop returns)
        out, state = v, state.clone()
    elif chunk_size is None:
        out, state = _loop(q, k, v, beta, log_decay, state)
    else:
        out, state = _chunked(q, k, v, beta, log_decay, state, chunk_size)
    return (out.to(dtype), state) if return_state else out.to(dtype)


def delta_rule_step(q_t, k_t, v_t, beta_t, state, *, log_decay_t=None):
    """One token of the (gated) delta rule. Notebook 11, Eq. (11.5).

    Args:
        q_t, k_t: ``(..., d)``; v_t: ``(..., e)``; beta_t: ``(...)`` in [0, 2].
        state: ``(..., d, e)`` from the previous step, or None (zeros).  Never mutated.
        log_decay_t: ``(...)`` (per head) or ``(..., d)`` (per key channel), ≤ 0, or None.

    Returns:
        ``(o_t (..., e), state (..., d, e))``.
    """
    _check_tensors(("beta_t",), (beta_t,))
    out, state = delta_rule_attention(*_as_sequence(q_t, k_t, v_t), beta_t[..., None],
                                      log_decay=_one_position(log_decay_t, k_t), chunk_size=None,
                                      initial_state=state, return_state=True)
    return out[..., 0, :], state


def _one_position(log_decay_t, k_t):
    """A step's decay as a sequence of one token: ``(...)`` → ``(..., 1)``, ``(..., d)`` → ``(..., 1, d)``."""
    if log_decay_t is None:
        return None
    _check_tensors(("log_decay_t",), (log_decay_t,))
    return log_decay_t[..., None, :] if log_decay_t.dim() == k_t.dim() else log_decay_t[..., None]


# --- DeltaProduct: n_h delta-rule steps a token (notebook 13) ----------------------------------

def _householder_steps(q, log_decay, n_householder):
    """q and the decay spread over each token's n_h steps: q at the last step, the decay at the first, zeros between.

    ``q (..., n, d)`` → ``(..., n·n_h, d)``; ``log_decay (..., n)`` or ``(..., n, d)`` → ``(..., n·n_h[, d])``.
    """
    n, d = q.shape[-2:]
    before = q.new_zeros(*q.shape[:-1], n_householder - 1, d)  # (..., n, n_h - 1, d)
    q_steps = torch.cat([before, q[..., None, :]], dim=-2).reshape(*q.shape[:-2], n * n_householder, d)
    if log_decay is None:
        return q_steps, None
    _check_tensors(("log_decay",), (log_decay,))
    if _validate.per_channel(log_decay, q):  # (..., n, d) → (..., n, n_h, d): log 1 = 0 after the first step
        after = log_decay.new_zeros(*log_decay.shape[:-1], n_householder - 1, d)
        steps = torch.cat([log_decay[..., None, :], after], dim=-2)
        return q_steps, steps.reshape(*log_decay.shape[:-2], n * n_householder, d)
    after = log_decay.new_zeros(*log_decay.shape, n_householder - 1)  # (..., n, n_h - 1)
    steps = torch.cat([log_decay[..., None], after], dim=-1)  # (..., n, n_h)
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
    _check_tensors(("q", "k", "v"), (q, k, v))
    _check_tensors(("beta",), (beta,))
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
    _check_tensors(("k_t",), (k_t,))
    if k_t.dim() < 2:
        raise ValueError(f"k_t must have shape (..., n_householder, d), one key per step, got {tuple(k_t.shape)}.")
    n_householder = k_t.shape[-2]
    out, state = delta_product_attention(q, k_t, v_t, beta_t, n_householder=n_householder,
                                         log_decay=_one_position(log_decay_t, q_t), chunk_size=None,
                                         initial_state=state, return_state=True)
    return out[..., 0, :], state
