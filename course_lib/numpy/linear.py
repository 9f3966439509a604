"""Linear attention in NumPy: kernel feature maps, prefix sums, chunks and the RNN step.

Implements notebooks 06 and 07; Katharopoulos et al. 2020, "Transformers are RNNs: Fast
Autoregressive Transformers with Linear Attention" (arXiv 2006.16236).  Shapes follow the
dimension key in ``course_lib``: ``q (..., n, d)``, ``k (..., s, d)``, ``v (..., s, e)``,
features ``phi_q (..., n, f)``, ``phi_k (..., s, f)``.  Inside the chunked form, ``g`` counts
chunks and ``i``, ``j`` are query and key positions within one chunk.

``eps`` is absolute and added to the normaliser phi(q_i)·Σ_j phi(k_j): a query whose features
are all zero (relu of an all-negative q) or whose keys are all padded has normaliser 0, and
eps turns that 0/0 into an output of 0; beside a sum of elu+1 kernel values it is negligible.
float16 inputs are accumulated in float32 (a float16 running sum of ones stalls at 2048).
"""

import numpy as np

from course_lib import _validate
from course_lib._shared import LINEAR_CHUNK_SIZE
from course_lib._shared import check_causal as _check_causal
from course_lib.numpy.full import _check  # shapes, dtypes and the key mask, as for exact attention

DEFAULT_CHUNK_SIZE = LINEAR_CHUNK_SIZE  # 64: see course_lib/_shared.py for how it was measured


def elu_feature_map(x):
    """phi(x) = elu(x) + 1. Notebook 06, Eq. (6.2); Katharopoulos et al. 2020, Eq. 7.

    Positive everywhere, so every kernel value phi(q)·phi(k) is a positive weight, and unlike
    relu it keeps a gradient for negative inputs.
    """
    x = np.asarray(x)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))  # minimum: no overflow in the unused branch


def relu_feature_map(x):
    """phi(x) = max(x, 0). Notebook 06: non-negative, but zero (and gradient-free) for x < 0."""
    return np.maximum(np.asarray(x), 0.0)


def _work_dtype(*xs):
    """float64 stays float64; float16 is accumulated in float32 (a float16 running sum stalls at 2048)."""
    return np.promote_types(np.result_type(*xs), np.float32)


def _features(feature_map, *xs):
    """Apply ``feature_map`` to each input; refuse negative features (the kernel must be positive)."""
    features = []
    for name, x in xs:
        phi = feature_map(np.asarray(x).astype(_work_dtype(x), copy=False))
        if (phi < 0).any():
            raise ValueError(f"feature_map must return non-negative features, but feature_map({name}) has "
                             f"entries down to {phi.min():.3g}: the normaliser would be a sum of signed weights "
                             "(0 or negative). The identity map is not positive; use elu_feature_map.")
        features.append(phi)
    return features


def _check_signs(allow_negative, *named):
    """Refuse features with negative entries unless ``allow_negative``: each weight phi(q)·phi(k) must be ≥ 0."""
    if allow_negative:
        return
    for name, phi in named:
        if phi.size and phi.min() < 0:
            raise ValueError(f"{name} must be non-negative features, but has entries down to {phi.min():.3g}: "
                             "the weights phi(q)·phi(k) would have mixed signs and cancel in the normaliser. Use a "
                             "positive feature map (elu_feature_map), or pass allow_negative=True to divide by a "
                             "signed normaliser on purpose.")


def _normalise(numerator, normaliser, eps, dtype, signed=False):
    """numerator / (normaliser + eps), refusing a negative normaliser unless ``signed``."""
    if not signed and (normaliser < 0).any():
        raise ValueError(f"the normaliser phi(q)·sum phi(k) is negative (down to {normaliser.min():.3g}): the "
                         "features must be non-negative; pick a positive feature_map such as elu_feature_map.")
    return (numerator / (normaliser[..., None] + eps)).astype(dtype, copy=False)  # (..., n, e)


def linear_attention_from_features(phi_q, phi_k, v, *, eps=1e-6, key_mask=None, allow_negative=False):
    """Non-causal linear attention from features, in O(n·f·e). Notebook 06, Eq. (6.3); Katharopoulos et al. 2020, Eq. 5.

    Associativity: phi(q) (phi(k)ᵀ v) never forms the n × s kernel.  Padded keys and values
    (``key_mask`` False) are zeroed with ``np.where`` first, so even inf/NaN padding adds nothing.

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
    key_mask = _check(phi_q, phi_k, v, key_mask, names=("phi_q", "phi_k", "v"))
    phi_q, phi_k = np.asarray(phi_q), np.asarray(phi_k)
    _check_signs(allow_negative, ("phi_q", phi_q), ("phi_k", phi_k))
    return _non_causal(phi_q, phi_k, v, eps, key_mask, allow_negative)


def _non_causal(phi_q, phi_k, v, eps, key_mask, signed):
    dtype, work = np.result_type(v), _work_dtype(phi_q, phi_k, v)
    phi_q, phi_k, v = (np.asarray(x, dtype=work) for x in (phi_q, phi_k, v))
    if key_mask is not None:
        phi_k = np.where(key_mask[..., :, None], phi_k, 0.0)  # (..., s, f)
        v = np.where(key_mask[..., :, None], v, 0.0)  # (..., s, e)
    kv_state = np.einsum("...sf,...se->...fe", phi_k, v, optimize=True)  # (..., f, e)
    key_sum = phi_k.sum(axis=-2)  # (..., f)
    numerator = np.einsum("...nf,...fe->...ne", phi_q, kv_state, optimize=True)  # (..., n, e)
    normaliser = np.einsum("...nf,...f->...n", phi_q, key_sum)  # (..., n)
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
        ``(..., n, e)``.
    """
    key_mask = _check(q, k, v, key_mask)
    phi_q, phi_k = _features(feature_map, ("q", q), ("k", k))
    return _non_causal(phi_q, phi_k, v, eps, key_mask, False).astype(np.result_type(v))


