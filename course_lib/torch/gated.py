"""Decay and gates on the linear-attention state, in PyTorch: the port of ``course_lib.numpy.gated``.

Implements notebooks 11 and 12.  S_t = Diag(a_t) S_{t-1} + k_t v_tᵀ, o_t = S_tᵀ q_t,
a_t = exp(log_decay_t); the state is ``(..., d, e)`` (keys × values).  Same names and signatures as
the NumPy tree; any device, autograd.  float16/bfloat16 inputs are computed in float32 (states and
sums) and the output cast back.

The chunked form differs from the NumPy one in what it batches, not in what it computes: every
chunk's c × c scores and its write to the state are computed for all chunks at once; only the
state crosses chunks in a Python loop, one multiply-add of a d × e matrix per chunk.  The scores
of a decay per channel (``channel_scores``, sub-chunks of c') have a backward of their own that
recomputes the decays instead of storing them.  Shapes inside: leading dims flattened into L,
``g`` chunks of ``c`` positions, ``i``, ``j`` positions in a chunk, ``s`` sub-chunks of ``c'``.
"""

import math

import torch

from course_lib import _validate
from course_lib._shared import RECURRENT_CHUNK_SIZE as DEFAULT_CHUNK_SIZE  # here, in torch.delta and the mixers
from course_lib._shared import SUB_CHUNK_SIZE

HALF = (torch.float16, torch.bfloat16)


def _work_dtype(*xs):
    dtype = xs[0].dtype
    return torch.float32 if dtype in HALF else dtype


def _check_tensors(names, xs, finite=True):
    """Each a floating-point tensor, one dtype for all, and (unless ``finite`` is False) free of NaN and inf."""
    for name, x in zip(names, xs, strict=True):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}.")
        _validate.check_float(name, x, x.is_floating_point())
        if finite and x.numel():  # min and max in one pass, one wait for the device (isfinite takes four passes)
            _validate.check_finite(name, *torch.stack(torch.aminmax(x)).tolist())
    if len({x.dtype for x in xs}) > 1:
        raise TypeError(f"{', '.join(names)} must share one dtype, got {', '.join(str(x.dtype) for x in xs)}.")


def _prepare(q, k, v, log_decay, initial_state, chunk_size, decay_name="log_decay"):
    """Check the arguments; return them broadcast to one leading shape, in the work dtype, and the decay's kind."""
    _check_tensors(("q", "k", "v"), (q, k, v))
    _validate.check_recurrence(q, k, v)
    _validate.check_chunk_size(chunk_size)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    channels = False
    work = _work_dtype(q)
    if log_decay is not None:
        _check_tensors((decay_name,), (log_decay,), finite=False)  # check_log_decay says why
        channels = _validate.per_channel(log_decay, k, decay_name)
        if log_decay.numel():
            lowest, largest = torch.stack(torch.aminmax(log_decay)).tolist()
            _validate.check_log_decay(decay_name, largest, math.isfinite(lowest) and math.isfinite(largest))
        lead = torch.broadcast_shapes(lead, log_decay.shape[:-2] if channels else log_decay.shape[:-1])
    n, d, e = k.shape[-2], k.shape[-1], v.shape[-1]
    if initial_state is not None:
        _check_tensors(("initial_state",), (initial_state,))
        _validate.check_state("initial_state", initial_state, lead, d, e)
    q, k, v = (x.to(work).expand(*lead, n, x.shape[-1]) for x in (q, k, v))
    if log_decay is not None:
        log_decay = log_decay.to(work).expand(*lead, n, d) if channels else log_decay.to(work).expand(*lead, n)
    state = (q.new_zeros(*lead, d, e) if initial_state is None else initial_state.to(work).expand(*lead, d, e))
    return q, k, v, log_decay, state, channels


def _loop(q, k, v, log_decay, state, channels):
    """The recurrence one token at a time (the reference)."""
    outs = []
    for t in range(q.shape[-2]):
        a = log_decay[..., t, :, None] if channels else log_decay[..., t, None, None]
        state = torch.exp(a) * state + k[..., t, :, None] * v[..., t, None, :]  # (..., d, e)
        outs.append(torch.einsum("...d,...de->...e", q[..., t, :], state))  # S_tᵀ q_t
    return torch.stack(outs, dim=-2), state  # (..., n, e), (..., d, e)


