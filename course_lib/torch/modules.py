"""Attention modules that drop into any model: linear attention, FAVOR+, Linformer and the gated mixers.

Notebooks 05-12.  Each is multi-head self-attention with the projections of
``course_lib.torch.full.MultiHeadAttention`` and one of the course's kernels, with the same
conventions (``course_lib/torch/_attention_module.py``):

    LinearAttention(d_model, n_heads, *, feature_map=elu_feature_map, causal=False,
                    chunk_size=DEFAULT_CHUNK_SIZE, eps=1e-6, bias=True, device=None, dtype=None)
    PerformerAttention(d_model, n_heads, *, n_features=256, causal=False, features="positive",
                       orthogonal=True, scaling="chi", chunk_size=DEFAULT_CHUNK_SIZE,
                       redraw_in_training=False, generator=None, bias=True, device=None, dtype=None)
    LinformerSelfAttention(d_model, n_heads, max_len, k, *, sharing="headwise",
                           shared_projection=None, causal=False, bias=True, device=None, dtype=None)

    module(x, key_mask=None)                        # x (b, n, d_model), key_mask (b, n) → (b, n, d_model)
    LinearAttention.from_attention(layer.attention)  # a MiniLM layer's projections, copied

Notebooks 11 and 12 add the recurrent mixers of ``course_lib/torch/_mixers.py`` (causal, chunked by default):

    GatedLinearAttention(d_model, n_heads, *, decay="head", conv_size=4, chunk_size=DEFAULT_CHUNK_SIZE, ...)
    DeltaNet(d_model, n_heads, *, gated=False, negative_eigenvalues=False, conv_size=4, ...)
        gated: False | True ("head": Gated DeltaNet) | "channel" (Kimi Delta Attention)
    DeltaProduct(d_model, n_heads, *, n_householder=2, gated=False, negative_eigenvalues=True, ...)  (notebook 13)

and notebook 14 their state, for generation (``MixerState(conv, S)``; ``course_lib.torch.hybrid`` uses them):

    module.prefill(x, state=None, *, key_mask=None)   # → (out (b, n, d_model), next state): chunked, from a state
    module.step(x_t, state)                            # x_t (b, d_model) → (out_t (b, d_model), next state)

A causal module uses the chunked form (memory linear in n) unless ``chunk_size=None``; padded
keys (``key_mask`` False) add nothing, causal or not.  ``recurrent(batch_shape)`` gives the
one-token-at-a-time state of a causal linear or FAVOR+ module (``course_lib.torch.decoding``).
"""

import torch
from torch import nn

from course_lib.torch import linear, performer
from course_lib.torch._attention_module import ProjectedAttention
from course_lib.torch._mixers import DeltaNet, DeltaProduct, GatedLinearAttention, MixerState  # noqa: F401 (11-14)
from course_lib.torch.decoding import RecurrentLinearAttention
from course_lib.torch.linear import DEFAULT_CHUNK_SIZE, elu_feature_map
from course_lib.torch.linformer import LinformerSelfAttention  # noqa: F401 (one of this file's modules)


