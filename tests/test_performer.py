"""Performer FAVOR+: the random matrix, the three feature maps (statistically), attention against
softmax attention, both trees against each other, causal safety of the stabiliser, half
precision, and bad input.

Statistical tests are seeded, so they are deterministic; each tolerance is chosen so that the
claim would hold for almost every seed (stated per test), not tuned to the one seed used.
"""

import numpy as np
import pytest
import torch

from course_lib.numpy import full as np_full
from course_lib.numpy import performer as np_perf
from course_lib.torch import performer as torch_perf
from tests.conftest import make_qkv, padding_mask


@pytest.fixture(autouse=True)
def _one_thread():
    """Every tensor here is small: one thread, as thread-pool hand-offs would cost more than the work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


FEATURE_MAPS = {"positive": "positive_features", "hyperbolic": "hyperbolic_features", "trig": "trig_features"}


def _rng(tree, seed):
    if tree.name == "numpy":
        return np.random.default_rng(seed)
    return torch.Generator(device=tree.device).manual_seed(seed)


def _omega(tree, m, d, seed=0, **kwargs):
    """ω from ``tree``'s own random_matrix, as a NumPy float64 array."""
    extra = {} if tree.name == "numpy" else {"dtype": torch.float64}
    return tree.numpy(tree.performer.random_matrix(m, d, _rng(tree, seed), **extra, **kwargs))


def _features(tree, kind, x, omega):
    return tree.numpy(getattr(tree.performer, FEATURE_MAPS[kind])(*tree.arrays(x, omega)))


def _estimates(tree, kind, x, y, omegas):
    """φ(x)·φ(y) for each ω in ``omegas (r, m, d)`` → ``(r,)``."""
    phi_x, phi_y = (_features(tree, kind, z[None], omegas)[:, 0] for z in (x, y))  # (r, f)
    return np.einsum("rf,rf->r", phi_x, phi_y)


def _independent_omegas(tree, r, m, d, seed, orthogonal=True):
    """``(r, m, d)``: r independent draws of ω with m = d (one orthogonal block each)."""
    assert m == d  # consecutive groups of d rows of one tall draw are independent blocks
    return _omega(tree, r * m, d, seed, orthogonal=orthogonal).reshape(r, m, d)


# --- the random matrix ----------------------------------------------------------------------

def test_rows_within_a_block_are_orthogonal(tree):
    omega = _omega(tree, 150, 64)  # blocks of 64, 64 and 22 rows
    for start in (0, 64, 128):
        block = omega[start:start + 64]
        directions = block / np.linalg.norm(block, axis=-1, keepdims=True)
        gram = directions @ directions.T
        np.testing.assert_allclose(gram, np.eye(len(block)), atol=1e-10)
    across = omega[:64] @ omega[64:128].T  # rows of different blocks are independent, not orthogonal
    assert np.abs(across).max() > 1.0


def test_row_norms_chi_versus_sqrt_d(tree):
    m, d = 4096, 16
    np.testing.assert_allclose(np.linalg.norm(_omega(tree, m, d, scaling="sqrt_d"), axis=-1), np.sqrt(d), rtol=1e-12)
    for orthogonal in (True, False):
        squared = (_omega(tree, m, d, orthogonal=orthogonal) ** 2).sum(-1)  # χ²_d: mean d, variance 2d
        # 5 standard errors of the mean, √(2d/m) ≈ 0.09: a false failure has probability < 1e-6
        assert abs(squared.mean() - d) < 5 * np.sqrt(2 * d / m)
        assert abs(squared.var() - 2 * d) < 0.2 * 2 * d  # the norms really vary (sqrt_d: variance 0)
    iid_sqrt_d = _omega(tree, 8, d, orthogonal=False, scaling="sqrt_d")
    np.testing.assert_allclose(np.linalg.norm(iid_sqrt_d, axis=-1), np.sqrt(d), rtol=1e-12)


