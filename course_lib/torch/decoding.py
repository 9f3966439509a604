"""One token at a time: the lean recurrent step of causal linear attention, and a fair key/value cache.

Implements notebook 07; Katharopoulos et al. 2020, §3.4, Eqs. 16-20.  ``linear_attention_step``
(``course_lib.torch.linear``) is the teaching form: it returns a new state and never changes the
old one.  Generating with it pays, per token, for a new state, a check of every argument and one
small operation per term: its arithmetic is about 10⁵ multiply-adds (h = 8, f = e = 64), so the
time goes to per-operation overhead.  ``RecurrentLinearAttention`` computes the same outputs at
the cost of what they compute:

- the state [S | Z] ``(L, f, e + 1)`` (L = b·h: every head in one batched product) is updated in
  place, and its shape, dtype and device are fixed once per sequence, at construction;
- the normaliser rides in the same products as the numerator: v gets a column of ones, so
  S += phi(k) vᵀ and Z += phi(k) are one multiply-add, and phi(q) [S | Z] gives numerator and
  normaliser (eps included) in one ``baddbmm``;
- the query and key go through the feature map in one call, stacked ``(2, ..., d)``: for the
  default elu+1, in place, in a buffer whose views the products read (no new tensor per token).

``KeyValueCache`` is the fair baseline for softmax attention: keys and values written into a
buffer preallocated for the whole sequence (never grown by concatenation) and the new query
attended with ``scaled_dot_product_attention``; no per-call validation either.

Both objects hold the state of one batch of sequences and change it at every ``step``.  They are
for inference: run them under ``torch.inference_mode()`` or ``torch.no_grad()`` (their ``out=``
buffers and in-place updates are not differentiable; training uses the parallel causal forms).
"""

import math

import torch


class RecurrentLinearAttention:
    """Causal linear attention for one token at a time, its state updated in place. Notebook 07, Eq. (7.3).

    Equal to ``linear_attention_step`` applied token after token (tests/test_decoding.py), and to
    row t of ``causal_linear_attention``.

    Args:
        batch_shape: the leading dims of one token's query, e.g. ``(b, h)``.
        d: query/key head dim; e: value head dim.
        features: ``features(qk)`` → ``(phi_q, phi_k)`` for the stacked ``qk (2, *batch_shape, d)``,
            each ``(*batch_shape, f)`` and non-negative.  Default None: elu+1 (Katharopoulos et al.
            2020, Eq. 7), computed in place in a buffer made once, for the query and key together.
        eps: added to the normaliser (absolute), as in ``linear_attention_step``.
        dtype, device: of the state (float32 at least: a half-precision running sum stalls).
    """

    def __init__(self, batch_shape, d, e, *, features=None, eps=1e-6, dtype=torch.float32, device=None):
        self.features, self.batch_shape, self.e, self.eps = features, tuple(batch_shape), e, eps
        self.dtype = dtype = torch.promote_types(dtype, torch.float32)
        self.f = d if features is None else self._check_features(features, d, device)  # f features
        length, f = math.prod(self.batch_shape), self.f  # L = b·h rows
        self.length = length
        self.state = torch.zeros(length, f, e + 1, dtype=dtype, device=device)  # [S | Z] (L, f, e + 1)
        self.values = torch.ones(length, 1, e + 1, dtype=dtype, device=device)  # [v | 1] (L, 1, e + 1)
        self._phi = torch.empty(2, length, f, dtype=dtype, device=device)  # [phi(q); phi(k)]
        self._qk = self._phi.view(2, *self.batch_shape, f)  # where the default path copies q and k (f = d)
        self._phi_q, self._phi_k = self._phi[0].view(length, 1, f), self._phi[1].view(length, f, 1)  # views, once
        self._out = torch.empty(length, 1, e + 1, dtype=dtype, device=device)  # [numerator | normaliser]
        out = self._out.view(*self.batch_shape, e + 1)
        self._numerator, self._normaliser = out[..., :e], out[..., e:]  # (*batch, e), (*batch, 1)
        self._eps = torch.zeros(length, 1, e + 1, dtype=dtype, device=device)
        self._eps[..., e] = eps  # [0 | eps]: the readout adds eps to the normaliser in the same call
        self._result = torch.empty(*self.batch_shape, e, dtype=dtype, device=device)
        self.position = 0  # tokens seen: informative only (the step never reads it)

    def _check_features(self, features, d, device):
        """Run ``features`` once on zeros: the shapes and signs it returns, checked once per sequence."""
        probe = torch.zeros(2, *self.batch_shape, d, dtype=self.dtype, device=device)
        phi_q, phi_k = features(probe)
        if phi_q.shape != phi_k.shape or phi_q.shape[:-1] != self.batch_shape or phi_q.min() < 0:
            raise ValueError(f"features(qk) must return two non-negative (*batch_shape, f) tensors for qk of shape "
                             f"{tuple(probe.shape)}, got {tuple(phi_q.shape)} and {tuple(phi_k.shape)}.")
        return phi_q.shape[-1]

    def reset(self):
        """Forget every token: S = 0 and Z = 0."""
        self.state.zero_()
        self.position = 0

    def step(self, qk, v):
        """Add one token and return its attention output. Notebook 07, Eq. (7.3).

        Args:
            qk: the token's query and key stacked, ``(2, *batch_shape, d)`` (a view of a fused
                projection's output works, contiguous or not).
            v: its value ``(*batch_shape, e)``, or ``(*batch_shape, e + 1)`` with the ones column
                already appended (a fused projection can emit it: a zero row with bias 1), which
                saves a copy.

        Returns:
            ``(*batch_shape, e)`` in the state's dtype: a view of a buffer that the next step overwrites.

        The shapes are not checked here, once per token: they must be those above (a ``qk`` that
        broadcasts, such as ``(2, d)``, would be copied to every head without an error).
        """
        length, f, e = self.length, self.f, self.e
        if self.features is None:  # elu+1 in place: one pass over q and k together
            self._qk.copy_(qk)  # casts a half-precision input too
            torch.nn.functional.elu_(self._phi).add_(1.0)
            phi_q, phi_k = self._phi_q, self._phi_k  # (L, 1, f), (L, f, 1)
        else:
            phi_q, phi_k = self.features(qk.to(self.dtype))  # (*batch, f) each, one call
            phi_q, phi_k = phi_q.reshape(length, 1, f), phi_k.reshape(length, f, 1)
        if v.shape[-1] == e:
            values = self.values  # (L, 1, e + 1)
            values[..., :e].copy_(v.reshape(length, 1, e))
        else:
            values = v.reshape(length, 1, e + 1)
            if values.dtype is not self.dtype:  # a test, not a .to(): this path runs once per token
                values = values.to(self.dtype)
        # S += phi(k) vᵀ and Z += phi(k): "lf,le->lfe", one broadcast multiply-add in place
        self.state.addcmul_(phi_k, values)
        # [numerator | normaliser + eps] = [0 | eps] + phi(q) [S | Z]: "lf,lfe->le" (L, 1, e + 1)
        torch.baddbmm(self._eps, phi_q, self.state, out=self._out)
        torch.div(self._numerator, self._normaliser, out=self._result)  # (*batch, e)
        self.position += 1
        return self._result

    def functional_state(self):
        """The state as ``linear_attention_step`` holds it: ``(S (*batch, f, e), Z (*batch, f))``, views."""
        state = self.state.view(*self.batch_shape, self.f, self.e + 1)
        return state[..., :self.e], state[..., self.e]


