"""Random projections and the Johnson–Lindenstrauss lemma in NumPy.

Implements notebook 03.  A projection ``R (k, n)`` maps a point ``x`` of R^n to ``R x`` in
R^k; a set of points is stored row-wise as ``X (points, n)`` and projected as ``X Rᵀ``.  In
Linformer the same ``R`` acts on the sequence axis (n positions), which is where the
Linformer bounds at the end of this file come from.  NumPy only: no torch mirror.
"""

import math

import numpy as np


def _check_int(name, value, minimum, meaning):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} ({meaning}) must be an integer >= {minimum}, got {value!r}.")


def _check_eps(eps):
    if not isinstance(eps, (int, float, np.floating, np.integer)) or not 0.0 < eps < 1.0:
        raise ValueError(f"eps (the allowed relative distortion) must lie in the open interval (0, 1), got {eps!r}.")


def _check_rng(rng):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (e.g. np.random.default_rng(0)), "
                        f"got {type(rng).__name__}.")


# --- Projection matrices --------------------------------------------------------------------

def gaussian_projection(k, n, rng):
    """Gaussian random projection, entries N(0, 1/k). Notebook 03, Eq. (3.2); Dasgupta & Gupta 2003.

    The variance 1/k makes E‖R x‖² = ‖x‖²: each of the k rows contributes ‖x‖²/k on average.

    Args:
        k: target dimension (rows), k >= 1.
        n: input dimension (columns), n >= 1.
        rng: ``numpy.random.Generator``; the only source of randomness.

    Returns:
        R ``(k, n)``.
    """
    _check_int("k", k, 1, "the target dimension")
    _check_int("n", n, 1, "the input dimension")
    _check_rng(rng)
    return rng.standard_normal((k, n)) / np.sqrt(k)  # (k, n)


def sparse_projection(k, n, rng, *, density=1 / 3):
    """Sparse ±1 random projection. Notebook 03, Eq. (3.3); Achlioptas 2003.

    Each entry is +c or -c with probability density/2 each and 0 otherwise, with
    c = 1/√(density·k) so that every entry has variance 1/k, like ``gaussian_projection``.
    ``density=1/3`` is Achlioptas's sparse matrix (two thirds zeros); ``density=1`` his dense
    ±1/√k matrix.

    Args:
        k: target dimension (rows), k >= 1.
        n: input dimension (columns), n >= 1.
        rng: ``numpy.random.Generator``.
        density: fraction of non-zero entries, in (0, 1].

    Returns:
        R ``(k, n)``.
    """
    _check_int("k", k, 1, "the target dimension")
    _check_int("n", n, 1, "the input dimension")
    _check_rng(rng)
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density (fraction of non-zero entries) must lie in (0, 1], got {density!r}.")
    scale = 1.0 / np.sqrt(density * k)
    u = rng.random((k, n))  # (k, n): one uniform draw decides zero, +c or -c
    return np.where(u < density / 2, scale, np.where(u < density, -scale, 0.0))  # (k, n)


def theorem2_projections(k, n, rng, *, delta=0.1):
    """E = δR and F = e^(−δ)R from one Gaussian R. Notebook 03, Eq. (3.11); Wang et al. 2020, Eq. (9).

    The construction in the proof of Linformer's Theorem 2 (the paper writes E, F as n × k;
    here they are (k, n), like every projection in the course).  R is
    ``gaussian_projection(k, n, rng)``, entries N(0, 1/k).  The paper asks only that δ be "a
    small constant".  The default 0.1 keeps the projected scores δ·(R wᵀ)_j below one in size
    for score rows w of norm ~23 (MiniLM's median, notebook 03) at k >= 16, so the softmax over
    the k projected positions is neither saturated nor exactly uniform; notebook 03 measures the
    same error at δ = 0.01 and 0.1 and a somewhat larger one at δ = 1.  The guarantee this construction proves
    (the paper's Eq. 8) is on the JL scale ‖softmax(w)‖‖v‖, not relative to ‖softmax(w) v‖.

    Args:
        k: projected length (rows), k >= 1.
        n: sequence length (columns), n >= 1.
        rng: ``numpy.random.Generator``; R is its next k·n standard normals over √k.
        delta: δ > 0.

    Returns:
        ``(E, F)``, each ``(k, n)``.
    """
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating, np.integer)) \
            or not 0.0 < delta < math.inf:
        raise ValueError(f"delta (the scale δ of E = δR) must be a positive finite number, got {delta!r}.")
    R = gaussian_projection(k, n, rng)  # (k, n): the shared draw
    return delta * R, math.exp(-delta) * R  # (k, n) each


