"""Linformer attention in PyTorch: the port of ``course_lib.numpy.linformer``, plus modules.

Implements notebooks 04 and 05; Wang et al. 2020, "Linformer: Self-Attention with Linear
Complexity" (arXiv 2006.04768).  Same names and signatures as the NumPy tree; works on any
device, for any floating dtype, with autograd.  Shapes: ``q (..., n, d)``, ``k (..., s, d)``,
``v (..., s, e)``, projections ``E, F (..., k, n_max)``.
"""

import math

import torch
from torch import nn

from course_lib import _validate

# Counting matrices is plain arithmetic: one definition serves both trees.
from course_lib._shared import SHARING_MODES, count_projection_matrices, pooling_blocks  # noqa: F401 (re-exported)
from course_lib.torch._attention_module import ProjectedAttention
from course_lib.torch.full import MultiHeadAttention, masked_softmax, softmax_attention


def _check(q, k, v=None, E=None, F=None, key_mask=None):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x is not None:
            _validate.check_float(name, x, x.is_floating_point())
    _validate.check_qkv(q, k, v)
    for name, proj in (("E", E), ("F", F)):
        if proj is not None:
            _validate.check_projection(name, proj, k, proj.is_floating_point())
    if E is not None and F is not None and E.shape != F.shape:
        raise ValueError(f"E and F must have the same shape (..., k, n), got E {tuple(E.shape)} "
                         f"and F {tuple(F.shape)}.")
    if key_mask is not None:
        _validate.check_key_mask(key_mask, k, key_mask.dtype == torch.bool)


def project_sequence(proj, x, key_mask=None):
    """Project ``x (..., s, d)`` along the sequence axis: ``proj[..., :s] x`` → ``(..., k, d)``.

    Notebook 05, Eq. (5.2).  Padded rows of ``x`` (``key_mask`` False) are zeroed first, so a
    padded position adds nothing to the k mixtures: the result equals projecting the unpadded
    sequence.  Zeroing with ``masked_fill`` (not a product) keeps even inf/NaN padding out.
    """
    s = x.shape[-2]
    if key_mask is not None:
        x = x.masked_fill(~key_mask[..., :, None], 0.0)  # (..., s, d)
    # "...ks,...sd->...kd" written as a broadcast matmul: torch.einsum would copy x into one
    # (s, b·h·d) block first, while matmul reuses one E for every batch and head without a copy.
    return proj[..., :s] @ x  # (..., k, d)


def linformer_weights(q, k, E, *, key_mask=None):
    """The k-column context-mapping matrix P̄ = softmax(q (E k)ᵀ / √d). Notebook 05, Eq. (5.1).

    Args:
        q: queries ``(..., n, d)``.
        k: keys ``(..., s, d)``.
        E: key projection ``(k, n_max)`` or ``(..., k, n_max)`` with ``n_max >= s``.
        key_mask: boolean ``(..., s)``, True where the key is a real token.

    Returns:
        P̄ ``(..., n, k)``; each row sums to 1.
    """
    _check(q, k, E=E, key_mask=key_mask)
    d = q.shape[-1]
    projected_keys = project_sequence(E, k, key_mask)  # (..., k, d)
    scores = torch.einsum("...nd,...kd->...nk", q, projected_keys) / math.sqrt(d)  # (..., n, k)
    return masked_softmax(scores)


