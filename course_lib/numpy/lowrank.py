"""How low-rank is a matrix P: its spectrum, the rank that holds most of it, the best rank-k copy.

Implements notebook 02.  Every function takes ``P (..., n, s)`` (a context-mapping matrix, or a
stack of them) and works on the last two axes; r = min(n, s) is the number of singular values.
"""

import numpy as np


def _check_matrix(P):
    P = np.asarray(P)
    if P.ndim < 2:
        raise ValueError(f"P must have shape (..., n, s) with at least two axes, got {P.shape}.")
    if not np.issubdtype(P.dtype, np.floating):
        raise TypeError(f"P must hold floating-point numbers, got dtype {P.dtype}; convert it with P.astype(float).")
    return P


def _check_rank(k, P):
    r = min(P.shape[-2:])
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= r:
        raise ValueError(f"k must be an integer between 1 and min(n, s) = {r} for P of shape {P.shape}, got {k!r}.")


def singular_values(P, *, method="svd"):
    """The singular values σ₁ ≥ σ₂ ≥ … ≥ σᵣ ≥ 0 of P. Notebook 02, Eq. (2.1).

    Args:
        P: ``(..., n, s)``.
        method: ``"svd"`` (LAPACK's SVD, the reference) or ``"gram"``: the square roots of the
            eigenvalues of the Gram matrix P Pᵀ (or Pᵀ P, whichever is smaller), Eq. (2.3).
            The Gram route is several times faster; values far below σ₁·√eps lose accuracy.

    Returns:
        ``(..., r)`` in descending order, r = min(n, s).
    """
    P = _check_matrix(P)
    if method == "svd":
        return np.linalg.svd(P, compute_uv=False)  # (..., r), LAPACK returns them descending
    if method != "gram":
        raise ValueError(f"method must be 'svd' or 'gram', got {method!r}.")
    wide = P.shape[-2] <= P.shape[-1]
    gram = P @ np.swapaxes(P, -1, -2) if wide else np.swapaxes(P, -1, -2) @ P  # (..., r, r)
    eigenvalues = np.linalg.eigvalsh(gram)[..., ::-1]  # (..., r), eigvalsh is ascending
    # Round-off can make the smallest eigenvalues of a PSD matrix slightly negative.
    return np.sqrt(np.clip(eigenvalues, 0.0, None))


def cumulative_spectrum(P, *, squared=False, method="svd"):
    """The normalised cumulative spectrum c_k = (σ₁ + … + σ_k) / (σ₁ + … + σᵣ). Notebook 02, Eq. (2.2).

    This is the normalisation of the Linformer paper's Figure 1 (cumulative sum of the singular
    values over their total), so ``c[..., -1] == 1``.  With ``squared=True`` the σ are squared
    first: the share of ‖P‖²_F, which is what the Eckart–Young error (Eq. 2.6) leaves out.

    Args:
        P: ``(..., n, s)``.
        squared: sum σᵢ² instead of σᵢ.
        method: as in ``singular_values``.

    Returns:
        ``(..., r)``, non-decreasing, ending at 1; entry k-1 is c_k.
    """
    sigma = singular_values(P, method=method)  # (..., r)
    weights = sigma**2 if squared else sigma
    total = weights.sum(axis=-1, keepdims=True)  # (..., 1)
    if np.any(total == 0):
        raise ValueError("P must not be the zero matrix: its spectrum cannot be normalised.")
    cumulative = np.cumsum(weights, axis=-1) / total  # (..., r)
    cumulative[..., -1] = 1.0  # exactly 1: the sum and the cumulative sum may differ in the last bit
    return cumulative


def rank_for_energy(P, energy, *, squared=False, method="svd"):
    """The smallest k with c_k ≥ ``energy``: the rank that holds that share. Notebook 02, Eq. (2.4).

    Args:
        P: ``(..., n, s)``.
        energy: the share in (0, 1], e.g. 0.9.
        squared, method: as in ``cumulative_spectrum``.

    Returns:
        Integer array ``(...)`` with values in 1 … r.
    """
    if not 0 < energy <= 1:
        raise ValueError(f"energy must be a share in (0, 1], got {energy}.")
    cumulative = cumulative_spectrum(P, squared=squared, method=method)  # (..., r)
    below = (cumulative < energy).sum(axis=-1)  # how many c_k fall short; k = that + 1
    return np.minimum(below + 1, cumulative.shape[-1])


