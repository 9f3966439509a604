"""Trainable attention layers for MiniLM, and ``linearize``: MiniLM with one in every layer.

Implements notebook 10, Sections 10.2-10.5.  The layers are the library's attention modules
(``course_lib.torch.modules``): ``LearnedLinearAttention`` is a ``LinearAttention`` with learned
feature maps, ``LearnedLinformer`` a ``LinformerSelfAttention`` whose E, F start at mean pooling.
``from_attention(layer.attention, ...)`` copies a MiniLM layer's projections into one, so it
replaces that layer's attention with the same weights.  Each also has ``stage1_loss(q, k, v,
key_mask)``: what stage 1 minimises for it, given the exact model's q, k, v of its layer.
"""

import copy
import math

import torch
from torch import nn

from course_lib.pretrained import MiniLM
from course_lib.torch import linear
from course_lib.torch.feature_maps import (
    HedgehogFeatureMap,
    T2RFeatureMap,
    _window_logits,
    linear_attention_weights,
    window_linear_attention,
    window_linear_weights,
)
from course_lib.torch.full import attention_weights, softmax_attention
from course_lib.torch.linformer import LinformerSelfAttention, mean_pooling
from course_lib.torch.modules import LinearAttention

METHODS = ("hedgehog", "t2r", "linformer")


def _rows(q, key_mask, rows):
    """The chosen query rows of q ``(b, h, r, d)`` and of the mask ``(b, 1, r)`` (all of them for None)."""
    return (q, key_mask) if rows is None else (q[..., rows, :], key_mask[..., rows])


