"""Learned feature maps in PyTorch: the port of ``course_lib.numpy.feature_maps``, and the modules that train.

Implements notebook 10.  Hedgehog: Zhang et al. 2024 (ICLR 2024, arXiv 2402.04347); T2R:
Kasai et al. 2021 (EMNLP 2021, arXiv 2103.13076).  Same names and signatures as the NumPy
tree; any device and floating dtype, autograd.  ``HedgehogFeatureMap`` and ``T2RFeatureMap``
hold one weight ``(h, f, d)`` and one bias ``(h, f)``, a map per head, and are called on
``x (..., h, n, d)``: pass one as ``feature_map`` and its parameters train with the model.
"""

import math

import torch
from torch import nn

from course_lib import _validate
from course_lib.torch.full import _check


def _check_map(x, weight, bias):
    for name, a in (("x", x), ("weight", weight), ("bias", bias)):
        _validate.check_float(name, a, a.is_floating_point())
    if not x.dtype == weight.dtype == bias.dtype:  # else einsum: "expected m1 and m2 to have the same dtype"
        raise ValueError(f"x, weight and bias must share one dtype, got {x.dtype}, {weight.dtype} and {bias.dtype}: "
                         "cast the parameters to x's dtype (the map modules do).")
    if x.dim() < 1 or weight.dim() < 2 or weight.shape[-1] != x.shape[-1]:
        raise ValueError(f"weight must have shape (..., f, d) with d = {x.shape[-1] if x.dim() else '?'} (x is "
                         f"(..., n, d) = {tuple(x.shape)}), got {tuple(weight.shape)}.")
    if bias.shape[-1:] != weight.shape[-2:-1]:
        raise ValueError(f"bias must have shape (..., f) with f = {weight.shape[-2]} (weight is (..., f, d) = "
                         f"{tuple(weight.shape)}), got {tuple(bias.shape)}.")


def _affine(x, weight, bias):
    """u = W x + b for every position: ``(..., n, f)``, each head with its own W and b."""
    _check_map(x, weight, bias)
    return torch.einsum("...nd,...fd->...nf", x, weight) + bias.unsqueeze(-2)  # (..., n, f)


def hedgehog_feature_map(x, weight, bias, *, normalise=True):
    """Hedgehog's map phi(x) = [exp(Wx + b), exp(-(Wx + b))]. Notebook 10, Eq. (10.3); Zhang et al. 2024, §4.

    ``normalise=True``: a softmax over the f features of each half (Eq. 10.4), every feature in
    (0, 1) and no overflow; ``normalise=False``: the bare exponential.

    Args:
        x: queries or keys ``(..., n, d)``.
        weight: ``(..., f, d)``, one matrix per head; bias: ``(..., f)``.
        normalise: softmax over features (default) or the bare exponential.

    Returns:
        ``(..., n, 2f)``, every entry positive.
    """
    u = _affine(x, weight, bias)  # (..., n, f)
    if normalise:
        return torch.cat([torch.softmax(u, dim=-1), torch.softmax(-u, dim=-1)], dim=-1)  # (..., n, 2f)
    return torch.cat([u.exp(), (-u).exp()], dim=-1)  # (..., n, 2f)


def t2r_feature_map(x, weight, bias):
    """T2R's map phi(x) = relu(Wx + b). Notebook 10, Eq. (10.5); Kasai et al. 2021, §3.

    Args:
        x: queries or keys ``(..., n, d)``; weight: ``(..., f, d)``; bias: ``(..., f)``.

    Returns:
        ``(..., n, f)``, every entry ≥ 0.
    """
    return torch.relu(_affine(x, weight, bias))  # (..., n, f)


def linear_attention_weights(phi_q, phi_k, *, key_mask=None, eps=1e-6):
    """The n × s weights that linear attention applies to v, formed explicitly. Notebook 10, Eq. (10.2).

    Args:
        phi_q: query features ``(..., n, f)``; phi_k: key features ``(..., s, f)``; both non-negative.
        key_mask: boolean ``(..., s)``, True where the key is a real token.
        eps: added to each row's sum (absolute), as in ``linear_attention``.

    Returns:
        ``(..., n, s)``, rows summing to 1 over the real keys; padded keys get weight 0.
    """
    _check(phi_q, phi_k, None, key_mask, names=("phi_q", "phi_k", "v"))
    if phi_q.min() < 0 or phi_k.min() < 0:
        raise ValueError("phi_q and phi_k must be non-negative features: a signed kernel is no weight.")
    kernel = phi_q @ phi_k.transpose(-1, -2)  # "...nf,...sf->...ns" (..., n, s)
    if key_mask is not None:
        kernel = kernel.masked_fill(~key_mask.unsqueeze(-2), 0.0)  # padded keys weigh nothing
    return kernel / (kernel.sum(dim=-1, keepdim=True) + eps)  # (..., n, s)


