"""Performer FAVOR+ in PyTorch: the port of ``course_lib.numpy.performer``.

Implements notebook 08; Choromanski et al. 2020, "Rethinking Attention with Performers"
(arXiv 2009.14794).  Same names and signatures as the NumPy tree; any device, any floating
dtype, autograd.  Shapes: ``q (..., n, d)``, ``k (..., s, d)``, ``v (..., s, e)``,
``omega (f, d)`` with f = m random features.  float16/bfloat16 inputs are computed in float32
(exponentials and sums) and the result is cast back.
"""

import math

import torch

from course_lib import _validate
from course_lib._shared import FEATURES, HEADROOM, SCALINGS, check_sizes  # noqa: F401 (re-exported)
from course_lib.torch.linear import (
    DEFAULT_CHUNK_SIZE,
    causal_linear_attention_from_features,
    chunked_causal_sums,
)

HALF = (torch.float16, torch.bfloat16)
# Features per block in the non-causal path, all leading dims together: 8 MB in float32, which
# stays in cache from the block's matmul to its sums.  At h = 8, n = 16,384, m = 256 (CPU time,
# one thread): 2^20-2^21 elements 250-260 ms, 2^22 290 ms, one block for all 475 ms; with two
# threads smaller blocks mean more thread hand-offs (tools/bench_performer.py).
BLOCK_ELEMENTS = 2**21


def _check_omega(x, omega):
    _validate.check_float("omega", omega, omega.is_floating_point())
    if omega.dim() < 2 or omega.shape[-1] != x.shape[-1] or omega.shape[-2] < 1:
        raise ValueError(f"omega must have shape (..., m, d) with m >= 1 and d = {x.shape[-1]} (the inputs are "
                         f"{tuple(x.shape)}), got {tuple(omega.shape)}. Draw it with random_matrix(m, d, rng).")


def _orthogonal_blocks(n_blocks, d, rng):
    """Haar-random d × d orthogonal matrices: QR of Gaussian ones, signs fixed by diag(R) (Mezzadri 2007)."""
    gaussian = torch.randn(n_blocks, d, d, generator=rng, dtype=torch.float64, device=rng.device)
    q, r = torch.linalg.qr(gaussian)  # one batched QR for every block
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[..., None, :]  # without it Q is not uniform
    return q.transpose(-1, -2)  # (blocks, d, d); rows orthonormal, each uniform on the sphere


