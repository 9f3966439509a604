"""Linear attention: each efficient form against its definition, the trees against each other,
the chunked backward (gradcheck, linear memory), half precision, padding, properties and bad input."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.numpy import linear as np_lin
from course_lib.torch import linear as torch_lin
from tests.conftest import ROOT, make_qkv, padding_mask, requires_cuda

CHUNK_SIZES = [None, 1, 2, 3, 4, 7, 16]  # None: prefix sums; 3 and 4 do not divide n = 7 or 10; 16 > n


def identity(x):
    return x


def _quadratic(q, k, v, causal=False, key_mask=None, eps=1e-6):
    """The definition, written out: the n × s kernel elu(q)+1 · elu(k)+1, masked, row-normalised."""
    kernel = np_lin.elu_feature_map(q) @ np.swapaxes(np_lin.elu_feature_map(k), -1, -2)  # (..., n, s)
    if causal:
        kernel = np.tril(kernel)
    if key_mask is not None:
        kernel = kernel * key_mask[..., None, :]
    return kernel @ v / (kernel.sum(-1, keepdims=True) + eps)


# --- each form against its definition, on every tree ----------------------------------------

@pytest.mark.parametrize("masked", [False, True])
def test_non_causal_equals_the_quadratic_kernel_form(tree, rng, masked):
    q, k, v = make_qkv(rng, n=6, s=7)
    key_mask = padding_mask([7, 4], 7)[:, None, :] if masked else None  # (b, 1, s)
    got = tree.linear.linear_attention(*tree.arrays(q, k, v),
                                       key_mask=None if key_mask is None else tree.array(key_mask))
    assert tuple(got.shape) == (2, 3, 6, 4)
    np.testing.assert_allclose(tree.numpy(got), _quadratic(q, k, v, key_mask=key_mask), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
@pytest.mark.parametrize("n", [7, 10])
def test_causal_reference_prefix_sums_and_chunks_agree(tree, rng, chunk_size, n):
    q, k, v = make_qkv(rng, n=n, s=n)
    expected = _quadratic(q, k, v, causal=True)
    reference = tree.linear.causal_linear_attention_reference(*tree.arrays(q, k, v))
    got = tree.linear.causal_linear_attention(*tree.arrays(q, k, v), chunk_size=chunk_size)
    np.testing.assert_allclose(tree.numpy(reference), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tree.numpy(got), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_from_features_is_what_the_map_functions_call(tree, rng, chunk_size):
    q, k, v = make_qkv(rng)
    phi_q, phi_k = np_lin.elu_feature_map(q), np_lin.elu_feature_map(k)
    causal = tree.linear.causal_linear_attention_from_features(*tree.arrays(phi_q, phi_k, v), chunk_size=chunk_size)
    plain = tree.linear.linear_attention_from_features(*tree.arrays(phi_q, phi_k, v))
    np.testing.assert_allclose(tree.numpy(causal), np_lin.causal_linear_attention(q, k, v), rtol=1e-12)
    np.testing.assert_allclose(tree.numpy(plain), np_lin.linear_attention(q, k, v), rtol=1e-12)


def test_rnn_steps_equal_the_causal_parallel_form(tree, rng):
    q, k, v = make_qkv(rng, n=9, s=9)
    parallel = np_lin.causal_linear_attention(q, k, v)
    state, outputs = None, []
    for t in range(9):
        out, state = tree.linear.linear_attention_step(*tree.arrays(q[..., t, :], k[..., t, :], v[..., t, :]), state)
        outputs.append(tree.numpy(out))
    np.testing.assert_allclose(np.stack(outputs, axis=-2), parallel, rtol=1e-12, atol=1e-12)
    kv_state, key_sum = (tree.numpy(x) for x in state)
    assert kv_state.shape == (2, 3, 5, 4) and key_sum.shape == (2, 3, 5)  # (b, h, f, e), (b, h, f)
    np.testing.assert_allclose(key_sum, np_lin.elu_feature_map(k).sum(-2), rtol=1e-12)


def test_a_step_returns_a_new_state_and_leaves_the_old_one(tree, rng):
    q, k, v = tree.arrays(*(rng.standard_normal((2, 3)) for _ in range(3)))
    _, first = tree.linear.linear_attention_step(q, k, v, None)
    before = [tree.numpy(x).copy() for x in first]
    _, second = tree.linear.linear_attention_step(q, k, v, first)
    for old, kept in zip(before, first, strict=True):
        np.testing.assert_array_equal(tree.numpy(kept), old)
    np.testing.assert_allclose(tree.numpy(second[1]), 2 * before[1], rtol=1e-12)


@pytest.mark.parametrize("shape", [(2, 0, 3), (0, 5, 3)])  # no positions; no sequences
@pytest.mark.parametrize("chunk_size", [None, 4])
def test_empty_inputs_give_empty_outputs(tree, shape, chunk_size):
    x = tree.array(np.ones(shape))
    assert tuple(tree.linear.causal_linear_attention(x, x, x, chunk_size=chunk_size).shape) == shape
    assert tuple(tree.linear.linear_attention(x, x, x).shape) == shape


# --- padding, eps, feature maps -------------------------------------------------------------

@pytest.mark.parametrize("huge", [1e4, np.inf, np.nan])
def test_padded_keys_contribute_nothing(tree, rng, huge):
    q, k, v = make_qkv(rng, lead=(2,), n=5, s=7)
    lengths = [7, 4]
    key_mask = padding_mask(lengths, 7)  # (b, s)
    pads = ~key_mask[..., :, None]
    k_huge, v_huge = np.where(pads, 1e4, k), np.where(pads, huge, v)
    got = tree.numpy(tree.linear.linear_attention(*tree.arrays(q, k_huge, v_huge), key_mask=tree.array(key_mask)))
    assert np.isfinite(got).all()
    for i, s in enumerate(lengths):
        alone = np_lin.linear_attention(q[i], k[i, :s], v[i, :s])
        np.testing.assert_allclose(got[i], alone, rtol=1e-12, atol=1e-12)


def test_eps_turns_zero_over_zero_into_zero(tree):
    q = tree.array(-np.ones((1, 3, 2)))  # relu features of an all-negative query are zero
    k, v = tree.array(np.ones((1, 3, 2))), tree.array(np.ones((1, 3, 2)))
    for out in (tree.linear.linear_attention(q, k, v, feature_map=tree.linear.relu_feature_map),
                tree.linear.causal_linear_attention(q, k, v, feature_map=tree.linear.relu_feature_map, chunk_size=2)):
        np.testing.assert_array_equal(tree.numpy(out), 0.0)


def test_feature_maps(tree):
    x = np.linspace(-30, 30, 61)
    elu = tree.numpy(tree.linear.elu_feature_map(tree.array(x)))
    # atol: torch computes elu as expm1(x), whose + 1 rounds exp(x) to the nearest 2^-53 absolute
    np.testing.assert_allclose(elu, np.where(x > 0, x + 1, np.exp(x)), rtol=1e-12, atol=2e-16)
    assert (elu > 0).all()
    np.testing.assert_array_equal(tree.numpy(tree.linear.relu_feature_map(tree.array(x))), np.maximum(x, 0))


def test_elu_features_keep_a_gradient_for_negative_inputs():
    x = torch.tensor([-3.0, -0.5, 0.5], dtype=torch.float64, requires_grad=True)
    torch_lin.elu_feature_map(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([np.exp(-3.0), np.exp(-0.5), 1.0], dtype=torch.float64))


# --- the chunked backward -------------------------------------------------------------------

@pytest.fixture
def one_thread():
    """Tiny tensors gain nothing from threads, and on a busy machine each threaded op waits for its turn."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# c = 1, c not dividing n, c dividing n, c = n, c > n; 11 chunks of 1 are summed in blocks of 4, the last padded
