"""Recurrent token mixers of today's linear-attention models: gated linear attention and (gated) DeltaNet.

Notebooks 11 and 12.  Both layers share one front end, so that a comparison between them is about
the state's update rule alone:

    x (b, n, d_model) → q, k, v = x W_q, x W_k, x W_v  → a short causal depthwise convolution and SiLU
    → q, k L2-normalised per head, q scaled by 1/√d  → the recurrence  → RMSNorm per head → W_o

(DeltaNet, Yang et al. 2024, §4; Gated DeltaNet, Yang et al. 2025, §3.3.)  The delta rule needs the
L2 norm (β‖k‖² ≤ 2); the decays use it too, so a decay's effect is not confounded with a key's
scale.  Names follow ``course_lib.torch.modules``: ``q_proj, k_proj, v_proj, out_proj``;
``forward(x, *, key_mask=None)``.  Shapes: ``x (b, n, d_model)``, heads ``(b, h, n, d)``.

    GatedLinearAttention(d_model, n_heads, *, decay="head", ...)   decay: "none" | "fixed" | "head" | "channel"
    DeltaNet(d_model, n_heads, *, gated=False, ...)                Gated DeltaNet with gated=True ("head"),
                                                                   Kimi Delta Attention with gated="channel";
                                                                   negative_eigenvalues=True: β in (0, 2)
    DeltaProduct(d_model, n_heads, *, n_householder=2, ...)        n_h delta-rule steps a token (notebook 13)

Notebook 14 makes them generate.  A layer's state is ``MixerState(conv, S)``: the short convolution's
last ``conv_size − 1`` inputs ``(b, conv_size − 1, 3·d_model)`` (q, k, v side by side) and the matrix
S ``(b, h, d, e)``.  ``prefill(x, state)`` consumes a chunk of tokens with the chunked form and returns
the next state (``forward(x)`` is ``prefill`` from the empty state); ``step(x_t, state)`` consumes one
token with the library's one-token step.  A padded position (``key_mask`` False) is as if it were not
there: it writes nothing into S (zero key, β = 0, a = 1) and nothing into the convolution's window,
whether the pads are on the right, on the left or in between.
"""

import math
from typing import NamedTuple

import torch
from torch import nn

from course_lib import _validate
from course_lib.torch.delta import delta_product_attention, delta_product_step, delta_rule_attention, delta_rule_step
from course_lib.torch.full import merge_heads, split_heads
from course_lib.torch.gated import DEFAULT_CHUNK_SIZE, gated_linear_attention, gated_linear_attention_step

DECAYS = ("none", "fixed", "head", "channel")


class MixerState(NamedTuple):
    """What a recurrent layer carries from one token to the next. Notebook 14.

    conv: the short convolution's last ``conv_size − 1`` real inputs ``(b, conv_size − 1, channels)``, q, k and
        v side by side (3·d_model channels; (1 + 2 n_h)·d_model for ``DeltaProduct``).
    S: the recurrent matrix ``(b, h, d, e)`` (keys × values).
    """

    conv: torch.Tensor
    S: torch.Tensor


