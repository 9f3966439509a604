"""The delta rule, with and without a gate, in PyTorch: the port of ``course_lib.numpy.delta``.

Implements notebooks 11 and 12; Yang et al. 2024 (arXiv 2406.06484) and 2025 (arXiv 2412.06464).
S_t = a_t (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t; the state is ``(..., d, e)``
(keys × values).  Same names and signatures as the NumPy tree; any device, autograd.
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
from course_lib.torch.gated import DEFAULT_CHUNK_SIZE, _as_sequence, _check_tensors, _prepare, chunk, masked_decay


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
    if largest > 2 * (1 + 1e-6):  # the slack: a unit key with β = 1 rounds to 1 ± ulp
        warnings.warn(_validate.key_norm_warning(largest), RuntimeWarning, stacklevel=3)


def _loop(q, k, v, beta, log_decay, state):
    """The recurrence one token at a time (the reference): decay, then write v_t under k_t in proportion β_t."""
    outs = []
    for t in range(q.shape[-2]):
        if log_decay is not None:
            state = torch.exp(log_decay[..., t, None, None]) * state  # a_t S_{t-1}
        stored = torch.einsum("...d,...de->...e", k[..., t, :], state)  # what k_t reads now (..., e)
        state = state + beta[..., t, None, None] * k[..., t, :, None] * (v[..., t, None, :] - stored[..., None, :])
        outs.append(torch.einsum("...d,...de->...e", q[..., t, :], state))  # S_tᵀ q_t
    return torch.stack(outs, dim=-2), state  # (..., n, e), (..., d, e)


def ut_transform(k, beta, log_decay=None):
    """T = (I + tril(Diag(β) (Γ ⊙ K Kᵀ), -1))⁻¹ Diag(β) for each chunk. Notebook 12, Eq. (12.6).

    Args:
        k: ``(..., c, d)``; beta: ``(..., c)``; log_decay: ``(..., c)`` or None.

    Returns:
        ``T (..., c, c)``, lower triangular: one triangular solve, no pivoting.
    """
    c = k.shape[-2]
    eye = torch.eye(c, dtype=k.dtype, device=k.device)
    gram = k @ k.transpose(-1, -2)  # (..., c, c)
    if log_decay is not None:
        gram = gram * masked_decay(torch.cumsum(log_decay, dim=-1))
    lower = eye + (beta[..., :, None] * gram).tril(-1)  # (..., c, c), ones on the diagonal
    return torch.linalg.solve_triangular(lower, torch.diag_embed(beta), upper=False, unitriangular=True)


def _chunked(q, k, v, beta, log_decay, state, chunk_size):
    """The WY/UT form: all chunks' solves at once, then the state chunk by chunk. Notebook 12, Eq. (12.7)."""
    lead, n, d, e = q.shape[:-2], q.shape[-2], q.shape[-1], v.shape[-1]
    chunk_size = max(1, min(chunk_size, n))  # a sequence shorter than a chunk is one chunk of its length: no padding
    qc, kc, vc = (chunk(x.reshape(-1, n, x.shape[-1]), chunk_size) for x in (q, k, v))  # (L, g, c, d|e)
    bc = chunk(beta.reshape(-1, n), chunk_size)  # (L, g, c); padding has β = 0: it writes nothing
    c = chunk_size
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    scores = (qc @ kc.transpose(-1, -2)).masked_fill(~causal, 0.0)  # (L, g, c, c), j <= i
    gram = kc @ kc.transpose(-1, -2)  # (L, g, c, c)
    if log_decay is not None:
        G = torch.cumsum(chunk(log_decay.reshape(-1, n), chunk_size), dim=2)  # (L, g, c)
        scores = scores * masked_decay(G)
        gram = gram * masked_decay(G, inclusive=False)
        rhs = torch.cat([kc * torch.exp(G)[..., None], vc], dim=-1)  # (L, g, c, d + e): Diag(γ) K beside V
    else:
        rhs = torch.cat([kc, vc], dim=-1)
    lower = (bc[..., :, None] * gram).tril(-1) + torch.eye(c, dtype=q.dtype, device=q.device)  # (L, g, c, c)
    # T [γK, V] = L⁻¹ Diag(β) [γK, V]: one solve for W and U together, Eq. (12.6)
    wu = torch.linalg.solve_triangular(lower, bc[..., None] * rhs, upper=False, unitriangular=True)
    w, u = wu[..., :d], wu[..., d:]  # (L, g, c, d), (L, g, c, e)
    if log_decay is not None:
        q_decayed, last = qc * torch.exp(G)[..., None], G[..., -1:]  # (L, g, c, d), (L, g, 1)
        k_to_end, chunk_decay = kc * torch.exp(last - G)[..., None], torch.exp(last)[..., None]  # ≤ 1 both
    else:
        q_decayed, k_to_end, chunk_decay = qc, kc, None
    outs = []
    state = state.reshape(-1, d, e)  # (L, d, e)
    # unbind, not [:, g]: the backward of one unbind stacks the chunks' gradients once, while each
    # [:, g] would write its gradient into a zero tensor of the whole sequence (quadratic in n)
    decays = [None] * qc.shape[1] if chunk_decay is None else chunk_decay.unbind(1)
    for u_g, w_g, q_g, s_g, k_g, a_g in zip(u.unbind(1), w.unbind(1), q_decayed.unbind(1), scores.unbind(1),
                                            k_to_end.unbind(1), decays, strict=True):
        written = torch.baddbmm(u_g, w_g, state, alpha=-1)  # (L, c, e): Ũ = U − W S, what this chunk writes
        outs.append(torch.baddbmm(s_g @ written, q_g, state))  # (L, c, e): Q S + tril(Q Kᵀ) Ũ
        state = state if a_g is None else a_g * state
        state = torch.baddbmm(state, k_g.transpose(-1, -2), written)  # (L, d, e): S + Kᵀ Ũ
    out = torch.stack(outs, dim=1).reshape(-1, qc.shape[1] * c, e)[:, :n]  # (L, n, e)
    return out.reshape(*lead, n, e), state.reshape(*lead, d, e)


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
        return_state: also return the final state ``(..., d, e)`` (float32 for half-precision inputs).

    Returns:
        ``o (..., n, e)`` in the dtype of ``v``, or ``(o, state)``.
    """
    dtype = v.dtype
    q, k, v, log_decay, state, channels = _prepare(q, k, v, log_decay, initial_state, chunk_size)
    _validate.check_decay_per_head(channels, k)
    beta = _prepare_beta(beta, k, k.dtype)
    _warn_key_norms(k, beta)
    if chunk_size is None:
        out, state = _loop(q, k, v, beta, log_decay, state)
    else:
        out, state = _chunked(q, k, v, beta, log_decay, state, chunk_size)
    return (out.to(dtype), state) if return_state else out.to(dtype)


def delta_rule_step(q_t, k_t, v_t, beta_t, state, *, log_decay_t=None):
    """One token of the (gated) delta rule. Notebook 11, Eq. (11.5).

    Args:
        q_t, k_t: ``(..., d)``; v_t: ``(..., e)``; beta_t: ``(...)`` in [0, 1]; log_decay_t: ``(...)`` ≤ 0, or None.
        state: ``(..., d, e)`` from the previous step, or None (zeros).  Never mutated.

    Returns:
        ``(o_t (..., e), state (..., d, e))``.
    """
    _check_tensors(("beta_t",), (beta_t,))
    log_decay = None if log_decay_t is None else log_decay_t[..., None]
    out, state = delta_rule_attention(*_as_sequence(q_t, k_t, v_t), beta_t[..., None], log_decay=log_decay,
                                      chunk_size=None, initial_state=state, return_state=True)
    return out[..., 0, :], state
