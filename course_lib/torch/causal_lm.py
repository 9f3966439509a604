"""A small causal transformer language model whose attention is softmax, linear or FAVOR+. Notebook 07.

Katharopoulos et al. 2020, §3.4: a causal transformer with linear attention is an RNN.  The model
runs three ways with the same weights:

- in parallel over a whole sequence (``CausalLM.forward``), for training: softmax attention with
  the causal mask, or the causal ``LinearAttention`` / ``PerformerAttention`` modules of
  ``course_lib.torch.modules`` (chunked, memory linear in n; ``chunk_size=None``: prefix sums);
- one token at a time through the teaching step (``CausalLM.step``): linear attention and FAVOR+
  update each layer's (S, Z) with ``linear_attention_step``, which returns a new state; softmax
  appends the new key and value to a cache by concatenation;
- one token at a time through ``Decoder`` (what ``generate`` uses): per layer a
  ``RecurrentLinearAttention`` updated in place, or a preallocated ``KeyValueCache`` for softmax,
  and one fused projection for q, k and v (for the recurrent layers, v with its ones column).

All three give the same logits (tests/test_causal_lm.py).  Shapes: tokens ``(b, n)`` int64,
hidden ``(b, n, d_model)``, heads ``(b, h, n, d)``, logits ``(b, n, vocab)``.
"""

import torch
from torch import nn

from course_lib.torch.decoding import KeyValueCache
from course_lib.torch.full import MultiHeadAttention, merge_heads, softmax_attention, split_heads
from course_lib.torch.linear import DEFAULT_CHUNK_SIZE, linear_attention_step
from course_lib.torch.modules import LinearAttention, PerformerAttention

ATTENTIONS = ("softmax", "linear")  # the pair notebook 07 compares
MODEL_ATTENTIONS = (*ATTENTIONS, "performer")  # what CausalLM accepts


def _causal_softmax(q, k, v, *, causal=True, key_mask=None):
    return softmax_attention(q, k, v, causal=True)


def _identity(x):
    return x