# --- Distortion of pairwise distances -------------------------------------------------------

def pairwise_sq_distances(X):
    """Squared distances ‖x_i − x_j‖² of all pairs i < j of rows of ``X``. Notebook 03, Eq. (3.1).

    Differences are taken explicitly (not via ‖x‖² + ‖y‖² − 2xᵀy, which cancels badly for
    close points), one row at a time so memory stays O(points · n).

    Args:
        X: points ``(points, n)``, points >= 2.

    Returns:
        ``(points·(points−1)/2,)`` in the order of ``np.triu_indices(points, k=1)``.
    """
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or len(X) < 2:
        raise ValueError(f"X must have shape (points, n) with at least 2 points, got {X.shape}.")
    # row i against rows i+1, i+2, …: a (points − i − 1, n) block of differences at a time
    return np.concatenate([((X[i + 1:] - X[i]) ** 2).sum(axis=-1) for i in range(len(X) - 1)])


def distance_ratios(X, R):
    """Ratios ‖R(x_i − x_j)‖² / ‖x_i − x_j‖² for all pairs i < j. Notebook 03, Eq. (3.1).

    By linearity R(x_i − x_j) = R x_i − R x_j, so the points are projected once.

    Args:
        X: points ``(points, n)``, no two equal.
        R: projection ``(k, n)``.

    Returns:
        ``(points·(points−1)/2,)`` in the order of ``np.triu_indices(points, k=1)``.
    """
    X, R = np.asarray(X, dtype=float), np.asarray(R, dtype=float)
    if R.ndim != 2 or X.ndim != 2 or R.shape[1] != X.shape[1]:
        raise ValueError(f"R must have shape (k, n) and X shape (points, n) with the same n, "
                         f"got R {R.shape} and X {X.shape}.")
    before = pairwise_sq_distances(X)
    if np.any(before == 0):
        raise ValueError("X has two identical rows: the ratio of their distances is undefined.")
    after = pairwise_sq_distances(X @ R.T)  # points projected to (points, k)
    return after / before


def pairwise_distortion(X, R):
    """Distortion of every pairwise squared distance. Notebook 03, Eq. (3.1); Johnson & Lindenstrauss 1984.

    For each pair i < j: |‖R(x_i − x_j)‖² / ‖x_i − x_j‖² − 1|.  The JL lemma holds for R when
    every value is at most eps.

    Args:
        X: points ``(points, n)``, no two equal.
        R: projection ``(k, n)``.

    Returns:
        ``(points·(points−1)/2,)`` in the order of ``np.triu_indices(points, k=1)``.
    """
    return np.abs(distance_ratios(X, R) - 1.0)


# --- Bounds ----------------------------------------------------------------------------------

def jl_min_dim(n_points, eps):
    """Smallest k the JL lemma guarantees for n points. Notebook 03, Eq. (3.4); Dasgupta & Gupta 2003.

    k = ⌈4 ln n / (ε²/2 − ε³/3)⌉: a Gaussian R ``(k, n)`` keeps all pairwise squared
    distances of n points within a factor 1 ± ε with probability at least 1/n (Dasgupta &
    Gupta's Theorem 2.1; redraw R until it works).  The bound ignores the input dimension.
    ``sklearn.random_projection.johnson_lindenstrauss_min_dim`` truncates the same expression.

    Args:
        n_points: number of points n >= 2.
        eps: allowed relative distortion of squared distances, 0 < eps < 1.

    Returns:
        k as an int.
    """
    _check_int("n_points", n_points, 2, "the number of points")
    _check_eps(eps)
    return math.ceil(4 * math.log(n_points) / (eps**2 / 2 - eps**3 / 3))


