"""Performer FAVOR+ in NumPy: random features whose dot products estimate the softmax kernel.

Implements notebook 08; Choromanski et al. 2020, "Rethinking Attention with Performers"
(arXiv 2009.14794).  Shapes follow the dimension key in ``course_lib``: ``q (..., n, d)``,
``k (..., s, d)``, ``v (..., s, e)``, ``omega (f, d)`` with f = m random features.
"""

import numpy as np

from course_lib import _validate
from course_lib._shared import FEATURES, HEADROOM, SCALINGS, check_sizes  # noqa: F401 (re-exported)
from course_lib.numpy.linear import (
    DEFAULT_CHUNK_SIZE,
    causal_linear_attention_from_features,
    chunked_causal_sums,
    linear_attention_from_features,
)


def _check_omega(x, omega):
    _validate.check_float("omega", omega, np.issubdtype(omega.dtype, np.floating))
    if omega.ndim < 2 or omega.shape[-1] != x.shape[-1] or omega.shape[-2] < 1:
        raise ValueError(f"omega must have shape (..., m, d) with m >= 1 and d = {x.shape[-1]} (the inputs are "
                         f"{tuple(x.shape)}), got {tuple(omega.shape)}. Draw it with random_matrix(m, d, rng).")


def _orthogonal_blocks(n_blocks, d, rng):
    """Haar-random d × d orthogonal matrices: QR of Gaussian ones, signs fixed by diag(R) (Mezzadri 2007)."""
    q, r = np.linalg.qr(rng.standard_normal((n_blocks, d, d)))  # one batched QR for every block
    q = q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]  # without it Q is not uniform
    return np.swapaxes(q, -1, -2)  # (blocks, d, d); rows orthonormal, each uniform on the sphere