class ShortConvolution(nn.Module):
    """A causal depthwise convolution over positions, then SiLU: each channel mixes its last ``size`` tokens."""

    def __init__(self, channels, size, *, device=None, dtype=None):
        super().__init__()
        self.size = size
        self.conv = nn.Conv1d(channels, channels, size, groups=channels, padding=size - 1, bias=False,
                              device=device, dtype=dtype)

    def forward(self, x):  # x (b, n, channels)
        return self.with_state(x, x.new_zeros(x.shape[0], self.size - 1, x.shape[-1]))[0]  # zeros before t = 0

    def with_state(self, x, state, key_mask=None):
        """The convolution continued from ``state``: ``x (b, n, channels)`` → ``(y (b, n, channels), next state)``.

        ``state (b, size − 1, channels)`` holds the last real inputs before ``x`` (zeros: none yet).  Pads
        (``key_mask (b, n)`` False) are moved behind the real tokens first, so each real token's window
        and the next state hold real inputs only; y is put back in the original order.
        """
        n, weight = x.shape[1], self.conv.weight[:, 0]  # weight (channels, size)
        if key_mask is not None:  # a stable sort puts the real tokens first, in order, then the pads
            order = torch.argsort((~key_mask).to(torch.int8), dim=1, stable=True)[..., None].expand_as(x)  # (b, n, c)
            x = x.gather(1, order)
        window = torch.cat([state, x], dim=1)  # (b, size − 1 + n, channels)
        # y_t = Σ_j w_j x_{t − size + 1 + j}: ``size`` shifted multiply-adds, the same sum as ``self.conv`` with
        # its right overhang cut, and several times faster than a depthwise Conv1d's backward on a CPU
        y = nn.functional.silu(sum(weight[:, j] * window[:, j:j + n] for j in range(self.size)))  # (b, n, channels)
        real = torch.full((x.shape[0],), n, device=x.device) if key_mask is None else key_mask.sum(1)  # (b,)
        last = (real[:, None] + torch.arange(self.size - 1, device=x.device))[..., None]  # (b, size − 1, 1)
        next_state = window.gather(1, last.expand(-1, -1, x.shape[-1]))  # (b, size − 1, channels)
        if key_mask is not None:
            y = torch.empty_like(y).scatter_(1, order, y)  # back to the original positions
        return y, next_state