def random_matrix(m, d, rng, *, orthogonal=True, scaling="chi", dtype=None, device=None):
    """The random matrix ω of FAVOR+. Notebook 08, Section 8.3; Choromanski et al. 2020, §2.4.

    Orthogonal random features (Yu et al. 2016): rows are taken from independent Haar-random
    d × d orthogonal blocks (the last block truncated), so rows within a block are exactly
    orthogonal, then rescaled so each row is still marginally N(0, I_d) ("chi": norms of fresh
    Gaussian d-vectors, χ_d-distributed) or has the fixed norm √d ("sqrt_d").  Drawn in float64
    on the generator's device, then cast.

    ``scaling="sqrt_d"`` makes a *biased* estimator of the softmax kernel: the feature maps are
    unbiased for exp(xᵀy) only when ω's rows are N(0, I_d), norms included, and "sqrt_d" fixes
    every norm at √d instead of drawing it from χ_d.  For positive features the expectation
    becomes exp(−(‖x‖² + ‖y‖²)/2) Γ(d/2) (2/t)^(d/2−1) I_(d/2−1)(t) with t = √d ‖x + y‖ (a Bessel
    function), smaller than exp(xᵀy): E exp(ωᵀz) is convex in ‖ω‖², and E‖ω‖² = d (Jensen).
    tests/test_performer.py measures the bias.

    Args:
        m: number of random features (rows).
        d: input dimension.
        rng: a ``torch.Generator``; the only source of randomness.
        orthogonal: False draws i.i.d. Gaussian rows.
        scaling: ``"chi"`` or ``"sqrt_d"``, the row norms.
        dtype: result dtype (default: torch's default dtype).
        device: result device (default: the generator's).

    Returns:
        ω ``(m, d)``.
    """
    check_sizes(m=m, d=d)
    if not isinstance(rng, torch.Generator):
        raise TypeError(f"rng must be a torch.Generator (torch.Generator().manual_seed(seed)), got {type(rng)}.")
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {', '.join(map(repr, SCALINGS))}; got {scaling!r}.")
    dtype, device = dtype or torch.get_default_dtype(), device or rng.device
    gaussian = dict(generator=rng, dtype=torch.float64, device=rng.device)
    if not orthogonal:
        omega = torch.randn(m, d, **gaussian)  # (f, d); Gaussian rows already have χ_d norms
        if scaling == "sqrt_d":
            omega = omega * (math.sqrt(d) / omega.norm(dim=-1, keepdim=True))
        return omega.to(dtype=dtype, device=device)
    directions = _orthogonal_blocks(-(-m // d), d, rng).reshape(-1, d)[:m]  # (f, d) unit rows
    if scaling == "chi":
        norms = torch.randn(m, d, **gaussian).norm(dim=-1)  # (f,)
    else:
        norms = torch.full((m,), math.sqrt(d), dtype=torch.float64, device=rng.device)
    return (directions * norms[:, None]).to(dtype=dtype, device=device)


def _projections(x, omega, features, scale=1.0):
    """ωᵀx' for every feature ``(..., n, f)`` (hyperbolic: ±ωᵀx', ``(..., n, 2f)``) and ‖x'‖²/2 ``(..., n, 1)``.

    x' = scale · x, by scaling ω instead: the same products, without a scaled copy of x.
    """
    omega_t = (scale * omega).transpose(-1, -2).contiguous()  # (..., d, f); contiguous: a faster BLAS call
    projections = x @ omega_t  # "...nd,...fd->...nf" (..., n, f): one matmul for all heads
    if features == "hyperbolic":
        projections = torch.cat([projections, -projections], dim=-1)  # (..., n, 2f)
    half_norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() * (scale**2 / 2)  # (..., n, 1)
    return projections, half_norm


def _sin_cos(projections):
    return torch.cat([projections.sin(), projections.cos()], dim=-1)  # (..., n, 2f)


def _feature_map(x, omega, features):
    _validate.check_float("x", x, x.is_floating_point())
    _check_omega(x, omega)
    dtype = x.dtype
    x = x.float() if dtype in HALF else x  # exp of float16 overflows above 11
    projections, half_norm = _projections(x, omega.to(x), features)
    if features == "trig":
        phi = half_norm.exp() * _sin_cos(projections)  # (..., n, 2f)
    else:
        phi = projections.sub_(half_norm).exp_()  # (..., n, f); in place: no backward needs the matmul's output
    m = omega.shape[-2] * (2 if features == "hyperbolic" else 1)  # trig: 2m entries, but m terms of cos(ωᵀ(x − y))
    return (phi / math.sqrt(m)).to(dtype)


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
    return half_norm if features == "trig" else projections.amax(dim=-1, keepdim=True) - half_norm


def _key_shift(projections, half_norm, omega, features, causal, key_mask):
    """A constant subtracted from every key exponent: exact, since it cancels in the normaliser.

    Non-causal: the largest exponent over all (real) keys.  Causal: a bound that depends on ω
    alone, ωᵀx − ‖x‖²/2 ≤ max ‖ω‖²/2, less HEADROOM (see ``course_lib.numpy.performer._key_shift``);
    trig features have no such bound and are not shifted.
    """
    if causal:
        if features == "trig":
            return 0.0
        bound = omega.square().sum(dim=-1).amax(dim=-1)[..., None, None] / 2  # (..., 1, 1)
        return (bound - HEADROOM).clamp(min=0.0)
    largest = _largest_exponents(projections, half_norm, features)  # (..., s, 1)
    if key_mask is not None:
        largest = largest.masked_fill(~key_mask[..., :, None], -math.inf)  # padded keys do not set the scale
    shift = largest.amax(dim=-2, keepdim=True)  # (..., 1, 1)
    return torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))  # every key padded: no scale


def _query_features(q, omega, features, scale):
    """Query features up to a factor per query position, which cancels for that query alone.

    The factor: exp(−‖q‖²/2) (trig: exp(‖q‖²/2)), and for exp features a softmax over the
    features, i.e. exp(ωᵀq − max) / Σ exp(ωᵀq − max): one fused pass, whose max (the NumPy tree
    subtracts it) and sum are both constant per position.  The 1/√m of both maps cancels too.
    """
    projections, _ = _projections(q, omega, features, scale)
    if features == "trig":
        return _sin_cos(projections)  # (..., n, 2f)
    return torch.softmax(projections, dim=-1)  # (..., n, f)


