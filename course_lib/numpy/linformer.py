"""Linformer attention in NumPy: keys and values projected along the sequence axis.

Implements notebooks 04 and 05; Wang et al. 2020, "Linformer: Self-Attention with Linear
Complexity" (arXiv 2006.04768).  Shapes follow the dimension key in ``course_lib``:
``q (..., n, d)``, ``k (..., s, d)``, ``v (..., s, e)``, projections ``E, F (..., k, n_max)``.
"""

import numpy as np

from course_lib import _validate
from course_lib._shared import SHARING_MODES, count_projection_matrices, pooling_blocks  # noqa: F401 (re-exported)
from course_lib.numpy.full import masked_softmax, softmax_attention


def _check(q, k, v=None, E=None, F=None, key_mask=None):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x is not None:
            _validate.check_float(name, x, np.issubdtype(np.asarray(x).dtype, np.floating))
    _validate.check_qkv(q, k, v)
    for name, proj in (("E", E), ("F", F)):
        if proj is not None:
            _validate.check_projection(name, proj, k, np.issubdtype(np.asarray(proj).dtype, np.floating))
    if E is not None and F is not None and E.shape != F.shape:
        raise ValueError(f"E and F must have the same shape (..., k, n), got E {tuple(E.shape)} "
                         f"and F {tuple(F.shape)}.")
    if key_mask is not None:
        key_mask = np.asarray(key_mask)
        _validate.check_key_mask(key_mask, k, key_mask.dtype == np.bool_)
    return key_mask


def project_sequence(proj, x, key_mask=None):
    """Project ``x (..., s, d)`` along the sequence axis: ``proj[..., :s] x`` → ``(..., k, d)``.

    Notebook 05, Eq. (5.2).  Padded rows of ``x`` (``key_mask`` False) are zeroed first, so a
    padded position adds nothing to the k mixtures: the result equals projecting the unpadded
    sequence.  Zeroing with ``np.where`` (not a product) keeps even inf/NaN padding out.
    """
    s = x.shape[-2]
    if key_mask is not None:
        x = np.where(np.asarray(key_mask)[..., :, None], x, 0.0)  # (..., s, d)
    return np.einsum("...ks,...sd->...kd", proj[..., :s], x, optimize=True)  # (..., k, d)


def linformer_weights(q, k, E, *, key_mask=None):
    """The k-column context-mapping matrix P̄ = softmax(q (E k)ᵀ / √d). Notebook 05, Eq. (5.1).

    Args:
        q: queries ``(..., n, d)``.
        k: keys ``(..., s, d)``.
        E: key projection ``(k, n_max)`` or ``(..., k, n_max)`` with ``n_max >= s``.
        key_mask: boolean ``(..., s)``, True where the key is a real token.

    Returns:
        P̄ ``(..., n, k)``; each row sums to 1.
    """
    key_mask = _check(q, k, E=E, key_mask=key_mask)
    d = q.shape[-1]
    projected_keys = project_sequence(E, k, key_mask)  # (..., k, d)
    scores = np.einsum("...nd,...kd->...nk", q, projected_keys, optimize=True) / np.sqrt(d)  # (..., n, k)
    return masked_softmax(scores)


def linformer_attention(q, k, v, E, F, *, key_mask=None):
    """Linformer attention softmax(q (E k)ᵀ / √d) (F v). Notebook 05, Eq. (5.1); Wang et al. 2020, Eq. 7.

    The n × s matrix P is never formed: keys and values are first projected from s positions
    down to k, so the cost is O(n·k) instead of O(n·s).

    Padding: padded keys and values are zeroed *before* the projection.  The published code
    ignores the mask, so E mixes the padding tokens into every projected key; masking the
    k projected scores afterwards cannot undo that, because each of them already mixes all s
    positions.  Zeroing makes a padded batch give exactly what each unpadded sequence gives.

    Shorter inputs: a sequence of s < n_max positions uses the first s columns ``E[..., :s]``,
    as the reference implementations do.  The cost of that choice: a sequence's projection
    depends on its length, so a model trained at one length sees differently scaled
    projected keys at another.

    Args:
        q: queries ``(..., n, d)``.
        k: keys ``(..., s, d)``.
        v: values ``(..., s, e)``.
        E: key projection ``(k, n_max)`` or broadcastable ``(..., k, n_max)``, ``s <= n_max``.
        F: value projection, the same shape as ``E`` (the same array for key-value sharing).
        key_mask: boolean ``(..., s)``, True where the key is a real token.

    Returns:
        ``(..., n, e)``.
    """
    key_mask = _check(q, k, v, E, F, key_mask)
    projected_keys = project_sequence(E, k, key_mask)  # (..., k, d)
    projected_values = project_sequence(F, v, key_mask)  # (..., k, e)
    return softmax_attention(q, projected_keys, projected_values)


def mean_pooling(k, s):
    """Mean pooling as a projection ``(k, s)``. Notebook 04, Section 4.3; Wang et al. 2020, §4.

    Row i averages the i-th of k consecutive blocks of positions (``np.array_split`` sizes, so
    k need not divide s): one of the paper's "general projections", fixed and non-negative.
    """
    blocks = pooling_blocks(k, s)  # checks k and s
    pool = np.zeros((k, s))
    for i, (start, stop) in enumerate(blocks):
        pool[i, start:stop] = 1.0 / (stop - start)  # (k, s): each row sums to 1
    return pool


def causal_leak(attention, q, k, v, t, *, shift=1.0):
    """How much outputs at positions ≤ t move when the keys and values after t change. Notebook 04.

    A causal model must give 0.  Linformer does not: every projected key E k mixes all s
    positions, the future included.

    Args:
        attention: ``attention(q, k, v) → (..., n, e)``.
        q, k, v: as in ``linformer_attention``, with n = s.
        t: the last position whose output is inspected (0-based).
        shift: added to every key and value after position t.

    Returns:
        max |Δ output[..., :t + 1, :]|, a float.
    """
    future_k, future_v = k.copy(), v.copy()
    future_k[..., t + 1:, :] += shift
    future_v[..., t + 1:, :] += shift
    before = attention(q, k, v)[..., : t + 1, :]  # (..., t + 1, e)
    after = attention(q, future_k, future_v)[..., : t + 1, :]
    return float(np.abs(after - before).max())