class LearnedLinearAttention(LinearAttention):
    """Linear attention with learned maps: ``feature_map`` for queries, ``key_map`` for keys. Notebook 10, Eq. (10.2).

    Non-causal (MiniLM is an encoder).  ``key_map=None`` uses ``feature_map`` for both (T2R).
    With ``window`` = w, the keys within w positions of each query also get softmax's exact
    weight, under one normaliser with the kernel scaled by a learned γ per head (Eq. 10.9;
    LoLCATs): the cost stays linear in n, O(n·(w + f)·e).

    Args:
        d_model, n_heads: width and heads.
        feature_map: an ``nn.Module`` ``(b, h, n, d) → (b, h, n, f)`` with non-negative output.
        key_map: the keys' map, or None.
        window: None (linear attention only) or an int w ≥ 0 (a sliding window of 2w + 1 exact keys).
        eps, bias, device, dtype: as for ``LinearAttention``.
    """

    def __init__(self, d_model, n_heads, *, feature_map, key_map=None, window=None, eps=1e-6, bias=True, device=None,
                 dtype=None):
        super().__init__(d_model, n_heads, feature_map=feature_map, eps=eps, bias=bias, device=device, dtype=dtype)
        self.key_map = key_map if key_map is None or (device is None and dtype is None) else key_map.to(
            device=device, dtype=dtype)  # a Module: registered, trained, saved
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
            raise ValueError(f"window must be None or an int >= 0, got {window!r}.")
        self.window = window
        if window is not None:  # ln γ per head; start_scale sets it from data before training
            self.log_scale = nn.Parameter(torch.zeros(n_heads, 1, 1, device=device, dtype=dtype))  # (h, 1, 1)

    def features(self, q, k):
        """``(phi_q (b, h, n, f), phi_k (b, h, s, f))``, checked non-negative."""
        (phi_q,) = linear._features(self.feature_map, ("q", q))
        (phi_k,) = linear._features(self.feature_map if self.key_map is None else self.key_map, ("k", k))
        return phi_q, phi_k

    def attend(self, q, k, v, key_mask):
        phi_q, phi_k = self.features(q, k)
        if self.window is not None:
            return window_linear_attention(q, k, v, phi_q, phi_k, window=self.window, log_scale=self.log_scale,
                                           key_mask=key_mask)  # (b, h, n, e), sums in float32 for half inputs
        out = linear.linear_attention_from_features(phi_q, phi_k, v.to(phi_q.dtype), eps=self.eps, key_mask=key_mask)
        return out.to(v.dtype)  # (b, h, n, e)

    def weights(self, q, k, *, key_mask=None):
        """The explicit n × s weights this layer applies (Eq. 10.2 or 10.9), ``(b, h, n, s)``, from q, k."""
        if self.window is not None:
            return window_linear_weights(q, k, *self.features(q, k), window=self.window, log_scale=self.log_scale,
                                         key_mask=key_mask)
        return linear_attention_weights(*self.features(q, k), key_mask=key_mask, eps=self.eps)

    @torch.no_grad()
    def start_scale(self, q, k, key_mask):
        """Set γ (windowed layers only) so that the kernel carries softmax's weight outside the window, per head.

        ln γ = mean over real query rows of ln Σ_{|i-j|>w} e^{q_i·k_j/√d} - ln Σ_{|i-j|>w} phi(q_i)·phi(k_j):
        at γ = 1 a learned map's kernel (features in (0, 1)) is a few orders of magnitude below
        softmax's e^score, and the band would take every row's weight.

        Args:
            q, k: the exact model's ``(b, h, n, d)``; key_mask: ``(b, 1, n)``.
        """
        if self.window is None:
            return
        n = q.shape[-2]
        positions = torch.arange(n, device=q.device)
        far = ((positions[:, None] - positions[None, :]).abs() > self.window) & key_mask[..., None, :]  # (b, 1, n, s)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~far, -torch.inf)  # (b, h, n, s)
        phi_q, phi_k = self.features(q, k)  # (b, h, n, f), (b, h, s, f)
        kernel = (phi_q @ phi_k.transpose(-1, -2)).log().masked_fill(~far, -torch.inf)  # (b, h, n, s)
        gap = scores.logsumexp(dim=-1) - kernel.logsumexp(dim=-1)  # (b, h, n)
        rows = key_mask.expand(gap.shape)  # (b, h, n): real query rows (n = s)
        self.log_scale.copy_(torch.stack([gap[:, head][rows[:, head]].mean() for head in range(gap.shape[1])])
                             .reshape(self.log_scale.shape))

    def stage1_loss(self, q, k, v, key_mask, rows=None):
        """Hedgehog's attention distillation: cross-entropy from softmax's P to these weights (Eq. 10.6).

        Equal to ``attention_cross_entropy(P, self.weights(q, k))`` but cheaper: since each row of P
        sums to 1, -Σ_j P_ij ln A_ij = ln Σ_t a_it - Σ_j P_ij ln a_ij, with a_ij the numerator of
        A_ij (phi(q_i)·phi(k_j), or Eq. 10.9's), so the weights are never normalised.  ``rows`` (an
        index of query positions) scores a random subset of the queries: an unbiased estimate of
        the mean over all rows.

        Args:
            q, k, v: the exact model's ``(b, h, n, d)`` for this layer; key_mask: ``(b, 1, s)``.
            rows: query positions to score, or None for all.
        """
        positions = torch.arange(q.shape[-2], device=q.device) if rows is None else rows  # (r,)
        q, row_mask = _rows(q, key_mask, rows)  # (b, h, r, d), (b, 1, r)
        with torch.no_grad():
            target = attention_weights(q, k, key_mask=key_mask)  # (b, h, r, s)
        phi_q, phi_k = self.features(q, k)  # (b, h, r, f), (b, h, s, f)
        if self.window is not None:  # the floor 1e-12 as below: a relu map's zero kernel values
            log_numerator = _window_logits(q, k, phi_q, phi_k, self.window, self.log_scale, positions, 1e-12)
            log_numerator = log_numerator.masked_fill(~key_mask[..., None, :], -torch.inf)  # (b, h, r, s): padded: none
            log_normaliser = log_numerator.logsumexp(dim=-1)  # (b, h, r)
            log_numerator = log_numerator.masked_fill(~key_mask[..., None, :], 0.0)  # P is 0 there: 0 · 0, not NaN
        else:
            phi_k = phi_k.masked_fill(~key_mask[..., :, None], 0.0)  # padded keys weigh nothing
            log_normaliser = ((phi_q * phi_k.sum(dim=-2, keepdim=True)).sum(dim=-1) + self.eps).log()  # (b, h, r)
            log_numerator = (phi_q @ phi_k.transpose(-1, -2) + 1e-12).log()  # "...rf,...sf->...rs" (b, h, r, s)
        per_row = log_normaliser - (target * log_numerator).sum(dim=-1)  # (b, h, r)
        return per_row[row_mask.expand(per_row.shape)].mean()  # padded query rows are never read

    def extra_repr(self):
        return super().extra_repr() + ("" if self.window is None else f", window={self.window}")