class _RecurrentMixer(nn.Module):
    """The front end and back end both layers share. Notebooks 11 and 14.

    A subclass supplies ``gates(x, key_mask)`` (its decays and β per head and token, a pad's set to
    write and forget nothing), ``recur(q, k, v, gates, S)`` (the chunked form from S, returning the
    next S) and ``recur_step(q_t, k_t, v_t, gates_t, S)`` (one token).
    """

    def __init__(self, d_model, n_heads, *, conv_size=4, chunk_size=DEFAULT_CHUNK_SIZE, norm_eps=1e-5, bias=False,
                 device=None, dtype=None, keys_per_token=1):
        super().__init__()
        _validate.check_heads(d_model, n_heads)
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.chunk_size, self.conv_size, self.keys_per_token = chunk_size, conv_size, keys_per_token
        widths = {"q_proj": d_model, "k_proj": keys_per_token * d_model, "v_proj": keys_per_token * d_model,
                  "out_proj": d_model}  # out_proj maps d_model to d_model too
        for name, width in widths.items():
            setattr(self, name, nn.Linear(d_model, width, bias=bias, device=device, dtype=dtype))
        # one depthwise convolution over q, k and v side by side: their per-channel filters in one call
        self.channels = (1 + 2 * keys_per_token) * d_model
        self.conv = ShortConvolution(self.channels, conv_size, device=device, dtype=dtype) if conv_size else None
        self.norm = nn.RMSNorm(self.head_dim, eps=norm_eps, device=device, dtype=dtype)  # per head

    def empty_state(self, batch_size):
        """The state before any token: a ``MixerState`` of zeros, in the parameters' dtype and device."""
        weight = self.q_proj.weight
        conv = weight.new_zeros(batch_size, max(self.conv_size - 1, 0), self.channels)  # (b, size − 1, channels)
        return MixerState(conv, weight.new_zeros(batch_size, self.n_heads, self.head_dim, self.head_dim))

    def forward(self, x, *, key_mask=None):
        """``x (b, n, d_model)`` → ``(b, n, d_model)``: ``prefill`` from the empty state; pads write nothing."""
        return self.prefill(x, key_mask=key_mask)[0]

    def prefill(self, x, state=None, *, key_mask=None):
        """A chunk of tokens consumed from a state, in parallel. Notebook 14.

        The chunked form with ``initial_state``: no loop over tokens.  A pad leaves the state as it found it.

        Args:
            x: ``(b, n, d_model)``.
            state: a ``MixerState`` (from ``empty_state``, ``prefill`` or ``step``), or None (the empty state).
            key_mask: ``(b, n)`` boolean, True at real tokens, or None.

        Returns:
            ``(out (b, n, d_model), next MixerState)``; ``state`` is not changed.
        """
        if state is None:
            state = self.empty_state(x.shape[0])
        if key_mask is not None:
            x = x.masked_fill(~key_mask[..., None], 0.0)  # what the decay and β projections of a pad see
        q, k, v, conv = self._heads(x, state.conv, key_mask)  # (b, h, n, d)
        out, S = self.recur(q, k, v, self.gates(x, key_mask), state.S)  # (b, h, n, e), (b, h, d, e)
        return self.out_proj(merge_heads(self.norm(out))), MixerState(conv, S)  # (b, n, d_model)

    def step(self, x_t, state):
        """One token consumed from a state, with the library's one-token step. Notebook 14.

        Args:
            x_t: ``(b, d_model)``; state: a ``MixerState``.

        Returns:
            ``(out_t (b, d_model), next MixerState)``; ``state`` is not changed.
        """
        x = x_t[:, None]  # (b, 1, d_model): a sequence of one
        q, k, v, conv = self._heads(x, state.conv, None)  # (b, h, 1, d)
        out, S = self.recur_step(*self._one_token(q, k, v, self.gates(x, None)), state.S)  # (b, h, e), (b, h, d, e)
        return self.out_proj(self.norm(out).flatten(1)), MixerState(conv, S)  # (b, d_model)

    def _heads(self, x, conv, key_mask):
        """q, k, v ``(b, h, n, d)`` after the projections, the short convolution and the norms; the next conv state."""
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)  # (b, n, 3 d_model)
        if self.conv is not None:
            qkv, conv = self.conv.with_state(qkv, conv, key_mask)
        c = self.keys_per_token
        q, k, v = qkv.split([self.d_model, c * self.d_model, c * self.d_model], dim=-1)  # (b, n, [c] d_model)
        if self.conv is None:
            q, k = nn.functional.silu(q), nn.functional.silu(k)
        q, k, v = split_heads(q, self.n_heads), self._token_major(k), self._token_major(v)  # (b, h, n [c], d)
        q = nn.functional.normalize(q, dim=-1) / math.sqrt(self.head_dim)
        k = nn.functional.normalize(k, dim=-1)  # ‖k‖ = 1: the delta rule's eigenvalue 1 - β‖k‖² stays in [1 - β, 1]
        if key_mask is not None:  # a pad's q, k, v hold its bias or earlier tokens: its zero keys write nothing
            k = k.masked_fill(~key_mask.repeat_interleave(c, dim=1)[:, None, :, None], 0.0)
        return q, k, v, conv

    def _one_token(self, q, k, v, gates):
        """A sequence of one token's inputs as the one-token step takes them: position 0 of each, ``(b, h[, d])``."""
        return q[:, :, 0], k[:, :, 0], v[:, :, 0], [None if g is None else g[:, :, 0] for g in gates]

    def _token_major(self, x):
        """``(b, n, c·d_model)`` → ``(b, h, n·c, d)``: a token's c keys (or values) one after another."""
        b, n = x.shape[:2]
        x = x.reshape(b, n, self.keys_per_token, self.n_heads, self.head_dim)  # (b, n, c, h, d)
        return x.permute(0, 3, 1, 2, 4).reshape(b, self.n_heads, n * self.keys_per_token, self.head_dim)

    def state_size(self):
        """Numbers in the recurrent state per sequence: h heads of d × d (keys × values)."""
        return self.n_heads * self.head_dim * self.head_dim

    def extra_repr(self):
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, conv_size={self.conv_size}, "
                f"chunk_size={self.chunk_size}")