def linformer_min_k(n, eps):
    """Projected length k of Linformer's Theorem 1. Notebook 03, Eq. (3.5); Wang et al. 2020, Theorem 1.

    k = ⌈5 ln n / (ε² − ε³)⌉: the paper states that with R ``(k, n)``, entries N(0, 1/k),
    ‖P Rᵀ R v − P v‖ ≤ ε‖P v‖ for a column v of V with probability 1 − o(1).  JL bounds
    the error relative to ‖P‖_F‖v‖, not ‖P v‖ (``amplification_factor``), and notebook 03
    measures the proof's construction (this R at this k) missing its own probability level for
    most heads at n = 128; the theorem's claim that some such matrix exists is not what fails.
    The natural log is used; the paper writes "log".

    Args:
        n: sequence length, n >= 2.
        eps: allowed relative error, 0 < eps < 1.

    Returns:
        k as an int.
    """
    _check_int("n", n, 2, "the sequence length")
    _check_eps(eps)
    return math.ceil(5 * math.log(n) / (eps**2 - eps**3))


def linformer_theorem2_k(n, d, eps):
    """The k of Linformer's Theorem 2, constants taken literally. Notebook 03, Eq. (3.7); Wang et al. 2020, Theorem 2.

    k = ⌈min{9 d ln d / ε², 5 ln n / ε²}⌉.  The paper states min{Θ(9 d log d / ε²),
    5 Θ(log n / ε²)}: the Θ hides constants, so this is an order of magnitude, not a
    guarantee.  Taken literally, the d-term is the smaller only once ln n > 9 d ln d / 5, i.e.
    n > d^(9d/5) (about 10^208 for d = 64): at any real length the k comes from the ln n term.

    Args:
        n: sequence length, n >= 2.
        d: head dimension, d >= 2.
        eps: allowed relative error, 0 < eps < 1.

    Returns:
        k as an int.
    """
    _check_int("n", n, 2, "the sequence length")
    _check_int("d", d, 2, "the head dimension")
    _check_eps(eps)
    return math.ceil(min(9 * d * math.log(d), 5 * math.log(n)) / eps**2)


def theorem2_crossover_log10_n(d):
    """log10 of the n above which Eq. (3.7)'s d-term is the smaller one. Notebook 03, Eq. (3.7).

    9 d ln d / ε² < 5 ln n / ε²  ⇔  ln n > 9 d ln d / 5; returned as a base-10 exponent because
    the n itself overflows a float for d >= 64 (d = 64 gives 208.1).

    Args:
        d: head dimension, d >= 2.

    Returns:
        log10 n at the crossover, a float.
    """
    _check_int("d", d, 2, "the head dimension")
    return 9 * d * math.log(d) / 5 / math.log(10)


def _solve_increasing(f, target, low, high):
    """The x in [low, high] with f(x) = target, for f increasing there (bisection)."""
    for _ in range(100):  # 100 halvings reach float64 resolution on any interval in (0, 1)
        mid = (low + high) / 2
        low, high = (mid, high) if f(mid) < target else (low, mid)
    return high


def jl_eps(n_points, k):
    """The distortion ε that Eq. (3.4) guarantees with k dimensions (``jl_min_dim`` inverted). Notebook 03, Eq. (3.4).

    Solves ε²/2 − ε³/3 = 4 ln n / k.  The left side grows to 1/6 at ε = 1, so for
    k < 24 ln n no ε < 1 is guaranteed and the result is NaN.

    Args:
        n_points: number of points n >= 2.
        k: target dimension, k >= 1.

    Returns:
        ε as a float (NaN when the lemma says nothing).
    """
    _check_int("n_points", n_points, 2, "the number of points")
    _check_int("k", k, 1, "the target dimension")
    target = 4 * math.log(n_points) / k
    if target >= 1 / 6:
        return math.nan
    return _solve_increasing(lambda e: e**2 / 2 - e**3 / 3, target, 0.0, 1.0)


def linformer_eps(n, k):
    """The error ε that Theorem 1 guarantees with k dimensions (``linformer_min_k`` inverted). Notebook 03, Eq. (3.5).

    Solves ε² − ε³ = 5 ln n / k on (0, 2/3], where the left side rises to its maximum 4/27;
    for k < 33.75 ln n Theorem 1 guarantees no ε < 1 and the result is NaN.

    Args:
        n: sequence length, n >= 2.
        k: projected length, k >= 1.

    Returns:
        ε as a float (NaN when the theorem says nothing).
    """
    _check_int("n", n, 2, "the sequence length")
    _check_int("k", k, 1, "the projected length")
    target = 5 * math.log(n) / k
    if target > 4 / 27:
        return math.nan
    return _solve_increasing(lambda e: e**2 - e**3, target, 0.0, 2 / 3)