@pytest.mark.parametrize("n, chunk_size", [(7, 1), (7, 2), (7, 3), (6, 3), (7, 7), (7, 9), (11, 1)])
def test_gradcheck_of_the_chunked_causal_sums(one_thread, chunk_size, n):
    gen = torch.Generator().manual_seed(n * 10 + chunk_size)
    a, b = (torch.rand(2, n, 2, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, n, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, v: torch_lin.chunked_causal_sums(a, b, v, chunk_size), (a, b, v))


@pytest.mark.parametrize("n, chunk_size", [(300, 4), (256, 2), (97, 1)])  # g = 75, 128, 97 chunks
def test_chunked_sums_equal_the_numpy_ones_with_many_chunks(rng, n, chunk_size):
    phi_q, phi_k, v = (np_lin.elu_feature_map(x) for x in make_qkv(rng, lead=(2,), n=n, s=n))
    expected = np_lin.chunked_causal_sums(phi_q, phi_k, v, chunk_size)
    got = torch_lin.chunked_causal_sums(*(torch.as_tensor(x) for x in (phi_q, phi_k, v)), chunk_size)
    for x, y in zip(got, expected, strict=True):
        np.testing.assert_allclose(x.numpy(), y, rtol=1e-12)


def test_gradcheck_of_chunked_causal_attention_with_broadcast_heads(one_thread):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 6, 2, generator=gen, dtype=torch.float64, requires_grad=True)  # (b, h, n, d)
    k = torch.randn(1, 1, 6, 2, generator=gen, dtype=torch.float64, requires_grad=True)  # one key head
    v = torch.randn(1, 2, 6, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: torch_lin.causal_linear_attention(q, k, v, chunk_size=4), (q, k, v))