def test_sqrt_d_norms_make_a_biased_estimator_of_the_softmax_kernel(tree):
    from scipy.special import gammaln, ive

    d, m, r = 16, 64, 4000
    rng = np.random.default_rng(0)
    x, y = (0.3 * rng.standard_normal(d) for _ in range(2))  # exp(xᵀy) = 1.25, ‖x + y‖ = 1.5
    exact = np.exp(x @ y)
    # E over ω of φ(x)·φ(y) with every ‖ω_i‖ = √d: the mean of exp(√d uᵀz) over unit u (a Bessel function)
    nu, t = d / 2 - 1, np.sqrt(d) * np.linalg.norm(x + y)
    fixed_norm = np.exp(gammaln(d / 2) + nu * np.log(2 / t) + np.log(ive(nu, t)) + t - (x @ x + y @ y) / 2)
    means = {}
    for scaling, seed in (("chi", 10), ("sqrt_d", 20)):
        omegas = _omega(tree, r * m, d, seed, scaling=scaling).reshape(r, m, d)  # r draws of 4 whole blocks
        estimates = _estimates(tree, "positive", x, y, omegas)
        means[scaling] = (estimates.mean(), estimates.std() / np.sqrt(r))
    (chi, chi_se), (sqrt_d, sqrt_d_se) = means["chi"], means["sqrt_d"]
    # 5 standard errors around each expectation: a false failure has probability < 1e-6 for a normal
    # mean of 4000 draws (over 8 input pairs tried, both stayed within 2 SE); the bias is 6 % of exp(xᵀy)
    # here, 13-52 standard errors of the sqrt_d mean over those pairs, so 10 SE is a wide margin.
    assert abs(chi - exact) < 5 * chi_se
    assert abs(sqrt_d - fixed_norm) < 5 * sqrt_d_se
    assert exact - sqrt_d > 10 * sqrt_d_se and fixed_norm < 0.95 * exact


def test_the_generator_is_the_only_source_of_randomness(tree):
    np.testing.assert_array_equal(_omega(tree, 20, 8, seed=3), _omega(tree, 20, 8, seed=3))
    assert not np.allclose(_omega(tree, 20, 8, seed=3), _omega(tree, 20, 8, seed=4))


# --- the feature maps -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(FEATURE_MAPS))
@pytest.mark.parametrize("orthogonal", [True, False])
def test_features_are_unbiased_for_the_softmax_kernel(tree, kind, orthogonal):
    d, r = 8, 4000
    rng = np.random.default_rng(1)
    x, y = (0.6 * rng.standard_normal(d) for _ in range(2))
    estimates = _estimates(tree, kind, x, y, _independent_omegas(tree, r, d, d, seed=2, orthogonal=orthogonal))
    standard_error = estimates.std() / np.sqrt(r)
    # 5 standard errors: |z| > 5 has probability 6e-7 for a normal mean of 4000 draws
    assert abs(estimates.mean() - np.exp(x @ y)) < 5 * standard_error
    assert standard_error < 0.05 * np.exp(x @ y)  # and the interval is narrow enough to mean something


def test_mean_squared_error_falls_like_one_over_m(tree):
    d, r = 8, 600
    rng = np.random.default_rng(2)
    x, y = (0.3 * rng.standard_normal(d) for _ in range(2))  # small: positive estimates are lognormal,
    # and for ‖x + y‖ much above 1 their heavy tail makes a sample MSE unreliable
    ms = np.array([4, 16, 64, 256])
    mse = []
    for m in ms:
        omegas = _omega(tree, r * m, d, seed=int(m), orthogonal=False).reshape(r, m, d)  # i.i.d.: any m
        mse.append(((_estimates(tree, "positive", x, y, omegas) - np.exp(x @ y)) ** 2).mean())
    slope = np.polyfit(np.log(ms), np.log(mse), 1)[0]
    # the variance of a mean of m i.i.d. terms is exactly ∝ 1/m; with 600 draws per m the fitted
    # slope stayed within [-1.05, -0.9] over 10 seeds tried, so ±0.2 is a wide band
    assert -1.2 < slope < -0.8, slope


