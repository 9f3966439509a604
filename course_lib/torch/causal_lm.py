"""A small causal transformer language model whose attention is softmax or causal linear. Notebook 07.

Katharopoulos et al. 2020, §3.4: a causal transformer with linear attention is an RNN.  The model
runs two ways with the same weights:

- in parallel over a whole sequence (``CausalLM.forward``), for training: softmax attention with
  the causal mask, or ``causal_linear_attention`` (prefix sums, or the chunked form);
- one token at a time (``CausalLM.step``), for generation: linear attention updates each layer's
  (S, Z) state with ``linear_attention_step`` (the same work at every position); softmax attention
  appends the new key and value to a cache and attends over it (work growing with the position),
  or, with ``cache=False``, recomputes the whole prefix (work growing with its square).

Both ways give the same logits (tests/test_causal_lm.py).  Shapes: tokens ``(b, n)`` int64,
hidden ``(b, n, d_model)``, heads ``(b, h, n, d)``, logits ``(b, n, vocab)``.
"""

import torch
from torch import nn

from course_lib.torch.full import MultiHeadAttention, merge_heads, softmax_attention, split_heads
from course_lib.torch.linear import causal_linear_attention, linear_attention_step

ATTENTIONS = ("softmax", "linear")


def _kernel(attention, chunk_size):
    """The parallel attention kernel, with ``softmax_attention``'s signature, always causal."""
    if attention == "softmax":
        return lambda q, k, v, *, causal=True, key_mask=None: softmax_attention(q, k, v, causal=True)
    return lambda q, k, v, *, causal=True, key_mask=None: causal_linear_attention(q, k, v, chunk_size=chunk_size)


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x)). Notebook 07, Section 7.3."""

    def __init__(self, d_model, n_heads, attention, chunk_size):
        super().__init__()
        self.attention = attention
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, attention=_kernel(attention, chunk_size))
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        """``x (b, n, d_model)`` → ``(b, n, d_model)``, every position in parallel."""
        x = x + self.attn(self.norm1(x), causal=True)
        return x + self.mlp(self.norm2(x))

    def step(self, x_t, state):
        """One position ``x_t (b, d_model)`` and this layer's state → ``(b, d_model)``, new state.

        The state is (S, Z) for linear attention (Katharopoulos et al. 2020, Eqs. 16-20) and the
        key/value cache ``(b, h, t, d)`` for softmax; None before the first token.
        """
        attn = self.attn
        y = self.norm1(x_t)
        q, k, v = (split_heads(proj(y)[:, None, :], attn.n_heads) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        if self.attention == "linear":  # (b, h, 1, d) → (b, h, d): one position, no sequence axis
            out, state = linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], state)
            out = out[..., None, :]  # (b, h, 1, e)
        else:
            if state is not None:
                k, v = torch.cat([state[0], k], dim=-2), torch.cat([state[1], v], dim=-2)  # (b, h, t, d)
            state = (k, v)
            out = softmax_attention(q, k, v)  # the last position sees every cached one: no mask needed
        x_t = x_t + attn.out_proj(merge_heads(out))[:, 0, :]  # (b, d_model)
        return x_t + self.mlp(self.norm2(x_t)), state


class CausalLM(nn.Module):
    """A decoder-only transformer over tokens with learned positions. Notebook 07, Section 7.3.

    Args:
        vocab_size: number of token values.
        max_len: the most positions a sequence may have (learned position embeddings).
        d_model: model width; n_heads: heads h (``d_model // n_heads`` per head); n_layers: blocks.
        attention: ``"softmax"`` or ``"linear"`` (elu+1 features, Katharopoulos et al. 2020, Eq. 7).
        chunk_size: for linear attention in ``forward``: None (prefix sums) or the chunk length.
    """

    def __init__(self, vocab_size, max_len, *, d_model=64, n_heads=4, n_layers=2, attention="linear",
                 chunk_size=None):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}.")
        self.attention, self.max_len = attention, max_len
        self.embed, self.position = nn.Embedding(vocab_size, d_model), nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, attention, chunk_size) for _ in range(n_layers))
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


def stepwise_logits(model, tokens, *, cache=True):
    """The logits of every position computed token by token, as in generation. Notebook 07, Section 7.3.

    ``cache=True``: ``model.step`` (the RNN for linear attention, a key/value cache for softmax).
    ``cache=False``: the whole prefix again through ``model.forward`` for each token (no state).
    Equal to ``model(tokens)`` up to float rounding: the parallel and recurrent forms agree.

    Args:
        model: a ``CausalLM``; tokens: ``(b, n)`` int64.

    Returns:
        ``(b, n, vocab)``.
    """
    if not cache:
        return torch.stack([model(tokens[:, :t + 1])[:, -1] for t in range(tokens.shape[1])], dim=1)
    state, logits = None, []
    for t in range(tokens.shape[1]):
        out, state = model.step(tokens[:, t], t, state)
        logits.append(out)
    return torch.stack(logits, dim=1)  # (b, n, vocab)


@torch.no_grad()
def generate(model, prompt, n_new, *, cache=True):
    """Greedy autoregressive generation: append ``n_new`` tokens to ``prompt``. Notebook 07, Section 7.3.

    With ``cache=True`` each new token costs one ``model.step`` — constant for linear attention,
    growing with the position for softmax (its cache); ``cache=False`` recomputes the prefix.

    Args:
        model: a ``CausalLM``; prompt: ``(b, n0)`` int64 with n0 ≥ 1; n_new: tokens to add.

    Returns:
        ``(b, n0 + n_new)`` int64: the prompt and the generated tokens.
    """
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must have shape (b, n0) with n0 ≥ 1, got {tuple(prompt.shape)}.")
    tokens, state = prompt, None
    if cache:
        for t in range(prompt.shape[1]):
            logits, state = model.step(prompt[:, t], t, state)
    for _ in range(n_new):
        if not cache:
            logits = model(tokens)[:, -1]  # (b, vocab)
        tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], dim=1)  # (b, t + 1)
        if cache and tokens.shape[1] < prompt.shape[1] + n_new:
            logits, state = model.step(tokens[:, -1], tokens.shape[1] - 1, state)
    return tokens