def test_chunked_gradients_equal_prefix_sum_gradients(one_thread):
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(2, 2, 37, 8, generator=gen, dtype=torch.float64) for _ in range(3)]
    grad_out = torch.randn(2, 2, 37, 8, generator=gen, dtype=torch.float64)
    grads = {}
    for chunk_size in (None, 1, 8, 16, 64):
        leaves = [x.clone().requires_grad_() for x in inputs]
        torch_lin.causal_linear_attention(*leaves, chunk_size=chunk_size).backward(grad_out)
        grads[chunk_size] = [leaf.grad for leaf in leaves]
    for chunk_size in (1, 8, 16, 64):
        for got, expected in zip(grads[chunk_size], grads[None], strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


MEMORY_SCRIPT = """
import json, sys, torch
from course_lib.bench import peak_memory
from course_lib.torch.linear import causal_linear_attention
from course_lib.torch.performer import performer_attention, random_matrix
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
omega = random_matrix(128, 64, gen, dtype=torch.float32)  # (f, d)
CALLS = {"linear": lambda q, k, v, **options: causal_linear_attention(q, k, v, **options),
         "favor": lambda q, k, v, **options: performer_attention(q, k, v, omega, causal=True, **options)}
def peak(kernel, n, **options):  # options: none at all for the default call
    q, k, v, grad = (torch.randn(1, 2, n, 64, generator=gen) for _ in range(4))  # (b, h, n, d)
    def call():
        for x in (q, k, v):
            x.grad = None
        CALLS[kernel](q, k, v, **options).backward(grad)
    for x in (q, k, v):
        x.requires_grad_()
    peaks = []
    for _ in range(3):  # the least of three: the resident set at the peak varies by a tensor or so
        for x in (q, k, v):
            x.grad = None
        peaks.append(peak_memory(call, "cpu")[0])
    return min(peaks)
kernel = sys.argv[1]
peak(kernel, 512)  # warm-up: first-call allocations of the thread pool and the allocator
print(json.dumps({"default_2048": peak(kernel, 2048), "default_8192": peak(kernel, 8192),
                  "prefix_2048": peak(kernel, 2048, chunk_size=None)}))
"""


@pytest.mark.parametrize("kernel, f", [("linear", 64), ("favor", 128)])
def test_default_causal_memory_grows_linearly_and_stays_far_below_the_prefix_sum_states(kernel, f):
    done = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, kernel], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, check=True)
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    states_bytes = lambda n: 2 * n * f * 64 * 4  # (b·h, n, f, e) float32: what autograd of cumsum keeps
    # Linear growth gives a ratio of 4 for 4× n; 4.5 leaves room for the page-granular measurement
    # (4 KiB pages, < 1 MiB of Python objects on peaks of tens of MiB); n·log n would still pass, n² would not.
    assert peaks["default_8192"] / peaks["default_2048"] <= 4.5, peaks
    # Measured for elu+1: the default's peak is ≈ 0.19 of the states (about 12 (n, d)-sized tensors: inputs'
    # grads, features, outputs, two (n, c) score blocks); the prefix-sum peak is ≈ 4× them.
    assert peaks["default_8192"] < 0.3 * states_bytes(8192), peaks
    assert peaks["prefix_2048"] >= states_bytes(2048), peaks  # the naive form does keep them: the test can tell