def random_matrix(m, d, rng, *, orthogonal=True, scaling="chi"):
    """The random matrix ω of FAVOR+. Notebook 08, Section 8.3; Choromanski et al. 2020, §2.4.

    Orthogonal random features (Yu et al. 2016): rows are taken from independent Haar-random
    d × d orthogonal blocks (the last block truncated), so rows within a block are exactly
    orthogonal, then rescaled so each row is still marginally N(0, I_d) ("chi": norms of fresh
    Gaussian d-vectors, χ_d-distributed) or has the fixed norm √d ("sqrt_d").

    ``scaling="sqrt_d"`` makes a *biased* estimator of the softmax kernel: the feature maps are
    unbiased for exp(xᵀy) only when ω's rows are N(0, I_d), norms included, and "sqrt_d" fixes
    every norm at √d instead of drawing it from χ_d.  For positive features the expectation
    becomes exp(−(‖x‖² + ‖y‖²)/2) Γ(d/2) (2/t)^(d/2−1) I_(d/2−1)(t) with t = √d ‖x + y‖ (a Bessel
    function), smaller than exp(xᵀy): E exp(ωᵀz) is convex in ‖ω‖², and E‖ω‖² = d (Jensen).
    tests/test_performer.py measures the bias.

    Args:
        m: number of random features (rows).
        d: input dimension.
        rng: a ``numpy.random.Generator``; the only source of randomness.
        orthogonal: False draws i.i.d. Gaussian rows.
        scaling: ``"chi"`` or ``"sqrt_d"``, the row norms.

    Returns:
        ω ``(m, d)``.
    """
    check_sizes(m=m, d=d)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), got {type(rng)}.")
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {', '.join(map(repr, SCALINGS))}; got {scaling!r}.")
    if not orthogonal:
        omega = rng.standard_normal((m, d))  # (f, d); Gaussian rows already have χ_d norms
        return omega if scaling == "chi" else omega * (np.sqrt(d) / np.linalg.norm(omega, axis=-1, keepdims=True))
    directions = _orthogonal_blocks(-(-m // d), d, rng).reshape(-1, d)[:m]  # (f, d) unit rows
    if scaling == "chi":
        norms = np.linalg.norm(rng.standard_normal((m, d)), axis=-1)  # (f,)
    else:
        norms = np.full(m, np.sqrt(d))
    return directions * norms[:, None]


def _projections(x, omega, features):
    """ωᵀx for every feature ``(..., n, f)`` (hyperbolic: ±ωᵀx, ``(..., n, 2f)``) and ‖x‖²/2 ``(..., n, 1)``."""
    projections = np.einsum("...nd,...fd->...nf", x, omega, optimize=True)  # (..., n, f)
    if features == "hyperbolic":
        projections = np.concatenate([projections, -projections], axis=-1)  # (..., n, 2f)
    return projections, 0.5 * np.einsum("...nd,...nd->...n", x, x)[..., None]  # (..., n, 1)


def _sin_cos(projections):
    return np.concatenate([np.sin(projections), np.cos(projections)], axis=-1)  # (..., n, 2f)


def _feature_map(x, omega, features):
    _validate.check_float("x", x, np.issubdtype(np.asarray(x).dtype, np.floating))
    x, omega = np.asarray(x), np.asarray(omega)
    _check_omega(x, omega)
    projections, half_norm = _projections(x, omega, features)
    if features == "trig":
        phi = np.exp(half_norm) * _sin_cos(projections)  # (..., n, 2f)
    else:
        phi = np.exp(projections - half_norm)  # (..., n, f)
    m = omega.shape[-2] * (2 if features == "hyperbolic" else 1)  # trig: 2m entries, but m terms of cos(ωᵀ(x − y))
    return phi / np.sqrt(m)


def positive_features(x, omega):
    """Positive random features, E[φ(x)·φ(y)] = exp(xᵀy). Notebook 08, Eq. (8.4); Choromanski et al. 2020, Lemma 1.

    φ(x) = exp(ωᵀx − ‖x‖²/2) / √m: every feature is positive (the SM⁺ estimator).

    Args:
        x: inputs ``(..., n, d)``.
        omega: ``(m, d)`` from ``random_matrix``.

    Returns:
        ``(..., n, m)``.
    """
    return _feature_map(x, omega, "positive")


def hyperbolic_features(x, omega):
    """Hyperbolic positive features. Notebook 08, Eq. (8.5); Choromanski et al. 2020, Lemma 2 (SM^hyp+).

    φ(x) = exp(−‖x‖²/2) [exp(ωᵀx), exp(−ωᵀx)] / √(2m): ω and −ω together, lower variance.

    Returns:
        ``(..., n, 2m)``.
    """
    return _feature_map(x, omega, "hyperbolic")


def trig_features(x, omega):
    """Trigonometric random features. Notebook 08, Eq. (8.2); Choromanski et al. 2020, Eq. 6 (SM^trig).

    φ(x) = exp(‖x‖²/2) [sin ωᵀx, cos ωᵀx] / √m.  Unbiased too, but φ(x)·φ(y) can be negative.

    Returns:
        ``(..., n, 2m)``.
    """
    return _feature_map(x, omega, "trig")


def _largest_exponents(projections, half_norm, features):
    """Each key's largest exponent ``(..., s, 1)``: max_f ωᵀk − ‖k‖²/2 (trig: ‖k‖²/2)."""
    return half_norm if features == "trig" else projections.max(axis=-1, keepdims=True) - half_norm


def _key_shift(projections, half_norm, omega, features, causal, key_mask):
    """A constant subtracted from every key exponent: exact, since it cancels in the normaliser.

    Non-causal: the largest exponent over all (real) keys, so the largest key feature is 1.
    Causal: a maximum over the sequence would let a future key change the scale of earlier
    outputs (``_global_max_causal_attention`` shows it), so the shift depends on ω alone:
    ωᵀx − ‖x‖²/2 = ‖ω‖²/2 − ‖x − ω‖²/2 ≤ max ‖ω‖²/2, and the shift leaves e^HEADROOM of room
    under that bound (none when the bound itself is below HEADROOM).  Trig features have no
    such bound (exp(‖x‖²/2) grows without limit): they are not shifted.
    """
    if causal:
        if features == "trig":
            return 0.0
        bound = 0.5 * np.einsum("...fd,...fd->...f", omega, omega).max(axis=-1)[..., None, None]  # (..., 1, 1)
        return np.maximum(bound - HEADROOM, 0.0)
    largest = _largest_exponents(projections, half_norm, features)  # (..., s, 1)
    if key_mask is not None:
        largest = np.where(key_mask[..., :, None], largest, -np.inf)  # padded keys do not set the scale
    shift = largest.max(axis=-2, keepdims=True)  # (..., 1, 1)
    return np.where(np.isfinite(shift), shift, 0.0)  # every key padded: nothing to scale


def _query_features(q, omega, features):
    """Query features up to a factor per query position, which cancels for that query alone.

    The factor: exp(−‖q‖²/2) (trig: exp(‖q‖²/2)) and the position's own largest exponent, so
    the largest feature is 1.  The 1/√m of both maps cancels too, so it is left out.
    """
    projections, _ = _projections(q, omega, features)
    if features == "trig":
        return _sin_cos(projections)  # (..., n, 2f)
    return np.exp(projections - projections.max(axis=-1, keepdims=True))  # (..., n, f)


def _key_features(k, omega, features, causal, key_mask, key_shift):
    """Key features up to one factor exp(−shift) shared by every key, which cancels in the normaliser."""
    projections, half_norm = _projections(k, omega, features)
    shift = key_shift(projections, half_norm, omega, features, causal, key_mask)  # (..., 1, 1)
    if features == "trig":
        phi_k = np.exp(half_norm - shift) * _sin_cos(projections)  # (..., s, 2f)
    else:
        phi_k = np.exp(projections - (half_norm + shift))  # (..., s, f)
    if key_mask is not None:
        phi_k = np.where(key_mask[..., :, None], phi_k, 0.0)  # a padded key adds nothing
    return phi_k


def _signed_attention(phi_q, phi_k, v, causal, chunk_size):
    """Linear attention whose normaliser may be negative or 0 (trig features): divided as it is.

    The linear-attention kernels refuse a negative normaliser, which no positive feature map
    produces; the trig estimator does, and clamping it would hide what notebook 08 shows.
    """
    if causal:
        numerator, normaliser = chunked_causal_sums(phi_q, phi_k, v, chunk_size or DEFAULT_CHUNK_SIZE)
    else:
        numerator = phi_q @ (np.swapaxes(phi_k, -1, -2) @ v)  # "...nf,...fs,...se->...ne" (..., n, e)
        normaliser = np.einsum("...nf,...f->...n", phi_q, phi_k.sum(axis=-2))  # (..., n)
    with np.errstate(divide="ignore", invalid="ignore"):  # a 0 normaliser gives inf/NaN: visible, not hidden
        return numerator / normaliser[..., None]


def _attention(q, k, v, omega, causal, features, key_mask, chunk_size, key_shift, eps):
    for name, x in (("q", q), ("k", k), ("v", v)):
        _validate.check_float(name, x, np.issubdtype(np.asarray(x).dtype, np.floating))
    _validate.check_qkv(q, k, v)
    omega = np.asarray(omega)
    _check_omega(q, omega)
    if features not in FEATURES:
        raise ValueError(f"features must be one of {', '.join(map(repr, FEATURES))}; got {features!r}.")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal attention needs as many queries as keys (n = s), got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}.")
    if key_mask is not None:
        key_mask = np.asarray(key_mask)
        _validate.check_key_mask(key_mask, k, key_mask.dtype == np.bool_)
    dtype = np.result_type(v)
    work = np.promote_types(np.result_type(q, k, v), np.float32)  # exponentials of float16 would overflow
    q, k, v, omega = (np.asarray(x, dtype=work) for x in (q, k, v, omega))
    if key_mask is not None:  # padded keys and values zeroed first: even inf/NaN padding then adds nothing
        k, v = (np.where(key_mask[..., :, None], x, 0.0) for x in (k, v))
    scale = q.shape[-1] ** -0.25  # exp(q'ᵀk') = exp(qᵀk / √d) for q' = q d^(-1/4), k' = k d^(-1/4)
    phi_q = _query_features(q * scale, omega, features)  # (..., n, f) or (..., n, 2f)
    phi_k = _key_features(k * scale, omega, features, causal, key_mask, key_shift)  # (..., s, f) or (..., s, 2f)
    if features == "trig":
        out = _signed_attention(phi_q, phi_k, v, causal, chunk_size)
    elif causal:
        out = causal_linear_attention_from_features(phi_q, phi_k, v, eps=eps, chunk_size=chunk_size)
    else:
        out = linear_attention_from_features(phi_q, phi_k, v, eps=eps)
    return out.astype(dtype, copy=False)


def performer_attention(q, k, v, omega, *, causal=False, features="positive", key_mask=None,
                        chunk_size=DEFAULT_CHUNK_SIZE):
    """FAVOR+ attention, an estimate of softmax attention. Notebook 08, Eq. (8.6); Choromanski et al. 2020, Alg. 1.

    Queries and keys are scaled by d^(-1/4), mapped to random features, and combined by
    linear attention: O(n·m·(d + e)) instead of O(n·s·d).  Redrawing features is the
    caller's choice: pass a new ``omega``.

    Stabilisation is exact and causal-safe: the query exponents lose their own per-position
    maximum, the key exponents one constant (``_key_shift``); both cancel between numerator and
    normaliser.  The normaliser gets no absolute eps beyond the smallest normal float (it
    only stops 0/0): with trig features it can be negative or near zero, and that shows.

    Args:
        q: queries ``(..., n, d)``.
        k: keys ``(..., s, d)``.
        v: values ``(..., s, e)``.
        omega: ``(m, d)`` (or ``(..., m, d)``) from ``random_matrix``.
        causal: if True, query i sees only keys up to its own position (n = s).
        features: ``"positive"`` (FAVOR+), ``"hyperbolic"`` or ``"trig"``.
        key_mask: boolean ``(..., s)``, True where the key is a real token.
        chunk_size: causal only: positions per chunk of the chunked form (default
            ``DEFAULT_CHUNK_SIZE``), or None for the prefix sums of notebook 06 (trig features
            always take the chunked form, with ``DEFAULT_CHUNK_SIZE`` for None).

    Returns:
        ``(..., n, e)``.
    """
    # The smallest normal float: it only turns an all-underflowed 0/0 into 0, and beside the
    # stabilised normaliser it is negligible (an eps of 1e-6 would not be: see the causal shift).
    eps = np.finfo(np.promote_types(np.result_type(q, k, v), np.float32)).tiny
    return _attention(q, k, v, omega, causal, features, key_mask, chunk_size, _key_shift, eps)


def _global_max_key_shift(projections, half_norm, omega, features, causal, key_mask):
    return _largest_exponents(projections, half_norm, features).max(axis=-2, keepdims=True)  # the future included


def _global_max_causal_attention(q, k, v, omega, *, features="positive", eps=1e-6,
                                 chunk_size=DEFAULT_CHUNK_SIZE):
    """The trap (notebook 08, Section 8.6): causal FAVOR+ whose key stabiliser is a maximum over the whole sequence.

    Exact in exact arithmetic, yet a large future key raises the maximum and shrinks every
    earlier key feature by the same factor; against any absolute quantity (the usual eps of
    1e-6 in the normaliser, or float underflow) earlier outputs then change: the future leaks.
    Notebook 08 demonstrates it; do not use.
    """
    return _attention(q, k, v, omega, True, features, None, chunk_size, _global_max_key_shift, eps)