def _key_features(k, omega, features, causal, key_mask, key_shift, scale):
    """Key features up to one factor exp(−shift) shared by every key, which cancels in the normaliser.

    The shift is detached: it cancels exactly, so its gradient is zero and tracing it would be waste.
    """
    projections, half_norm = _projections(k, omega, features, scale)
    shift = key_shift(projections.detach(), half_norm.detach(), omega, features, causal, key_mask)  # (..., 1, 1)
    if features == "trig":
        phi_k = (half_norm - shift).exp() * _sin_cos(projections)  # (..., s, 2f)
    else:
        phi_k = projections.sub_(half_norm + shift).exp_()  # (..., s, f): one pass for both terms, in place
    if key_mask is not None:
        phi_k = phi_k.masked_fill(~key_mask[..., :, None], 0.0)  # a padded key adds nothing
    return phi_k


def _signed_attention(phi_q, phi_k, v, causal, chunk_size):
    """Linear attention whose normaliser may be negative or 0 (trig features): divided as it is.

    The linear-attention kernels refuse a negative normaliser, which no positive feature map
    produces; the trig estimator does, and clamping it would hide what notebook 08 shows.
    """
    if causal:
        numerator, normaliser = chunked_causal_sums(phi_q, phi_k, v, chunk_size or DEFAULT_CHUNK_SIZE)
    else:
        numerator = phi_q @ (phi_k.transpose(-1, -2) @ v)  # "...nf,...fs,...se->...ne" (..., n, e)
        normaliser = (phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)).squeeze(-1)  # "...nf,...f->...n" (..., n)
    return numerator / normaliser.unsqueeze(-1)


def _block_rows(x, f):
    """Positions per block: about BLOCK_ELEMENTS features over all leading dims (CUDA: one block)."""
    if x.is_cuda:
        return x.shape[-2]  # a GPU is fastest with one large kernel, not a loop of small ones
    return max(1, BLOCK_ELEMENTS // (x[..., 0, 0].numel() * f))


def _noncausal_in_blocks(q, k, v, omega, features, key_mask, eps, scale):
    """Non-causal FAVOR+ with exp features, a block of positions at a time. Notebook 08, Eq. (8.6).

    The sums of ``linear_attention_from_features`` (which the NumPy tree calls), without ever
    holding all features: at h = 8, n = 16,384, m = 256 they are 134 MB, and each pass over them
    (matmul output, max, exp, sums) would run at memory speed; a block's features stay in cache
    from their matmul to their sums.  The key shift is the running maximum over the blocks read so
    far; when it grows, the sums so far are rescaled by exp(old − new) (exact, the rescaling of
    flash attention), so the keys are read once.
    """
    rows = _block_rows(k, omega.shape[-2])
    kv_state, key_sum, shift = 0.0, 0.0, None  # Σ φ_k vᵀ (..., f, e) and Σ φ_k (..., f, 1), scaled by exp(−shift)
    for start in range(0, k.shape[-2], rows):
        block = slice(start, start + rows)
        mask = None if key_mask is None else key_mask[..., block]
        projections, half_norm = _projections(k[..., block, :], omega, features, scale)  # (..., rows, f), (.., 1)
        # A block of padding only has shift 0 (``_key_shift``): exact still, like any shift.
        new_shift = _key_shift(projections.detach(), half_norm.detach(), omega, features, False, mask)  # (..., 1, 1)
        if shift is not None:
            new_shift = torch.maximum(shift, new_shift)
            rescale = (shift - new_shift).exp()  # the earlier blocks, rescaled to the new shift
            kv_state, key_sum = kv_state * rescale, key_sum * rescale
        phi_k = projections.sub_(half_norm + new_shift).exp_()  # (..., rows, f), in place
        if mask is not None:
            phi_k = phi_k.masked_fill(~mask[..., :, None], 0.0)  # a padded key adds nothing
        kv_state = kv_state + phi_k.transpose(-1, -2) @ v[..., block, :]  # "...sf,...se->...fe" (..., f, e)
        key_sum = key_sum + phi_k.sum(dim=-2).unsqueeze(-1)  # (..., f, 1)
        shift = new_shift
    state = torch.cat([kv_state, key_sum], dim=-1)  # (..., f, e + 1): numerator and normaliser in one product
    rows, out = _block_rows(q, omega.shape[-2]), []
    for start in range(0, q.shape[-2], rows):
        phi_q = _query_features(q[..., start:start + rows, :], omega, features, scale)  # (..., rows, f)
        y = phi_q @ state  # (..., rows, e + 1)
        out.append(y[..., :-1] / (y[..., -1:] + eps))  # numerator / normaliser (..., rows, e)
    return torch.cat(out, dim=-2)  # (..., n, e)


def _attention(q, k, v, omega, causal, features, key_mask, chunk_size, key_shift, eps):
    for name, x in (("q", q), ("k", k), ("v", v)):
        _validate.check_float(name, x, x.is_floating_point())
    _validate.check_qkv(q, k, v)
    _check_omega(q, omega)
    if features not in FEATURES:
        raise ValueError(f"features must be one of {', '.join(map(repr, FEATURES))}; got {features!r}.")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal attention needs as many queries as keys (n = s), got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}.")
    if key_mask is not None:
        _validate.check_key_mask(key_mask, k, key_mask.dtype == torch.bool)
    dtype = v.dtype
    work = torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.promote_types(v.dtype, torch.float32))
    q, k, v, omega = (x.to(dtype=work, device=q.device) for x in (q, k, v, omega))  # float16 exp would overflow
    if key_mask is not None:  # padded keys and values zeroed first: even inf/NaN padding then adds nothing
        k, v = (torch.where(key_mask[..., :, None], x, 0.0) for x in (k, v))
    scale = q.shape[-1] ** -0.25  # exp(q'ᵀk') = exp(qᵀk / √d) for q' = q d^(-1/4), k' = k d^(-1/4)
    if not causal and features != "trig":
        return _noncausal_in_blocks(q, k, v, omega, features, key_mask, eps, scale).to(dtype)
    phi_q = _query_features(q, omega, features, scale)  # (..., n, f) or (..., n, 2f)
    phi_k = _key_features(k, omega, features, causal, key_mask, key_shift, scale)  # (..., s, f) or (..., s, 2f)
    if features == "trig":
        out = _signed_attention(phi_q, phi_k, v, causal, chunk_size)
    else:
        out = causal_linear_attention_from_features(phi_q, phi_k, v, eps=eps, chunk_size=chunk_size)
    return out.to(dtype)