def test_default_numpy_causal_forward_memory_grows_linearly():
    import tracemalloc

    def peak(n, **options):
        q, k, v = (np.random.default_rng(0).standard_normal((2, n, 32)) for _ in range(3))  # (h, n, d)
        tracemalloc.start()  # NumPy reports its array buffers to tracemalloc
        np_lin.causal_linear_attention(q, k, v, **options)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak

    states_bytes = 2 * 2048 * 32 * 32 * 8  # (h, n, f, e) float64: the prefix sums' forward holds them all
    assert peak(8192) / peak(2048) <= 4.5  # linear: 4; the bound as in the torch test above
    assert peak(8192) < 0.5 * states_bytes * 4
    assert peak(2048, chunk_size=None) >= states_bytes  # the teaching form does hold them: the test can tell


# --- half precision -------------------------------------------------------------------------

def test_a_float16_running_sum_stalls_which_is_why_we_accumulate_in_float32():
    # NumPy adds in float16: past 2048 the spacing of float16 is 2, so 2048 + 1 rounds back to 2048.
    assert np.cumsum(np.ones(4096, dtype=np.float16))[-1] == 2048


@pytest.mark.parametrize("chunk_size", [None, 64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, np.float16],
                         ids=["torch-f16", "torch-bf16", "numpy-f16"])
def test_half_precision_causal_run_at_4096_stays_close_to_float32(chunk_size, dtype):
    gen = torch.Generator().manual_seed(0)
    torch_dtype = torch.float16 if dtype is np.float16 else dtype
    q, k, v = (torch.randn(1, 4096, 8, generator=gen).to(torch_dtype) for _ in range(3))
    if dtype is np.float16:
        q, k, v = (x.numpy() for x in (q, k, v))
        half = np_lin.causal_linear_attention(q, k, v, chunk_size=chunk_size)
        full = np_lin.causal_linear_attention(*(x.astype(np.float32) for x in (q, k, v)), chunk_size=chunk_size)
        half, full = torch.as_tensor(half), torch.as_tensor(full)
    else:
        half = torch_lin.causal_linear_attention(q, k, v, chunk_size=chunk_size)
        full = torch_lin.causal_linear_attention(q.float(), k.float(), v.float(), chunk_size=chunk_size)
    assert half.dtype == torch_dtype
    # The outputs are averages of values of size ~1: rounding the result to the half dtype costs
    # one unit in the last place (2^-11 for float16, 2^-8 for bfloat16).  A normaliser summed in
    # float16 would stall at 2048 and be wrong by up to 2x in the second half of the sequence.
    tolerance = 2 * torch.finfo(torch_dtype).eps
    torch.testing.assert_close(half.float(), full, rtol=tolerance, atol=tolerance)


# --- properties -----------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 9), t=st.integers(0, 8), chunk_size=st.sampled_from(CHUNK_SIZES),
       use_torch=st.booleans(), seed=st.integers(0, 2**16))
def test_causal_output_ignores_the_future(n, t, chunk_size, use_torch, seed):
    t = min(t, n - 2)
    rng = np.random.default_rng(seed)
    q, k, v = make_qkv(rng, lead=(2,), n=n, s=n, d=3, e=2)
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for x in (q2, k2, v2):
        x[..., t + 1:, :] = 10 * rng.standard_normal(x[..., t + 1:, :].shape)
    module, wrap = (torch_lin, torch.as_tensor) if use_torch else (np_lin, np.asarray)
    before = np.asarray(module.causal_linear_attention(wrap(q), wrap(k), wrap(v), chunk_size=chunk_size))
    after = np.asarray(module.causal_linear_attention(wrap(q2), wrap(k2), wrap(v2), chunk_size=chunk_size))
    np.testing.assert_array_equal(after[..., : t + 1, :], before[..., : t + 1, :])
    assert not np.allclose(after[..., t + 1:, :], before[..., t + 1:, :])  # the future did change