def linformer_theorem2_eps(n, d, k):
    """The ε of Theorem 2 for k dimensions, constants taken literally (``linformer_theorem2_k`` inverted).

    Notebook 03, Eq. (3.7): ε = √(min{9 d ln d, 5 ln n} / k).  An order of magnitude, like Eq. (3.7)
    itself; NaN when it reaches 1 or more, where the theorem says nothing.

    Args:
        n: sequence length, n >= 2.
        d: head dimension, d >= 2.
        k: projected length, k >= 1.

    Returns:
        ε as a float (NaN when ε >= 1).
    """
    _check_int("n", n, 2, "the sequence length")
    _check_int("d", d, 2, "the head dimension")
    _check_int("k", k, 1, "the projected length")
    eps = math.sqrt(min(9 * d * math.log(d), 5 * math.log(n)) / k)
    return eps if eps < 1 else math.nan

# --- Theorem 1 on attention -----------------------------------------------------------------

def projected_attention_error(P, v, R):
    """Relative error ‖P Rᵀ R v − P v‖ / ‖P v‖ of projecting the sequence axis. Notebook 03, Eq. (3.6).

    Since E[Rᵀ R] = I for entries of variance 1/k, P Rᵀ R v is an unbiased estimate of P v;
    this is the error of one draw of R.  The product is evaluated right to left, P (Rᵀ (R v)),
    which costs O(k·s + n·s) instead of the O(n·s·k) of forming P Rᵀ first.

    Args:
        P: attention weights ``(..., n, s)``.
        v: a value vector ``(..., s)``.
        R: projection ``(k, s)``.

    Returns:
        ``(...)``, the relative error over the n positions.
    """
    P, v, R = np.asarray(P, dtype=float), np.asarray(v, dtype=float), np.asarray(R, dtype=float)
    if R.ndim != 2 or P.shape[-1] != R.shape[1] or v.shape[-1] != R.shape[1]:
        raise ValueError(f"P (..., n, s), v (..., s) and R (k, s) must share s, "
                         f"got P {P.shape}, v {v.shape}, R {R.shape}.")
    exact = np.einsum("...ns,...s->...n", P, v)  # (..., n)
    projected_v = np.einsum("ks,...s->...k", R, v)  # (..., k): R v
    lifted_v = np.einsum("ks,...k->...s", R, projected_v)  # (..., s): Rᵀ R v
    approx = np.einsum("...ns,...s->...n", P, lifted_v)  # (..., n)
    return np.linalg.norm(approx - exact, axis=-1) / np.linalg.norm(exact, axis=-1)


def amplification_factor(P, v):
    """‖P‖_F ‖v‖ / ‖P v‖: how much larger the JL scale is than ‖P v‖. Notebook 03, Eq. (3.9).

    Summed over rows, the JL guarantee of Eq. (3.8) bounds ‖P Rᵀ R v − P v‖ by ε‖P‖_F‖v‖;
    relative to ‖P v‖ (Theorem 1, Eq. 3.5) that is ε times this factor.  For v independent
    of P each |w_i v| is about ‖w_i‖‖v‖/√s, so the factor is about √s (the key length).

    Args:
        P: attention weights ``(..., n, s)``.
        v: a value vector ``(..., s)``.

    Returns:
        ``(...)``, the factor (>= 1 by Cauchy–Schwarz).
    """
    P, v = np.asarray(P, dtype=float), np.asarray(v, dtype=float)
    if P.ndim < 2 or v.shape[-1] != P.shape[-1]:
        raise ValueError(f"P (..., n, s) and v (..., s) must share s, got P {P.shape}, v {v.shape}.")
    exact = np.einsum("...ns,...s->...n", P, v)  # (..., n)
    return np.linalg.norm(P, axis=(-2, -1)) * np.linalg.norm(v, axis=-1) / np.linalg.norm(exact, axis=-1)