@pytest.mark.parametrize("kind", ["positive", "trig"])
def test_orthogonal_features_beat_iid_on_average(tree, kind):
    d, r = 16, 8000
    rng = np.random.default_rng(3)
    # small inputs keep the positive estimates' lognormal tail light enough for a sample MSE
    pairs = [(0.15 * rng.standard_normal(d), 0.15 * rng.standard_normal(d)) for _ in range(8)]
    errors = {}
    for orthogonal in (True, False):
        omegas = _independent_omegas(tree, r, d, d, seed=4, orthogonal=orthogonal)
        errors[orthogonal] = np.mean([((_estimates(tree, kind, x, y, omegas) - np.exp(x @ y)) ** 2).mean()
                                      for x, y in pairs])
    # Choromanski et al. 2020, Theorem 2 (and Yu et al. 2016 for trig): strictly smaller MSE; over
    # 12 seeds tried the ratio was 0.76-0.87 for positive features (about 0.2 for trig)
    assert errors[True] < 0.95 * errors[False], errors


def test_positive_features_are_positive_and_trig_estimates_can_be_negative(tree):
    d, r = 16, 500
    rng = np.random.default_rng(4)
    x = rng.standard_normal((50, d))
    omega = _omega(tree, 64, d)
    assert (_features(tree, "positive", x, omega) > 0).all()
    assert (_features(tree, "hyperbolic", x, omega) > 0).all()
    x = 0.5 * rng.standard_normal(d)
    y = -x  # exp(xᵀy) = exp(-‖x‖²) ≈ 0.02: a small kernel value
    omegas = _independent_omegas(tree, r, d, d, seed=5)
    assert (_estimates(tree, "positive", x, y, omegas) > 0).all()
    # the trig estimate's standard deviation (~1) dwarfs the true value (~0.02): about half are negative
    assert (_estimates(tree, "trig", x, y, omegas) < 0).mean() > 0.2


def test_hyperbolic_features_are_positive_features_of_omega_and_minus_omega(tree):
    rng = np.random.default_rng(5)
    x, omega = rng.standard_normal((3, 6, 8)), _omega(tree, 10, 8)
    expected = _features(tree, "positive", x, np.concatenate([omega, -omega]))
    np.testing.assert_allclose(_features(tree, "hyperbolic", x, omega), expected, rtol=1e-12)


# --- attention ------------------------------------------------------------------------------

def _performer(tree, q, k, v, omega, **kwargs):
    key_mask = kwargs.pop("key_mask", None)
    mask = None if key_mask is None else tree.array(key_mask)
    return tree.numpy(tree.performer.performer_attention(*tree.arrays(q, k, v, omega), key_mask=mask, **kwargs))


def _unstabilised(q, k, v, omega, kind, causal=False, key_mask=None):
    """The definition, quadratic and unstabilised: weights φ(q')·φ(k'), normalised, no eps."""
    scale = q.shape[-1] ** -0.25
    feature_map = getattr(np_perf, FEATURE_MAPS[kind])
    kernel = feature_map(q * scale, omega) @ np.swapaxes(feature_map(k * scale, omega), -1, -2)  # (..., n, s)
    if causal:
        kernel = np.tril(kernel)
    if key_mask is not None:
        kernel = kernel * key_mask[..., None, :]
    return kernel @ v / kernel.sum(-1, keepdims=True)


@pytest.mark.parametrize("kind", list(FEATURE_MAPS))
@pytest.mark.parametrize("causal, chunk_size", [(False, None), (True, None), (True, 3)])
@pytest.mark.parametrize("masked", [False, True])
def test_stabilised_equals_the_unstabilised_definition(tree, rng, kind, causal, chunk_size, masked):
    q, k, v = make_qkv(rng)
    k = 2.0 * k  # larger keys: exponents spread over tens, still far from float64 overflow
    omega = _omega(tree, 32, 5)
    key_mask = padding_mask([7, 4], 7)[:, None, :] if masked else None  # (b, 1, s)
    got = _performer(tree, q, k, v, omega, causal=causal, features=kind, chunk_size=chunk_size, key_mask=key_mask)
    expected = _unstabilised(q, k, v, omega, kind, causal, key_mask)
    # exact in exact arithmetic; trig weights are signed, so cancellation costs a few more digits
    np.testing.assert_allclose(got, expected, rtol=1e-9 if kind == "trig" else 1e-11, atol=1e-11)