def _chunk(x, chunk_size):
    """``(..., n, f)`` → ``(..., g, c, f)``, zero-padded to g·c positions (zeros add nothing)."""
    n, c = x.shape[-2], chunk_size
    g = -(-n // c)
    x = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, g * c - n), (0, 0)])
    return x.reshape(*x.shape[:-2], g, c, x.shape[-1])  # (..., g, c, f)


def _exclusive_cumsum(x):
    """Sum over the chunks before each chunk: a cumulative sum over the chunk axis, shifted by one."""
    inclusive = np.cumsum(x, axis=-3)  # (..., g, ·, ·): up to and including chunk g
    return np.concatenate([np.zeros_like(inclusive[..., :1, :, :]), inclusive[..., :-1, :, :]], axis=-3)


def chunked_causal_sums(phi_q, phi_k, v, chunk_size):
    """Causal numerator and normaliser chunk by chunk. Notebook 06, Eq. (6.6).

    numerator_i = Σ_{j ≤ i} (phi_q_i·phi_k_j) v_j and normaliser_i = Σ_{j ≤ i} phi_q_i·phi_k_j.
    Within a chunk: the masked c × c product; across chunks: the states Σ phi_k_jᵀ v_j and
    Σ phi_k_j of all earlier chunks, from one cumulative sum over the chunk axis.  The
    normaliser is the numerator's computation with v = 1.

    Args:
        phi_q: ``(..., n, f)``; phi_k: ``(..., n, f)``; v: ``(..., n, e)``; chunk_size: positions per chunk c.

    Returns:
        ``(numerator (..., n, e), normaliser (..., n))``.
    """
    n = phi_q.shape[-2]
    a, b, v = (_chunk(x, chunk_size) for x in (phi_q, phi_k, v))  # (..., g, c, f), (..., g, c, e)
    states = _exclusive_cumsum(np.einsum("...gjf,...gje->...gfe", b, v, optimize=True))  # (..., g, f, e)
    key_states = _exclusive_cumsum(b.sum(axis=-2, keepdims=True))  # (..., g, 1, f): the same with v = 1
    scores = np.tril(np.einsum("...gif,...gjf->...gij", a, b, optimize=True))  # (..., g, c, c), j <= i
    numerator = np.einsum("...gif,...gfe->...gie", a, states, optimize=True)  # (..., g, c, e): earlier chunks
    numerator = numerator + np.einsum("...gij,...gje->...gie", scores, v, optimize=True)  # + this chunk
    normaliser = np.einsum("...gif,...gf->...gi", a, key_states[..., 0, :]) + scores.sum(axis=-1)  # (..., g, c)
    padded = a.shape[-3] * chunk_size  # g·c positions
    numerator = numerator.reshape(*numerator.shape[:-3], padded, numerator.shape[-1])[..., :n, :]  # (..., n, e)
    return numerator, normaliser.reshape(*normaliser.shape[:-2], padded)[..., :n]  # (..., n)


