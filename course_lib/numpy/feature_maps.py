"""Learned feature maps for linear attention, in NumPy: Hedgehog and T2R, and how close they come to softmax.

Implements notebook 10.  Hedgehog: Zhang et al. 2024, "The Hedgehog & the Porcupine: Expressive
Linear Attentions with Softmax Mimicry" (ICLR 2024, arXiv 2402.04347).  T2R: Kasai et al. 2021,
"Finetuning Pretrained Transformers into RNNs" (EMNLP 2021, arXiv 2103.13076).  A learned map
has a weight ``(..., f, d)`` and a bias ``(..., f)`` per head; with the head axis leading, one
call maps every head of ``x (b, h, n, d)`` with its own ``weight (h, f, d)``.

This file is the reference for the maps themselves and for the quantities lesson 10 measures
(the n × s weights of linear attention, the entropy of their rows, the distillation loss);
training lives in ``course_lib.torch.feature_maps`` and ``course_lib.linearize``.
"""

import numpy as np

from course_lib import _validate
from course_lib.numpy.full import _check


def _check_map(x, weight, bias):
    for name, a in (("x", x), ("weight", weight), ("bias", bias)):
        _validate.check_float(name, a, np.issubdtype(a.dtype, np.floating))
    if x.ndim < 1 or weight.ndim < 2 or weight.shape[-1] != x.shape[-1]:
        raise ValueError(f"weight must have shape (..., f, d) with d = {x.shape[-1] if x.ndim else '?'} (x is "
                         f"(..., n, d) = {x.shape}), got {weight.shape}.")
    if bias.shape[-1:] != weight.shape[-2:-1]:
        raise ValueError(f"bias must have shape (..., f) with f = {weight.shape[-2]} (weight is (..., f, d) = "
                         f"{weight.shape}), got {bias.shape}.")


def _affine(x, weight, bias):
    """u = W x + b for every position: ``(..., n, f)``, each head with its own W and b."""
    x, weight, bias = (np.asarray(a) for a in (x, weight, bias))
    _check_map(x, weight, bias)
    return np.einsum("...nd,...fd->...nf", x, weight) + bias[..., None, :]  # (..., n, f)


def _softmax(u, axis=-1):
    u = u - u.max(axis=axis, keepdims=True)  # exp(u - max) <= 1: no overflow, the ratios are unchanged
    e = np.exp(u)
    return e / e.sum(axis=axis, keepdims=True)


def hedgehog_feature_map(x, weight, bias, *, normalise=True):
    """Hedgehog's map phi(x) = [exp(Wx + b), exp(-(Wx + b))]. Notebook 10, Eq. (10.3); Zhang et al. 2024, §4.

    ``normalise=True`` takes a softmax over the f features of each half instead of a bare exp
    (Eq. 10.4): the same directions, every feature in (0, 1), no overflow.  For a query the
    softmax's denominator cancels in linear attention's normaliser; for a key it rescales that
    key's weights, which training absorbs.  The negative half lets a feature grow when Wx + b
    is very negative, so the map can be spiky on both sides.

    Args:
        x: queries or keys ``(..., n, d)``.
        weight: ``(..., f, d)``, one matrix per head (leading dims broadcast with x's).
        bias: ``(..., f)``.
        normalise: softmax over features (default) or the bare exponential.

    Returns:
        ``(..., n, 2f)``, every entry positive.
    """
    u = _affine(x, weight, bias)  # (..., n, f)
    if normalise:
        return np.concatenate([_softmax(u), _softmax(-u)], axis=-1)  # (..., n, 2f)
    return np.concatenate([np.exp(u), np.exp(-u)], axis=-1)  # (..., n, 2f)


def t2r_feature_map(x, weight, bias):
    """T2R's map phi(x) = relu(Wx + b). Notebook 10, Eq. (10.5); Kasai et al. 2021, §3.

    Non-negative, but a query whose f projections are all negative has no feature at all
    (its normaliser is 0, and linear attention's eps turns its output into 0).

    Args:
        x: queries or keys ``(..., n, d)``.
        weight: ``(..., f, d)``; bias: ``(..., f)``.

    Returns:
        ``(..., n, f)``, every entry ≥ 0.
    """
    return np.maximum(_affine(x, weight, bias), 0.0)  # (..., n, f)