@settings(max_examples=25, deadline=None)
@given(dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
       lead=st.lists(st.integers(1, 3), max_size=2), n=st.integers(1, 6), s=st.integers(1, 6),
       e=st.integers(1, 4), chunk_size=st.sampled_from(CHUNK_SIZES))
def test_shapes_and_dtypes_are_preserved(dtype, lead, n, s, e, chunk_size):
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(*lead, m, 3, generator=gen).to(dtype) for m in (n, s))
    v = torch.randn(*lead, s, e, generator=gen).to(dtype)
    out = torch_lin.linear_attention(q, k, v)
    assert out.dtype == dtype and tuple(out.shape) == (*lead, n, e)
    causal = torch_lin.causal_linear_attention(k, k, v, chunk_size=chunk_size)
    assert causal.dtype == dtype and tuple(causal.shape) == (*lead, s, e)
    step, (kv_state, key_sum) = torch_lin.linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], None)
    assert step.dtype == dtype and tuple(step.shape) == (*lead, e)
    assert kv_state.dtype == key_sum.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    np_out = np_lin.causal_linear_attention(*(x.double().numpy() for x in (k, k, v)), chunk_size=chunk_size)
    assert np_out.dtype == np.float64 and np_out.shape == tuple(causal.shape)


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("shapes, match", [
    (((2, 5, 3), (2, 5, 4), (2, 5, 2)), r"q and k must share the head dim d"),
    (((2, 5, 3), (2, 5, 3), (2, 4, 2)), r"k and v must have the same number of key positions s"),
    (((2, 5, 3), (3, 5, 3), (3, 5, 2)), r"q and k leading \(batch/head\) dims do not broadcast"),
    (((2, 4, 3), (2, 5, 3), (2, 5, 2)), r"causal attention needs as many queries as keys"),
    (((3,), (3,), (3,)), r"q must have shape \(\.\.\., positions, dim\)"),
])
def test_bad_shapes_name_the_argument(tree, shapes, match):
    q, k, v = (tree.array(np.ones(shape)) for shape in shapes)
    with pytest.raises(ValueError, match=match):
        tree.linear.causal_linear_attention(q, k, v, chunk_size=2)


@pytest.mark.parametrize("chunk_size, error", [(0, ValueError), (-1, ValueError), (2.0, TypeError),
                                               (True, TypeError), ("8", TypeError)])
def test_bad_chunk_size(tree, chunk_size, error):
    q = tree.array(np.ones((4, 2)))
    with pytest.raises(error, match="chunk_size must be"):
        tree.linear.causal_linear_attention(q, q, q, chunk_size=chunk_size)


def test_integer_inputs_and_masks_are_refused(tree):
    q, ints = tree.array(np.ones((4, 2))), tree.array(np.ones((4, 2), dtype=np.int64))
    with pytest.raises(TypeError, match="v must hold floating-point numbers"):
        tree.linear.linear_attention(q, q, ints)
    with pytest.raises(TypeError, match="q_t must hold floating-point numbers"):
        tree.linear.linear_attention_step(ints[0], q[0], q[0], None)
    with pytest.raises(TypeError, match="key_mask must be boolean"):
        tree.linear.linear_attention(q, q, q, key_mask=tree.array(np.ones(4)))


@pytest.mark.parametrize("which", ["linear", "causal", "chunked", "reference", "step"])
def test_a_feature_map_that_is_not_positive_is_refused(tree, rng, which):
    q, k, v = tree.arrays(*make_qkv(rng))
    calls = {"linear": lambda: tree.linear.linear_attention(q, k, v, feature_map=identity),
             "causal": lambda: tree.linear.causal_linear_attention(q, k, v, feature_map=identity),
             "chunked": lambda: tree.linear.causal_linear_attention(q, k, v, feature_map=identity, chunk_size=2),
             "reference": lambda: tree.linear.causal_linear_attention_reference(q, k, v, feature_map=identity),
             "step": lambda: tree.linear.linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], None,
                                                               feature_map=identity)}
    with pytest.raises(ValueError, match="feature_map must return non-negative features"):
        calls[which]()


