"""Learned feature maps (Hedgehog, T2R): the maps against their formulas on every tree, the explicit
linear-attention weights against the library's linear attention, entropy and the distillation loss,
the trainable modules, and bad input."""

import math

import numpy as np
import pytest
import torch

from course_lib.numpy import feature_maps as np_fm
from course_lib.torch import feature_maps as torch_fm
from course_lib.torch.linear import linear_attention_from_features
from tests.conftest import padding_mask


def _params(rng, lead=(3,), f=4, d=5):
    return rng.standard_normal((*lead, f, d)), rng.standard_normal((*lead, f))


def _softmax(u):
    e = np.exp(u - u.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# --- the maps against their formulas ------------------------------------------------------------

@pytest.mark.parametrize("normalise", [True, False])
def test_hedgehog_is_exp_of_both_signs_per_head(tree, rng, normalise):
    x = rng.standard_normal((2, 3, 6, 5))  # (b, h, n, d)
    weight, bias = _params(rng)  # (h, f, d), (h, f): one map per head
    got = tree.numpy(tree.feature_maps.hedgehog_feature_map(*tree.arrays(x, weight, bias), normalise=normalise))
    u = np.stack([x[:, i] @ weight[i].T + bias[i] for i in range(3)], axis=1)  # (b, h, n, f), head by head
    expected = (np.concatenate([_softmax(u), _softmax(-u)], -1) if normalise
                else np.concatenate([np.exp(u), np.exp(-u)], -1))
    assert got.shape == (2, 3, 6, 8)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


def test_softmax_form_is_each_half_of_the_exp_form_rescaled(rng):
    x = rng.standard_normal((4, 5))
    weight, bias = _params(rng, lead=())
    bare = np_fm.hedgehog_feature_map(x, weight, bias, normalise=False)  # (n, 2f)
    scaled = np.concatenate([bare[:, :4] / bare[:, :4].sum(-1, keepdims=True),
                             bare[:, 4:] / bare[:, 4:].sum(-1, keepdims=True)], -1)
    np.testing.assert_allclose(np_fm.hedgehog_feature_map(x, weight, bias), scaled, rtol=1e-12)


def test_softmax_form_does_not_overflow_where_the_bare_exp_does(tree):
    x = np.full((1, 2), 400.0)  # Wx = 800: exp overflows float64
    weight, bias = np.eye(2) * 2, np.zeros(2)
    with np.errstate(over="ignore"):
        bare = tree.numpy(tree.feature_maps.hedgehog_feature_map(*tree.arrays(x, weight, bias), normalise=False))
    assert np.isinf(bare).any()
    normalised = tree.numpy(tree.feature_maps.hedgehog_feature_map(*tree.arrays(x, weight, bias)))
    assert np.isfinite(normalised).all() and (normalised > 0).all() and (normalised <= 1).all()


def test_t2r_is_relu_of_an_affine_map(tree, rng):
    x = rng.standard_normal((2, 3, 6, 5))
    weight, bias = _params(rng, f=7)
    got = tree.numpy(tree.feature_maps.t2r_feature_map(*tree.arrays(x, weight, bias)))
    expected = np.maximum(np.einsum("bhnd,hfd->bhnf", x, weight) + bias[None, :, None, :], 0)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    assert (got >= 0).all() and (got == 0).any()


# --- the explicit weights, entropy and the loss ---------------------------------------------------

@pytest.mark.parametrize("masked", [False, True])
def test_explicit_weights_times_v_is_linear_attention(tree, rng, masked):
    phi_q, phi_k = np.exp(rng.standard_normal((2, 3, 6, 8))), np.exp(rng.standard_normal((2, 3, 7, 8)))
    v = rng.standard_normal((2, 3, 7, 4))
    key_mask = padding_mask([7, 4], 7)[:, None, :] if masked else None  # (b, 1, s)
    mask = None if key_mask is None else tree.array(key_mask)
    weights = tree.numpy(tree.feature_maps.linear_attention_weights(*tree.arrays(phi_q, phi_k), key_mask=mask))
    out = linear_attention_from_features(*(torch.as_tensor(a) for a in (phi_q, phi_k, v)),
                                         key_mask=None if key_mask is None else torch.as_tensor(key_mask))
    np.testing.assert_allclose(weights @ v, out.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)  # eps = 1e-6 beside sums of order 1-10
    if masked:
        assert (weights[1, ..., 4:] == 0).all()


def test_explicit_weights_refuse_negative_features(tree, rng):
    phi = rng.standard_normal((5, 3))
    with pytest.raises(ValueError, match="non-negative"):
        tree.feature_maps.linear_attention_weights(*tree.arrays(phi, np.abs(phi)))


def test_entropy_is_zero_for_a_spike_and_log_s_for_uniform_rows(tree):
    spike = np.eye(4)[None]  # (1, n, s): each row all on one key
    assert np.allclose(tree.numpy(tree.feature_maps.row_entropy(tree.array(spike))), 0.0)
    uniform = np.full((2, 3, 5), 0.2)
    np.testing.assert_allclose(tree.numpy(tree.feature_maps.row_entropy(tree.array(uniform))), math.log(5))
    padded = np.concatenate([np.full((3, 2), 0.5), np.zeros((3, 3))], -1)  # two real keys of five
    key_mask = np.array([True, True, False, False, False])
    got = tree.numpy(tree.feature_maps.row_entropy(*tree.arrays(padded), key_mask=tree.array(key_mask)))
    np.testing.assert_allclose(got, math.log(2))


def test_cross_entropy_is_smallest_at_the_teacher_and_drops_padded_rows(tree, rng):
    teacher = _softmax(rng.standard_normal((2, 6, 6)))  # (b, n, s)
    student = _softmax(rng.standard_normal((2, 6, 6)))
    xent = tree.feature_maps.attention_cross_entropy
    own = float(xent(*tree.arrays(teacher, teacher)))
    np.testing.assert_allclose(own, np_fm.row_entropy(teacher).mean(), rtol=1e-9)
    assert float(xent(*tree.arrays(teacher, student))) > own  # Gibbs' inequality
    key_mask = padding_mask([6, 3], 6)  # (b, s) = (b, n): query rows 3-5 of text 1 are padding
    rows = -(teacher * np.log(student + 1e-12)).sum(-1)  # (b, n)
    got = float(xent(*tree.arrays(teacher, student), key_mask=tree.array(key_mask)))
    np.testing.assert_allclose(got, rows[key_mask].mean(), rtol=1e-9)


# --- a sliding window beside the learned kernel (Eq. 10.9) -------------------------------------------

def _window_case(rng, b=2, h=3, n=11, d=4, f=5, e=6):
    q, k = rng.standard_normal((b, h, n, d)) * 2, rng.standard_normal((b, h, n, d)) * 2  # spiky scores
    v = rng.standard_normal((b, h, n, e))
    phi_q, phi_k = np.exp(rng.standard_normal((b, h, n, f))), np.exp(rng.standard_normal((b, h, n, f)))
    return q, k, v, phi_q, phi_k, rng.standard_normal((h, 1, 1))  # log_scale: one per head


@pytest.mark.parametrize("window", [0, 2, 30])
def test_window_weights_are_the_band_of_softmax_plus_the_scaled_kernel(tree, rng, window):
    q, k, v, phi_q, phi_k, log_scale = _window_case(rng)
    mask = padding_mask([11, 7], 11)[:, None, :]  # (b, 1, s): one mask for every head
    got = tree.numpy(tree.feature_maps.window_linear_weights(*tree.arrays(q, k, phi_q, phi_k), window=window,
                                                             log_scale=tree.array(log_scale),
                                                             key_mask=tree.array(mask)))
    near = np.abs(np.arange(11)[:, None] - np.arange(11)[None, :]) <= window  # written out from Eq. (10.9)
    numerator = near * np.exp(q @ k.swapaxes(-1, -2) / 2) + np.exp(log_scale) * (phi_q @ phi_k.swapaxes(-1, -2))
    numerator = numerator * mask[..., None, :]
    np.testing.assert_allclose(got, numerator / numerator.sum(-1, keepdims=True), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("n, window", [(11, 0), (11, 3), (70, 1), (70, 40), (64, 5)])
def test_window_attention_is_its_weights_times_v_without_forming_them(tree, rng, n, window):
    # n = 70 is not a whole number of the torch form's 32-query blocks; window 40 spans several blocks
    q, k, v, phi_q, phi_k, log_scale = _window_case(rng, n=n)
    mask = padding_mask([n, n - 4], n)[:, None, :]  # (b, 1, s)
    args = dict(window=window, log_scale=tree.array(log_scale), key_mask=tree.array(mask))
    weights = tree.numpy(tree.feature_maps.window_linear_weights(*tree.arrays(q, k, phi_q, phi_k), **args))
    got = tree.numpy(tree.feature_maps.window_linear_attention(*tree.arrays(q, k, v, phi_q, phi_k), **args))
    np.testing.assert_allclose(got, weights @ v, rtol=1e-10, atol=1e-12)


def test_a_window_over_every_key_with_no_kernel_is_softmax_attention(tree, rng):
    q, k, v, phi_q, phi_k, _ = _window_case(rng)
    got = tree.numpy(tree.feature_maps.window_linear_attention(*tree.arrays(q, k, v, phi_q, phi_k), window=10,
                                                               log_scale=-200.0))  # γ = e^-200: no kernel left
    expected = tree.numpy(tree.full.softmax_attention(*tree.arrays(q, k, v)))
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_window_attention_stays_finite_where_the_exponentials_overflow(rng):
    # scores of several hundred and a large γ: exp() of either overflows float32; the row shift keeps it finite
    q, k, v, phi_q, phi_k, _ = (torch.from_numpy(x).float() for x in _window_case(rng))
    out = torch_fm.window_linear_attention(q * 30, k * 30, v, phi_q, phi_k, window=2, log_scale=150.0)
    assert torch.isfinite(out).all()
    reference = np_fm.window_linear_attention(*(x.double().numpy() for x in (q * 30, k * 30, v, phi_q, phi_k)),
                                              window=2, log_scale=150.0)
    np.testing.assert_allclose(out.numpy(), reference, rtol=1e-4, atol=1e-4)


def test_window_attention_in_half_precision_sums_in_float32(rng):
    q, k, v, phi_q, phi_k, log_scale = (torch.from_numpy(x) for x in _window_case(rng))
    args = dict(window=2, log_scale=log_scale.half())
    half = torch_fm.window_linear_attention(*(x.half() for x in (q, k, v, phi_q, phi_k)), **args)
    assert half.dtype == torch.float16
    full = torch_fm.window_linear_attention(q, k, v, phi_q, phi_k, window=2, log_scale=log_scale)
    torch.testing.assert_close(half.double(), full, rtol=0.02, atol=0.02)  # float16 inputs: ~3 decimal digits


def test_window_attention_has_the_gradient_of_its_definition():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    phi_q, phi_k = (torch.rand(1, 2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    log_scale = torch.zeros(2, 1, 1, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[[True] * 5 + [False]]])
    assert torch.autograd.gradcheck(lambda *a: torch_fm.window_linear_attention(*a[:5], window=1, log_scale=a[5],
                                                                                key_mask=mask),
                                    (q, k, v, phi_q, phi_k, log_scale))


def test_window_functions_refuse_bad_input(tree, rng):
    q, k, v, phi_q, phi_k, _ = _window_case(rng)
    with pytest.raises(ValueError, match="window must be an int >= 0"):
        tree.feature_maps.window_linear_attention(*tree.arrays(q, k, v, phi_q, phi_k), window=-1)
    with pytest.raises(ValueError, match="window must be an int >= 0"):
        tree.feature_maps.window_linear_weights(*tree.arrays(q, k, phi_q, phi_k), window=1.5)
    with pytest.raises(ValueError, match="q and k need as many positions"):
        tree.feature_maps.window_linear_weights(*tree.arrays(q[..., :5, :], k, phi_q[..., :5, :], phi_k), window=1)
    with pytest.raises(ValueError, match="phi_q and phi_k must be the features of q and k"):
        tree.feature_maps.window_linear_weights(*tree.arrays(q, k, phi_q[..., :5, :], phi_k), window=1)
    with pytest.raises(ValueError, match="non-negative"):
        tree.feature_maps.window_linear_attention(*tree.arrays(q, k, v, -phi_q, phi_k), window=1)


# --- the trainable modules -----------------------------------------------------------------------

def test_hedgehog_module_starts_at_the_identity_and_trains(rng):
    fmap = torch_fm.HedgehogFeatureMap(n_heads=3, head_dim=5)
    x = torch.as_tensor(rng.standard_normal((2, 3, 6, 5)))
    expected = torch.cat([torch.softmax(x, -1), torch.softmax(-x, -1)], -1)
    torch.testing.assert_close(fmap.double()(x), expected)
    assert fmap.n_features == 10 and {n for n, _ in fmap.named_parameters()} == {"weight", "bias"}
    fmap(x)[..., 0].sum().backward()
    assert fmap.weight.grad.abs().sum() > 0 and fmap.bias.grad.abs().sum() > 0
    fewer = torch_fm.HedgehogFeatureMap(3, 5, n_features=2)
    assert tuple(fewer.weight.shape) == (3, 2, 5) and fewer.n_features == 4


def test_t2r_module_is_seeded_and_non_negative():
    a, b = (torch_fm.T2RFeatureMap(3, 5, 8, generator=torch.Generator().manual_seed(1)) for _ in range(2))
    torch.testing.assert_close(a.weight, b.weight)
    x = torch.randn(2, 3, 6, 5)
    assert a(x).shape == (2, 3, 6, 8) and (a(x) >= 0).all()


@pytest.mark.parametrize("cls", [torch_fm.HedgehogFeatureMap, torch_fm.T2RFeatureMap])
def test_a_half_precision_module_maps_float32_inputs_as_linear_attention_feeds_them(cls):
    fmap = cls(3, 5, 4, generator=torch.Generator().manual_seed(0)) if cls is torch_fm.T2RFeatureMap else cls(3, 5)
    x = torch.randn(2, 3, 6, 5, generator=torch.Generator().manual_seed(1))  # float32, as _features passes half x
    expected = fmap(x)
    got = fmap.half()(x)  # the parameters in float16, the input in float32
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-3)  # W rounded to float16: ~3 decimal digits


@pytest.mark.parametrize("cls, args", [(torch_fm.HedgehogFeatureMap, (3, 5, 0)), (torch_fm.T2RFeatureMap, (3, 5, 0))])
def test_modules_refuse_no_features(cls, args):
    with pytest.raises(ValueError, match="n_features"):
        cls(*args)


# --- bad input ---------------------------------------------------------------------------------------

def test_bad_weight_and_bias_shapes_are_named(tree, rng):
    x = rng.standard_normal((6, 5))
    with pytest.raises(ValueError, match=r"weight must have shape \(\.\.\., f, d\) with d = 5"):
        tree.feature_maps.hedgehog_feature_map(*tree.arrays(x, rng.standard_normal((4, 3)), np.zeros(4)))
    with pytest.raises(ValueError, match=r"bias must have shape \(\.\.\., f\) with f = 4"):
        tree.feature_maps.t2r_feature_map(*tree.arrays(x, rng.standard_normal((4, 5)), np.zeros(3)))
    with pytest.raises(TypeError, match="x must hold floating-point"):
        tree.feature_maps.t2r_feature_map(*tree.arrays(np.ones((6, 5), dtype=int), np.ones((4, 5)), np.zeros(4)))


def test_the_torch_map_names_mixed_dtypes():
    x, weight, bias = torch.randn(6, 5), torch.randn(4, 5, dtype=torch.float16), torch.zeros(4)
    with pytest.raises(ValueError, match="x, weight and bias must share one dtype, got torch.float32, torch.float16"):
        torch_fm.hedgehog_feature_map(x, weight, bias)
