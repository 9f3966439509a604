"""A causal language model whose layers are any of the course's mixers, with one cache for all. Notebook 14.

Hybrid models stack recurrent layers with a few softmax layers (Jamba, Lieber et al. 2024; the
hybrids of Gated DeltaNet, Yang et al. 2025).  The same weights run three ways:

- ``forward(tokens)``: every position in parallel, for training; it is ``prefill`` from the empty cache;
- ``prefill(tokens, cache)``: a chunk of tokens in parallel from a cache (the chunked recurrences
  with ``initial_state``), returning the next cache;
- ``step(tokens_t, cache)``: one token per sequence (the recurrences' one-token steps).

The cache (``HybridCache``) holds, per layer, a softmax layer's keys and values (``KeyValues``, in
buffers preallocated and doubled when full, never concatenated per token, as ``KeyValueCache`` in
``course_lib.torch.decoding``) or a recurrent layer's ``MixerState`` (the short convolution's last
inputs and S); and, per sequence, how many tokens it has seen and which (for ``rollback``).  A
sequence's entries are stored compacted: a pad (``key_mask`` False) takes no slot, writes no state and
does not count as a position, so a left- or right-padded batch gives each sequence what it gets alone.

Positions: no absolute position embeddings (a trained model could use them to imitate an overwrite,
and recurrent language models are built without them); the recurrent layers know order from their
recurrence and convolution, and softmax layers rotate q and k by each token's position in its own
sequence (RoPE, Su et al. 2021), so that they see relative order and not only the causal mask.

Rolling back j tokens (speculative decoding rejects drafted tokens) replays, from a snapshot
(``cache.copy()``), the tokens seen since: one chunked prefill of the tokens between the snapshot and
the target, no memory beyond the snapshot.  The alternative, a state stored after every token, rolls
back in O(1) but holds j × (h·d·e + (conv_size − 1)·3·d_model) numbers per recurrent layer and
sequence to go back up to j tokens (softmax layers need nothing stored: their length moves back).
A snapshot can be taken after any token, not only at a chunk's end: a prefix cache whose snapshots
sit at chunk boundaries alone gives a prompt shorter than a chunk no hit.

Shapes: tokens ``(b, n)`` int64, hidden ``(b, n, d_model)``, heads ``(b, h, n, d)``, cached keys
``(b, h, capacity, d)``, logits ``(b, n, vocab)``.
"""

from typing import NamedTuple

import torch
from torch import nn

from course_lib import _validate
from course_lib.torch._mixers import DeltaNet, DeltaProduct, GatedLinearAttention, MixerState  # noqa: F401 (cache)
from course_lib.torch.full import split_heads
from course_lib.torch.gated import DEFAULT_CHUNK_SIZE

DECAYS = {"linear": "none", "retnet": "fixed", "gate": "head", "gla": "channel"}  # GatedLinearAttention's
DELTAS = {"deltanet": False, "gated_deltanet": "head", "kda": "channel"}  # DeltaNet's gated=
MIXERS = ("softmax", *DECAYS, *DELTAS, "deltaproduct")


def _reserve(buffer, needed, dim):
    """``buffer`` if it has ``needed`` slots along ``dim``, else a copy twice as large: O(1) a token, amortised."""
    capacity = buffer.shape[dim]
    if needed <= capacity:
        return buffer
    shape = list(buffer.shape)
    shape[dim] = max(needed, 2 * capacity)
    grown = buffer.new_zeros(shape)
    grown.narrow(dim, 0, capacity).copy_(buffer)
    return grown


def _slots(lengths, real):
    """Each token's slot ``(b, n)``: ``lengths (b,)`` before it plus the real tokens up to it (a pad: its last)."""
    return lengths[:, None] + real.cumsum(1) - 1


def _append(buffer, new, lengths, real, dim=1):
    """Each sequence's real entries of ``new`` written after its ``lengths (b,)`` slots; pads take none.

    ``buffer`` and ``new`` have the batch first and their slots and positions along ``dim``: the tokens
    ``(b, capacity)`` and ``(b, n)``, keys ``(b, h, capacity, d)`` and ``(b, h, n, d)``.  Returns
    ``(buffer, lengths)``, the buffer grown if it was full.
    """
    slots, lengths = _slots(lengths, real), lengths + real.sum(1)
    buffer = _reserve(buffer, max(int(lengths.max()), 1), dim)  # one slot at least: a query with no key reads zeros
    rows, cols = real.nonzero(as_tuple=True)  # the real tokens
    buffer.movedim(dim, 1)[rows, slots[rows, cols]] = new.movedim(dim, 1)[rows, cols]  # a view: written in place
    return buffer, lengths


