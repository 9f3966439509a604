"""Exact attention: both trees against each other, against PyTorch's SDPA, and their properties."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.numpy import full as np_full
from course_lib.torch import full as torch_full
from tests.conftest import make_qkv, padding_mask, requires_cuda


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_every_tree_matches_the_numpy_reference(tree, rng, causal, masked):
    q, k, v = make_qkv(rng)
    key_mask = padding_mask([7, 4], 7)[:, None, :] if masked else None  # (b, 1, s)
    expected = np_full.softmax_attention(q, k, v, causal=causal, key_mask=key_mask)
    args = tree.arrays(q, k, v)
    got = tree.full.softmax_attention(*args, causal=causal, key_mask=None if key_mask is None else tree.array(key_mask))
    np.testing.assert_allclose(tree.numpy(got), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_matches_scaled_dot_product_attention(rng, causal, masked):
    q, k, v = (torch.as_tensor(x) for x in make_qkv(rng, e=5))
    key_mask = torch.as_tensor(padding_mask([7, 3], 7))[:, None, :] if masked else None  # (b, 1, s)
    sdpa_mask = None
    if masked:
        sdpa_mask = key_mask[..., None, :]  # (b, 1, 1, s)
        if causal:
            sdpa_mask = sdpa_mask & torch.ones(7, 7, dtype=torch.bool).tril()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, is_causal=causal and not masked)
    numpy_mask = None if key_mask is None else key_mask.numpy()
    numpy_out = np_full.softmax_attention(q.numpy(), k.numpy(), v.numpy(), causal=causal, key_mask=numpy_mask)
    ours = torch_full.softmax_attention(q, k, v, causal=causal, key_mask=key_mask)
    for tree_out in (ours, torch.as_tensor(numpy_out)):
        torch.testing.assert_close(tree_out, expected, rtol=1e-10, atol=1e-10)


def test_weights_are_the_context_mapping_matrix(tree, rng):
    q, k, v = make_qkv(rng)
    weights = tree.numpy(tree.full.attention_weights(*tree.arrays(q, k)))
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    expected = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, expected, rtol=1e-12)


def test_causal_mask_aligns_queries_with_the_last_keys():
    assert np_full.causal_mask(3, 3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert np_full.causal_mask(1, 4).all()  # one new token after a cache of 3 sees all 4 keys
    assert (torch_full.causal_mask(2, 5).numpy() == np_full.causal_mask(2, 5)).all()


def test_a_query_with_no_real_key_gets_zero_weights_not_nan(tree, rng):
    q, k, v = make_qkv(rng, lead=(1,))
    key_mask = np.zeros((1, 7), bool)
    out = tree.numpy(tree.full.softmax_attention(*tree.arrays(q, k, v), key_mask=tree.array(key_mask)))
    assert np.isfinite(out).all() and (out == 0).all()


def test_large_scores_do_not_overflow(tree, rng):
    q, k, v = make_qkv(rng)
    out = tree.numpy(tree.full.softmax_attention(*tree.arrays(q * 1e3, k * 1e3, v)))
    assert np.isfinite(out).all()


def test_half_precision_is_normalised_in_float32(rng):
    q, k, v = (torch.as_tensor(x, dtype=torch.float16) for x in make_qkv(rng, n=64, s=64))
    weights = torch_full.attention_weights(q, k)
    assert weights.dtype == torch.float16
    torch.testing.assert_close(weights.float().sum(-1), torch.ones(2, 3, 64), rtol=2e-3, atol=2e-3)


# --- multi-head attention ------------------------------------------------------------------

def test_split_and_merge_heads_are_inverse(tree, rng):
    x = tree.array(rng.standard_normal((2, 5, 12)))
    heads = tree.full.split_heads(x, 3)
    assert tuple(heads.shape) == (2, 3, 5, 4)
    np.testing.assert_array_equal(tree.numpy(tree.full.merge_heads(heads)), tree.numpy(x))
    # head j holds columns j*d ... (j+1)*d - 1 of the width
    np.testing.assert_array_equal(tree.numpy(heads)[:, 1], tree.numpy(x)[..., 4:8])


def test_numpy_multi_head_matches_torch_module(rng):
    module = torch_full.MultiHeadAttention(12, 3, bias=False).double()
    x = rng.standard_normal((2, 6, 12))
    key_mask = padding_mask([6, 4], 6)
    layers = (module.q_proj, module.k_proj, module.v_proj, module.out_proj)
    weights = [layer.weight.detach().numpy().T for layer in layers]
    expected = np_full.multi_head_attention(x, *weights, 3, causal=True, key_mask=key_mask)
    got = module(torch.as_tensor(x), causal=True, key_mask=torch.as_tensor(key_mask))
    np.testing.assert_allclose(got.detach().numpy(), expected, rtol=1e-12, atol=1e-12)


def test_module_matches_torch_multihead_attention(rng):
    ours = torch_full.MultiHeadAttention(16, 4).double()
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=True).double()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.as_tensor(rng.standard_normal((2, 5, 16)))
    key_mask = torch.as_tensor(padding_mask([5, 2], 5))
    expected, _ = theirs(x, x, x, key_padding_mask=~key_mask, need_weights=False)
    torch.testing.assert_close(ours(x, key_mask=key_mask), expected)


def test_the_attention_kernel_is_pluggable(rng):
    calls = []

    def spy(q, k, v, *, causal=False, key_mask=None):
        calls.append((tuple(q.shape), causal))
        return torch_full.softmax_attention(q, k, v, causal=causal, key_mask=key_mask)

    module = torch_full.MultiHeadAttention(8, 2, attention=spy)
    out = module(torch.randn(3, 4, 8), causal=True)
    assert out.shape == (3, 4, 8) and calls == [((3, 2, 4, 4), True)]


def test_gradients_flow_through_the_module():
    module = torch_full.MultiHeadAttention(8, 2).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    module(x, causal=True).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in module.parameters())


def test_gradcheck_float64():
    q, k, v = (torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    assert torch.autograd.gradcheck(lambda q, k, v: torch_full.softmax_attention(q, k, v, causal=True, key_mask=mask),
                                    (q, k, v))


# --- properties -------------------------------------------------------------------------------

shapes = st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 4), st.integers(1, 4))


@settings(max_examples=40, deadline=None)
@given(shape=shapes, causal=st.booleans(), seed=st.integers(0, 2**16))
def test_rows_of_p_sum_to_one(shape, causal, seed):
    n, s, d, _ = shape
    if causal:
        s = n
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((n, d)) * 3, rng.standard_normal((s, d)) * 3
    weights = np_full.attention_weights(q, k, causal=causal)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-12)
    assert (weights >= 0).all()
    torch.testing.assert_close(torch_full.attention_weights(torch.as_tensor(q), torch.as_tensor(k), causal=causal),
                               torch.as_tensor(weights))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 8), t=st.integers(0, 7), seed=st.integers(0, 2**16))
def test_causal_output_ignores_future_inputs(n, t, seed):
    t = t % n
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((n, 3)) for _ in range(3))
    before = np_full.softmax_attention(q, k, v, causal=True)
    k2, v2, q2 = k.copy(), v.copy(), q.copy()
    for x in (q2, k2, v2):
        x[t + 1:] = rng.standard_normal(x[t + 1:].shape) * 10  # rewrite the future
    after = np_full.softmax_attention(q2, k2, v2, causal=True)
    np.testing.assert_allclose(after[: t + 1], before[: t + 1], rtol=1e-12)
    torch_after = torch_full.softmax_attention(*(torch.as_tensor(x) for x in (q2, k2, v2)), causal=True)
    np.testing.assert_allclose(torch_after.numpy()[: t + 1], before[: t + 1], rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtype_and_shape_are_preserved(dtype):
    q, k, v = torch.randn(2, 5, 4, dtype=dtype), torch.randn(2, 6, 4, dtype=dtype), torch.randn(2, 6, 3, dtype=dtype)
    out = torch_full.softmax_attention(q, k, v)
    assert out.dtype == dtype and out.shape == (2, 5, 3)


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("make, error, match", [
    (lambda a: (a((3, 4)), a((3, 5)), a((3, 2))), ValueError, r"q and k must share the head dim d"),
    (lambda a: (a((3, 4)), a((3, 4)), a((5, 2))), ValueError, r"k and v must have the same number of key positions"),
    (lambda a: (a((3,)), a((3, 4)), a((3, 2))), ValueError, r"q must have shape \(\.\.\., positions, dim\)"),
    (lambda a: (a((2, 3, 4)), a((5, 3, 4)), a((5, 3, 2))), ValueError, r"leading \(batch/head\) dims"),
])
def test_bad_shapes_name_the_argument(tree, make, error, match):
    q, k, v = make(lambda shape: tree.array(np.ones(shape)))
    with pytest.raises(error, match=match):
        tree.full.softmax_attention(q, k, v)


def test_integer_inputs_are_rejected(tree):
    q = tree.array(np.ones((3, 4), dtype=np.int64))
    v = tree.array(np.ones((3, 2)))
    with pytest.raises(TypeError, match="q must hold floating-point numbers"):
        tree.full.softmax_attention(q, tree.array(np.ones((3, 4))), v)


@pytest.mark.parametrize("mask_shape, match", [((2, 5), r"key_mask must have shape \(\.\.\., s\) with s = 4"),
                                               ((3, 4), r"key_mask leading dims")])
def test_bad_key_mask_shape_names_the_argument(tree, mask_shape, match):
    q, k, v = (tree.array(np.ones((2, 4, 3))) for _ in range(3))
    with pytest.raises(ValueError, match=match):
        tree.full.softmax_attention(q, k, v, key_mask=tree.array(np.ones(mask_shape, bool)))


def test_non_boolean_key_mask_is_rejected(tree):
    q, k, v = (tree.array(np.ones((2, 4, 3))) for _ in range(3))
    with pytest.raises(TypeError, match="key_mask must be boolean"):
        tree.full.softmax_attention(q, k, v, key_mask=tree.array(np.ones((2, 4))))


def test_heads_must_divide_the_width():
    with pytest.raises(ValueError, match="n_heads must be a positive divisor"):
        torch_full.MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="d_model = 10, n_heads = 4"):
        np_full.split_heads(np.ones((2, 10)), 4)


@requires_cuda
def test_cuda_matches_sdpa_in_float32():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", generator=gen) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(torch_full.softmax_attention(q, k, v, causal=True), expected, rtol=2e-4, atol=2e-5)
