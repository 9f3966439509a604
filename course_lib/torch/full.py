"""Exact (softmax) attention in PyTorch: the port of ``course_lib.numpy.full``.

Implements notebook 01.  Same names and signatures as the NumPy tree; works on any device,
for any floating dtype, with autograd.  Shapes: ``q (..., n, d)``, ``k (..., s, d)``,
``v (..., s, e)``.
"""

import math

import torch
from torch import nn

from course_lib import _validate


def _check(q, k, v=None, key_mask=None, names=("q", "k", "v")):
    for name, x in zip(names, (q, k, v), strict=True):
        if x is not None:
            _validate.check_float(name, x, x.is_floating_point())
    _validate.check_qkv(q, k, v)
    if key_mask is not None:
        _validate.check_key_mask(key_mask, k, key_mask.dtype == torch.bool)


def causal_mask(n, s, device=None):
    """Boolean ``(n, s)`` mask, True where query i may attend to key j. Notebook 01, Eq. (1.4).

    Queries are aligned with the *last* n keys (query i sits at position s - n + i).
    """
    keys = torch.arange(s, device=device)[None, :]
    queries = torch.arange(n, device=device)[:, None] + (s - n)
    return keys <= queries  # (n, s)


def allowed_keys(n, s, *, causal=False, key_mask=None, device=None):
    """Combine the causal and key-padding masks into one boolean ``(..., n, s)`` mask, or None."""
    allowed = causal_mask(n, s, device) if causal else None
    if key_mask is not None:
        padding = key_mask[..., None, :]  # (..., 1, s)
        allowed = padding if allowed is None else allowed & padding  # (..., n, s)
    return allowed


def masked_softmax(scores, allowed=None):
    """Softmax over the last dim, with weight 0 where ``allowed`` is False.

    A row with no allowed key gets all-zero weights (not NaN), matching PyTorch's SDPA.
    Half-precision scores are normalised in float32 (a float16 sum of many weights loses digits).
    """
    dtype = scores.dtype
    scores = scores.float() if dtype in (torch.float16, torch.bfloat16) else scores
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    row_max = scores.amax(dim=-1, keepdim=True)
    # Subtracting the row maximum keeps exp() from overflowing; an all-masked row has max -inf.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    unnormalised = torch.exp(scores - row_max)  # (..., n, s); out of place: autograd needs exp's output
    normaliser = unnormalised.sum(dim=-1, keepdim=True)  # (..., n, 1)
    weights = unnormalised / torch.where(normaliser == 0, torch.ones_like(normaliser), normaliser)
    return weights.to(dtype)


def attention_weights(q, k, *, causal=False, key_mask=None):
    """The context-mapping matrix P = softmax(q kᵀ / √d). Notebook 01, Eq. (1.2).

    Args:
        q: queries ``(..., n, d)``.
        k: keys ``(..., s, d)``.
        causal: if True, query i sees only keys up to its own position.
        key_mask: boolean ``(..., s)``, True where the key is a real token.

    Returns:
        P ``(..., n, s)``; each row sums to 1 (or is all zero if every key is masked).
    """
    _check(q, k, key_mask=key_mask)
    d = q.shape[-1]
    scores = torch.einsum("...nd,...sd->...ns", q, k) / math.sqrt(d)  # (..., n, s)
    allowed = allowed_keys(q.shape[-2], k.shape[-2], causal=causal, key_mask=key_mask, device=q.device)
    return masked_softmax(scores, allowed)


def softmax_attention(q, k, v, *, causal=False, key_mask=None):
    """Scaled dot-product attention P v. Notebook 01, Eq. (1.1); Vaswani et al. 2017, Eq. 1.

    Args:
        q: queries ``(..., n, d)``.
        k: keys ``(..., s, d)``.
        v: values ``(..., s, e)``.
        causal: if True, query i sees only keys up to its own position.
        key_mask: boolean ``(..., s)``, True where the key is a real token.

    Returns:
        ``(..., n, e)``.
    """
    _check(q, k, v, key_mask)
    weights = attention_weights(q, k, causal=causal, key_mask=key_mask)  # (..., n, s)
    return torch.einsum("...ns,...se->...ne", weights, v)


def split_heads(x, n_heads):
    """``(..., n, h*d)`` → ``(..., h, n, d)``. Notebook 01, Section 1.4."""
    *lead, n, width = x.shape
    _validate.check_heads(width, n_heads)
    x = x.reshape(*lead, n, n_heads, width // n_heads)  # (..., n, h, d)
    return x.transpose(-2, -3)  # (..., h, n, d)


def merge_heads(x):
    """``(..., h, n, d)`` → ``(..., n, h*d)``, the inverse of ``split_heads``."""
    *lead, h, n, d = x.shape
    x = x.transpose(-2, -3)  # (..., n, h, d)
    return x.reshape(*lead, n, h * d)


def multi_head_attention(x, w_q, w_k, w_v, w_o, n_heads, *, causal=False, key_mask=None,
                         attention=softmax_attention):
    """Multi-head self-attention with a pluggable kernel. Notebook 01, Eq. (1.5).

    Args:
        x: inputs ``(..., n, d_model)``.
        w_q, w_k, w_v, w_o: ``(d_model, d_model)`` projection matrices (``x @ w``).
        n_heads: number of heads h; must divide d_model.
        causal, key_mask: as in ``softmax_attention``; ``key_mask`` is ``(..., n)``.
        attention: any function with ``softmax_attention``'s signature.

    Returns:
        ``(..., n, d_model)``.
    """
    q, k, v = (split_heads(x @ w, n_heads) for w in (w_q, w_k, w_v))  # (..., h, n, d)
    if key_mask is not None:
        key_mask = key_mask[..., None, :]  # (..., 1, s): one mask for every head
    heads = attention(q, k, v, causal=causal, key_mask=key_mask)  # (..., h, n, d)
    return merge_heads(heads) @ w_o


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention whose attention kernel is pluggable. Notebook 01, Section 1.4.

    ``attention`` is any function with ``softmax_attention``'s signature
    ``(q, k, v, *, causal, key_mask)``, so every variant of the course drops into the same block.

    Args:
        d_model: model width; split into ``n_heads`` heads of width ``d_model // n_heads``.
        n_heads: number of heads h.
        attention: the attention kernel (default: exact softmax attention).
        bias: whether the four projections have a bias.
    """

    def __init__(self, d_model, n_heads, attention=softmax_attention, *, bias=True):
        super().__init__()
        _validate.check_heads(d_model, n_heads)
        self.n_heads = n_heads
        self.attention = attention
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, *, causal=False, key_mask=None):
        """``x (b, n, d_model)``, ``key_mask (b, n)`` boolean → ``(b, n, d_model)``."""
        q = split_heads(self.q_proj(x), self.n_heads)  # (b, h, n, d)
        k = split_heads(self.k_proj(x), self.n_heads)  # (b, h, s, d)
        v = split_heads(self.v_proj(x), self.n_heads)  # (b, h, s, e)
        if key_mask is not None:
            key_mask = key_mask[..., None, :]  # (b, 1, s): one mask for every head
        heads = self.attention(q, k, v, causal=causal, key_mask=key_mask)  # (b, h, n, e)
        return self.out_proj(merge_heads(heads))  # (b, n, d_model)