def performer_attention(q, k, v, omega, *, causal=False, features="positive", key_mask=None,
                        chunk_size=DEFAULT_CHUNK_SIZE):
    """FAVOR+ attention, an estimate of softmax attention. Notebook 08, Eq. (8.6); Choromanski et al. 2020, Alg. 1.

    Queries and keys are scaled by d^(-1/4), mapped to random features, and combined by
    linear attention: O(n·m·(d + e)) instead of O(n·s·d).  Redrawing features is the
    caller's choice: pass a new ``omega``.  Stabilisation as in the NumPy tree: exact and
    causal-safe; no absolute eps beyond the smallest normal float (it only stops 0/0).

    Args:
        q: queries ``(..., n, d)``.
        k: keys ``(..., s, d)``.
        v: values ``(..., s, e)``.
        omega: ``(m, d)`` (or ``(..., m, d)``) from ``random_matrix``; cast to the inputs' dtype.
        causal: if True, query i sees only keys up to its own position (n = s).
        features: ``"positive"`` (FAVOR+), ``"hyperbolic"`` or ``"trig"``.
        key_mask: boolean ``(..., s)``, True where the key is a real token.
        chunk_size: causal only: positions per chunk of the chunked form (default
            ``DEFAULT_CHUNK_SIZE``: memory linear in n, forward and backward), or None for the
            prefix sums of notebook 06, whose backward stores n states of m × e.

    Returns:
        ``(..., n, e)`` in the dtype of ``v``.
    """
    eps = torch.finfo(torch.promote_types(v.dtype, torch.float32)).tiny
    return _attention(q, k, v, omega, causal, features, key_mask, chunk_size, _key_shift, eps)


def _global_max_key_shift(projections, half_norm, omega, features, causal, key_mask):
    return _largest_exponents(projections, half_norm, features).amax(dim=-2, keepdim=True)  # the future included


def _global_max_causal_attention(q, k, v, omega, *, features="positive", eps=1e-6,
                                 chunk_size=DEFAULT_CHUNK_SIZE):
    """The trap (notebook 08, Section 8.6): causal FAVOR+ whose key stabiliser is a maximum over the whole sequence.

    See ``course_lib.numpy.performer._global_max_causal_attention``; notebook 08 demonstrates it.
    """
    return _attention(q, k, v, omega, True, features, None, chunk_size, _global_max_key_shift, eps)