class LinearAttention(ProjectedAttention):
    """Multi-head linear attention phi(q) (phi(k)ᵀ v) / normaliser. Notebook 06; Katharopoulos et al. 2020, Eq. 5.

    Args:
        d_model, n_heads: width and heads.
        feature_map: ``(..., d) → (..., f)``, non-negative; an ``nn.Module`` is registered as a
            submodule (its parameters train and live in ``state_dict``) and moved to ``device``/``dtype``.
        causal: query i sees keys j ≤ i (``causal_linear_attention``).
        chunk_size: causal only: positions per chunk, or None for prefix sums (notebook 06).
        eps: added to the normaliser (absolute).
        bias, device, dtype: as for ``nn.Linear``.
    """

    def __init__(self, d_model, n_heads, *, feature_map=elu_feature_map, causal=False, chunk_size=DEFAULT_CHUNK_SIZE,
                 eps=1e-6, bias=True, device=None, dtype=None):
        super().__init__(d_model, n_heads, causal=causal, bias=bias, device=device, dtype=dtype)
        if isinstance(feature_map, nn.Module) and (device is not None or dtype is not None):
            feature_map = feature_map.to(device=device, dtype=dtype)
        self.feature_map, self.chunk_size, self.eps = feature_map, chunk_size, eps  # a Module: registered

    def features(self, q, k):
        """``(phi(q), phi(k))``, each ``(..., f)``, checked non-negative."""
        return linear._features(self.feature_map, ("q", q), ("k", k))

    def attend(self, q, k, v, key_mask):
        if not self.causal:
            return linear.linear_attention(q, k, v, feature_map=self.feature_map, eps=self.eps, key_mask=key_mask)
        if key_mask is None:
            return linear.causal_linear_attention(q, k, v, feature_map=self.feature_map, eps=self.eps,
                                                  chunk_size=self.chunk_size)
        phi_q, phi_k = self.features(q, k)  # (b, h, n, f)
        return _causal_masked(phi_q, phi_k, v, key_mask, self.eps, self.chunk_size)

    def recurrent(self, batch_shape):
        """The state for one token at a time: ``RecurrentLinearAttention`` with this module's feature map."""
        feature_map = self.feature_map

        def stacked(qk):  # (2, *batch, d): one call for the query and the key
            if isinstance(feature_map, nn.Module):  # a module may expect a sequence axis: give it one of length 1
                return feature_map(qk.unsqueeze(-2)).squeeze(-2).unbind(0)
            return feature_map(qk).unbind(0)
        weight = self.q_proj.weight
        features = None if feature_map is elu_feature_map else stacked  # None: elu+1 in place, the fast path
        return RecurrentLinearAttention(batch_shape, self.head_dim, self.head_dim, features=features, eps=self.eps,
                                        dtype=weight.dtype, device=weight.device)

    def extra_repr(self):
        return super().extra_repr() + f", chunk_size={self.chunk_size}, eps={self.eps}"


def _causal_masked(phi_q, phi_k, v, key_mask, eps, chunk_size):
    """Causal linear attention whose padded keys (``key_mask (b, 1, n)`` False) add nothing."""
    phi_k = phi_k.masked_fill(~key_mask[..., :, None], 0.0)  # (b, h, n, f)
    values = v.to(phi_q.dtype).masked_fill(~key_mask[..., :, None], 0.0)  # (b, h, n, e)
    out = linear.causal_linear_attention_from_features(phi_q, phi_k, values, eps=eps, chunk_size=chunk_size)
    return out.to(v.dtype)