@pytest.mark.parametrize("kind", list(FEATURE_MAPS))
def test_causal_equals_non_causal_on_each_prefix(tree, rng, kind):
    q, k, v = make_qkv(rng, n=9, s=9)
    omega = _omega(tree, 24, 5)
    causal = _performer(tree, q, k, v, omega, causal=True, features=kind)
    chunked = _performer(tree, q, k, v, omega, causal=True, features=kind, chunk_size=4)  # 4 does not divide 9
    np.testing.assert_allclose(chunked, causal, rtol=1e-10, atol=1e-12)
    for t in (0, 4, 8):
        prefix = _performer(tree, q[..., t:t + 1, :], k[..., :t + 1, :], v[..., :t + 1, :], omega, features=kind)
        np.testing.assert_allclose(causal[..., t:t + 1, :], prefix, rtol=1e-9, atol=1e-12)


def test_every_tree_matches_the_numpy_reference(tree, rng):
    q, k, v = make_qkv(rng)
    omega = _omega(tree, 16, 5)
    key_mask = padding_mask([7, 4], 7)[:, None, :]  # (b, 1, s)
    for kind in FEATURE_MAPS:
        np.testing.assert_allclose(_features(tree, kind, q, omega), getattr(np_perf, FEATURE_MAPS[kind])(q, omega),
                                   rtol=1e-12)
        for causal, mask in ((False, None), (False, key_mask), (True, None)):
            expected = np_perf.performer_attention(q, k, v, omega, causal=causal, features=kind, key_mask=mask)
            got = _performer(tree, q, k, v, omega, causal=causal, features=kind, key_mask=mask)
            np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_converges_to_softmax_attention_as_m_grows(tree, causal):
    rng = np.random.default_rng(6)
    q, k, v = make_qkv(rng, lead=(2,), n=32, s=32, d=16, e=8)
    q, k = 0.5 * q, 0.5 * k  # ‖q'‖² ≈ 1: unit-scale inputs need m in the thousands before the error falls
    exact = np_full.softmax_attention(q, k, v, causal=causal)
    error = {m: np.abs(_performer(tree, q, k, v, _omega(tree, m, 16, seed=m), causal=causal) - exact).mean()
             for m in (64, 4096)}
    # the error falls like 1/√m, an eighth from 64 to 4096 (a bit less: orthogonal features help
    # most at small m); over 8 seeds tried the ratio was 0.13-0.28
    assert error[4096] < 0.4 * error[64], error


@pytest.mark.parametrize("kind", ["positive", "hyperbolic"])
def test_torch_blocks_equal_the_numpy_reference(monkeypatch, rng, kind):
    q, k, v = make_qkv(rng, n=11, s=13)
    k[..., 7:, :] *= 3.0  # later blocks raise the running maximum: the rescaling of earlier sums runs
    omega = np_perf.random_matrix(8, 5, rng)
    key_mask = padding_mask([13, 3], 13)[:, None, :]  # (b, 1, s): row 1 has blocks of padding only
    monkeypatch.setattr(torch_perf, "BLOCK_ELEMENTS", 2 * 3 * 8 * 2)  # two positions per block
    for mask in (None, key_mask):
        expected = np_perf.performer_attention(q, k, v, omega, features=kind, key_mask=mask)
        got = torch_perf.performer_attention(*(torch.as_tensor(x) for x in (q, k, v, omega)), features=kind,
                                             key_mask=None if mask is None else torch.as_tensor(mask))
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-12)
    monkeypatch.setattr(torch_perf, "BLOCK_ELEMENTS", 2 * 8)  # two positions per block for one head
    leaves = [torch.tensor(x[0, 0, :5], requires_grad=True) for x in (q, k, v)]  # gradients through 3 blocks
    assert torch.autograd.gradcheck(lambda a, b, c: torch_perf.performer_attention(
        a, b, c, torch.as_tensor(omega), features=kind), leaves)


