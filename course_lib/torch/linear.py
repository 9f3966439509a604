"""Linear attention in PyTorch: the port of ``course_lib.numpy.linear``, with a memory-linear causal backward.

Implements notebooks 06 and 07; Katharopoulos et al. 2020, "Transformers are RNNs: Fast
Autoregressive Transformers with Linear Attention" (arXiv 2006.16236).  Same names and
signatures as the NumPy tree; any device, any floating dtype, autograd.  Shapes: ``q (..., n, d)``,
``k (..., s, d)``, ``v (..., s, e)``, features ``phi_q (..., n, f)``, ``phi_k (..., s, f)``.

Causal calls default to the chunked form, ``chunk_size=DEFAULT_CHUNK_SIZE`` (memory linear in n,
forward and backward; the constant and how it was measured: ``course_lib/numpy/linear.py``);
``chunk_size=None`` selects the prefix sums that notebook 06 teaches.

``eps`` is absolute and added to the normaliser phi(q_i)·Σ_j phi(k_j): a query whose features
are all zero (relu of an all-negative q) or whose keys are all padded has normaliser 0, and
eps turns that 0/0 into an output of 0.  float16/bfloat16 inputs are accumulated in float32
(features, sums and states; a float16 running sum of ones stalls at 2048) and the result is
cast back to the input dtype.
"""

import math

import torch

from course_lib import _validate
from course_lib._shared import LINEAR_CHUNK_SIZE as DEFAULT_CHUNK_SIZE
from course_lib._shared import check_causal as _check_causal
from course_lib.torch import full
from course_lib.torch._causal_linear import CausalSums

HALF = (torch.float16, torch.bfloat16)


def elu_feature_map(x):
    """phi(x) = elu(x) + 1. Notebook 06, Eq. (6.2); Katharopoulos et al. 2020, Eq. 7.

    Positive everywhere, so every kernel value phi(q)·phi(k) is a positive weight, and unlike
    relu it keeps a gradient for negative inputs.
    """
    return torch.nn.functional.elu(x) + 1


def relu_feature_map(x):
    """phi(x) = max(x, 0). Notebook 06: non-negative, but zero (and gradient-free) for x < 0."""
    return torch.relu(x)


def _work(*xs):
    """The inputs in the dtype to accumulate in: float32 for half precision, else unchanged."""
    return tuple(x.float() if x.dtype in HALF else x for x in xs)


def _check(q, k, v=None, key_mask=None, names=("q", "k", "v")):
    full._check(q, k, v, key_mask, names)
    # the sums run in one dtype: a silent promotion would hide a half-precision input
    if len({x.dtype for x in (q, k, v) if x is not None}) > 1:
        raise TypeError(f"{', '.join(names)} must share one dtype, got {q.dtype}, {k.dtype}"
                        + ("" if v is None else f", {v.dtype}") + ".")


def _features(feature_map, *xs):
    """Apply ``feature_map`` to each input (in float32 for half); refuse negative features."""
    features = []
    for name, x in xs:
        phi = feature_map(*_work(x))
        if phi.numel() and phi.min() < 0:  # min: one reduction, no (..., n, f) boolean temporary
            raise ValueError(f"feature_map must return non-negative features, but feature_map({name}) has "
                             f"entries down to {phi.min().item():.3g}: the normaliser would be a sum of signed "
                             "weights (0 or negative). The identity map is not positive; use elu_feature_map.")
        features.append(phi)
    return features


def _check_signs(allow_negative, *named):
    """Refuse features with negative entries unless ``allow_negative``: each weight phi(q)·phi(k) must be ≥ 0."""
    if allow_negative:
        return
    for name, phi in named:
        if phi.numel() and phi.min() < 0:  # min: one reduction, no (..., n, f) boolean temporary
            raise ValueError(f"{name} must be non-negative features, but has entries down to {phi.min().item():.3g}: "
                             "the weights phi(q)·phi(k) would have mixed signs and cancel in the normaliser. Use a "
                             "positive feature map (elu_feature_map), or pass allow_negative=True to divide by a "
                             "signed normaliser on purpose.")


