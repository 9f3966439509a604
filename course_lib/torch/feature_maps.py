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
        return hedgehog_feature_map(x, self.weight, self.bias, normalise=self.normalise)


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
        return t2r_feature_map(x, self.weight, self.bias)