@pytest.mark.parametrize("causal", [False, True])
def test_huge_values_in_padded_slots_change_nothing(tree, rng, causal):
    q, k, v = make_qkv(rng)
    omega = _omega(tree, 16, 5)
    key_mask = padding_mask([7, 4], 7)[:, None, :]  # (b, 1, s)
    pads = ~key_mask[..., :, None]  # (b, 1, s, 1)
    k_huge, v_huge = np.where(pads, 1e30, k), np.where(pads, -1e30, v)
    for kind in FEATURE_MAPS:
        clean = _performer(tree, q, k, v, omega, causal=causal, features=kind, key_mask=key_mask)
        huge = _performer(tree, q, k_huge, v_huge, omega, causal=causal, features=kind, key_mask=key_mask)
        np.testing.assert_allclose(huge, clean, rtol=1e-12, atol=1e-12)


# --- causal safety: the future must not reach the past ---------------------------------------

def _future_probe(rng, omega, kind, t, n=32, d=64, factor=10.0):
    """Inputs, and the same inputs with the keys after position t made to dominate the global max."""
    q, k, v = make_qkv(rng, lead=(2,), n=n, s=n, d=d, e=8)
    future = k.copy()
    if kind == "trig":
        future[..., t + 1:, :] *= factor  # the exponent ‖k'‖²/2 grows factor² times
    else:
        # k' = ω_f for the longest row: the exponent reaches its bound max ‖ω‖²/2 (about 45 above
        # typical keys for d = 64); a key scaled by a constant would *lower* its exponent (−‖k'‖²/2)
        longest = omega[np.argmax((omega ** 2).sum(-1))]
        future[..., t + 1:, :] = longest * d ** 0.25
    return q, k, v, future