class GatedLinearAttention(_RecurrentMixer):
    """S_t = Diag(a_t) S_{t-1} + k_t v_tᵀ, o_t = S_tᵀ q_t. Notebook 11, Eq. (11.3).

    Args:
        d_model, n_heads: width and heads.
        decay: ``"none"`` (a_t = 1: linear attention without a normaliser), ``"fixed"`` (RetNet: a
            constant a per head, 1 − 2^(−5−i) for head i of 8, spread over the heads; one head keeps
            1 − 2^(−5) alone, as RetNet's own rule does), ``"head"`` (a data-dependent a_t per head and
            token: simple GLA; Mamba-2 also scales the write by its step Δ_t), ``"channel"`` (one per key
            channel: GLA).  Data-dependent decays are log a_t = −exp(A)·softplus(x w + b), Mamba-2's
            parametrisation, whose log is finite and ≤ 0 by construction.
        conv_size: the short convolution's width (0: none, SiLU on q and k only).
        chunk_size: positions per chunk (None: the token loop).
        norm_eps, bias, device, dtype: the output norm's eps; as for ``nn.Linear``.
    """

    def __init__(self, d_model, n_heads, *, decay="head", conv_size=4, chunk_size=DEFAULT_CHUNK_SIZE, norm_eps=1e-5,
                 bias=False, device=None, dtype=None):
        super().__init__(d_model, n_heads, conv_size=conv_size, chunk_size=chunk_size, norm_eps=norm_eps, bias=bias,
                         device=device, dtype=dtype)
        if decay not in DECAYS:
            raise ValueError(f"decay must be one of {', '.join(map(repr, DECAYS))}; got {decay!r}.")
        self.decay = decay
        if decay == "fixed":  # RetNet's γ_i = 1 − 2^(−5−i), stretched over however many heads there are
            exponents = -5.0 - torch.linspace(0, 7, n_heads, dtype=torch.float64)
            self.register_buffer("fixed_log_decay", torch.log1p(-torch.exp2(exponents)).to(dtype or torch.float32))
        elif decay in ("head", "channel"):
            width = n_heads if decay == "head" else d_model
            self.a_proj = nn.Linear(d_model, width, bias=True, device=device, dtype=dtype)
            # A and the bias start Mamba-2's way: decays spread between about e^-0.001 and e^-0.1 per token
            self.A_log = nn.Parameter(torch.zeros(width, device=device, dtype=dtype))
            with torch.no_grad():
                self.a_proj.bias.copy_(torch.log(torch.expm1(torch.logspace(-3, -1, width, dtype=torch.float64))))

    def log_decay(self, x):
        """log a_t: ``(b, h, n)`` per head or ``(b, h, n, d)`` per channel, or None for ``decay="none"``."""
        b, n = x.shape[:2]
        if self.decay == "none":
            return None
        if self.decay == "fixed":
            return self.fixed_log_decay[:, None].expand(b, self.n_heads, n)
        rate = -torch.exp(self.A_log) * nn.functional.softplus(self.a_proj(x))  # (b, n, h | d_model), ≤ 0
        if self.decay == "head":
            return rate.transpose(1, 2)  # (b, h, n)
        return split_heads(rate, self.n_heads)  # (b, h, n, d)

    def gates(self, x, key_mask):
        """``(log_decay,)``: log a_t ``(b, h, n)`` or ``(b, h, n, d)``; 0 (a = 1) at pads and for ``"none"``."""
        log_decay = self.log_decay(x)
        if log_decay is None:
            return (x.new_zeros(x.shape[0], self.n_heads, x.shape[1]),)  # (b, h, n): a = 1
        if key_mask is not None:  # a padded position neither writes nor forgets
            mask = key_mask[:, None, :] if log_decay.dim() == 3 else key_mask[:, None, :, None]
            log_decay = log_decay.masked_fill(~mask, 0.0)
        return (log_decay,)

    def recur(self, q, k, v, gates, S):
        return gated_linear_attention(q, k, v, *gates, chunk_size=self.chunk_size, initial_state=S, return_state=True)

    def recur_step(self, q_t, k_t, v_t, gates_t, S):
        return gated_linear_attention_step(q_t, k_t, v_t, *gates_t, S)

    def extra_repr(self):
        return super().extra_repr() + f", decay={self.decay!r}"


