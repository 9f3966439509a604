"""Decay and gates on the linear-attention state, in PyTorch: the port of ``course_lib.numpy.gated``.

Implements notebooks 11 and 12.  S_t = Diag(a_t) S_{t-1} + k_t v_tᵀ, o_t = S_tᵀ q_t,
a_t = exp(log_decay_t); the state is ``(..., d, e)`` (keys × values).  Same names and signatures as
the NumPy tree; any device, autograd.  float16/bfloat16 inputs are computed in float32 (states and
sums) and the output cast back.

The chunked form differs from the NumPy one in what it batches, not in what it computes: every
chunk's c × c scores and its write to the state are computed for all chunks at once; only the
state crosses chunks in a Python loop, one multiply-add of a d × e matrix per chunk.  Shapes
inside: leading dims flattened into L, ``g`` chunks of ``c`` positions, ``i``, ``j`` positions in
a chunk.
"""

import torch

from course_lib import _validate
from course_lib.numpy.gated import DEFAULT_CHUNK_SIZE  # noqa: F401 (re-exported: one default for both trees)

HALF = (torch.float16, torch.bfloat16)


def _work_dtype(*xs):
    dtype = xs[0].dtype
    return torch.float32 if dtype in HALF else dtype


def _check_tensors(names, xs):
    for name, x in zip(names, xs, strict=True):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}.")
        _validate.check_float(name, x, x.is_floating_point())
    if len({x.dtype for x in xs}) > 1:
        raise TypeError(f"{', '.join(names)} must share one dtype, got {', '.join(str(x.dtype) for x in xs)}.")


def _prepare(q, k, v, log_decay, initial_state, chunk_size, decay_name="log_decay"):
    """Check the arguments; return them broadcast to one leading shape, in the work dtype, and the decay's kind."""
    _check_tensors(("q", "k", "v"), (q, k, v))
    _validate.check_recurrence(q, k, v)
    _validate.check_chunk_size(chunk_size, isinstance(chunk_size, int))
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    channels = False
    work = _work_dtype(q)
    if log_decay is not None:
        _check_tensors((decay_name,), (log_decay,))
        channels = _validate.per_channel(log_decay, k, decay_name)
        if log_decay.numel():
            _validate.check_log_decay(decay_name, log_decay.max().item(), bool(torch.isfinite(log_decay).all()))
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


def _chunked(q, k, v, log_decay, state, channels, chunk_size):
    """All chunks' masked c × c decays at once, then the state chunk by chunk. Notebook 12, Eqs. (12.1)-(12.3)."""
    lead, n, d, e = q.shape[:-2], q.shape[-2], q.shape[-1], v.shape[-1]
    chunk_size = max(1, min(chunk_size, n))  # a sequence shorter than a chunk is one chunk of its length: no padding
    qc, kc, vc = (chunk(x.reshape(-1, n, x.shape[-1]), chunk_size) for x in (q, k, v))  # (L, g, c, d|e)
    G = torch.cumsum(chunk(log_decay.reshape(-1, n, *log_decay.shape[len(lead) + 1:]), chunk_size), dim=2)
    last = G[:, :, -1:]  # (L, g, 1[, d]): each chunk's total log decay
    if channels:  # G (L, g, c, d)
        weights = masked_decay(G.transpose(-1, -2))  # (L, g, d, c, c)
        scores = torch.einsum("Lgid,Lgjd,Lgdij->Lgij", qc, kc, weights)  # (L, g, c, c)
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
    are exponentiated, so a decay of e^-30 per token stays finite.

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
    if chunk_size is None:
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