def linformer_attention(q, k, v, E, F, *, key_mask=None):
    """Linformer attention softmax(q (E k)ᵀ / √d) (F v). Notebook 05, Eq. (5.1); Wang et al. 2020, Eq. 7.

    The n × s matrix P is never formed: keys and values are first projected from s positions
    down to k (one broadcast matmul each, every head at once), so the cost is O(n·k).

    Padding: padded keys and values are zeroed *before* the projection.  The published code
    ignores the mask, so E mixes the padding tokens into every projected key; masking the
    k projected scores afterwards cannot undo that, because each of them already mixes all s
    positions.  Zeroing makes a padded batch give exactly what each unpadded sequence gives.

    Shorter inputs: a sequence of s < n_max positions uses the first s columns ``E[..., :s]``,
    as the reference implementations do.  The cost of that choice: a sequence's projection
    depends on its length, so a model trained at one length sees differently scaled
    projected keys at another.

    Args:
        q: queries ``(..., n, d)``.
        k: keys ``(..., s, d)``.
        v: values ``(..., s, e)``.
        E: key projection ``(k, n_max)`` or broadcastable ``(..., k, n_max)``, ``s <= n_max``.
        F: value projection, the same shape as ``E`` (the same tensor for key-value sharing).
        key_mask: boolean ``(..., s)``, True where the key is a real token.

    Returns:
        ``(..., n, e)``.
    """
    _check(q, k, v, E, F, key_mask)
    projected_keys = project_sequence(E, k, key_mask)  # (..., k, d)
    projected_values = project_sequence(F, v, key_mask)  # (..., k, e)
    # The fused kernel computes softmax(q k̄ᵀ/√d) v̄ in one pass over the (..., n, k) scores instead
    # of softmax_attention's separate element-wise passes; tests hold the two equal in float64.
    return nn.functional.scaled_dot_product_attention(q, projected_keys, projected_values)


def causal_leak(attention, q, k, v, t, *, shift=1.0):
    """How much outputs at positions ≤ t move when the keys and values after t change. Notebook 04.

    A causal model must give 0.  Linformer does not: every projected key E k mixes all s
    positions, the future included.

    Args:
        attention: ``attention(q, k, v) → (..., n, e)``.
        q, k, v: as in ``linformer_attention``, with n = s.
        t: the last position whose output is inspected (0-based).
        shift: added to every key and value after position t.

    Returns:
        max |Δ output[..., :t + 1, :]|, a float.
    """
    future_k, future_v = k.clone(), v.clone()
    future_k[..., t + 1:, :] += shift
    future_v[..., t + 1:, :] += shift
    before = attention(q, k, v)[..., : t + 1, :]  # (..., t + 1, e)
    after = attention(q, future_k, future_v)[..., : t + 1, :]
    return float((after - before).abs().max())


def mean_pooling(k, s, *, dtype=torch.float32, device=None):
    """Mean pooling as a projection ``(k, s)``. Notebook 04, Section 4.3; Wang et al. 2020, §4.

    Row i averages the i-th of k consecutive blocks of positions (``pooling_blocks``), as in the NumPy tree.
    """
    blocks = pooling_blocks(k, s)  # checks k and s
    pool = torch.zeros(k, s, dtype=dtype, device=device)
    for i, (start, stop) in enumerate(blocks):
        pool[i, start:stop] = 1.0 / (stop - start)  # (k, s): each row sums to 1
    return pool


def fit_projections(q, k, v, E, F, *, steps=200, lr=1e-2, log_every=0, callback=None):
    """Fit E and F to exact attention's output by gradient descent. Notebook 04, Eq. (4.6).

    Minimises the mean over the leading dims of ‖Linformer(q, k, v) − softmax_attention(q, k, v)‖²
    / ‖softmax_attention(q, k, v)‖² (Frobenius norms over ``(n, e)``) with Adam, full batch.  Only
    E and F change: q, k, v are data, e.g. those a frozen pretrained model computes on training text.

    Args:
        q, k, v: ``(..., n, d)``, ``(..., s, d)``, ``(..., s, e)``, e.g. ``(passages, heads, n, d)``.
        E, F: starting projections ``(..., k, s)``, broadcast over q's leading dims (``(heads, k, s)``:
            one pair per head, shared by every passage); they are copied, not changed.
        steps: Adam steps.
        lr: Adam's learning rate.
        log_every: print the loss every this many steps (0: silent).
        callback: called as ``callback(step, E, F)`` after each step (step counted from 1, E and F
            detached), e.g. to score held-out passages while the fit runs.

    Returns:
        ``(E, F, losses)``: the fitted projections (detached) and the loss before each step.
    """
    q, k, v = q.detach(), k.detach(), v.detach()
    with torch.no_grad():
        target = softmax_attention(q, k, v)  # (..., n, e)
        target_sq = target.square().sum(dim=(-2, -1))  # (...): ‖Y‖² per head and passage
    E, F = (p.detach().clone().requires_grad_(True) for p in (E, F))
    optimizer = torch.optim.Adam([E, F], lr=lr)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        error_sq = (linformer_attention(q, k, v, E, F) - target).square().sum(dim=(-2, -1))  # (...)
        loss = (error_sq / target_sq).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if callback is not None:
            callback(step + 1, E.detach(), F.detach())
        if log_every and (step + 1) % log_every == 0:
            print(f"  step {step + 1:>4}/{steps}: mean relative squared error {loss.item():.3g}", flush=True)
    return E.detach(), F.detach(), losses