def linear_attention_weights(phi_q, phi_k, *, key_mask=None, eps=1e-6):
    """The n × s weights that linear attention applies to v, formed explicitly. Notebook 10, Eq. (10.2).

    A_ij = phi(q_i)·phi(k_j) / (Σ_t phi(q_i)·phi(k_t) + eps), the t running over real keys: each
    row sums to 1 (up to eps), like a row of softmax's P, so the two can be compared entry by
    entry.  Linear attention never forms this matrix; distillation and the heatmaps do.

    Args:
        phi_q: query features ``(..., n, f)``, non-negative.
        phi_k: key features ``(..., s, f)``, non-negative.
        key_mask: boolean ``(..., s)``, True where the key is a real token.
        eps: added to each row's sum (absolute), as in ``linear_attention``.

    Returns:
        ``(..., n, s)``; padded keys get weight 0.
    """
    phi_q, phi_k = np.asarray(phi_q), np.asarray(phi_k)
    _check(phi_q, phi_k, None, key_mask, names=("phi_q", "phi_k", "v"))
    if (phi_q < 0).any() or (phi_k < 0).any():
        raise ValueError("phi_q and phi_k must be non-negative features: a signed kernel is no weight.")
    kernel = np.einsum("...nf,...sf->...ns", phi_q, phi_k)  # (..., n, s)
    if key_mask is not None:
        kernel = np.where(np.asarray(key_mask)[..., None, :], kernel, 0.0)  # padded keys weigh nothing
    return kernel / (kernel.sum(axis=-1, keepdims=True) + eps)  # (..., n, s)


def row_entropy(weights, *, key_mask=None):
    """Entropy -Σ_j w_ij ln w_ij of each row of attention weights, in nats. Notebook 10, Eq. (10.1).

    0 for a row that puts all its weight on one key; ln s for a uniform row over s real keys.
    0 · ln 0 counts as 0.

    Args:
        weights: ``(..., n, s)``, rows summing to 1.
        key_mask: boolean ``(..., s)``; padded keys must carry weight 0 and are left out.

    Returns:
        ``(..., n)``.
    """
    weights = np.asarray(weights)
    if key_mask is not None:
        weights = np.where(np.asarray(key_mask)[..., None, :], weights, 0.0)  # (..., n, s)
    logs = np.log(np.where(weights > 0, weights, 1.0))  # ln 1 = 0 where w = 0: 0 · ln 0 = 0
    return -(weights * logs).sum(axis=-1)  # (..., n)


def attention_cross_entropy(weights, approx, *, key_mask=None, eps=1e-12):
    """Hedgehog's distillation loss: -Σ_j P_ij ln A_ij, averaged over real query rows. Notebook 10, Eq. (10.6).

    The cross-entropy between each row of softmax's P (the teacher) and the same row of the
    student's weights A (Eq. 10.2).  It is smallest, equal to the rows' own entropy, when A = P.
    Padded keys carry no weight in P and are left out; padded *query* rows are dropped too (a
    query at a padded position is never read).

    Args:
        weights: the teacher's P ``(..., n, s)``.
        approx: the student's A ``(..., n, s)``, rows summing to 1 over the real keys.
        key_mask: boolean ``(..., s)`` with n = s (self-attention): True on real tokens.
        eps: floor inside the log (a weight of exactly 0 would give -inf).

    Returns:
        A float: the mean over real rows of every leading index.
    """
    weights, approx = np.asarray(weights), np.asarray(approx)
    if weights.shape != approx.shape:
        raise ValueError(f"weights and approx must have the same shape (..., n, s), got {weights.shape} and "
                         f"{approx.shape}.")
    per_row = -(weights * np.log(approx + eps)).sum(axis=-1)  # (..., n)
    if key_mask is None:
        return float(per_row.mean())
    rows = np.broadcast_to(np.asarray(key_mask), per_row.shape)  # (..., n): n = s, a query is a token
    return float(per_row[rows].mean())