class PerformerAttention(ProjectedAttention):
    """Multi-head FAVOR+ attention, ω owned by the module. Notebook 08; Choromanski et al. 2020, Alg. 1.

    ω ``(n_features, d)`` is a buffer: it moves with the module and lives in ``state_dict``, so a
    saved module gives the same outputs when loaded.  It changes only when asked: ``redraw()``
    draws a new one; ``redraw_in_training=True`` does so at every forward in training mode (the
    policy is this flag alone, no counter).  ``redraw_features(model)`` redraws every module of a
    model, e.g. every k training steps in the caller's loop.

    Args:
        d_model, n_heads: width and heads.
        n_features: m, the random features per head.
        causal: query i sees keys j ≤ i (causal-safe stabiliser, chunked unless ``chunk_size=None``).
        features: ``"positive"``, ``"hyperbolic"`` or ``"trig"`` (``performer_attention``).
        orthogonal, scaling: how ω is drawn (``random_matrix``; ``"sqrt_d"`` is biased).
        chunk_size: causal only: positions per chunk, or None for prefix sums.
        redraw_in_training: draw a new ω at every forward while ``self.training``.
        generator: the ``torch.Generator`` ω is drawn from (default: torch's global one); not saved
            in ``state_dict``.
        bias, device, dtype: as for ``nn.Linear``; ω gets the same device and dtype.
    """

    def __init__(self, d_model, n_heads, *, n_features=256, causal=False, features="positive", orthogonal=True,
                 scaling="chi", chunk_size=DEFAULT_CHUNK_SIZE, redraw_in_training=False, generator=None, bias=True,
                 device=None, dtype=None):
        super().__init__(d_model, n_heads, causal=causal, bias=bias, device=device, dtype=dtype)
        if features not in performer.FEATURES:
            raise ValueError(f"features must be one of {', '.join(map(repr, performer.FEATURES))}; got {features!r}.")
        self.n_features, self.kind, self.orthogonal, self.scaling = n_features, features, orthogonal, scaling
        self.chunk_size, self.redraw_in_training, self.generator = chunk_size, redraw_in_training, generator
        self.register_buffer("omega", torch.empty(n_features, self.head_dim, device=device, dtype=dtype))  # (f, d)
        self.redraw()

    @torch.no_grad()
    def redraw(self, generator=None):
        """Draw a new ω from ``generator`` (default: the module's, else torch's global one) and return it."""
        generator = generator or self.generator or torch.default_generator
        omega = performer.random_matrix(self.n_features, self.head_dim, generator, orthogonal=self.orthogonal,
                                        scaling=self.scaling, dtype=torch.float64)  # on the generator's device
        return self.omega.copy_(omega)  # into the buffer's device and dtype

    def attend(self, q, k, v, key_mask):
        if self.redraw_in_training and self.training:
            self.redraw()
        return performer.performer_attention(q, k, v, self.omega, causal=self.causal, features=self.kind,
                                             key_mask=key_mask, chunk_size=self.chunk_size)

    def features(self, q, k):
        """The causal-safe ``(phi(q), phi(k))`` of ``performer_attention(causal=True)``, each ``(..., f)``.

        Up to factors that cancel: a per-query one, and one exp(−shift) shared by every key.
        """
        work = torch.promote_types(q.dtype, torch.float32)
        q, k, omega = q.to(work), k.to(work), self.omega.to(work)
        scale = self.head_dim ** -0.25
        phi_q = performer._query_features(q, omega, self.kind, scale)
        return phi_q, performer._key_features(k, omega, self.kind, True, None, performer._key_shift, scale)

    def recurrent(self, batch_shape):
        """The state for one token at a time (positive or hyperbolic features; trig ones are signed)."""
        if self.kind == "trig":
            raise ValueError("trig features can be negative: the recurrent step needs positive features "
                             "(features='positive' or 'hyperbolic').")
        work = torch.promote_types(self.omega.dtype, torch.float32)
        omega, scale = self.omega.to(work), self.head_dim ** -0.25
        omega_t = (scale * omega).T.contiguous()  # (d, f), ω fixed for the whole sequence
        shift = performer._key_shift(None, None, omega, self.kind, True, None)  # from ω alone: causal-safe
        hyperbolic = self.kind == "hyperbolic"

        def stacked(qk):  # (2, *batch, d): one matmul for the query and the key
            projections = qk @ omega_t  # (2, *batch, f)
            if hyperbolic:
                projections = torch.cat([projections, -projections], dim=-1)  # (2, *batch, 2f)
            half_norm = qk[1].square().sum(dim=-1, keepdim=True) * (scale**2 / 2)  # (*batch, 1)
            return torch.softmax(projections[0], dim=-1), (projections[1] - half_norm - shift).exp()
        return RecurrentLinearAttention(batch_shape, self.head_dim, self.head_dim, features=stacked,
                                        eps=torch.finfo(work).tiny, dtype=work, device=omega.device)

    def extra_repr(self):
        return (super().extra_repr() + f", n_features={self.n_features}, features={self.kind!r}, "
                f"chunk_size={self.chunk_size}, redraw_in_training={self.redraw_in_training}")


def redraw_features(model, generator=None):
    """Call ``redraw(generator)`` on every ``PerformerAttention`` in ``model``; return how many there were."""
    modules = [m for m in model.modules() if isinstance(m, PerformerAttention)]
    for module in modules:
        module.redraw(generator)
    return len(modules)