def row_entropy(weights, *, key_mask=None):
    """Entropy -Σ_j w_ij ln w_ij of each row of attention weights, in nats. Notebook 10, Eq. (10.1).

    Args:
        weights: ``(..., n, s)``, rows summing to 1; key_mask: boolean ``(..., s)`` (padded keys left out).

    Returns:
        ``(..., n)``; 0 · ln 0 counts as 0.
    """
    if key_mask is not None:
        weights = weights.masked_fill(~key_mask.unsqueeze(-2), 0.0)  # (..., n, s)
    logs = torch.where(weights > 0, weights, torch.ones_like(weights)).log()  # ln 1 = 0 where w = 0
    return -(weights * logs).sum(dim=-1)  # (..., n)


def attention_cross_entropy(weights, approx, *, key_mask=None, eps=1e-12):
    """Hedgehog's distillation loss: -Σ_j P_ij ln A_ij, averaged over real query rows. Notebook 10, Eq. (10.6).

    Args:
        weights: the teacher's P ``(..., n, s)``; approx: the student's A ``(..., n, s)``.
        key_mask: boolean ``(..., s)`` with n = s: True on real tokens (padded query rows are dropped).
        eps: floor inside the log.

    Returns:
        A 0-dim tensor (differentiable in ``approx``).
    """
    if weights.shape != approx.shape:
        raise ValueError(f"weights and approx must have the same shape (..., n, s), got {tuple(weights.shape)} "
                         f"and {tuple(approx.shape)}.")
    per_row = -(weights * (approx + eps).log()).sum(dim=-1)  # (..., n)
    if key_mask is None:
        return per_row.mean()
    rows = key_mask.expand(per_row.shape)  # (..., n): n = s, a query is a token
    return per_row[rows].mean()



def _window_logits(q, k, phi_q, phi_k, window, log_scale, positions=None, floor=0.0):
    """ln of each weight's numerator in Eq. (10.9), ``(..., n, s)``: ln(near · e^score + γ phi(q)·phi(k)).

    ``positions`` ``(n,)``: where the n queries sit among the s keys (default 0 ... n - 1; a
    subset of rows for stage 1's loss); ``floor`` is added to the kernel before its log.
    """
    s = k.shape[-2]
    positions = torch.arange(q.shape[-2], device=q.device) if positions is None else positions  # (n,)
    near = (positions[:, None] - torch.arange(s, device=q.device)[None, :]).abs() <= window  # (n, s): the band
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # "...nd,...sd->...ns" (..., n, s)
    linear = log_scale + (phi_q @ phi_k.transpose(-1, -2) + floor).log()  # (..., n, s); ln 0 = -inf: no weight
    return torch.logaddexp(scores.masked_fill(~near, -torch.inf), linear)  # (..., n, s)


def _check_window(q, k, phi_q, phi_k, window):
    _check(q, k, None, None)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"the window pairs query i with key i: q and k need as many positions, got q "
                         f"{tuple(q.shape)} and k {tuple(k.shape)}.")
    if phi_q.shape[-2] != q.shape[-2] or phi_k.shape[-2] != k.shape[-2]:
        raise ValueError(f"phi_q and phi_k must be the features of q and k, one row per position: got phi_q "
                         f"{tuple(phi_q.shape)} for q {tuple(q.shape)}, phi_k {tuple(phi_k.shape)} for k "
                         f"{tuple(k.shape)}.")
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0 (keys within that many positions of the query), got {window!r}.")
    if phi_q.min() < 0 or phi_k.min() < 0:
        raise ValueError("phi_q and phi_k must be non-negative features: a signed kernel is no weight.")