def masked_decay(G, inclusive=True):
    """exp(G_i - G_j) for j ≤ i (j < i unless ``inclusive``), 0 above: the differences masked *before* exp.

    Notebook 12, Eq. (12.2).  ``G (..., c)`` → ``(..., c, c)``; per channel, pass ``G`` as
    ``(..., d, c)`` for ``(..., d, c, c)``.  Every exponent that reaches exp is ≤ 0: nothing overflows.
    """
    c = G.shape[-1]
    allowed = torch.ones(c, c, dtype=torch.bool, device=G.device).tril(0 if inclusive else -1)  # (c, c), j <= i
    diff = G[..., :, None] - G[..., None, :]  # (..., c, c): G_i - G_j
    return torch.exp(diff.masked_fill(~allowed, float("-inf")))  # exp(-inf) = 0: no overflow, no NaN gradient


def chunk(x, chunk_size):
    """``(L, n, ...)`` → ``(L, g, c, ...)``, zero-padded to g·c positions (a zero key or value adds nothing)."""
    n = x.shape[1]
    g = -(-n // chunk_size)
    if g * chunk_size != n:
        pad = [0, 0] * (x.dim() - 2) + [0, g * chunk_size - n]
        x = torch.nn.functional.pad(x, pad)
    return x.reshape(x.shape[0], g, chunk_size, *x.shape[2:])


def _rescaled(q, k, G, start, sub):
    """The sub-chunk at ``start``: its queries and the keys before it, rescaled to G there, and the two decays.

    ``q, k, G (..., c, d)`` → ``q_rel (..., c', d)``, ``k_rel (..., start, d)``, ``to_first``, ``from_first``.
    Both exponents are ≤ 0: G_i − G_start for i in the sub-chunk, G_start − G_j for j before it (G falls).
    """
    rows, first = slice(start, start + sub), G[..., start:start + 1, :]  # (..., 1, d)
    to_first, from_first = torch.exp(G[..., rows, :] - first), torch.exp(first - G[..., :start, :])
    return q[..., rows, :] * to_first, k[..., :start, :] * from_first, to_first, from_first


def _diagonal_blocks(scores, sub):
    """The c' × c' blocks on the diagonal of ``scores (..., c, c)``, as a view ``(..., s, c', c')``."""
    s = scores.shape[-1] // sub
    blocks = scores.view(*scores.shape[:-2], s, sub, s, sub).diagonal(dim1=-4, dim2=-2)  # (..., c', c', s)
    return blocks.movedim(-1, -3)


class _ChannelScores(torch.autograd.Function):
    """``channel_scores`` with c a multiple of c', and a backward that recomputes the decays.

    Forward: the earlier sub-chunks as in the NumPy tree, one matmul each, batched over all chunks; the
    inside of the sub-chunks one diagonal j = i − δ at a time for all sub-chunks at once: the same sums as
    the masked (c', c', d) form, without its masked half or a (c', c', d) temporary, and G_i − G_j ≤ 0
    needs no mask.  Backward: nothing but q, k and G is stored (memory linear in n with a small constant),
    and G needs no graph: each score depends on G only through G_id − G_jd, so dG = q ⊙ dq − k ⊙ dk.
    """

    @staticmethod
    def forward(ctx, q, k, G, sub):
        ctx.save_for_backward(q, k, G)
        ctx.sub = sub
        c, d = q.shape[-2:]
        scores = q.new_zeros(*q.shape[:-1], c)  # (..., c, c)
        for start in range(sub, c, sub):
            q_rel, k_rel, _, _ = _rescaled(q, k, G, start, sub)
            scores[..., start:start + sub, :start] = q_rel @ k_rel.transpose(-1, -2)  # (..., c', start)
        qs, ks, Gs = (x.reshape(*x.shape[:-2], c // sub, sub, d) for x in (q, k, G))  # (..., s, c', d)
        blocks = _diagonal_blocks(scores, sub)  # (..., s, c', c')
        for delta in range(sub):
            i, j = slice(delta, sub), slice(0, sub - delta)  # j = i − δ
            term = torch.exp(Gs[..., i, :] - Gs[..., j, :]).mul_(qs[..., i, :]).mul_(ks[..., j, :])  # (..., s, c'−δ, d)
            blocks.diagonal(-delta, -2, -1).copy_(term.sum(-1))
        return scores

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_scores):
        q, k, G = ctx.saved_tensors
        sub, (c, d) = ctx.sub, q.shape[-2:]
        dq, dk = torch.zeros_like(q), torch.zeros_like(k)  # (..., c, d)
        for start in range(sub, c, sub):
            rows = slice(start, start + sub)
            q_rel, k_rel, to_first, from_first = _rescaled(q, k, G, start, sub)
            d_earlier = d_scores[..., rows, :start]  # (..., c', start)
            dq[..., rows, :] += (d_earlier @ k_rel).mul_(to_first)
            dk[..., :start, :] += (d_earlier.transpose(-1, -2) @ q_rel).mul_(from_first)
        qs, ks, Gs, dqs, dks = (x.view(*x.shape[:-2], c // sub, sub, d) for x in (q, k, G, dq, dk))  # (..., s, c', d)
        d_blocks = _diagonal_blocks(d_scores.contiguous(), sub)  # (..., s, c', c')
        for delta in range(sub):
            i, j = slice(delta, sub), slice(0, sub - delta)
            weighted = torch.exp(Gs[..., i, :] - Gs[..., j, :]).mul_(d_blocks.diagonal(-delta, -2, -1)[..., None])
            dqs[..., i, :] += weighted * ks[..., j, :]
            dks[..., j, :] += weighted.mul_(qs[..., i, :])
        return dq, dk, q * dq - k * dk, None


def channel_scores(q, k, G, sub=SUB_CHUNK_SIZE):
    """A chunk's scores Σ_d q_id k_jd exp(G_id − G_jd), j ≤ i, by sub-chunks. Notebook 12; Yang et al. 2024, §4.

    Sub-chunks of c': a sub-chunk's queries meet the earlier keys in one matmul, both rescaled to G at
    the sub-chunk's first position r (G_i − G_r ≤ 0 and G_r − G_j ≤ 0: no factor overflows); only
    inside a sub-chunk are the decays exponentiated per pair and channel.

    Args:
        q, k: ``(..., c, d)``; G: ``(..., c, d)``, the cumulative log decay from the chunk's start.
        sub: positions per sub-chunk.

    Returns:
        ``(..., c, c)``, zero above the diagonal.
    """
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], G.shape[:-2])
    q, k, G = (x.expand(*lead, *x.shape[-2:]) for x in (q, k, G))
    c = q.shape[-2]
    sub = min(sub, c)
    pad = -c % sub  # to whole sub-chunks: zero queries and keys, and no decay (G stays at its last value)
    if pad:
        q, k = (torch.nn.functional.pad(x, [0, 0, 0, pad]) for x in (q, k))  # (..., s·c', d)
        G = torch.cat([G, G[..., -1:, :].expand(*lead, pad, G.shape[-1])], dim=-2)
    return _ChannelScores.apply(q.contiguous(), k.contiguous(), G.contiguous(), sub)[..., :c, :c]


def _chunked(q, k, v, log_decay, state, channels, chunk_size):
    """All chunks' c × c scores at once, then the state chunk by chunk. Notebook 12, Eqs. (12.1)-(12.3)."""
    lead, n, d, e = q.shape[:-2], q.shape[-2], q.shape[-1], v.shape[-1]
    chunk_size = max(1, min(int(chunk_size), n))  # a sequence shorter than a chunk is one chunk of its length
    qc, kc, vc = (chunk(x.reshape(-1, n, x.shape[-1]), chunk_size) for x in (q, k, v))  # (L, g, c, d|e)
    G = torch.cumsum(chunk(log_decay.reshape(-1, n, *log_decay.shape[len(lead) + 1:]), chunk_size), dim=2)
    last = G[:, :, -1:]  # (L, g, 1[, d]): each chunk's total log decay
    if channels:  # G (L, g, c, d)
        scores = channel_scores(qc, kc, G)  # (L, g, c, c): sub-chunks, never a (c, c, d) tensor
        q_decayed, k_to_end = qc * torch.exp(G), kc * torch.exp(last - G)  # (L, g, c, d): exponents ≤ 0
    else:  # G (L, g, c)
        scores = (qc @ kc.transpose(-1, -2)) * masked_decay(G)  # (L, g, c, c)
        q_decayed, k_to_end = qc * torch.exp(G)[..., None], kc * torch.exp(last - G)[..., None]
    writes = k_to_end.transpose(-1, -2) @ vc  # (L, g, d, e): what each chunk adds, decayed to its end
    chunk_decay = torch.exp(last[:, :, 0])  # (L, g[, d]): each chunk's total decay, ≤ 1
    chunk_decay = chunk_decay[..., None] if channels else chunk_decay[..., None, None]  # (L, g, d | 1, 1)
    S, entering = state.reshape(-1, d, e), []
    for a_g, write_g in zip(chunk_decay.unbind(1), writes.unbind(1), strict=True):  # across chunks, Eq. (12.3)
        entering.append(S)
        S = a_g * S + write_g  # (L, d, e)
    out = q_decayed @ torch.stack(entering, dim=1) + scores @ vc  # (L, g, c, e)
    out = out.reshape(out.shape[0], -1, e)[:, :n]  # (L, n, e)
    return out.reshape(*lead, n, e), S.reshape(*lead, d, e)


def gated_linear_attention(q, k, v, log_decay, *, chunk_size=DEFAULT_CHUNK_SIZE, initial_state=None,
                           return_state=False):
    """Linear attention with a decay or gate on the state. Notebook 11, Eq. (11.3); notebook 12, Eqs. (12.1)-(12.3).

    S_t = Diag(a_t) S_{t-1} + k_t v_tᵀ and o_t = S_tᵀ q_t with a_t = exp(log_decay_t): no
    normaliser and no 1/√d (the caller scales).  Only masked differences of cumulative log decays
    are exponentiated, so a decay of e^-30 per token stays finite.  A decay per channel is chunked
    by sub-chunks (``channel_scores``; Yang et al. 2024, §4).

    Args:
        q, k: ``(..., n, d)``; v: ``(..., n, e)``.
        log_decay: ``(..., n)`` (one decay per head and token) or ``(..., n, d)`` (one per channel), ≤ 0.
        chunk_size: positions per chunk (need not divide n), or None for the token loop (the reference).
        initial_state: ``(..., d, e)`` to continue a sequence (None: zeros).
        return_state: also return the final state ``(..., d, e)`` (float32 for half-precision inputs).

    Returns:
        ``o (..., n, e)`` in the dtype of ``v``, or ``(o, state)``.
    """
    dtype = v.dtype
    q, k, v, log_decay, state, channels = _prepare(q, k, v, log_decay, initial_state, chunk_size)
    if q.shape[-2] == 0:  # no tokens: an empty output, and the state as it came in (as the NumPy loop returns)
        out, state = v, state.clone()
    elif chunk_size is None:
        out, state = _loop(q, k, v, log_decay, state, channels)
    else:
        out, state = _chunked(q, k, v, log_decay, state, channels, chunk_size)
    return (out.to(dtype), state) if return_state else out.to(dtype)


def gated_linear_attention_step(q_t, k_t, v_t, log_decay_t, state):
    """One token of the gated recurrence: S ← Diag(a_t) S + k_t v_tᵀ, o_t = Sᵀ q_t. Notebook 11, Eq. (11.3).

    Args:
        q_t, k_t: ``(..., d)``; v_t: ``(..., e)``; log_decay_t: ``(...)`` or ``(..., d)``, ≤ 0.
        state: ``(..., d, e)`` from the previous step, or None (zeros).  Never mutated.

    Returns:
        ``(o_t (..., e), state (..., d, e))``.
    """
    q, k, v = _as_sequence(q_t, k_t, v_t)
    if not isinstance(log_decay_t, torch.Tensor):
        raise TypeError(f"log_decay_t must be a torch.Tensor, got {type(log_decay_t).__name__}.")
    log_decay = log_decay_t[..., None] if log_decay_t.dim() < k_t.dim() else log_decay_t[..., None, :]
    q, k, v, log_decay, state, channels = _prepare(q, k, v, log_decay, state, None, "log_decay_t")
    out, state = _loop(q, k, v, log_decay, state, channels)
    return out[..., 0, :].to(v_t.dtype), state


def _as_sequence(*xs):
    """One token ``(..., dim)`` as a sequence of length 1 ``(..., 1, dim)``, after a check of its rank."""
    for name, x in zip(("q_t", "k_t", "v_t"), xs, strict=False):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}.")
        if x.dim() < 1:
            raise ValueError(f"{name} must have shape (..., dim) (one position, no sequence axis), got a scalar.")
    return tuple(x[..., None, :] for x in xs)