class KeyValueCache:
    """Softmax attention for one token at a time over a preallocated key/value cache. Notebook 07.

    The fair baseline for generation: each step writes the token's key and value into a buffer
    sized for ``max_len`` positions and attends the query to the positions so far with
    ``scaled_dot_product_attention``; work O(t·d) per token at position t.

    Args:
        batch_shape: the leading dims of one token's query, e.g. ``(b, h)``.
        max_len: the most positions the sequence may reach.
        d: query/key head dim; e: value head dim.
        dtype, device: of the cache.
    """

    def __init__(self, batch_shape, max_len, d, e, *, dtype=torch.float32, device=None):
        self.max_len = max_len
        self.keys = torch.zeros(*batch_shape, max_len, d, dtype=dtype, device=device)  # (*batch, max_len, d)
        self.values = torch.zeros(*batch_shape, max_len, e, dtype=dtype, device=device)  # (*batch, max_len, e)
        self.position = 0  # tokens in the cache

    def reset(self):
        """Forget every token (the buffers stay allocated)."""
        self.position = 0

    def step(self, q, k, v):
        """Add one token's key and value and return its attention output ``(*batch_shape, e)``.

        Args:
            q, k: the token's query and key ``(*batch_shape, d)``; v: its value ``(*batch_shape, e)``.
        """
        t = self.position
        if t >= self.max_len:
            raise ValueError(f"the cache holds max_len = {self.max_len} positions; reset it or make a larger one.")
        self.keys[..., t, :] = k
        self.values[..., t, :] = v
        self.position = t + 1
        out = torch.nn.functional.scaled_dot_product_attention(
            q.unsqueeze(-2), self.keys[..., :t + 1, :], self.values[..., :t + 1, :])  # (*batch, 1, e)
        return out.squeeze(-2)
