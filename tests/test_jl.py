"""Tests for ``course_lib.numpy.jl``: the bounds on known values, seeded statistics of the
projections, the JL guarantee at ``k = jl_min_dim``, input errors, and properties."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from course_lib.numpy import jl

PROJECTIONS = {
    "gaussian": jl.gaussian_projection,
    "sparse": jl.sparse_projection,
}


# --- The bounds on known values -------------------------------------------------------------

@pytest.mark.parametrize(("n_points", "eps", "k"), [
    (1_000_000, 0.5, 664),  # 4 ln 1e6 / (1/8 − 1/24) = 663.15…
    (1000, 0.1, 5921),  # 4 ln 1000 / (0.005 − 0.000333…) = 5920.4…
    (2, 0.5, 34),  # 4 ln 2 / (1/12) = 33.27…
])
def test_jl_min_dim_known_values(n_points, eps, k):
    assert jl.jl_min_dim(n_points, eps) == k


def test_jl_min_dim_agrees_with_sklearn():
    sklearn_rp = pytest.importorskip("sklearn.random_projection")
    for n_points in (2, 10, 100, 1234, 10**6):
        for eps in (0.05, 0.1, 0.3, 0.5, 0.9):
            ours = jl.jl_min_dim(n_points, eps)
            # scikit-learn evaluates the same expression but truncates it to an integer, while the
            # lemma needs k >= the expression, hence a ceiling: equal, or one more.
            theirs = int(sklearn_rp.johnson_lindenstrauss_min_dim(n_points, eps=eps))
            assert theirs <= ours <= theirs + 1
            assert ours == math.ceil(4 * math.log(n_points) / (eps**2 / 2 - eps**3 / 3))


@pytest.mark.parametrize(("n", "eps", "k"), [
    (512, 0.5, 250),  # 5 ln 512 / (1/4 − 1/8) = 249.53…
    (128, 0.5, 195),  # 5 ln 128 / (1/8) = 194.09…
    (4096, 0.1, 4621),  # 5 ln 4096 / (0.01 − 0.001) = 4620.9…
])
def test_linformer_min_k_known_values(n, eps, k):
    assert jl.linformer_min_k(n, eps) == k


def test_linformer_theorem2_k_takes_the_smaller_term():
    # n = 512, d = 64: 5 ln 512 = 31.19 beats 9·64·ln 64 = 2395.6, so k = 31.19 / 0.25 → 125.
    assert jl.linformer_theorem2_k(512, 64, 0.5) == 125
    # d = 2, n = 10^6: 9·2·ln 2 = 12.48 beats 5 ln 10^6 = 69.08, so k = 12.48 / 0.01 → 1248.
    assert jl.linformer_theorem2_k(10**6, 2, 0.1) == 1248


def test_theorem2_crossover():
    # d = 64: ln n > 9·64·ln 64 / 5 = 479.1, i.e. log10 n > 208.07
    assert jl.theorem2_crossover_log10_n(64) == pytest.approx(9 * 64 * math.log(64) / 5 / math.log(10), rel=1e-12)
    assert 208 < jl.theorem2_crossover_log10_n(64) < 208.2
    # d = 2: the crossover is n = e^(18 ln 2 / 5) = 12.1, so n = 12 takes the ln n term and n = 13 the d-term
    assert 10 ** jl.theorem2_crossover_log10_n(2) == pytest.approx(2 ** 3.6, rel=1e-12)
    assert jl.linformer_theorem2_k(12, 2, 0.5) == math.ceil(5 * math.log(12) / 0.25)
    assert jl.linformer_theorem2_k(13, 2, 0.5) == math.ceil(9 * 2 * math.log(2) / 0.25)


@pytest.mark.parametrize("n_points", [2, 50, 10**4])
def test_jl_eps_inverts_jl_min_dim(n_points):
    for k in (100, 1000, 20000):
        eps = jl.jl_eps(n_points, k)
        if k < 24 * math.log(n_points):
            assert math.isnan(eps)
            continue
        assert 0 < eps < 1
        assert math.isclose(eps**2 / 2 - eps**3 / 3, 4 * math.log(n_points) / k, rel_tol=1e-12)
        assert jl.jl_min_dim(n_points, eps * (1 + 1e-9)) <= k


def test_linformer_eps_inverts_linformer_min_k():
    n = 512
    assert math.isnan(jl.linformer_eps(n, 200))  # 200 < 33.75 ln 512 = 210.5: no guarantee
    for k in (211, 250, 1000, 10**5):
        eps = jl.linformer_eps(n, k)
        assert 0 < eps <= 2 / 3
        assert math.isclose(eps**2 - eps**3, 5 * math.log(n) / k, rel_tol=1e-12)
        assert jl.linformer_min_k(n, eps * (1 + 1e-9)) <= k
    assert jl.linformer_min_k(n, jl.linformer_eps(n, 250)) == 250



def test_linformer_theorem2_eps_inverts_linformer_theorem2_k():
    # n = 128, d = 32: the ln n term (5 ln 128 = 24.26) is the smaller, so ε(k) = √(24.26 / k)
    assert jl.linformer_theorem2_eps(128, 32, 64) == pytest.approx(math.sqrt(5 * math.log(128) / 64), rel=1e-12)
    assert math.isnan(jl.linformer_theorem2_eps(128, 32, 24))  # 24.26 / 24 > 1: no ε < 1
    for n, d, k in ((128, 32, 256), (10**6, 2, 5000), (512, 64, 100)):
        eps = jl.linformer_theorem2_eps(n, d, k)
        assert 0 < eps < 1
        assert jl.linformer_theorem2_k(n, d, eps * (1 + 1e-9)) <= k
        assert jl.linformer_theorem2_k(n, d, eps) in (k, k + 1)  # the ceiling may round k itself up by one
    with pytest.raises(ValueError, match="k"):
        jl.linformer_theorem2_eps(128, 32, 0)

# --- Statistics of the projections (seeded) --------------------------------------------------

@pytest.mark.parametrize("family", PROJECTIONS)
def test_entries_have_mean_zero_and_variance_one_over_k(family):
    k, n = 50, 2000
    R = PROJECTIONS[family](k, n, np.random.default_rng(1))
    count = R.size  # 100,000 entries, each with variance 1/k
    # The sample mean has standard deviation sqrt(1/k / count); allow 5 of them (a 1-in-10^6 miss).
    assert abs(R.mean()) < 5 * math.sqrt(1 / k / count)
    # The sample variance has relative standard deviation sqrt((kurtosis − 1) / count): kurtosis 3
    # for Gaussian entries, 1/density = 3 for sparse ones at density 1/3, so sqrt(2 / count) =
    # 0.45 % either way.  5 standard deviations: 2.2 %.
    assert abs(R.var() * k - 1) < 5 * math.sqrt(2 / count)


@pytest.mark.parametrize("family", PROJECTIONS)
def test_squared_norm_is_preserved_on_average(family):
    k, n, draws = 16, 64, 4000
    rng = np.random.default_rng(2)
    x = rng.standard_normal(n)
    ratios = np.array([np.sum((PROJECTIONS[family](k, n, rng) @ x) ** 2) for _ in range(draws)]) / (x @ x)
    # For Gaussian R, ‖Rx‖²/‖x‖² is chi-squared with k degrees of freedom over k: mean 1, variance
    # 2/k.  Sparse R at density 1/3 has E (r·x)^4 = 3‖x‖^4/k², the Gaussian value, hence the same
    # variance.  The mean of 4000 draws has sd sqrt(2/k/4000) = 0.0079; allow 5 sd (0.040).
    assert abs(ratios.mean() - 1) < 5 * math.sqrt(2 / k / draws)
    # The variance 2/k itself: chi-squared_16 / 16 has kurtosis 3 + 12/16, so the sample variance
    # of 4000 draws has relative sd sqrt(2.75 / 4000) = 2.6 %; 0.25 is about 10 sd.
    assert abs(ratios.var() * k / 2 - 1) < 0.25


def test_sparse_projection_values_and_density():
    k, n, density = 20, 3000, 0.1
    R = jl.sparse_projection(k, n, np.random.default_rng(3), density=density)
    c = 1 / math.sqrt(density * k)
    assert set(np.unique(R)) <= {-c, 0.0, c}
    # The non-zero fraction is a binomial proportion with sd sqrt(p(1 − p)/60000) = 0.0012; 5 sd.
    assert abs(np.mean(R != 0) - density) < 5 * math.sqrt(density * (1 - density) / R.size)
    assert abs(np.mean(R > 0) - np.mean(R < 0)) < 5 * math.sqrt(density / R.size)


def test_projection_depends_only_on_the_generator_state():
    for family in PROJECTIONS.values():
        a = family(7, 11, np.random.default_rng(5))
        b = family(7, 11, np.random.default_rng(5))
        np.testing.assert_array_equal(a, b)


# --- The JL guarantee, empirically ------------------------------------------------------------

@pytest.mark.parametrize("family", PROJECTIONS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_all_pairwise_distortions_within_eps_at_jl_min_dim(family, seed):
    n_points, dim, eps = 150, 1000, 0.3
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_points, dim)) * rng.uniform(0.1, 10, size=(n_points, 1))
    k = jl.jl_min_dim(n_points, eps)  # 4 ln 150 / (0.045 − 0.009) = 557
    R = PROJECTIONS[family](k, dim, rng)
    distortion = jl.pairwise_distortion(X, R)
    assert distortion.shape == (n_points * (n_points - 1) // 2,)
    # The lemma promises success with probability >= 1/n; in practice the maximum sits well below eps.
    assert distortion.max() <= eps


def test_distortion_shrinks_with_k():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((40, 500))
    worst = [jl.pairwise_distortion(X, jl.gaussian_projection(k, 500, rng)).max() for k in (10, 100, 1000)]
    assert worst[0] > worst[1] > worst[2]


def test_pairwise_sq_distances_by_brute_force():
    X = np.random.default_rng(6).standard_normal((7, 4))
    i, j = np.triu_indices(7, k=1)
    np.testing.assert_allclose(jl.pairwise_sq_distances(X), ((X[i] - X[j]) ** 2).sum(-1), rtol=1e-14)


# --- Theorem 1 on an attention matrix --------------------------------------------------------

def _attention(rng, n):
    scores = rng.standard_normal((n, n)) * 2
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True)


def test_projected_attention_error_is_zero_for_the_identity():
    rng = np.random.default_rng(7)
    P, v = _attention(rng, 9), rng.standard_normal(9)
    assert jl.projected_attention_error(P, v, np.eye(9)) < 1e-14


def test_projected_attention_is_unbiased_and_error_falls_with_k():
    n, draws = 32, 3000
    rng = np.random.default_rng(8)
    P, v = _attention(rng, n), rng.standard_normal(n) + 1
    estimates = np.array([P @ (R.T @ (R @ v)) for R in (jl.gaussian_projection(8, n, rng) for _ in range(draws))])
    # E[Rᵀ R] = I, so the average over draws approaches P v; the per-draw error is O(1) at k = 8,
    # so the average of 3000 is within about 1/sqrt(3000) ≈ 0.02 relative — allow 0.1.
    assert np.linalg.norm(estimates.mean(0) - P @ v) / np.linalg.norm(P @ v) < 0.1
    errors = [np.mean([jl.projected_attention_error(P, v, jl.gaussian_projection(k, n, rng)) for _ in range(200)])
              for k in (4, 64, 1024)]
    assert errors[0] > errors[1] > errors[2]


def test_projected_attention_error_batches():
    rng = np.random.default_rng(9)
    P = np.stack([_attention(rng, 6) for _ in range(3)])  # (h, n, s)
    v, R = rng.standard_normal((3, 6)), jl.gaussian_projection(4, 6, rng)
    batched = jl.projected_attention_error(P, v, R)
    assert batched.shape == (3,)
    np.testing.assert_allclose(batched, [jl.projected_attention_error(P[i], v[i], R) for i in range(3)])


# --- Theorem 1's amplification and Theorem 2's construction ---------------------------------

def test_amplification_factor_by_brute_force_and_cauchy_schwarz():
    rng = np.random.default_rng(10)
    P = np.stack([_attention(rng, 7) for _ in range(3)])  # (h, n, s)
    v = rng.standard_normal((3, 7))
    factor = jl.amplification_factor(P, v)
    assert factor.shape == (3,)
    brute = [np.sqrt((P[i] ** 2).sum()) * np.linalg.norm(v[i]) / np.linalg.norm(P[i] @ v[i]) for i in range(3)]
    np.testing.assert_allclose(factor, brute, rtol=1e-12)
    assert np.all(factor >= 1 - 1e-12)  # ‖P v‖ <= ‖P‖_F ‖v‖
    # uniform rows and v = ones: ‖P‖_F = 1 and ‖v‖ = ‖P v‖ = √5, so the factor is exactly 1
    assert jl.amplification_factor(np.full((5, 5), 0.2), np.ones(5)) == pytest.approx(1.0, rel=1e-12)


def test_amplification_factor_is_about_sqrt_s_for_an_independent_v():
    n, rng = 128, np.random.default_rng(11)
    factors = [jl.amplification_factor(_attention(rng, n), rng.standard_normal(n)) for _ in range(20)]
    # E(w_i v)² = ‖w_i‖² for v ~ N(0, I), so ‖P v‖² ≈ ‖P‖_F² and ‖v‖² ≈ n: the factor is ≈ √n.
    # The median of 20 draws sits within 2 % of √n at this seed; allow a third either way.
    assert 0.75 * math.sqrt(n) < np.median(factors) < 1.33 * math.sqrt(n)


@pytest.mark.parametrize(("k", "n"), [(1, 1), (4, 9), (64, 128)])
@pytest.mark.parametrize("delta", [0.01, 0.1, 1.0])
def test_theorem2_projections_are_delta_r_and_exp_minus_delta_r_of_one_draw(k, n, delta):
    E, F = jl.theorem2_projections(k, n, np.random.default_rng(12), delta=delta)
    R = jl.gaussian_projection(k, n, np.random.default_rng(12))  # the same generator state
    assert E.shape == F.shape == (k, n)
    np.testing.assert_allclose(E, delta * R, rtol=1e-15, atol=0)
    np.testing.assert_allclose(F, math.exp(-delta) * R, rtol=1e-15, atol=0)
    # so F = e^(−δ)/δ · E, whatever R is
    np.testing.assert_allclose(F * delta, E * math.exp(-delta), rtol=1e-14, atol=0)


def test_theorem2_projections_default_delta_and_scale():
    E, F = jl.theorem2_projections(50, 2000, np.random.default_rng(13))
    R = E / 0.1  # the default δ is 0.1
    np.testing.assert_allclose(F, math.exp(-0.1) * R, rtol=1e-14)
    # R has entries N(0, 1/k): its sample variance over 100,000 entries is within 2.2 % (5 sd) of 1/k.
    assert abs(R.var() * 50 - 1) < 5 * math.sqrt(2 / R.size)


@pytest.mark.parametrize("k", [64, 256])
def test_theorem2_error_is_small_on_the_jl_scale_but_not_relative_to_pv(k):
    n, rng = 128, np.random.default_rng(14)
    jl_scale, zero_output, relative = [], [], []
    for _ in range(10):
        scores = rng.standard_normal((n, n)) * 2  # (n, s)
        P = np.exp(scores - scores.max(-1, keepdims=True))
        P /= P.sum(-1, keepdims=True)
        v = rng.standard_normal(n)
        E, F = jl.theorem2_projections(k, n, rng)
        projected = scores @ E.T  # (n, k): w Eᵀ for every row w
        weights = np.exp(projected - projected.max(-1, keepdims=True))
        out = weights / weights.sum(-1, keepdims=True) @ (F @ v)  # (n,): softmax(w Eᵀ) F v
        exact, scale = P @ v, np.linalg.norm(P, axis=-1) * np.linalg.norm(v)  # Eq. (8)'s ‖softmax(w)‖ ‖v‖
        jl_scale.append(np.abs(out - exact) / scale)
        zero_output.append(np.abs(exact) / scale)
        relative.append(np.linalg.norm(out - exact) / np.linalg.norm(exact))
    # On Eq. (8)'s scale the median row is off by ≈ 0.06 (measured 0.057 and 0.058 at this seed), no
    # worse than an output of zero (also ≈ 0.06, i.e. 1/√n): allow 0.1 and 1.5× the zero output.
    assert np.median(jl_scale) < 0.1
    assert np.median(jl_scale) < 1.5 * np.median(zero_output)
    # Relative to ‖P v‖ the construction keeps almost nothing: measured 0.95 and 0.99; 0.8 leaves room.
    assert np.median(relative) > 0.8


# --- Errors for bad input --------------------------------------------------------------------

@pytest.mark.parametrize("eps", [0, 1, -0.1, 1.5, float("nan")])
@pytest.mark.parametrize("bound", [jl.jl_min_dim, jl.linformer_min_k, lambda n, e: jl.linformer_theorem2_k(n, 8, e)])
def test_eps_outside_the_open_unit_interval_is_rejected(bound, eps):
    with pytest.raises(ValueError, match=r"eps .* open interval \(0, 1\)"):
        bound(100, eps)


@pytest.mark.parametrize("n_points", [1, 0, -5, 2.5, True])
def test_too_few_points_are_rejected(n_points):
    with pytest.raises(ValueError, match="n_points .* integer >= 2"):
        jl.jl_min_dim(n_points, 0.5)


def test_bad_sizes_are_rejected():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="k .* integer >= 1"):
        jl.gaussian_projection(0, 5, rng)
    with pytest.raises(ValueError, match="n .* integer >= 1"):
        jl.sparse_projection(3, 0, rng)
    with pytest.raises(ValueError, match="n .* integer >= 2"):
        jl.linformer_min_k(1, 0.5)
    with pytest.raises(ValueError, match="d .* integer >= 2"):
        jl.linformer_theorem2_k(100, 1, 0.5)
    with pytest.raises(ValueError, match=r"density .* \(0, 1\]"):
        jl.sparse_projection(3, 5, rng, density=0)
    for delta in (0, -0.1, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="delta .* positive finite"):
            jl.theorem2_projections(3, 5, rng, delta=delta)
    with pytest.raises(ValueError, match="d .* integer >= 2"):
        jl.theorem2_crossover_log10_n(1)
    with pytest.raises(ValueError, match="must share s"):
        jl.amplification_factor(np.ones((3, 4)), np.ones(5))


def test_rng_must_be_a_generator():
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        jl.gaussian_projection(3, 5, 0)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        jl.sparse_projection(3, 5, np.random.RandomState(0))


def test_bad_points_are_rejected():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="same n"):
        jl.pairwise_distortion(rng.standard_normal((4, 5)), rng.standard_normal((3, 6)))
    with pytest.raises(ValueError, match="at least 2 points"):
        jl.pairwise_sq_distances(np.ones((1, 3)))
    with pytest.raises(ValueError, match="identical rows"):
        jl.pairwise_distortion(np.ones((3, 2)), np.eye(2))
    with pytest.raises(ValueError, match="must share s"):
        jl.projected_attention_error(np.ones((3, 4)), np.ones(4), np.ones((2, 5)))


# --- Properties on tiny shapes ---------------------------------------------------------------

sizes = st.integers(1, 6)
seeds = st.integers(0, 2**32 - 1)


@settings(max_examples=30, deadline=None)
@given(k=sizes, n=sizes, seed=seeds, density=st.floats(0.05, 1.0))
def test_projection_shapes_and_sparse_values(k, n, seed, density):
    R = jl.gaussian_projection(k, n, np.random.default_rng(seed))
    S = jl.sparse_projection(k, n, np.random.default_rng(seed), density=density)
    assert R.shape == S.shape == (k, n)
    assert np.all(np.isclose(np.abs(S), 0) | np.isclose(np.abs(S), 1 / math.sqrt(density * k)))


distinct_points = hnp.arrays(np.float64, st.tuples(st.integers(2, 5), st.integers(1, 4)),
                             elements=st.floats(-10, 10)).filter(lambda X: jl.pairwise_sq_distances(X).min() > 1e-3)


@settings(max_examples=30, deadline=None)
@given(X=distinct_points, scale=st.floats(0.1, 10), seed=seeds)
def test_distortion_properties(X, scale, seed):
    n = X.shape[1]
    pairs = len(X) * (len(X) - 1) // 2
    # a scaled identity changes every squared distance by scale², exactly
    np.testing.assert_allclose(jl.pairwise_distortion(X, scale * np.eye(n)), abs(scale**2 - 1) * np.ones(pairs),
                               atol=1e-9)
    # ratios do not depend on where the points are or on their overall size
    R = jl.gaussian_projection(3, n, np.random.default_rng(seed))
    ratios = jl.distance_ratios(X, R)
    assert ratios.shape == (pairs,) and np.all(ratios >= 0)
    np.testing.assert_allclose(jl.distance_ratios(scale * X + 1.0, R), ratios, rtol=1e-6, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(n_points=st.integers(2, 10**6), eps=st.floats(0.01, 0.99), factor=st.floats(1.01, 2))
def test_bounds_shrink_with_eps_and_grow_with_n(n_points, eps, factor):
    assert jl.jl_min_dim(n_points, eps) >= jl.jl_min_dim(n_points, min(eps * factor, 0.999))
    assert jl.jl_min_dim(n_points, eps) <= jl.jl_min_dim(int(n_points * factor) + 1, eps)
    assert jl.linformer_min_k(n_points, eps) >= 1
    # Theorem 2 never asks for more than 5 ln n / ε², which is at most Theorem 1's 5 ln n / (ε² − ε³)
    assert jl.linformer_theorem2_k(n_points, 64, eps) <= jl.linformer_min_k(n_points, eps)