@pytest.mark.parametrize("causal", [False, True])
def test_features_with_negative_entries_are_refused_by_name(tree, causal):
    # A negative entry whose weights still sum positive: the old normaliser check alone let it through.
    phi = np.ones((3, 2))
    signed = phi.copy()
    signed[0, 1] = -0.5
    call = (tree.linear.causal_linear_attention_from_features if causal
            else tree.linear.linear_attention_from_features)
    v = tree.array(np.ones((3, 2)))
    for name, (phi_q, phi_k) in (("phi_q", (signed, phi)), ("phi_k", (phi, signed))):
        with pytest.raises(ValueError, match=f"{name} must be non-negative features, but has entries down to -0.5.*"
                                             "allow_negative=True"):
            call(*tree.arrays(phi_q, phi_k), v)


@pytest.mark.parametrize("chunk_size", [None, 2, "default"])
def test_allow_negative_divides_by_the_signed_normaliser(tree, rng, chunk_size):
    phi_q, phi_k, v = rng.standard_normal((5, 3)), rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    kernel = phi_q @ phi_k.T  # (n, s), mixed signs
    expected = kernel @ v / kernel.sum(-1, keepdims=True)  # eps = 0: the signed ratio exactly
    plain = tree.linear.linear_attention_from_features(*tree.arrays(phi_q, phi_k, v), eps=0.0, allow_negative=True)
    np.testing.assert_allclose(tree.numpy(plain), expected, rtol=1e-10)
    options = {} if chunk_size == "default" else {"chunk_size": chunk_size}
    causal = tree.linear.causal_linear_attention_from_features(*tree.arrays(phi_q, phi_k, v), eps=0.0,
                                                               allow_negative=True, **options)
    np.testing.assert_allclose(tree.numpy(causal), np.tril(kernel) @ v / np.tril(kernel).sum(-1, keepdims=True),
                               rtol=1e-10)
    # A negative normaliser is harmless in itself: flipping the sign of every key feature changes nothing.
    flipped = tree.linear.linear_attention_from_features(*tree.arrays(phi_q, -phi_k, v), eps=0.0, allow_negative=True)
    np.testing.assert_allclose(tree.numpy(flipped), expected, rtol=1e-10)


def test_the_default_causal_call_is_the_chunked_form(tree):
    import inspect

    functions = [tree.linear.causal_linear_attention, tree.linear.causal_linear_attention_from_features,
                 tree.performer.performer_attention]
    for fn in functions:
        assert inspect.signature(fn).parameters["chunk_size"].default == tree.linear.DEFAULT_CHUNK_SIZE, fn
    assert isinstance(tree.linear.DEFAULT_CHUNK_SIZE, int) and tree.linear.DEFAULT_CHUNK_SIZE >= 1


def test_bad_step_state(tree):
    x = tree.array(np.ones((2, 3)))
    with pytest.raises(ValueError, match="state must be None or the pair"):
        tree.linear.linear_attention_step(x, x, x, x)
    with pytest.raises(ValueError, match=r"state \(S, Z\) must have S \(\.\.\., f, e\) = \(\.\.\., 3, 3\)"):
        tree.linear.linear_attention_step(x, x, x, (tree.array(np.ones((2, 3, 4))), tree.array(np.ones((2, 3)))))


def test_mixed_dtypes_are_refused_in_torch():
    q = torch.ones(4, 2)
    with pytest.raises(TypeError, match="must share one dtype"):
        torch_lin.linear_attention(q, q, q.double())


# --- CUDA -----------------------------------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_chunked_forward_and_backward_match_cpu(dtype):
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(2, 2, 300, 16, generator=gen).to(dtype) for _ in range(3)]
    grads = {}
    for device in ("cpu", "cuda"):
        leaves = [x.to(device).requires_grad_() for x in inputs]
        out = torch_lin.causal_linear_attention(*leaves, chunk_size=64)
        out.float().sum().backward()
        grads[device] = [out.float().cpu()] + [leaf.grad.float().cpu() for leaf in leaves]
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2  # different summation orders; float16 outputs round
    for cuda, cpu in zip(grads["cuda"], grads["cpu"], strict=True):
        torch.testing.assert_close(cuda, cpu, rtol=tolerance, atol=tolerance)