def rotate(x, positions, base=10_000.0):
    """Rotary position embedding: ``x (b, h, n, d)`` rotated by ``positions (b, n)``. Su et al. 2021 (RoFormer).

    Channel i is paired with channel i + d/2 (not 2i with 2i + 1 as in the paper: the same rotation of
    permuted channels) and turned by position × base^(−i / (d/2)).
    """
    half = x.shape[-1] // 2
    frequencies = base ** -(torch.arange(half, device=x.device, dtype=x.dtype) / half)  # (d/2,)
    angles = positions[:, None, :, None].to(x.dtype) * frequencies  # (b, 1, n, d/2)
    cos, sin, x1, x2 = angles.cos(), angles.sin(), x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class KeyValues(NamedTuple):
    """A softmax layer's cache: ``keys, values (b, h, capacity, d)``, real in slots ``[0, lengths (b,))``."""

    keys: torch.Tensor
    values: torch.Tensor
    lengths: torch.Tensor


class SoftmaxAttention(nn.Module):
    """Causal multi-head softmax attention with rotary positions and a key/value cache. Notebooks 01, 07 and 14.

    The mixer interface of ``course_lib.torch._mixers``: ``empty_state(b)``, ``prefill(x, state, *,
    key_mask)`` and ``step(x_t, state)``; the state is ``KeyValues``, its buffers written in place.
    ``window=w`` (sliding-window attention, as in Mistral or Gemma's local layers): a query sees its own
    key and the w − 1 before it.  The cache still keeps every key (simple, and ``rollback`` needs nothing
    else); a serving system keeps the last w in a ring buffer, which ``HybridCache.nbytes`` counts.
    """

    def __init__(self, d_model, n_heads, *, window=None):
        super().__init__()
        _validate.check_heads(d_model, n_heads)
        if (d_model // n_heads) % 2:
            raise ValueError(f"rotary positions rotate pairs of channels: the head dim d_model / n_heads must be even, "
                             f"got {d_model} / {n_heads} = {d_model // n_heads}.")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be None (every earlier key) or a positive int, got {window!r}.")
        self.n_heads, self.head_dim, self.window = n_heads, d_model // n_heads, window
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self, name, nn.Linear(d_model, d_model, bias=False))

    def empty_state(self, batch_size):
        empty = self.q_proj.weight.new_zeros(batch_size, self.n_heads, 0, self.head_dim)  # (b, h, 0, d)
        return KeyValues(empty, empty.clone(), torch.zeros(batch_size, dtype=torch.long, device=empty.device))

    def prefill(self, x, state=None, *, key_mask=None):
        """``x (b, n, d_model)`` from ``state`` → ``(out (b, n, d_model), KeyValues)``; pads take no slot."""
        state = self.empty_state(x.shape[0]) if state is None else state
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if key_mask is None else key_mask
        positions = _slots(state.lengths, real)  # (b, n): a pad's is its last real token's, −1 before any
        q, k, v = (split_heads(p(x), self.n_heads) for p in (self.q_proj, self.k_proj, self.v_proj))  # (b, h, n, d)
        q, k = rotate(q, positions), rotate(k, positions)
        keys, _ = _append(state.keys, k, state.lengths, real, dim=2)  # (b, h, capacity, d)
        values, lengths = _append(state.values, v, state.lengths, real, dim=2)
        s = max(int(lengths.max()), 1)  # slot 0 exists even before any token (``_append``)
        # the slots up to its own; a pad before any token reads slot 0, not nothing: a query with no key is
        # NaN in some versions of scaled_dot_product_attention, and a pad's output is never read
        slots, last = torch.arange(s, device=x.device), positions.clamp(min=0)[..., None]  # (s,), (b, n, 1)
        allowed = slots <= last  # (b, n, s)
        if self.window is not None:
            allowed = allowed & (slots > last - self.window)  # the last ``window`` keys, its own included
        out = nn.functional.scaled_dot_product_attention(q, keys[:, :, :s], values[:, :, :s],
                                                         attn_mask=allowed[:, None])  # (b, h, n, e)
        return self.out_proj(out.transpose(1, 2).flatten(2)), KeyValues(keys, values, lengths)  # (b, n, d_model)

    def step(self, x_t, state):
        """``x_t (b, d_model)`` → ``(out_t (b, d_model), KeyValues)``: a prefill of one token (the same products)."""
        out, state = self.prefill(x_t[:, None], state)
        return out[:, 0], state

    def extra_repr(self):
        return f"n_heads={self.n_heads}, window={self.window}"