class LearnedLinformer(LinformerSelfAttention):
    """Linformer with trainable E, F ``(k, max_len)`` shared by the heads, started at mean pooling. Notebook 10, §10.4.

    A text of s ≤ max_len tokens uses the first s columns of E and F (``linformer_attention``).
    """

    def __init__(self, d_model, n_heads, max_len, k, *, bias=True, device=None, dtype=None):
        super().__init__(d_model, n_heads, max_len, k, sharing="headwise", bias=bias, device=device, dtype=dtype)
        with torch.no_grad():  # mean pooling (notebook 04, Section 4.3): a sensible start, not a random one
            self.E.copy_(mean_pooling(k, max_len))
            self.F.copy_(mean_pooling(k, max_len))

    def stage1_loss(self, q, k, v, key_mask, rows=None):
        """Lesson 04's fit (Eq. 4.6): relative squared error of the attention output, per head and text."""
        q, row_mask = _rows(q, key_mask, rows)  # (b, h, r, d), (b, 1, r)
        with torch.no_grad():
            target = softmax_attention(q, k, v, key_mask=key_mask)  # (b, h, r, e)
            real = row_mask[..., :, None].to(q.dtype)  # (b, 1, r, 1): padded query rows are never read
            target_sq = (target * real).square().sum(dim=(-2, -1))  # (b, h)
        error = (self.attend(q, k, v, key_mask) - target) * real  # (b, h, r, e)
        return (error.square().sum(dim=(-2, -1)) / target_sq).mean()


def feature_kernel(feature_map):
    """A fixed (untrained) feature map as a kernel for ``MiniLM.with_attention``. Notebook 06, Eq. (6.3)."""
    def kernel(q, k, v, *, causal=False, key_mask=None):
        if causal:
            raise ValueError("this kernel is for the (non-causal) MiniLM encoder; causal=True is not supported.")
        return linear.linear_attention_from_features(feature_map(q), feature_map(k), v, key_mask=key_mask)
    return kernel


def uniform_kernel():
    """Uniform attention: every query gets the mean of the real values — linear attention with phi(x) = 1.

    The trivial answer every approximation is measured against.
    """
    return feature_kernel(lambda x: torch.ones_like(x[..., :1]))  # (..., n, 1): every kernel value 1


def elu_kernel():
    """Linear attention with elu+1 (Katharopoulos et al. 2020), untrained. Notebook 06, Eq. (6.2)."""
    return feature_kernel(linear.elu_feature_map)