def attention_module(attention, d_model, n_heads, chunk_size, n_features=64, generator=None):
    """The causal attention of a block: ``MultiHeadAttention`` (softmax) or a ``course_lib.torch.modules`` module."""
    if attention == "softmax":
        return MultiHeadAttention(d_model, n_heads, attention=_causal_softmax)
    if attention == "linear":
        return LinearAttention(d_model, n_heads, causal=True, chunk_size=chunk_size)
    return PerformerAttention(d_model, n_heads, n_features=n_features, causal=True, chunk_size=chunk_size,
                              generator=generator)


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x)). Notebook 07, Section 7.3."""

    def __init__(self, d_model, n_heads, attention, chunk_size, **options):
        super().__init__()
        self.attention = attention
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = attention_module(attention, d_model, n_heads, chunk_size, **options)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        """``x (b, n, d_model)`` → ``(b, n, d_model)``, every position in parallel."""
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def step(self, x_t, state):
        """One position ``x_t (b, d_model)`` and this layer's state → ``(b, d_model)``, new state.

        The teaching form.  The state is (S, Z) for linear attention and FAVOR+ (Katharopoulos et
        al. 2020, Eqs. 16-20) and the key/value cache ``(b, h, t, d)`` for softmax; None before the
        first token; the state passed in is never changed.
        """
        attn = self.attn
        y = self.norm1(x_t)
        q, k, v = (split_heads(proj(y)[:, None, :], attn.n_heads)[..., 0, :]
                   for proj in (attn.q_proj, attn.k_proj, attn.v_proj))  # (b, h, d): one position
        if self.attention == "softmax":
            k, v = k[..., None, :], v[..., None, :]  # (b, h, 1, d)
            if state is not None:
                k, v = torch.cat([state[0], k], dim=-2), torch.cat([state[1], v], dim=-2)  # (b, h, t, d)
            state = (k, v)
            out = softmax_attention(q[..., None, :], k, v)[..., 0, :]  # the last position sees every cached one
        else:
            phi_q, phi_k = attn.features(q, k)  # (b, h, f): the module's (causal-safe) features
            eps = attn.eps if self.attention == "linear" else torch.finfo(phi_q.dtype).tiny
            out, state = linear_attention_step(phi_q, phi_k, v, state, feature_map=_identity, eps=eps)
        x_t = x_t + attn.out_proj(merge_heads(out[..., None, :]))[:, 0, :]  # (b, d_model)
        return x_t + self.mlp(self.norm2(x_t)), state


class CausalLM(nn.Module):
    """A decoder-only transformer over tokens with learned positions. Notebook 07, Section 7.3.

    Args:
        vocab_size: number of token values.
        max_len: the most positions a sequence may have (learned position embeddings).
        d_model: model width; n_heads: heads h (``d_model // n_heads`` per head); n_layers: blocks.
        attention: ``"softmax"``, ``"linear"`` (elu+1 features, Katharopoulos et al. 2020, Eq. 7) or
            ``"performer"`` (FAVOR+, positive features).
        chunk_size: for linear attention and FAVOR+ in ``forward``: positions per chunk, or None (prefix sums).
        n_features: FAVOR+ only: random features per head.
        generator: FAVOR+ only: the ``torch.Generator`` each layer's ω is drawn from (default: torch's).
    """

    def __init__(self, vocab_size, max_len, *, d_model=64, n_heads=4, n_layers=2, attention="linear",
                 chunk_size=DEFAULT_CHUNK_SIZE, n_features=64, generator=None):
        super().__init__()
        if attention not in MODEL_ATTENTIONS:
            raise ValueError(f"attention must be one of {MODEL_ATTENTIONS}, got {attention!r}.")
        self.attention, self.max_len = attention, max_len
        self.embed, self.position = nn.Embedding(vocab_size, d_model), nn.Embedding(max_len, d_model)
        options = dict(n_features=n_features, generator=generator) if attention == "performer" else {}
        self.blocks = nn.ModuleList(Block(d_model, n_heads, attention, chunk_size, **options) for _ in range(n_layers))
        self.norm, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab_size)

    def _check(self, tokens, start=0):
        if tokens.dtype != torch.long:
            raise TypeError(f"tokens must be int64 token ids, got {tokens.dtype}.")
        if start + tokens.shape[-1] > self.max_len:
            raise ValueError(f"sequence of {start + tokens.shape[-1]} positions is longer than max_len = "
                             f"{self.max_len}: the model has no position embedding beyond it.")
        if tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < self.embed.num_embeddings:
            raise ValueError(f"tokens must lie in [0, {self.embed.num_embeddings}), got values from "
                             f"{int(tokens.min())} to {int(tokens.max())}.")

    def forward(self, tokens):
        """Logits for every position in parallel (causal): ``tokens (b, n)`` → ``(b, n, vocab)``."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape (b, n), got {tuple(tokens.shape)}.")
        self._check(tokens)
        positions = torch.arange(tokens.shape[-1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)  # (b, n, d_model)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # (b, n, vocab)

    def step(self, token, position, state=None):
        """The logits after one more token, from the previous state. Notebook 07, Eq. (7.3).

        Args:
            token: the new tokens ``(b,)`` int64, at ``position`` (0-based).
            position: how many tokens came before it.
            state: one entry per layer from the previous step, or None before the first token.

        Returns:
            ``(logits (b, vocab), state)``; the state passed in is not changed.
        """
        if token.dim() != 1:
            raise ValueError(f"token must have shape (b,) (one token per sequence), got {tuple(token.shape)}.")
        self._check(token[:, None], start=position)
        state = [None] * len(self.blocks) if state is None else state
        x = self.embed(token) + self.position.weight[position]  # (b, d_model)
        new_state = []
        for block, layer_state in zip(self.blocks, state, strict=True):
            x, layer_state = block.step(x, layer_state)
            new_state.append(layer_state)
        return self.head(self.norm(x)), new_state


class Decoder:
    """The generation state of a ``CausalLM`` for one batch of sequences, changed in place. Notebook 07.

    Built once per sequence: each layer gets one fused q, k, v projection (weights transposed
    once; for linear attention and FAVOR+ each head's v has an extra output with weight 0 and
    bias 1, the ones column that puts the normaliser into the numerator's product) and its state,
    a ``RecurrentLinearAttention`` (``module.recurrent``) or a ``KeyValueCache`` of ``max_len``
    positions.  ``step`` then runs without re-validating anything but the position.

    Args:
        model: a ``CausalLM`` (its weights are read now: change them, make a new Decoder).
        batch_size: sequences generated together.
    """

    def __init__(self, model, batch_size):
        self.model, self.batch_size, self.position = model, batch_size, 0
        self.layers = [self._layer(block) for block in model.blocks]

    def _layer(self, block):
        attn, b = block.attn, self.batch_size
        h, width = attn.n_heads, attn.q_proj.in_features
        d = width // h
        weight = attn.q_proj.weight
        weights = [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]  # (d_model, d_model) each
        biases = [p.bias if p.bias is not None else weight.new_zeros(width)
                  for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
        if block.attention == "softmax":
            state = KeyValueCache((b, h), self.model.max_len, d, d, dtype=weight.dtype, device=weight.device)
        else:
            state = attn.recurrent((b, h))
            weights[2] = torch.cat([weights[2].view(h, d, width), weight.new_zeros(h, 1, width)], dim=1)  # (h, d+1, ·)
            biases[2] = torch.cat([biases[2].view(h, d), weight.new_ones(h, 1)], dim=1)  # (h, d + 1): bias 1
        fused_t = torch.cat([w.reshape(-1, width) for w in weights]).T.contiguous()  # (d_model, 3·d_model [+ h])
        return fused_t.detach(), torch.cat([x.reshape(-1) for x in biases]).detach(), state

    def step(self, token):
        """The logits after one more token ``(b,)`` int64 → ``(b, vocab)``; the state moves one position on."""
        model, b = self.model, self.batch_size
        if self.position >= model.max_len:
            raise ValueError(f"the sequence already has max_len = {model.max_len} positions.")
        x = model.embed(token) + model.position.weight[self.position]  # (b, d_model)
        for block, (fused_t, bias, state) in zip(model.blocks, self.layers, strict=True):
            attn = block.attn
            h, width = attn.n_heads, attn.q_proj.in_features
            projected = torch.addmm(bias, block.norm1(x), fused_t)  # (b, 3·d_model [+ h]): one product
            if block.attention == "softmax":
                q, k, v = projected.view(b, 3, h, width // h).unbind(1)  # (b, h, d) each
                out = state.step(q, k, v)  # (b, h, e)
            else:
                qk = projected[:, :2 * width].view(b, 2, h, width // h).transpose(0, 1)  # (2, b, h, d)
                out = state.step(qk, projected[:, 2 * width:].view(b, h, width // h + 1))  # (b, h, e)
            x = x + attn.out_proj(out.reshape(b, width).to(x.dtype))  # (b, d_model)
            x = x + block.mlp(block.norm2(x))
        self.position += 1
        return model.head(model.norm(x))


def stepwise_logits(model, tokens, *, cache=True, decoder=False):
    """The logits of every position computed token by token, as in generation. Notebook 07, Section 7.3.

    ``cache=True``: ``model.step`` (the RNN's teaching step for linear attention and FAVOR+, a
    key/value cache for softmax); with ``decoder=True``, the in-place ``Decoder`` instead.
    ``cache=False``: the whole prefix again through ``model.forward`` for each token (no state).
    Equal to ``model(tokens)`` up to float rounding: the parallel and recurrent forms agree.

    Args:
        model: a ``CausalLM``; tokens: ``(b, n)`` int64.

    Returns:
        ``(b, n, vocab)``.
    """
    if not cache:
        return torch.stack([model(tokens[:, :t + 1])[:, -1] for t in range(tokens.shape[1])], dim=1)
    if decoder:
        model._check(tokens)
        steps = Decoder(model, tokens.shape[0])
        return torch.stack([steps.step(tokens[:, t]).clone() for t in range(tokens.shape[1])], dim=1)
    state, logits = None, []
    for t in range(tokens.shape[1]):
        out, state = model.step(tokens[:, t], t, state)
        logits.append(out)
    return torch.stack(logits, dim=1)  # (b, n, vocab)


def generate(model, prompt, n_new, *, cache=True):
    """Greedy autoregressive generation: append ``n_new`` tokens to ``prompt``. Notebook 07, Section 7.3.

    With ``cache=True`` each token costs one ``Decoder.step``: constant for linear attention and
    FAVOR+ (the state updated in place), growing with the position for softmax (its preallocated
    cache); ``cache=False`` recomputes the whole prefix for each token.

    Args:
        model: a ``CausalLM``; prompt: ``(b, n0)`` int64 with n0 ≥ 1; n_new: tokens to add.

    Returns:
        ``(b, n0 + n_new)`` int64: the prompt and the generated tokens.
    """
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must have shape (b, n0) with n0 ≥ 1, got {tuple(prompt.shape)}.")
    model._check(prompt)  # once per sequence; the generated tokens are in range by construction
    with torch.inference_mode():
        tokens = [prompt]
        if cache:
            decoder = Decoder(model, prompt.shape[0])
            for t in range(prompt.shape[1]):
                logits = decoder.step(prompt[:, t])
        for i in range(n_new):
            if not cache:
                logits = model(torch.cat(tokens, dim=1))[:, -1]  # (b, vocab)
            tokens.append(logits.argmax(-1, keepdim=True))  # (b, 1)
            if cache and i < n_new - 1:
                logits = decoder.step(tokens[-1][:, 0])
        made = torch.cat(tokens, dim=1)  # (b, n0 + n_new)
    return made.clone()  # a normal tensor again, usable outside inference mode
