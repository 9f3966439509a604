"""Exact (softmax) attention in NumPy: the reference every other variant is measured against.

Implements notebook 01.  Shapes follow the dimension key in ``course_lib``:
``q (..., n, d)``, ``k (..., s, d)``, ``v (..., s, e)``.
"""

import numpy as np

from course_lib import _validate


def _check(q, k, v=None, key_mask=None, names=("q", "k", "v")):
    for name, x in zip(names, (q, k, v), strict=True):
        if x is not None:
            _validate.check_float(name, x, np.issubdtype(np.asarray(x).dtype, np.floating))
    _validate.check_qkv(q, k, v)
    if key_mask is not None:
        key_mask = np.asarray(key_mask)
        _validate.check_key_mask(key_mask, k, key_mask.dtype == np.bool_)
    return key_mask


def causal_mask(n, s):
    """Boolean ``(n, s)`` mask, True where query i may attend to key j. Notebook 01, Eq. (1.4).

    Queries are aligned with the *last* n keys (query i sits at position s - n + i), so
    n = s is the usual lower triangle and n = 1 after a cache of s - 1 keys sees all s keys.
    """
    return np.arange(s)[None, :] <= np.arange(n)[:, None] + (s - n)  # (n, s)


def allowed_keys(n, s, *, causal=False, key_mask=None):
    """Combine the causal and key-padding masks into one boolean ``(..., n, s)`` mask, or None."""
    allowed = causal_mask(n, s) if causal else None
    if key_mask is not None:
        padding = np.asarray(key_mask)[..., None, :]  # (..., 1, s)
        allowed = padding if allowed is None else allowed & padding  # (..., n, s)
    return allowed


def masked_softmax(scores, allowed=None):
    """Softmax over the last axis, with weight 0 where ``allowed`` is False.

    A row with no allowed key gets all-zero weights (not NaN), matching PyTorch's SDPA.
    """
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    # Subtracting the row maximum keeps exp() from overflowing; an all-masked row has max -inf.
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    unnormalised = np.exp(scores - row_max)  # (..., n, s)
    normaliser = unnormalised.sum(axis=-1, keepdims=True)  # (..., n, 1)
    normaliser[normaliser == 0] = 1  # an all-masked row stays all zero
    unnormalised /= normaliser  # in place: P needs no second n×n buffer
    return unnormalised


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
    key_mask = _check(q, k, key_mask=key_mask)
    d = q.shape[-1]
    scores = np.einsum("...nd,...sd->...ns", q, k, optimize=True)  # (..., n, s); optimize: use BLAS
    scores /= np.sqrt(d)
    allowed = allowed_keys(q.shape[-2], k.shape[-2], causal=causal, key_mask=key_mask)
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
    return np.einsum("...ns,...se->...ne", weights, v, optimize=True)


def split_heads(x, n_heads):
    """``(..., n, h*d)`` → ``(..., h, n, d)``. Notebook 01, Section 1.4."""
    *lead, n, width = x.shape
    _validate.check_heads(width, n_heads)
    x = x.reshape(*lead, n, n_heads, width // n_heads)  # (..., n, h, d)
    return np.swapaxes(x, -2, -3)  # (..., h, n, d)


def merge_heads(x):
    """``(..., h, n, d)`` → ``(..., n, h*d)``, the inverse of ``split_heads``."""
    *lead, h, n, d = x.shape
    x = np.swapaxes(x, -2, -3)  # (..., n, h, d)
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
        key_mask = np.asarray(key_mask)[..., None, :]  # (..., 1, s): one mask for every head
    heads = attention(q, k, v, causal=causal, key_mask=key_mask)  # (..., h, n, d)
    return merge_heads(heads) @ w_o