class DeltaNet(_RecurrentMixer):
    """S_t = (I − β_t k_t k_tᵀ) Diag(a_t) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t. Notebook 11, Eq. (11.5).

    β_t = sigmoid(x w_β + b_β) per head and token, in (0, 1); with ``negative_eigenvalues=True``
    β_t = 2·sigmoid(·), in (0, 2), so the transition's eigenvalue 1 − β_t along k_t reaches −1 (a
    reflection at β = 2: notebook 13; Grazzi et al. 2025).  The decay a_t:

    - ``gated=False``: none, a_t = 1 (DeltaNet);
    - ``gated=True`` or ``"head"``: one per head and token (Gated DeltaNet), log a_t =
      −exp(A)·softplus(x w_a + b_a), as in ``GatedLinearAttention(decay="head")``;
    - ``gated="channel"``: one per key channel (Kimi Delta Attention, Kimi Linear 2025), log a_t =
      −exp(A)·softplus(W_up W_down x + b), a low-rank (rank d) projection to every key channel.
      Kimi Linear also gates the output, o ← RMSNorm(o) ⊙ sigmoid(W_g x); the course's mixers share one
      back end (the per-head norm), so a comparison is about the state's rule alone, and leave it out.

    Args:
        d_model, n_heads: width and heads.
        gated: False, True / ``"head"`` or ``"channel"`` (above).
        negative_eigenvalues: β in (0, 2) instead of (0, 1).
        conv_size, chunk_size, norm_eps, bias, device, dtype: as for ``GatedLinearAttention``.
    """

    def __init__(self, d_model, n_heads, *, gated=False, negative_eigenvalues=False, conv_size=4,
                 chunk_size=DEFAULT_CHUNK_SIZE, norm_eps=1e-5, bias=False, device=None, dtype=None, keys_per_token=1):
        super().__init__(d_model, n_heads, conv_size=conv_size, chunk_size=chunk_size, norm_eps=norm_eps, bias=bias,
                         device=device, dtype=dtype, keys_per_token=keys_per_token)
        if gated not in (False, True, "head", "channel"):
            raise ValueError(f"gated must be False, True, 'head' or 'channel'; got {gated!r}.")
        self.gated = "head" if gated is True else gated
        self.negative_eigenvalues = bool(negative_eigenvalues)
        self.b_proj = nn.Linear(d_model, keys_per_token * n_heads, bias=True, device=device, dtype=dtype)
        if self.gated:
            width = n_heads if self.gated == "head" else d_model
            if self.gated == "head":
                self.a_proj = nn.Linear(d_model, width, bias=True, device=device, dtype=dtype)
            else:  # Kimi Delta Attention: a low-rank projection to the d_model key channels
                self.a_proj = nn.Sequential(nn.Linear(d_model, self.head_dim, bias=False, device=device, dtype=dtype),
                                            nn.Linear(self.head_dim, width, bias=True, device=device, dtype=dtype))
            # A and the bias start Mamba-2's way: decays spread between about e^-0.001 and e^-0.1 per token
            self.A_log = nn.Parameter(torch.zeros(width, device=device, dtype=dtype))
            bias_of = self.a_proj if self.gated == "head" else self.a_proj[1]
            with torch.no_grad():
                bias_of.bias.copy_(torch.log(torch.expm1(torch.logspace(-3, -1, width, dtype=torch.float64))))

    def log_decay(self, x):
        """log a_t: ``(b, h, n)`` per head, ``(b, h, n, d)`` per channel, or None (``gated=False``)."""
        if not self.gated:
            return None
        rate = -torch.exp(self.A_log) * nn.functional.softplus(self.a_proj(x))  # (b, n, h | d_model), ≤ 0
        return rate.transpose(1, 2) if self.gated == "head" else split_heads(rate, self.n_heads)

    def beta(self, x):
        """β_t ``(b, h, n·c)`` for the c keys of each token, in (0, 1), or (0, 2) with negative eigenvalues."""
        b, n = x.shape[:2]
        beta = torch.sigmoid(self.b_proj(x))  # (b, n, c h)
        if self.negative_eigenvalues:
            beta = 2 * beta
        c = self.keys_per_token
        return beta.reshape(b, n, c, self.n_heads).permute(0, 3, 1, 2).reshape(b, self.n_heads, n * c)  # (b, h, n c)

    def gates(self, x, key_mask):
        """``(beta, log_decay)``: β ``(b, h, n·c)``, log a ``(b, h, n[, d])`` or None; β = 0, a = 1 at pads."""
        beta, log_decay = self.beta(x), self.log_decay(x)
        if key_mask is not None:  # a padded position neither writes nor forgets
            beta = beta.masked_fill(~key_mask.repeat_interleave(self.keys_per_token, dim=1)[:, None, :], 0.0)
            if log_decay is not None:
                mask = key_mask[:, None, :] if log_decay.dim() == 3 else key_mask[:, None, :, None]
                log_decay = log_decay.masked_fill(~mask, 0.0)
        return beta, log_decay

    def recur(self, q, k, v, gates, S):
        beta, log_decay = gates
        return delta_rule_attention(q, k, v, beta, log_decay=log_decay, chunk_size=self.chunk_size, initial_state=S,
                                    return_state=True)

    def recur_step(self, q_t, k_t, v_t, gates_t, S):
        beta_t, log_decay_t = gates_t
        return delta_rule_step(q_t, k_t, v_t, beta_t, S, log_decay_t=log_decay_t)

    def extra_repr(self):
        return super().extra_repr() + f", gated={self.gated!r}, negative_eigenvalues={self.negative_eigenvalues}"