def window_linear_weights(q, k, phi_q, phi_k, *, window, log_scale=0.0, key_mask=None):
    """Softmax on a sliding window plus linear attention, one normaliser: the n × s weights. Notebook 10, Eq. (10.9).

    Zhang et al. 2025 (LoLCATs, arXiv 2410.10254, §3.1), for an encoder.  Forms the n × n
    weights (for distillation and heatmaps); ``window_linear_attention`` never does.

    Args:
        q, k: ``(..., n, d)``; phi_q, phi_k: their features ``(..., n, f)``, non-negative.
        window: w ≥ 0: keys within w positions of the query are exact.
        log_scale: ln γ, a float or a tensor broadcasting to ``(..., 1, 1)`` (one per head).
        key_mask: boolean ``(..., n)``, True where the key is a real token.

    Returns:
        ``(..., n, n)``, rows summing to 1 over the real keys; padded keys get weight 0.
    """
    _check_window(q, k, phi_q, phi_k, window)
    logits = _window_logits(q, k, phi_q, phi_k, window, log_scale)  # (..., n, s)
    if key_mask is not None:
        _check(q, k, None, key_mask)
        logits = logits.masked_fill(~key_mask.unsqueeze(-2), -torch.inf)  # padded keys weigh nothing
    return torch.softmax(logits, dim=-1)  # (..., n, s)