def make_mixer(spec, d_model, n_heads, conv_size, chunk_size):
    """The mixer a layer spec stands for: a name from ``MIXERS``, or ``(name, options)`` for its keywords.

    ``("deltanet", {"negative_eigenvalues": True})`` is DeltaNet with β in (0, 2);
    ``("deltaproduct", {"n_householder": 3})`` three reflections a token; ``("softmax", {"window": 16})`` a
    sliding window of 16 keys.
    """
    name, options = (spec, {}) if isinstance(spec, str) else spec
    if name == "softmax":
        return SoftmaxAttention(d_model, n_heads, **options)
    shared = dict(conv_size=conv_size, chunk_size=chunk_size, **options)
    if name in DECAYS:
        return GatedLinearAttention(d_model, n_heads, decay=DECAYS[name], **shared)
    if name in DELTAS:
        return DeltaNet(d_model, n_heads, **{"gated": DELTAS[name], **shared})
    return DeltaProduct(d_model, n_heads, **shared)


def _spec_name(spec):
    """A layer spec's mixer name: the spec itself, or the first of a ``(name, options dict)`` pair (else None)."""
    if isinstance(spec, str):
        return spec
    is_pair = isinstance(spec, tuple | list) and len(spec) == 2 and isinstance(spec[1], dict)
    return spec[0] if is_pair else None


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + mlp(norm(x)). Notebook 14."""

    def __init__(self, mixer, d_model):
        super().__init__()
        self.norm1, self.mixer, self.norm2 = nn.RMSNorm(d_model), mixer, nn.RMSNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def prefill(self, x, state, key_mask):
        out, state = self.mixer.prefill(self.norm1(x), state, key_mask=key_mask)
        x = x + out  # (b, n, d_model)
        return x + self.mlp(self.norm2(x)), state

    def step(self, x_t, state):
        out, state = self.mixer.step(self.norm1(x_t), state)
        x_t = x_t + out  # (b, d_model)
        return x_t + self.mlp(self.norm2(x_t)), state


class HybridCache:
    """What a ``HybridLM`` carries from one call to the next, for one batch of sequences. Notebook 14.

    Attributes:
        states: per layer, ``KeyValues`` (softmax) or ``MixerState`` (recurrent).
        lengths: ``(b,)`` the real tokens each sequence has seen.
        tokens: ``(b, capacity)`` those tokens, in slots ``[0, lengths)``: what ``rollback`` replays.
        windows: per layer, a softmax layer's window (None: every key; None too for a recurrent layer).
    """

    def __init__(self, owner, states, lengths, tokens, windows=None):
        self.owner, self.states, self.lengths, self.tokens = owner, states, lengths, tokens
        self.windows = [None] * len(states) if windows is None else list(windows)

    def copy(self):
        """A snapshot: later calls on this cache or on the snapshot never change the other."""
        states = [type(state)(*(t.clone() for t in state)) for state in self.states]
        return HybridCache(self.owner, states, self.lengths.clone(), self.tokens.clone(), self.windows)

    def nbytes(self):
        """Bytes of state per sequence at the longest sequence's length (not the buffers' slack, nor ``tokens``).

        A softmax layer's grows with the length (a sliding window's up to its window); a recurrent layer's
        does not.
        """
        longest, total = int(self.lengths.max()), 0
        for state, window in zip(self.states, self.windows, strict=True):
            if isinstance(state, KeyValues):
                kept = longest if window is None else min(longest, window)  # a window's ring buffer
                total += 2 * state.keys[0, :, :kept].numel() * state.keys.element_size()
            else:
                total += sum(t[0].numel() * t.element_size() for t in state)
        return total

    def __repr__(self):
        kinds = ["softmax" if isinstance(state, KeyValues) else "recurrent" for state in self.states]
        return f"HybridCache(lengths={self.lengths.tolist()}, layers={kinds}, nbytes={self.nbytes()})"


class HybridLM(nn.Module):
    """A causal language model whose layers are any mixers, with one cache for all of them. Notebook 14.

    Args:
        vocab_size: number of token values.
        layers: mixer names, one per block, from ``MIXERS``: ``"softmax"`` (rotary, cached keys and
            values), ``"linear"``, ``"retnet"``, ``"gate"``, ``"gla"`` (``GatedLinearAttention`` with
            decay ``"none"``, ``"fixed"``, ``"head"``, ``"channel"``), ``"deltanet"``, ``"gated_deltanet"``,
            ``"kda"`` (``DeltaNet`` with gated ``False``, ``"head"``, ``"channel"``), ``"deltaproduct"``; or a
            ``(name, options)`` pair whose options go to the mixer:
            ``("deltanet", {"negative_eigenvalues": True})``, ``("softmax", {"window": 16})``.
        d_model, n_heads: width and heads of every layer.
        conv_size, chunk_size: the recurrent layers' short convolution and chunk length.
    """

    def __init__(self, vocab_size, *, layers, d_model=64, n_heads=4, conv_size=4, chunk_size=DEFAULT_CHUNK_SIZE):
        super().__init__()
        names = [layers] if isinstance(layers, str) else list(layers)  # one string: one name, not its letters
        unknown = [spec for spec in names if _spec_name(spec) not in MIXERS]
        if isinstance(layers, str) or unknown or not names:
            raise ValueError(f"layers must be a non-empty sequence of mixer names from {MIXERS} (or (name, options) "
                             f"pairs); got {layers!r} (unknown: {unknown}).")
        self.layers, self.vocab_size, self.chunk_size = tuple(names), vocab_size, chunk_size
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(Block(make_mixer(name, d_model, n_heads, conv_size, chunk_size), d_model)
                                    for name in names)
        self.norm, self.head = nn.RMSNorm(d_model), nn.Linear(d_model, vocab_size, bias=False)
        self._cache_key = object()  # a cache belongs to the model that made it

    def empty_cache(self, batch_size):
        """The cache before any token, for ``batch_size`` sequences, in the parameters' dtype and device."""
        device = self.embed.weight.device
        states = [block.mixer.empty_state(batch_size) for block in self.blocks]
        return HybridCache(self._cache_key, states, torch.zeros(batch_size, dtype=torch.long, device=device),
                           torch.zeros(batch_size, 0, dtype=torch.long, device=device),
                           [getattr(block.mixer, "window", None) for block in self.blocks])

    def forward(self, tokens, *, key_mask=None):
        """Logits of every position in parallel: ``tokens (b, n)`` → ``(b, n, vocab)``; ``prefill`` from empty."""
        return self.prefill(tokens, key_mask=key_mask)[0]

    def prefill(self, tokens, cache=None, *, key_mask=None):
        """A chunk of tokens per sequence, in parallel, from ``cache``. Notebook 14.

        Args:
            tokens: ``(b, n)`` int64.
            cache: a ``HybridCache`` of this model (None: the empty cache); updated in place and returned.
            key_mask: ``(b, n)`` boolean, True at real tokens (pads on either side, or anywhere).

        Returns:
            ``(logits (b, n, vocab), cache)``; a pad's logits are not meaningful.
        """
        self._check_tokens("tokens", tokens, 2, "(b, n)")
        if key_mask is not None and (key_mask.dtype != torch.bool or key_mask.shape != tokens.shape):
            raise ValueError(f"key_mask must be boolean with the shape of tokens {tuple(tokens.shape)} (True at real "
                             f"tokens), got {key_mask.dtype} {tuple(key_mask.shape)}.")
        cache = self.empty_cache(tokens.shape[0]) if cache is None else self._check_cache(cache, tokens.shape[0])
        x = self.embed(tokens)  # (b, n, d_model)
        for i, block in enumerate(self.blocks):
            x, cache.states[i] = block.prefill(x, cache.states[i], key_mask)
        real = torch.ones_like(tokens, dtype=torch.bool) if key_mask is None else key_mask
        cache.tokens, cache.lengths = _append(cache.tokens, tokens, cache.lengths, real)
        return self.head(self.norm(x)), cache

    def step(self, tokens_t, cache):
        """One token per sequence: ``tokens_t (b,)`` → ``(logits (b, vocab), cache)``; the cache is updated in place."""
        self._check_tokens("tokens_t", tokens_t, 1, "(b,) (one token per sequence)")
        self._check_cache(cache, tokens_t.shape[0])
        x = self.embed(tokens_t)  # (b, d_model)
        for i, block in enumerate(self.blocks):
            x, cache.states[i] = block.step(x, cache.states[i])
        real = torch.ones_like(tokens_t[:, None], dtype=torch.bool)  # (b, 1)
        cache.tokens, cache.lengths = _append(cache.tokens, tokens_t[:, None], cache.lengths, real)
        return self.head(self.norm(x)), cache

    def rollback(self, cache, j, *, snapshot):
        """The cache as if its last ``j`` tokens had never been seen, by replaying from ``snapshot``. Notebook 14.

        Args:
            cache: a ``HybridCache``; j: tokens to forget, the same for every sequence.
            snapshot: ``copy()`` of this cache taken at least j tokens ago.

        Returns:
            A new cache; neither argument changes.
        """
        self._check_cache(cache, len(cache.lengths))
        self._check_cache(snapshot, len(cache.lengths))
        start, count = snapshot.lengths, cache.lengths - j - snapshot.lengths  # (b,) each
        seen = int(start.max())
        slots = torch.arange(seen, device=start.device) < start[:, None]  # (b, seen): the snapshot's tokens
        if j < 0 or (count < 0).any() or (snapshot.tokens[:, :seen] != cache.tokens[:, :seen])[slots].any():
            raise ValueError(f"rollback needs j >= 0 (got {j}) and a snapshot of this cache taken at least j tokens "
                             f"before it: snapshot lengths {start.tolist()}, cache lengths {cache.lengths.tolist()}.")
        width = int(count.max())
        if width == 0:
            return snapshot.copy()
        index = (start[:, None] + torch.arange(width, device=start.device)).clamp(max=cache.tokens.shape[1] - 1)
        key_mask = torch.arange(width, device=start.device) < count[:, None]  # (b, width): right padding
        return self.prefill(cache.tokens.gather(1, index), snapshot.copy(), key_mask=key_mask)[1]

    def generate(self, prompt, max_new_tokens, *, temperature=0.0, generator=None, key_mask=None):
        """Continue ``prompt (b, n0)`` by ``max_new_tokens``: greedy (temperature 0) or sampled. Notebook 14.

        One prefill of the prompt (``key_mask`` for a padded batch), then one ``step`` per new token.
        Returns ``(b, n0 + max_new_tokens)`` int64: the prompt as given, then the new tokens.
        """
        self._check_tokens("prompt", prompt, 2, "(b, n0) with n0 >= 1")
        if prompt.shape[1] < 1 or temperature < 0:
            raise ValueError(f"generate needs a prompt (b, n0) with n0 >= 1 and temperature >= 0, got "
                             f"{tuple(prompt.shape)} and {temperature}.")
        real = torch.ones_like(prompt, dtype=torch.bool) if key_mask is None else key_mask
        last = prompt.shape[1] - 1 - real.flip(1).int().argmax(1)  # (b,): the last real token, right padding too
        new = []
        with torch.inference_mode():
            logits, cache = self.prefill(prompt, key_mask=key_mask)
            logits = logits[torch.arange(len(prompt)), last]  # (b, vocab)
            for i in range(max_new_tokens):
                if temperature == 0:
                    new.append(logits.argmax(-1))
                else:
                    probabilities = torch.softmax(logits / temperature, dim=-1)  # (b, vocab)
                    new.append(torch.multinomial(probabilities, 1, generator=generator)[:, 0])
                if i < max_new_tokens - 1:
                    logits, cache = self.step(new[-1], cache)
            made = torch.cat([prompt, *(t[:, None] for t in new)], dim=1)  # (b, n0 + max_new_tokens)
        return made.clone()  # a normal tensor again, usable outside inference mode

    def _check_tokens(self, name, tokens, rank, shape):
        if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long or tokens.dim() != rank:
            got = f"{tokens.dtype} {tuple(tokens.shape)}" if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"{name} must be int64 token ids of shape {shape}, got {got}.")
        if tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < self.vocab_size:
            raise ValueError(f"{name} must lie in [0, {self.vocab_size}), got values from {int(tokens.min())} to "
                             f"{int(tokens.max())}.")

    def _check_cache(self, cache, batch_size):
        if not isinstance(cache, HybridCache) or cache.owner is not self._cache_key:
            raise ValueError("cache must be a HybridCache made by this model (empty_cache, prefill or a copy of "
                             "one): a cache from another model holds another model's states.")
        if len(cache.lengths) != batch_size:
            raise ValueError(f"the cache holds {len(cache.lengths)} sequences, the tokens {batch_size}.")
        return cache

    def extra_repr(self):
        return f"layers={list(self.layers)}, chunk_size={self.chunk_size}"