def best_rank_k(P, k):
    """The best rank-k approximation P_k = U_k Σ_k V_kᵀ (Eckart & Young 1936). Notebook 02, Eq. (2.5).

    No matrix of rank k is closer to P in the Frobenius (or spectral) norm.

    Args:
        P: ``(..., n, s)``.
        k: the rank, 1 ≤ k ≤ min(n, s).

    Returns:
        ``(..., n, s)``.
    """
    P = _check_matrix(P)
    _check_rank(k, P)
    u, sigma, vh = np.linalg.svd(P, full_matrices=False)  # (..., n, r), (..., r), (..., r, s)
    return (u[..., :, :k] * sigma[..., None, :k]) @ vh[..., :k, :]  # (..., n, s)


def truncation_error(P, k, *, relative=False):
    """‖P − P_k‖_F = √(σ²_{k+1} + … + σ²ᵣ), the error of the best rank-k copy. Notebook 02, Eq. (2.6).

    Args:
        P: ``(..., n, s)``.
        k: the rank, 1 ≤ k ≤ min(n, s).
        relative: divide by ‖P‖_F.

    Returns:
        ``(...)``.
    """
    P = _check_matrix(P)
    _check_rank(k, P)
    return truncation_errors(P, relative=relative)[..., k - 1]


def truncation_errors(P, *, relative=False, method="svd"):
    """``truncation_error`` for every k = 1 … r at once, from one spectrum. Notebook 02, Eq. (2.6).

    Returns:
        ``(..., r)``; entry k-1 is ‖P − P_k‖_F (0 at k = r).
    """
    sigma = singular_values(P, method=method)  # (..., r)
    tail = np.cumsum((sigma**2)[..., ::-1], axis=-1)[..., ::-1]  # tail[i] = σᵢ² + … + σᵣ² (0-based i)
    errors = np.sqrt(np.concatenate([tail[..., 1:], np.zeros_like(tail[..., :1])], axis=-1))  # (..., r)
    if relative:
        errors = errors / np.sqrt(tail[..., :1])
    return errors


def output_truncation_errors(P, V, *, relative=False, method="svd"):
    """‖P V − P_k V‖_F for every k = 1 … r: the output error of the best rank-k copy of P. Notebook 02, Eq. (2.8).

    With P = Σᵢ σᵢ uᵢ wᵢᵀ (Eq. 2.1; wᵢ the right singular vectors), (P − P_k) V = Σ_{i>k} σᵢ uᵢ (wᵢᵀ V), and
    the uᵢ are orthonormal, so the squared error is Σ_{i>k} σᵢ² ‖wᵢᵀ V‖²: one factorisation gives every k.

    Args:
        P: ``(..., n, s)``.
        V: ``(..., s, e)``, broadcastable against P's leading axes.
        relative: divide by ‖P V‖_F.
        method: ``"svd"`` (the reference) or ``"gram"``: the right singular vectors and σᵢ² as the
            eigenvectors and eigenvalues of Pᵀ P (s × s), faster for a stack of square matrices.

    Returns:
        ``(..., r)``, r = min(n, s); entry k-1 is the error of P_k V (0 at k = r).
    """
    P = _check_matrix(P)
    V = np.asarray(V)
    if V.ndim < 2 or V.shape[-2] != P.shape[-1]:
        raise ValueError(f"V must have shape (..., s, e) with s = {P.shape[-1]} (P's last axis), got {V.shape}.")
    if method == "svd":
        _, sigma, vh = np.linalg.svd(P, full_matrices=False)  # (..., r), (..., r, s)
        energy = sigma**2  # (..., r)
    elif method == "gram":
        energy, w = np.linalg.eigh(np.swapaxes(P, -1, -2) @ P)  # (..., s), (..., s, s), ascending
        energy, vh = np.clip(energy[..., ::-1], 0.0, None), np.swapaxes(w[..., ::-1], -1, -2)  # largest first
        r = min(P.shape[-2:])
        energy, vh = energy[..., :r], vh[..., :r, :]  # beyond r the eigenvalues are 0
    else:
        raise ValueError(f"method must be 'svd' or 'gram', got {method!r}.")
    through = energy * (np.abs(vh @ V) ** 2).sum(axis=-1)  # (..., r): σᵢ² ‖wᵢᵀ V‖²
    tail = np.cumsum(through[..., ::-1], axis=-1)[..., ::-1]  # tail[i] = sum from i on (0-based)
    errors = np.sqrt(np.concatenate([tail[..., 1:], np.zeros_like(tail[..., :1])], axis=-1))  # (..., r)
    if relative:
        errors = errors / np.linalg.norm(P @ V, axis=(-2, -1))[..., None]
    return errors
