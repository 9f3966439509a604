"""The base of the course's attention modules: the projections of ``MultiHeadAttention``, a kernel of one's own.

``course_lib.torch.modules`` (linear attention, FAVOR+) and ``course_lib.torch.linformer``
(Linformer) build on it, so every module has the same conventions: constructor keywords
``(d_model, n_heads, *, ..., causal, bias, device, dtype)``; projections named ``q_proj``,
``k_proj``, ``v_proj``, ``out_proj`` like ``course_lib.torch.full.MultiHeadAttention`` (and so
like a MiniLM layer's ``layer.attention``); ``forward(x, *, key_mask=None)``; and
``from_attention(mha, **options)``, which copies those four projections.  Shapes: ``x (b, n,
d_model)``, ``key_mask (b, n)`` True on real tokens, heads ``(b, h, n, d)`` with d = d_model / h.
"""

import torch
from torch import nn

from course_lib import _validate
from course_lib.torch.full import merge_heads, split_heads

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


class ProjectedAttention(nn.Module):
    """Multi-head self-attention whose kernel is the subclass's ``attend(q, k, v, key_mask)``.

    Args:
        d_model: model width; split into ``n_heads`` heads of width ``d_model // n_heads``.
        n_heads: number of heads h.
        causal: whether query i sees only keys up to its own position (fixed per module).
        bias: whether the four projections have a bias.
        device, dtype: of the parameters and buffers the module creates.
    """

    def __init__(self, d_model, n_heads, *, causal=False, bias=True, device=None, dtype=None):
        super().__init__()
        _validate.check_heads(d_model, n_heads)
        self.d_model, self.n_heads, self.head_dim, self.causal = d_model, n_heads, d_model // n_heads, causal
        for name in PROJECTIONS:
            setattr(self, name, nn.Linear(d_model, d_model, bias=bias, device=device, dtype=dtype))

    def heads(self, x):
        """Queries, keys and values ``(b, h, n, d)`` each, from ``x (b, n, d_model)``."""
        return tuple(split_heads(proj(x), self.n_heads) for proj in (self.q_proj, self.k_proj, self.v_proj))

    def forward(self, x, *, key_mask=None):
        """``x (b, n, d_model)``, ``key_mask (b, n)`` boolean (True on real tokens) → ``(b, n, d_model)``."""
        if x.dim() < 2 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (b, n, d_model) with d_model = {self.d_model}, got {tuple(x.shape)}.")
        if key_mask is not None:
            _validate.check_key_mask(key_mask, x, key_mask.dtype == torch.bool)
            key_mask = key_mask[..., None, :]  # (b, 1, n): one mask for every head
        q, k, v = self.heads(x)  # (b, h, n, d)
        return self.out_proj(merge_heads(self.attend(q, k, v, key_mask)))  # (b, n, d_model)

    def attend(self, q, k, v, key_mask):
        """The attention kernel: ``q, k, v (b, h, n, d)``, ``key_mask (b, 1, n)`` or None → ``(b, h, n, e)``."""
        raise NotImplementedError(f"{type(self).__name__} must define attend(q, k, v, key_mask).")

    @classmethod
    def from_attention(cls, mha, **options):
        """A module of this kind with the projections of ``mha`` copied (not shared).

        Args:
            mha: a module with ``n_heads`` and ``nn.Linear`` projections ``q_proj``, ``k_proj``,
                ``v_proj``, ``out_proj`` (``MultiHeadAttention``, a MiniLM layer's ``layer.attention``,
                or a module of this file).
            **options: the constructor's keywords (``causal``, ``n_features``, ``max_len``, ...).

        Returns:
            The new module, on the device and in the dtype of ``mha``'s weights.
        """
        missing = [name for name in PROJECTIONS if not isinstance(getattr(mha, name, None), nn.Linear)]
        if missing or not hasattr(mha, "n_heads"):
            raise TypeError(f"from_attention needs a module with n_heads and nn.Linear {', '.join(PROJECTIONS)} "
                            f"(like MultiHeadAttention); {type(mha).__name__} lacks {missing or ['n_heads']}.")
        weight = mha.q_proj.weight
        module = cls(weight.shape[1], mha.n_heads, bias=mha.q_proj.bias is not None, device=weight.device,
                     dtype=weight.dtype, **options)
        for name in PROJECTIONS:
            getattr(module, name).load_state_dict(getattr(mha, name).state_dict())  # a copy of the values
        return module

    def extra_repr(self):
        return f"d_model={self.d_model}, n_heads={self.n_heads}, causal={self.causal}"