def _normalise(numerator, normaliser, eps, dtype, signed=False):
    """numerator / (normaliser + eps), refusing a negative normaliser unless ``signed``."""
    if not signed and normaliser.numel() and normaliser.min() < 0:
        raise ValueError(f"the normaliser phi(q)·sum phi(k) is negative (down to {normaliser.min().item():.3g}): "
                         "the features must be non-negative; pick a positive feature_map such as elu_feature_map.")
    return (numerator / (normaliser.unsqueeze(-1) + eps)).to(dtype)  # (..., n, e)


def linear_attention_from_features(phi_q, phi_k, v, *, eps=1e-6, key_mask=None, allow_negative=False):
    """Non-causal linear attention from features, in O(n·f·e). Notebook 06, Eq. (6.3); Katharopoulos et al. 2020, Eq. 5.

    Associativity: phi(q) (phi(k)ᵀ v) never forms the n × s kernel.  Padded keys and values
    (``key_mask`` False) are zeroed with ``masked_fill`` first, so even inf/NaN padding adds nothing.

    Args:
        phi_q: query features ``(..., n, f)``, non-negative.
        phi_k: key features ``(..., s, f)``, non-negative.
        v: values ``(..., s, e)``.
        eps: added to the normaliser (absolute).
        key_mask: boolean ``(..., s)``, True where the key is a real token.
        allow_negative: False refuses features with a negative entry (ValueError naming
            ``phi_q`` or ``phi_k``); True divides by the signed normaliser as it is (notebook 09's
            Linformer-projected features, whose weights cancel).

    Returns:
        ``(..., n, e)`` in the dtype of ``v``.
    """
    _check(phi_q, phi_k, v, key_mask, names=("phi_q", "phi_k", "v"))
    _check_signs(allow_negative, ("phi_q", phi_q), ("phi_k", phi_k))
    return _non_causal(phi_q, phi_k, v, eps, key_mask, allow_negative)


def _non_causal(phi_q, phi_k, v, eps, key_mask, signed):
    dtype = v.dtype
    phi_q, phi_k, v = _work(phi_q, phi_k, v)
    if key_mask is not None:
        phi_k = phi_k.masked_fill(~key_mask[..., :, None], 0.0)  # (..., s, f)
        v = v.masked_fill(~key_mask[..., :, None], 0.0)  # (..., s, e)
    kv_state = phi_k.transpose(-1, -2) @ v  # "...sf,...se->...fe" (..., f, e)
    key_sum = phi_k.sum(dim=-2, keepdim=True)  # (..., 1, f)
    numerator = phi_q @ kv_state  # "...nf,...fe->...ne" (..., n, e)
    normaliser = (phi_q * key_sum).sum(dim=-1)  # "...nf,...f->...n" (..., n)
    return _normalise(numerator, normaliser, eps, dtype, signed)


def linear_attention(q, k, v, *, feature_map=elu_feature_map, eps=1e-6, key_mask=None):
    """Non-causal linear attention phi(q) (phi(k)ᵀ v) / (phi(q)·Σ phi(k) + eps). Notebook 06, Eq. (6.3).

    Katharopoulos et al. 2020, Eq. 5: cost O(n·f·e) instead of O(n·s·d).

    Args:
        q: queries ``(..., n, d)``.
        k: keys ``(..., s, d)``.
        v: values ``(..., s, e)``.
        feature_map: ``(..., d) → (..., f)``, non-negative (elu+1 by default).
        eps: added to the normaliser (absolute).
        key_mask: boolean ``(..., s)``, True where the key is a real token.

    Returns:
        ``(..., n, e)`` in the dtype of ``v``.
    """
    _check(q, k, v, key_mask)
    phi_q, phi_k = _features(feature_map, ("q", q), ("k", k))
    return _non_causal(phi_q, phi_k, v.to(phi_q.dtype), eps, key_mask, False).to(v.dtype)