# --- modules: notebook 05 -------------------------------------------------------------------

def projection_parameter(k, max_len, n_heads=None, *, device=None, dtype=None):
    """A trainable projection ``(k, max_len)``, or ``(h, k, max_len)`` with one per head.

    Entries are drawn from N(0, 1/k), the Johnson–Lindenstrauss projection of the paper's
    Theorem 1 (notebook 03), so E x keeps the scale of x from the first step.  The ``linformer``
    package on PyPI draws them uniformly from ±1/√k, a spread of the same order.
    """
    shape = (k, max_len) if n_heads is None else (n_heads, k, max_len)
    return nn.Parameter((torch.randn(shape) / math.sqrt(k)).to(device=device, dtype=dtype))


class LinformerSelfAttention(ProjectedAttention):
    """Multi-head Linformer self-attention with the paper's sharing modes. Notebook 05; Wang et al. 2020, §4.

    ``sharing`` picks which projections exist in this layer: ``"none"`` an E and an F per head
    ``(h, k, max_len)``; ``"headwise"`` one E and one F ``(k, max_len)`` shared by the heads;
    ``"key-value"`` one parameter used as both E and F; ``"layerwise"`` the one parameter
    ``shared_projection`` that every layer of a model receives (a fresh one if None).  The
    conventions of ``course_lib.torch.modules``: ``forward(x, *, key_mask=None)``,
    ``from_attention(mha, max_len=..., k=...)``, device and dtype.

    Args:
        d_model: model width; split into ``n_heads`` heads.
        n_heads: number of heads h.
        max_len: the longest input n_max; shorter inputs use the first columns of E and F.
        k: projected length, ``1 <= k <= max_len``.
        sharing: one of ``SHARING_MODES``.
        shared_projection: for ``"layerwise"``, the model-wide ``(k, max_len)`` parameter.
        causal: must be False: Linformer cannot be causal (notebook 04 shows the leak).
        bias: whether the four linear maps have a bias.
        device, dtype: of the parameters the module creates (a ``shared_projection`` is used as given).
    """

    def __init__(self, d_model, n_heads, max_len, k, *, sharing="headwise", shared_projection=None, causal=False,
                 bias=True, device=None, dtype=None):
        if causal:
            raise ValueError("Linformer cannot be causal: every projected key E k mixes all positions, the future "
                             "included (notebook 04 shows the leak); use LinearAttention or PerformerAttention "
                             "with causal=True.")
        super().__init__(d_model, n_heads, bias=bias, device=device, dtype=dtype)
        count_projection_matrices(1, n_heads, sharing)  # validates the mode
        if not 1 <= k <= max_len:
            raise ValueError(f"k must satisfy 1 <= k <= max_len: Linformer projects max_len = {max_len} "
                             f"positions down to k = {k}.")
        if shared_projection is not None and sharing != "layerwise":
            raise ValueError(f"shared_projection is only used with sharing='layerwise', got sharing={sharing!r}.")
        if shared_projection is not None and tuple(shared_projection.shape) != (k, max_len):
            raise ValueError(f"shared_projection must have shape (k, max_len) = {(k, max_len)}, "
                             f"got {tuple(shared_projection.shape)}.")
        self.sharing, self.k, self.max_len = sharing, k, max_len
        factory = dict(device=device, dtype=dtype)
        if sharing == "none":
            self.E = projection_parameter(k, max_len, n_heads, **factory)
            self.F = projection_parameter(k, max_len, n_heads, **factory)
        elif sharing == "headwise":
            self.E, self.F = projection_parameter(k, max_len, **factory), projection_parameter(k, max_len, **factory)
        elif sharing == "key-value":
            self.E = projection_parameter(k, max_len, **factory)
            self.F = self.E  # one Parameter registered under two names; parameters() yields it once
        else:
            self.E = shared_projection if shared_projection is not None else projection_parameter(k, max_len,
                                                                                                  **factory)
            self.F = self.E

    def attend(self, q, k, v, key_mask):
        return linformer_attention(q, k, v, self.E, self.F, key_mask=key_mask)  # (b, h, n, e)

    def extra_repr(self):
        return super().extra_repr() + f", max_len={self.max_len}, k={self.k}, sharing={self.sharing!r}"