class DeltaProduct(DeltaNet):
    """n_h delta-rule steps a token: S ← Diag(a_t) S, then S ← (I − β k kᵀ) S + β k vᵀ for each of the token's
    n_h keys; o_t = S_tᵀ q_t after the last. Notebook 13; Siems et al. 2025 (DeltaProduct).

    A product of n_h reflections (β = 2) is a rotation or a permutation of the key space, which one
    reflection a token cannot be: counting mod 3 needs n_h = 2, S3 needs 2 (notebook 13).  The front
    end projects n_h keys, values and β a token (k and v projections n_h times as wide), each key
    L2-normalised; one decay a token (per head, or per channel with ``gated="channel"``).

    Args:
        d_model, n_heads: width and heads.
        n_householder: n_h, the delta-rule steps a token.
        gated, negative_eigenvalues: as for ``DeltaNet``; negative eigenvalues are on by default here.
        conv_size, chunk_size, norm_eps, bias, device, dtype: as for ``GatedLinearAttention``.
    """

    def __init__(self, d_model, n_heads, *, n_householder=2, gated=False, negative_eigenvalues=True, conv_size=4,
                 chunk_size=DEFAULT_CHUNK_SIZE, norm_eps=1e-5, bias=False, device=None, dtype=None):
        _validate.check_n_householder(n_householder)
        super().__init__(d_model, n_heads, gated=gated, negative_eigenvalues=negative_eigenvalues, conv_size=conv_size,
                         chunk_size=chunk_size, norm_eps=norm_eps, bias=bias, device=device, dtype=dtype,
                         keys_per_token=n_householder)
        self.n_householder = n_householder

    def _one_token(self, q, k, v, gates):
        """One token's inputs for ``delta_product_step``: its n_h keys, values and β ``(b, h, n_h[, d])``."""
        beta, log_decay = gates
        return q[:, :, 0], k, v, (beta, None if log_decay is None else log_decay[:, :, 0])

    def recur(self, q, k, v, gates, S):
        beta, log_decay = gates
        return delta_product_attention(q, k, v, beta, n_householder=self.n_householder, log_decay=log_decay,
                                       chunk_size=self.chunk_size, initial_state=S, return_state=True)

    def recur_step(self, q_t, k_t, v_t, gates_t, S):
        beta_t, log_decay_t = gates_t
        return delta_product_step(q_t, k_t, v_t, beta_t, S, log_decay_t=log_decay_t)

    def extra_repr(self):
        return super().extra_repr() + f", n_householder={self.n_householder}"