def chunked_causal_sums(phi_q, phi_k, v, chunk_size):
    """Causal numerator and normaliser chunk by chunk, backward in linear memory. Notebook 06, Eq. (6.6).

    numerator_i = Σ_{j ≤ i} (phi_q_i·phi_k_j) v_j and normaliser_i = Σ_{j ≤ i} phi_q_i·phi_k_j, by
    ``CausalSums`` (see ``course_lib/torch/_causal_linear.py``); leading dims are broadcast.

    Args:
        phi_q: ``(..., n, f)``; phi_k: ``(..., n, f)``; v: ``(..., n, e)``; chunk_size: positions per chunk c.

    Returns:
        ``(numerator (..., n, e), normaliser (..., n))``.
    """
    lead = torch.broadcast_shapes(phi_q.shape[:-2], phi_k.shape[:-2], v.shape[:-2])
    n = phi_q.shape[-2]
    length = math.prod(lead)
    flat = [x.expand(*lead, *x.shape[-2:]).reshape(length, n, x.shape[-1]).contiguous() for x in (phi_q, phi_k, v)]
    numerator, normaliser = CausalSums.apply(*flat, int(chunk_size))  # (L, n, e), (L, n)
    return numerator.reshape(*lead, n, v.shape[-1]), normaliser.reshape(*lead, n)


def causal_linear_attention_from_features(phi_q, phi_k, v, *, eps=1e-6, chunk_size=DEFAULT_CHUNK_SIZE,
                                          allow_negative=False):
    """Causal linear attention from features. Notebook 06, Eqs. (6.4)-(6.6); Katharopoulos et al. 2020, Eq. 9.

    ``chunk_size=c`` (default ``DEFAULT_CHUNK_SIZE``): ``chunked_causal_sums``, whose forward and
    backward keep O(n·(f + e + c) + (n/c)·f·e) memory.  ``chunk_size=None``: prefix sums through
    plain autograd of ``cumsum``, the naive version whose memory notebook 06 measures: it stores
    all n states, an ``(..., n, f, e)`` tensor, for the backward.

    Args:
        phi_q: query features ``(..., n, f)``; phi_k: key features ``(..., n, f)``; v: ``(..., n, e)``.
        eps: added to the normaliser (absolute).
        chunk_size: positions per chunk (a positive int; need not divide n), or None for prefix sums.
        allow_negative: as in ``linear_attention_from_features``.

    Returns:
        ``(..., n, e)`` in the dtype of ``v``.
    """
    _check(phi_q, phi_k, v, names=("phi_q", "phi_k", "v"))
    _check_causal(phi_q, phi_k, chunk_size)
    _check_signs(allow_negative, ("phi_q", phi_q), ("phi_k", phi_k))
    return _causal(phi_q, phi_k, v, eps, chunk_size, allow_negative)


def _causal(phi_q, phi_k, v, eps, chunk_size, signed):
    dtype = v.dtype
    phi_q, phi_k, v = _work(phi_q, phi_k, v)
    if chunk_size is None:  # the naive version: autograd keeps the (..., n, f, e) states
        kv_states = torch.cumsum(phi_k.unsqueeze(-1) * v.unsqueeze(-2), dim=-3)  # (..., n, f, e)
        numerator = torch.einsum("...nf,...nfe->...ne", phi_q, kv_states)  # (..., n, e)
        normaliser = (phi_q * phi_k.cumsum(dim=-2)).sum(dim=-1)  # "...nf,...nf->...n" (..., n)
        return _normalise(numerator, normaliser, eps, dtype, signed)
    return _normalise(*chunked_causal_sums(phi_q, phi_k, v, chunk_size), eps, dtype, signed)


def causal_linear_attention(q, k, v, *, feature_map=elu_feature_map, eps=1e-6, chunk_size=DEFAULT_CHUNK_SIZE):
    """Causal linear attention: query i sees keys j ≤ i. Notebook 06, Eq. (6.4); Katharopoulos et al. 2020, Eq. 9.

    Args:
        q: queries ``(..., n, d)``; k: keys ``(..., n, d)``; v: values ``(..., n, e)``.
        feature_map: ``(..., d) → (..., f)``, non-negative (elu+1 by default).
        eps: added to the normaliser (absolute).
        chunk_size: positions per chunk of the chunked form (default ``DEFAULT_CHUNK_SIZE``: memory
            linear in n, forward and backward), or None for the prefix sums notebook 06 teaches
            (their backward stores n states of f × e).

    Returns:
        ``(..., n, e)`` in the dtype of ``v``.
    """
    _check(q, k, v)
    _check_causal(q, k, chunk_size)
    phi_q, phi_k = _features(feature_map, ("q", q), ("k", k))
    return _causal(phi_q, phi_k, v.to(phi_q.dtype), eps, chunk_size, False).to(v.dtype)