class LowRankAdapter(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank correction B A (LoRA, Hu et al. 2021, arXiv 2106.09685).

    y = base(x) + x Aᵀ Bᵀ with A ``(r, in)`` random and B ``(out, r)`` zero, so before training
    the adapter changes nothing.
    """

    def __init__(self, base, rank, *, generator=None):
        super().__init__()
        self.base = base
        a = torch.randn(rank, base.in_features, generator=generator) / math.sqrt(base.in_features)
        self.A = nn.Parameter(a.to(base.weight))  # (r, in)
        self.B = nn.Parameter(torch.zeros(base.out_features, rank).to(base.weight))  # (out, r)

    def forward(self, x):
        return self.base(x) + (x @ self.A.T) @ self.B.T  # (..., out)


def check_minilm(model, name="model"):
    """Raise TypeError unless ``model`` is a ``course_lib.pretrained.MiniLM``."""
    if not isinstance(model, MiniLM):
        raise TypeError(f"{name} must be a MiniLM from course_lib.pretrained.load_minilm(), got "
                        f"{type(model).__name__}.")


def linearized_layer(attention, method, *, n_features=None, k_proj=64, n_max=256, normalise=True, window=None,
                     generator=None):
    """A trainable layer for one MiniLM layer's ``attention``, its projections copied. Notebook 10, Section 10.3.

    ``"hedgehog"``: one map for queries and another for keys in every head (Zhang et al. 2024),
    f = d by default; ``"t2r"``: one map shared by queries and keys (Kasai et al. 2021), f = 2d by
    default; ``"linformer"``: learned E, F ``(k_proj, n_max)``.  ``window`` (feature maps only):
    the sliding window of exact keys of Eq. (10.9), or None.
    """
    heads = attention.n_heads
    head_dim = attention.q_proj.weight.shape[0] // heads
    if method == "hedgehog":
        return LearnedLinearAttention.from_attention(
            attention, feature_map=HedgehogFeatureMap(heads, head_dim, n_features, normalise=normalise),
            key_map=HedgehogFeatureMap(heads, head_dim, n_features, normalise=normalise), window=window)
    if method == "t2r":
        return LearnedLinearAttention.from_attention(
            attention, feature_map=T2RFeatureMap(heads, head_dim, n_features or 2 * head_dim, generator=generator),
            window=window)
    if window is not None:
        raise ValueError(f"window is for the feature-map methods ('hedgehog', 't2r'), not {method!r}.")
    if method == "linformer":
        return LearnedLinformer.from_attention(attention, max_len=n_max, k=k_proj)
    raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}.")


ADAPTABLE = {"q": "attention.q_proj", "k": "attention.k_proj", "v": "attention.v_proj", "out": "attention.out_proj",
             "ffn_in": "feed_forward_in", "ffn_out": "feed_forward_out"}  # adapter site → linear of an EncoderLayer


def _wrap(layer, path, rank, generator):
    """Replace the ``nn.Linear`` at ``path`` (e.g. ``"attention.q_proj"``) in ``layer`` by a ``LowRankAdapter``."""
    owner_path, _, name = path.rpartition(".")
    owner = layer.get_submodule(owner_path) if owner_path else layer
    setattr(owner, name, LowRankAdapter(getattr(owner, name), rank, generator=generator))


def linearize(model, method="hedgehog", *, n_features=None, k_proj=64, n_max=256, rank=0, adapt=("q", "k", "v"),
              normalise=True, window=None, seed=0):
    """A copy of MiniLM with a trainable ``method`` layer in every layer, the rest frozen. Notebook 10, Section 10.3.

    Args:
        model: a ``MiniLM`` (the exact, pretrained model: the teacher; it is not changed).
        method: ``"hedgehog"`` (learned exp maps, W = I at the start), ``"t2r"`` (learned relu
            map, W random) or ``"linformer"`` (learned E, F, mean pooling at the start).
        n_features: f of each map (Hedgehog: 2f features, default f = d; T2R: f, default 2d).
        k_proj, n_max: Linformer's projected length and its fixed sequence length.
        rank: rank of a ``LowRankAdapter`` on each of the ``adapt`` linears of every layer (0: none).
        adapt: where the adapters go: names from ``ADAPTABLE`` — ``"q", "k", "v", "out"`` (the
            attention's projections), ``"ffn_in", "ffn_out"`` (the feed-forward block's).
        normalise: Hedgehog's softmax form (Eq. 10.4, default) or the bare exponential (Eq. 10.3).
        window: None, or w: the keys within w positions of each query also get softmax's exact
            weight (Eq. 10.9, a sliding window beside the learned map; ``"hedgehog"``, ``"t2r"``).
        seed: seeds T2R's random W and the adapters' A.

    Returns:
        A ``MiniLM`` whose only trainable parameters are the maps or projections (and adapters).
    """
    check_minilm(model)
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int (0: no adapters), got {rank!r}.")
    adapt = tuple(adapt)
    if not set(adapt) <= set(ADAPTABLE) or len(set(adapt)) != len(adapt):
        raise ValueError(f"adapt must list distinct names from {', '.join(map(repr, ADAPTABLE))}, got {adapt!r}.")
    generator = torch.Generator().manual_seed(seed)
    student = copy.deepcopy(model)
    student.requires_grad_(False)
    for layer in student.layers:
        layer.attention = linearized_layer(layer.attention, method, n_features=n_features, k_proj=k_proj,
                                           n_max=n_max, normalise=normalise, window=window, generator=generator)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            getattr(layer.attention, name).requires_grad_(False)  # the pretrained projections stay as they are
        for site in adapt if rank else ():
            _wrap(layer, ADAPTABLE[site], rank, generator)
    student.attention_fn = None  # every layer has its own attention module
    student.linearized = {"method": method, "n_features": n_features, "k_proj": k_proj, "n_max": n_max,
                          "rank": rank, "adapt": list(adapt), "normalise": normalise, "window": window, "seed": seed}
    return student.eval()


def trainable_state(model):
    """The trained parameters only (maps, projections, adapters): ``{name: tensor}``, what the data files store."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def added_parameters(model):
    """How many parameters linearizing added: the maps' (or E, F) and the adapters'."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