def causal_linear_attention_from_features(phi_q, phi_k, v, *, eps=1e-6, chunk_size=DEFAULT_CHUNK_SIZE,
                                          allow_negative=False):
    """Causal linear attention from features. Notebook 06, Eqs. (6.4)-(6.6); Katharopoulos et al. 2020, Eq. 9.

    ``chunk_size=c`` (default ``DEFAULT_CHUNK_SIZE``): the chunked form, memory
    n·(f + e + c) + (n/c)·f·e.  ``chunk_size=None``: prefix sums S_i = Σ_{j ≤ i} phi_k_j v_jᵀ,
    all n states at once (memory n·f·e), the form notebook 06 teaches.

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
    phi_q, phi_k = np.asarray(phi_q), np.asarray(phi_k)
    _check_signs(allow_negative, ("phi_q", phi_q), ("phi_k", phi_k))
    return _causal(phi_q, phi_k, v, eps, chunk_size, allow_negative)


def _causal(phi_q, phi_k, v, eps, chunk_size, signed):
    dtype, work = np.result_type(v), _work_dtype(phi_q, phi_k, v)
    phi_q, phi_k, v = (np.asarray(x, dtype=work) for x in (phi_q, phi_k, v))
    if chunk_size is None:
        kv_states = np.cumsum(np.einsum("...sf,...se->...sfe", phi_k, v), axis=-3)  # (..., n, f, e)
        numerator = np.einsum("...nf,...nfe->...ne", phi_q, kv_states, optimize=True)  # (..., n, e)
        normaliser = np.einsum("...nf,...nf->...n", phi_q, np.cumsum(phi_k, axis=-2))  # (..., n)
        return _normalise(numerator, normaliser, eps, dtype, signed)
    return _normalise(*chunked_causal_sums(phi_q, phi_k, v, chunk_size), eps, dtype, signed)


def causal_linear_attention(q, k, v, *, feature_map=elu_feature_map, eps=1e-6, chunk_size=DEFAULT_CHUNK_SIZE):
    """Causal linear attention: query i sees keys j ≤ i. Notebook 06, Eq. (6.4); Katharopoulos et al. 2020, Eq. 9.

    Args:
        q: queries ``(..., n, d)``; k: keys ``(..., n, d)``; v: values ``(..., n, e)``.
        feature_map: ``(..., d) → (..., f)``, non-negative (elu+1 by default).
        eps: added to the normaliser (absolute).
        chunk_size: positions per chunk of the chunked form (default ``DEFAULT_CHUNK_SIZE``:
            memory linear in n), or None for the prefix sums notebook 06 teaches (memory n·f·e).

    Returns:
        ``(..., n, e)``.
    """
    _check(q, k, v)
    _check_causal(q, k, chunk_size)
    phi_q, phi_k = _features(feature_map, ("q", q), ("k", k))
    return _causal(phi_q, phi_k, v, eps, chunk_size, False).astype(np.result_type(v), copy=False)


def causal_linear_attention_reference(q, k, v, *, feature_map=elu_feature_map, eps=1e-6):
    """The slow quadratic form, for the reader: mask the n × n kernel. Notebook 06, Eq. (6.1).

    Builds phi(q) phi(k)ᵀ, zeroes the future (j > i) and normalises each row; O(n²) time and memory.
    """
    _check(q, k, v)
    _check_causal(q, k, None)
    phi_q, phi_k = _features(feature_map, ("q", q), ("k", k))
    kernel = np.tril(np.einsum("...nf,...sf->...ns", phi_q, phi_k, optimize=True))  # (..., n, s), s <= n
    numerator = np.einsum("...ns,...se->...ne", kernel, np.asarray(v, dtype=kernel.dtype), optimize=True)
    return _normalise(numerator, kernel.sum(axis=-1), eps, np.result_type(v))


def linear_attention_step(q_t, k_t, v_t, state, *, feature_map=elu_feature_map, eps=1e-6):
    """One autoregressive step of causal linear attention. Notebook 07; Katharopoulos et al. 2020, Eqs. 16-20.

    S ← S + phi(k_t) v_tᵀ and Z ← Z + phi(k_t), then out = phi(q_t) S / (phi(q_t)·Z + eps):
    the cost per token is O(f·e), whatever the position.  The state is returned, never mutated.

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
    v32 = np.asarray(v_t, dtype=phi_k.dtype)
    if state is None:
        lead = np.broadcast_shapes(phi_k.shape[:-1], v32.shape[:-1])
        state = (np.zeros((*lead, phi_k.shape[-1], v32.shape[-1]), phi_k.dtype), np.zeros((*lead, phi_k.shape[-1]),
                                                                                         phi_k.dtype))
    kv_state, key_sum = _check_state(state, phi_k, v32)
    kv_state = kv_state + phi_k[..., :, None] * v32[..., None, :]  # (..., f, e)
    key_sum = key_sum + phi_k  # (..., f)
    numerator = np.einsum("...f,...fe->...e", phi_q, kv_state)  # (..., e)
    normaliser = np.einsum("...f,...f->...", phi_q, key_sum)  # (...)
    return _normalise(numerator, normaliser, eps, np.result_type(v_t)), (kv_state, key_sum)


def _check_step(q_t, k_t, v_t):
    for name, x in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        _validate.check_float(name, x, np.issubdtype(np.asarray(x).dtype, np.floating))
        if np.ndim(x) < 1:
            raise ValueError(f"{name} must have shape (..., dim) (one position, no sequence axis), got a scalar.")
    if np.shape(q_t)[-1] != np.shape(k_t)[-1]:
        raise ValueError(f"q_t and k_t must share the head dim d: got {np.shape(q_t)} and {np.shape(k_t)}.")


def _check_state(state, phi_k, v):
    if not (isinstance(state, tuple | list) and len(state) == 2):
        raise ValueError("state must be None or the pair (S, Z) returned by the previous step.")
    kv_state, key_sum = state
    f, e = phi_k.shape[-1], v.shape[-1]
    if kv_state.shape[-2:] != (f, e) or key_sum.shape[-1:] != (f,):
        raise ValueError(f"state (S, Z) must have S (..., f, e) = (..., {f}, {e}) and Z (..., f) = (..., {f}), "
                         f"got S {tuple(kv_state.shape)} and Z {tuple(key_sum.shape)}.")
    return kv_state, key_sum