def _blocks(x, window, block, fill):
    """``x (..., n, c)`` cut into blocks of ``block`` rows, each with the ``window`` rows on either side.

    Returns a view ``(..., n_blocks, block + 2w, c)`` (``fill`` beyond the ends), block i holding
    rows i·block - w ... (i + 1)·block + w - 1: every key that a query of block i can see.
    """
    n_blocks = -(-x.shape[-2] // block)
    right = n_blocks * block - x.shape[-2] + window  # up to a whole number of blocks, then the window
    padded = torch.nn.functional.pad(x, (0, 0, window, right), value=fill)  # (..., n_blocks·block + 2w, c)
    return padded.unfold(-2, block + 2 * window, block).transpose(-1, -2)  # (..., n_blocks, block + 2w, c)


def window_linear_attention(q, k, v, phi_q, phi_k, *, window, log_scale=0.0, key_mask=None):
    """Sliding-window softmax plus linear attention in O(n·(w + f)·e): Eq. (10.9) times v. Notebook 10, Section 10.5.

    No n × n matrix: the band is computed block by block (each block of queries against the
    keys it can reach, ``(block, block + 2w)`` scores; block = max(32, 2w) so that each product
    is a small matrix multiply), the rest is linear attention's phi(q) (phi(k)ᵀ v).  One shift
    per row keeps the exponentials finite: the larger of the band's largest score and
    ln(γ phi(q)·Σ phi(k)); it divides the numerator and the normaliser alike, so it cancels.

    Args:
        q, k, v, phi_q, phi_k, window, log_scale, key_mask: as for ``window_linear_weights``;
            v is ``(..., n, e)``.

    Returns:
        ``(..., n, e)`` in the dtype of ``v`` (sums in float32 for half precision).
    """
    _check(q, k, v, key_mask)
    _check_window(q, k, phi_q, phi_k, window)
    dtype, n = v.dtype, q.shape[-2]
    q, k, v, phi_q, phi_k = (x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
                             for x in (q, k, v, phi_q, phi_k))
    real = torch.ones(k.shape[:-1], dtype=torch.bool, device=k.device) if key_mask is None else key_mask  # (..., s)
    phi_k = phi_k.masked_fill(~real[..., :, None], 0.0)  # padded keys add nothing
    v = v.masked_fill(~real[..., :, None], 0.0)
    # linear attention over every key
    kv_state = phi_k.transpose(-1, -2) @ v  # "...sf,...se->...fe" (..., f, e)
    linear_num = phi_q @ kv_state  # (..., n, e)
    linear_den = (phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)).squeeze(-1)  # (..., n)
    log_scale = torch.as_tensor(log_scale, dtype=q.dtype, device=q.device)
    row_log_scale = log_scale.squeeze(-1) if log_scale.dim() else log_scale  # (..., 1): broadcasts over rows
    # the band, block by block
    block = max(32, 2 * window)
    n_blocks = -(-n // block)
    q_blocks = torch.nn.functional.pad(q, (0, 0, 0, n_blocks * block - n)).unflatten(-2, (n_blocks, block))
    scores = q_blocks @ _blocks(k, window, block, 0.0).transpose(-1, -2) / math.sqrt(q.shape[-1])  # (..., nb, c, c+2w)
    offset = torch.arange(block + 2 * window, device=q.device)[None, :] - torch.arange(block, device=q.device)[:, None]
    reachable = (offset >= 0) & (offset <= 2 * window)  # (c, c + 2w): key within w of the query
    key_real = _blocks(real[..., :, None], window, block, False)[..., 0]  # (..., nb, c + 2w)
    scores = scores.masked_fill(~(reachable & key_real[..., None, :]), -torch.inf)  # (..., nb, c, c + 2w)
    log_linear = row_log_scale + linear_den.log()  # (..., n)
    log_linear = torch.nn.functional.pad(log_linear, (0, n_blocks * block - n)).unflatten(-1, (n_blocks, block))
    shift = torch.maximum(scores.amax(dim=-1), log_linear).detach()  # (..., nb, c): cancels
    shift = shift.masked_fill(~shift.isfinite(), 0.0)  # a row with no real key at all: nothing to shift
    band = (scores - shift.unsqueeze(-1)).exp()  # (..., nb, c, c + 2w)
    band_num = (band @ _blocks(v, window, block, 0.0)).flatten(-3, -2)[..., :n, :]  # (..., n, e)
    band_den = band.sum(dim=-1).flatten(-2)[..., :n]  # (..., n)
    gamma = (row_log_scale - shift.flatten(-2)[..., :n]).exp()  # (..., n): γ e^(-shift), at most 1 / linear_den
    numerator = band_num + gamma.unsqueeze(-1) * linear_num  # (..., n, e)
    normaliser = band_den + gamma * linear_den  # (..., n)
    return (numerator / normaliser.unsqueeze(-1)).to(dtype)  # (..., n, e)

class HedgehogFeatureMap(nn.Module):
    """A trainable Hedgehog map per head, W started at the identity. Notebook 10, Eq. (10.3); Zhang et al. 2024.

    Started at W = I (the first f of the d coordinates when f < d) and b = 0, so before any
    training phi(x) = [softmax(x), softmax(-x)]: a positive map that already grows with x, as
    exp(qᵀk) does.

    Args:
        n_heads: h; head_dim: d; n_features: f (default d); the map returns 2f features.
        normalise: the softmax form (default) or the bare exponential.
    """

    def __init__(self, n_heads, head_dim, n_features=None, *, normalise=True, device=None, dtype=None):
        super().__init__()
        f = head_dim if n_features is None else n_features
        if f < 1:
            raise ValueError(f"n_features must be a positive int, got {n_features}.")
        eye = torch.eye(f, head_dim, device=device, dtype=dtype)  # (f, d)
        self.weight = nn.Parameter(eye.expand(n_heads, f, head_dim).clone())  # (h, f, d)
        self.bias = nn.Parameter(torch.zeros(n_heads, f, device=device, dtype=dtype))  # (h, f)
        self.normalise = normalise

    @property
    def n_features(self):
        """Features per position: 2f."""
        return 2 * self.weight.shape[-2]

    def forward(self, x):
        """``x (..., h, n, d)`` → ``(..., h, n, 2f)``."""
        # x's dtype, not the parameters': linear attention feeds half inputs in float32 (_features)
        return hedgehog_feature_map(x, self.weight.to(x.dtype), self.bias.to(x.dtype), normalise=self.normalise)


class T2RFeatureMap(nn.Module):
    """A trainable T2R map relu(Wx + b) per head, W random. Notebook 10, Eq. (10.5); Kasai et al. 2021.

    W is drawn N(0, 1/d) from ``generator`` (T2R starts from a random map and learns it by
    fine-tuning), b = 0.

    Args:
        n_heads: h; head_dim: d; n_features: f, the features per position.
        generator: a ``torch.Generator`` for the initial W (the only randomness).
    """

    def __init__(self, n_heads, head_dim, n_features, *, generator=None, device=None, dtype=None):
        super().__init__()
        if n_features < 1:
            raise ValueError(f"n_features must be a positive int, got {n_features}.")
        weight = torch.randn(n_heads, n_features, head_dim, generator=generator) / math.sqrt(head_dim)  # (h, f, d)
        self.weight = nn.Parameter(weight.to(device=device, dtype=dtype or torch.get_default_dtype()))
        self.bias = nn.Parameter(torch.zeros(n_heads, n_features, device=device, dtype=dtype))  # (h, f)

    @property
    def n_features(self):
        return self.weight.shape[-2]

    def forward(self, x):
        """``x (..., h, n, d)`` → ``(..., h, n, f)``."""
        return t2r_feature_map(x, self.weight.to(x.dtype), self.bias.to(x.dtype))  # x's dtype, as for Hedgehog