def _window_logits(q, k, phi_q, phi_k, window, log_scale):
    """ln of each weight's numerator in Eq. (10.9), ``(..., n, s)``: ln(near · e^score + γ phi(q)·phi(k))."""
    n, s = q.shape[-2], k.shape[-2]
    near = np.abs(np.arange(n)[:, None] - np.arange(s)[None, :]) <= window  # (n, s): the exact band
    scores = np.einsum("...nd,...sd->...ns", q, k) / np.sqrt(q.shape[-1])  # (..., n, s)
    with np.errstate(divide="ignore"):  # a kernel value of exactly 0 (T2R) is ln 0 = -inf: no weight
        linear = log_scale + np.log(np.einsum("...nf,...sf->...ns", phi_q, phi_k))  # (..., n, s)
    return np.logaddexp(np.where(near, scores, -np.inf), linear)  # (..., n, s)


def _check_window(q, k, phi_q, phi_k, window):
    _check(q, k, None, None)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"the window pairs query i with key i: q and k need as many positions, got q "
                         f"{q.shape} and k {k.shape}.")
    if phi_q.shape[-2] != q.shape[-2] or phi_k.shape[-2] != k.shape[-2]:
        raise ValueError(f"phi_q and phi_k must be the features of q and k, one row per position: got phi_q "
                         f"{phi_q.shape} for q {q.shape}, phi_k {phi_k.shape} for k {k.shape}.")
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"window must be an int >= 0 (keys within that many positions of the query), got {window!r}.")
    if (phi_q < 0).any() or (phi_k < 0).any():
        raise ValueError("phi_q and phi_k must be non-negative features: a signed kernel is no weight.")


def window_linear_weights(q, k, phi_q, phi_k, *, window, log_scale=0.0, key_mask=None):
    """Softmax on a sliding window plus linear attention, one normaliser: the n × s weights. Notebook 10, Eq. (10.9).

    A_ij ∝ [|i - j| ≤ window] · exp(q_i·k_j/√d) + γ · phi(q_i)·phi(k_j), with γ = exp(log_scale);
    each row sums to 1 over the real keys.  The keys near the query get softmax's own weight
    (plus the kernel's, which is small beside it), every key gets the learned kernel's: the
    sliding window and linear attention of Zhang et al. 2025 (LoLCATs, arXiv 2410.10254, §3.1),
    here for an encoder (keys on both sides of the query).

    Args:
        q: ``(..., n, d)``; k: ``(..., n, d)`` (self-attention: query i sits at key i).
        phi_q, phi_k: the feature-map outputs of q and k, ``(..., n, f)``, non-negative.
        window: w ≥ 0: keys within w positions of the query are exact (2w + 1 of them).
        log_scale: ln γ, a float or an array broadcasting to ``(..., 1, 1)`` (one per head).
        key_mask: boolean ``(..., n)``, True where the key is a real token.

    Returns:
        ``(..., n, n)``; padded keys get weight 0.
    """
    q, k, phi_q, phi_k = (np.asarray(a) for a in (q, k, phi_q, phi_k))
    _check_window(q, k, phi_q, phi_k, window)
    logits = _window_logits(q, k, phi_q, phi_k, window, np.asarray(log_scale))  # (..., n, s)
    if key_mask is not None:
        _check(q, k, None, key_mask)
        logits = np.where(np.asarray(key_mask)[..., None, :], logits, -np.inf)  # padded keys weigh nothing
    logits = logits - logits.max(axis=-1, keepdims=True)  # one shift per row: the ratios are unchanged
    weights = np.exp(logits)
    return weights / weights.sum(axis=-1, keepdims=True)  # (..., n, s)


def window_linear_attention(q, k, v, phi_q, phi_k, *, window, log_scale=0.0, key_mask=None):
    """Sliding-window softmax plus linear attention: Eq. (10.9)'s weights times v. Notebook 10, Section 10.5.

    The reference: it forms the n × n weights.  ``course_lib.torch.feature_maps`` computes the
    same in O(n·(w + f)·e), never forming them.

    Args:
        q, k, phi_q, phi_k, window, log_scale, key_mask: as for ``window_linear_weights``.
        v: ``(..., n, e)``.

    Returns:
        ``(..., n, e)``.
    """
    _check(np.asarray(q), np.asarray(k), np.asarray(v), None)
    weights = window_linear_weights(q, k, phi_q, phi_k, window=window, log_scale=log_scale, key_mask=key_mask)
    return weights @ np.asarray(v)  # (..., n, e)