class EncoderLayer(nn.Module):
    """A transformer encoder layer: attention and a feed-forward block, each with a residual.

    ``norm_first=True`` is the pre-norm layout (x + f(norm(x))), which trains without a
    learning-rate warm-up at these small sizes; False is the original post-norm norm(x + f(x)).
    """

    def __init__(self, attention, d_model, d_ff, *, norm_first=True):
        super().__init__()
        self.attention, self.norm_first = attention, norm_first
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x, *, key_mask=None):
        """``x (b, n, d_model)`` → ``(b, n, d_model)``."""
        if self.norm_first:
            x = x + self.attention(self.norm1(x), key_mask=key_mask)
            return x + self.ff(self.norm2(x))
        x = self.norm1(x + self.attention(x, key_mask=key_mask))
        return self.norm2(x + self.ff(x))


class LinformerEncoder(nn.Module):
    """A small Linformer encoder for sequence tasks: embeddings, layers, a per-position head. Notebook 05.

    With ``k=None`` every layer uses exact softmax attention instead: the baseline with the same
    everything else.  ``sharing="layerwise"`` creates ONE projection parameter and hands it to
    every layer, so ``parameters()`` holds it once.

    Args:
        n_layers, d_model, n_heads: depth, width and heads.
        max_len: the longest input (positions are learned embeddings).
        k: projected length, or None for exact attention.
        sharing: one of ``SHARING_MODES``.
        vocab_size: input tokens; n_outputs: classes predicted at every position.
        d_ff: feed-forward width (default 4 · d_model); norm_first: pre-norm (True) or post-norm.
    """

    def __init__(self, n_layers, d_model, n_heads, max_len, k, sharing="headwise", *, vocab_size=16,
                 n_outputs=None, d_ff=None, norm_first=True):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        shared = projection_parameter(k, max_len) if (k is not None and sharing == "layerwise") else None
        self.shared_projection = shared  # registered here too; parameters() still yields it once
        layers = []
        for _ in range(n_layers):
            if k is None:
                attention = MultiHeadAttention(d_model, n_heads)
            else:
                attention = LinformerSelfAttention(d_model, n_heads, max_len, k, sharing=sharing,
                                                   shared_projection=shared)
            layers.append(EncoderLayer(attention, d_model, d_ff or 4 * d_model, norm_first=norm_first))
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.head = nn.Linear(d_model, n_outputs or vocab_size)

    def forward(self, tokens, *, key_mask=None):
        """``tokens (b, n)`` integer → logits ``(b, n, n_outputs)``."""
        positions = torch.arange(tokens.shape[-1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)  # (b, n, d_model)
        for layer in self.layers:
            x = layer(x, key_mask=key_mask)
        return self.head(self.norm(x))  # (b, n, n_outputs)


def distinct_projection_matrices(model):
    """Count the distinct k × n projection matrices a model really holds (shared ones once).

    Counts every distinct E/F ``Parameter`` of every ``LinformerSelfAttention`` by identity, a
    per-head ``(h, k, n)`` one as h matrices; it agrees with ``count_projection_matrices``.
    """
    seen = {}
    for module in model.modules():
        if isinstance(module, LinformerSelfAttention):
            for proj in (module.E, module.F):
                seen[id(proj)] = proj.numel() // (module.k * module.max_len)
    return sum(seen.values())