@pytest.mark.parametrize("kind", list(FEATURE_MAPS))
@pytest.mark.parametrize("chunk_size", [None, 8])
def test_the_future_cannot_change_earlier_outputs(tree, kind, chunk_size):
    rng = np.random.default_rng(7)
    t, d = 13, 64
    omega = _omega(tree, 128, d)
    q, k, v, future = _future_probe(rng, omega, kind, t)
    before = _performer(tree, q, k, v, omega, causal=True, features=kind, chunk_size=chunk_size)[..., :t + 1, :]
    after = _performer(tree, q, future, v, omega, causal=True, features=kind, chunk_size=chunk_size)[..., :t + 1, :]
    np.testing.assert_allclose(after, before, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", list(FEATURE_MAPS))
def test_a_global_max_stabiliser_leaks_the_future(kind):
    rng = np.random.default_rng(7)
    t, d = 13, 64
    omega = np_perf.random_matrix(128, d, np.random.default_rng(0))
    # trig: ×30 lifts ‖k'‖²/2 from ~5 to ~4500, past float64's underflow (e^-745)
    q, k, v, future = _future_probe(rng, omega, kind, t, factor=30.0)
    before = np_perf._global_max_causal_attention(q, k, v, omega, features=kind)[..., :t + 1, :]
    with np.errstate(all="ignore"):
        after = np_perf._global_max_causal_attention(q, future, v, omega, features=kind)[..., :t + 1, :]
    # the global maximum jumps (by ~45 for exp features, thousands for trig), every earlier key
    # feature shrinks by e^(-jump), and against the normaliser's eps of 1e-6 (exp features) or
    # float64 underflow (trig) earlier outputs move by O(1) or turn NaN, not by rounding
    assert not np.allclose(after, before, rtol=1e-3, atol=0.1)


def test_float32_causal_safety_and_the_trap():
    rng = np.random.default_rng(8)
    t, d = 13, 64
    omega = np_perf.random_matrix(128, d, np.random.default_rng(0))
    q, k, v, future = (torch.as_tensor(x, dtype=torch.float32) for x in _future_probe(rng, omega, "positive", t))
    omega = torch.as_tensor(omega, dtype=torch.float32)
    for chunk_size in (None, 8):
        before = torch_perf.performer_attention(q, k, v, omega, causal=True, chunk_size=chunk_size)[..., :t + 1, :]
        after = torch_perf.performer_attention(q, future, v, omega, causal=True, chunk_size=chunk_size)
        torch.testing.assert_close(after[..., :t + 1, :], before, rtol=1e-4, atol=1e-5)
    leaked = torch_perf._global_max_causal_attention(q, future, v, omega)[..., :t + 1, :]
    assert (leaked - before).abs().max() > 0.1


# --- half precision, gradients, bad input ---------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", list(FEATURE_MAPS))
@pytest.mark.parametrize("causal, chunk_size", [(False, None), (True, None), (True, 16)])
def test_half_precision_is_finite_and_close_to_float32(dtype, kind, causal, chunk_size):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (3 * torch.randn(2, 4, 64, 32, generator=generator) for _ in range(3))  # exp(3²·32/√32) ≫ fp16 max
    omega = torch_perf.random_matrix(64, 32, generator)
    half = torch_perf.performer_attention(q.to(dtype), k.to(dtype), v.to(dtype), omega, causal=causal,
                                          features=kind, chunk_size=chunk_size)
    full = torch_perf.performer_attention(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), omega,
                                          causal=causal, features=kind, chunk_size=chunk_size)
    assert half.dtype == dtype and torch.isfinite(half).all()
    if kind != "trig":  # a near-zero trig normaliser amplifies rounding without bound
        torch.testing.assert_close(half.float(), full, rtol=2e-2, atol=2e-2)  # one half-precision rounding


@pytest.mark.parametrize("kind", list(FEATURE_MAPS))
@pytest.mark.parametrize("causal, chunk_size", [(False, None), (True, None), (True, 3)])
def test_gradients_match_finite_differences(rng, kind, causal, chunk_size):
    q, k, v = (torch.tensor(x, requires_grad=True) for x in make_qkv(rng, lead=(2,), n=6, s=6, d=4, e=3))
    omega = torch.as_tensor(np_perf.random_matrix(8, 4, rng))
    assert torch.autograd.gradcheck(lambda a, b, c: torch_perf.performer_attention(
        a, b, c, omega, causal=causal, features=kind, chunk_size=chunk_size), (q, k, v))


def test_bad_input_raises_clear_errors(tree, rng):
    q, k, v = tree.arrays(*make_qkv(rng))
    omega = tree.array(_omega(tree, 8, 5))
    attention, random_matrix = tree.performer.performer_attention, tree.performer.random_matrix
    with pytest.raises(ValueError, match=r"omega must have shape \(\.\.\., m, d\).*d = 5"):
        attention(q, k, v, tree.array(_omega(tree, 8, 4)))
    with pytest.raises(ValueError, match="omega must have shape"):
        tree.performer.positive_features(q, omega[0])
    with pytest.raises(ValueError, match="features must be one of 'positive', 'hyperbolic', 'trig'"):
        attention(q, k, v, omega, features="relu")
    with pytest.raises(ValueError, match="m must be a positive integer"):
        random_matrix(0, 5, _rng(tree, 0))
    with pytest.raises(ValueError, match="d must be a positive integer"):
        random_matrix(4, -1, _rng(tree, 0))
    with pytest.raises(ValueError, match="scaling must be one of 'chi', 'sqrt_d'"):
        random_matrix(4, 5, _rng(tree, 0), scaling="unit")
    with pytest.raises(TypeError, match="rng must be a"):
        random_matrix(4, 5, 0)
    with pytest.raises(ValueError, match=r"n = s"):
        attention(q[..., :3, :], k, v, omega, causal=True)