def causal_linear_attention_reference(q, k, v, *, feature_map=elu_feature_map, eps=1e-6):
    """The slow quadratic form, for the reader: mask the n × n kernel. Notebook 06, Eq. (6.1).

    Builds phi(q) phi(k)ᵀ, zeroes the future (j > i) and normalises each row; O(n²) time and memory.
    """
    _check(q, k, v)
    _check_causal(q, k, None)
    phi_q, phi_k = _features(feature_map, ("q", q), ("k", k))
    kernel = torch.einsum("...nf,...sf->...ns", phi_q, phi_k).tril()  # (..., n, s), s <= n
    numerator = torch.einsum("...ns,...se->...ne", kernel, v.to(kernel.dtype))  # (..., n, e)
    return _normalise(numerator, kernel.sum(dim=-1), eps, v.dtype)


def linear_attention_step(q_t, k_t, v_t, state, *, feature_map=elu_feature_map, eps=1e-6):
    """One autoregressive step of causal linear attention. Notebook 07; Katharopoulos et al. 2020, Eqs. 16-20.

    S ← S + phi(k_t) v_tᵀ and Z ← Z + phi(k_t), then out = phi(q_t) S / (phi(q_t)·Z + eps):
    the cost per token is O(f·e), whatever the position.  The state is returned, never mutated;
    for half-precision inputs it is kept in float32.

    Args:
        q_t: the query at this position ``(..., d)``; k_t: its key ``(..., d)``; v_t: its value ``(..., e)``.
        state: ``(S, Z)`` with S ``(..., f, e)`` and Z ``(..., f)`` from the previous step, or None (empty).
        feature_map: ``(..., d) → (..., f)``, non-negative.
        eps: added to the normaliser (absolute).

    Returns:
        ``(out_t, (S, Z))``, out_t ``(..., e)``.
    """
    _check_step(q_t, k_t, v_t)
    phi_q, phi_k = _features(feature_map, ("q_t", q_t), ("k_t", k_t))
    v32 = v_t.to(phi_k.dtype)
    if state is None:
        lead = torch.broadcast_shapes(phi_k.shape[:-1], v32.shape[:-1])
        state = (phi_k.new_zeros(*lead, phi_k.shape[-1], v32.shape[-1]), phi_k.new_zeros(*lead, phi_k.shape[-1]))
    kv_state, key_sum = _check_state(state, phi_k, v32)
    kv_state = kv_state + phi_k.unsqueeze(-1) * v32.unsqueeze(-2)  # (..., f, e)
    key_sum = key_sum + phi_k  # (..., f)
    numerator = (phi_q.unsqueeze(-2) @ kv_state).squeeze(-2)  # "...f,...fe->...e" (..., e)
    normaliser = (phi_q * key_sum).sum(dim=-1)  # "...f,...f->..." (...)
    return _normalise(numerator, normaliser, eps, v_t.dtype), (kv_state, key_sum)


def _check_step(q_t, k_t, v_t):
    for name, x in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        _validate.check_float(name, x, x.is_floating_point())
        if x.dim() < 1:
            raise ValueError(f"{name} must have shape (..., dim) (one position, no sequence axis), got a scalar.")
    if q_t.shape[-1] != k_t.shape[-1]:
        raise ValueError(f"q_t and k_t must share the head dim d: got {tuple(q_t.shape)} and {tuple(k_t.shape)}.")


def _check_state(state, phi_k, v):
    if not (isinstance(state, tuple | list) and len(state) == 2):
        raise ValueError("state must be None or the pair (S, Z) returned by the previous step.")
    kv_state, key_sum = state
    f, e = phi_k.shape[-1], v.shape[-1]
    if tuple(kv_state.shape[-2:]) != (f, e) or tuple(key_sum.shape[-1:]) != (f,):
        raise ValueError(f"state (S, Z) must have S (..., f, e) = (..., {f}, {e}) and Z (..., f) = (..., {f}), "
                         f"got S {tuple(kv_state.shape)} and Z {tuple(key_sum.shape)}.")
    return kv_state, key_sum
