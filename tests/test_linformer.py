"""Linformer: both trees against each other and against exact attention; padding, shorter
inputs, sharing modes and their parameter counts, the causal leak, and bad input."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib import tasks
from course_lib.numpy import full as np_full
from course_lib.numpy import linformer as np_lin
from course_lib.torch import full as torch_full
from course_lib.torch import linformer as torch_lin
from tests.conftest import make_qkv, padding_mask, requires_cuda


def _projections(rng, shape):
    return rng.standard_normal(shape) / np.sqrt(shape[-2]), rng.standard_normal(shape) / np.sqrt(shape[-2])



# --- the two trees and exact attention ------------------------------------------------------

@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_every_tree_matches_the_numpy_reference(tree, rng, per_head, masked):
    q, k, v = make_qkv(rng)
    E, F = _projections(rng, (3, 4, 9) if per_head else (4, 9))  # (h, k, n_max) or (k, n_max)
    key_mask = padding_mask([7, 4], 7)[:, None, :] if masked else None  # (b, 1, s)
    expected = np_lin.linformer_attention(q, k, v, E, F, key_mask=key_mask)
    got = tree.linformer.linformer_attention(*tree.arrays(q, k, v, E, F),
                                             key_mask=None if key_mask is None else tree.array(key_mask))
    assert tuple(got.shape) == (2, 3, 7, 4)
    np.testing.assert_allclose(tree.numpy(got), expected, rtol=1e-12, atol=1e-12)


def test_identity_projections_give_exact_attention(tree, rng):
    q, k, v = make_qkv(rng)
    eye = np.eye(7)  # k = n: E k = k, F v = v
    got = tree.linformer.linformer_attention(*tree.arrays(q, k, v, eye, eye))
    np.testing.assert_allclose(tree.numpy(got), np_full.softmax_attention(q, k, v), rtol=1e-12, atol=1e-12)


def test_weights_are_softmax_of_projected_scores(tree, rng):
    q, k, _ = make_qkv(rng)
    E, _ = _projections(rng, (3, 7))
    weights = tree.numpy(tree.linformer.linformer_weights(*tree.arrays(q, k, E)))
    scores = q @ np.swapaxes(E @ k, -1, -2) / np.sqrt(q.shape[-1])  # (b, h, n, k)
    np.testing.assert_allclose(weights, np.exp(scores) / np.exp(scores).sum(-1, keepdims=True), rtol=1e-12)


# --- padding and shorter inputs -------------------------------------------------------------

@pytest.mark.parametrize("batched", [False, True])
def test_huge_values_in_padded_slots_change_nothing(tree, rng, batched):
    lead = (2, 3) if batched else ()
    q, k, v = make_qkv(rng, lead=lead)
    E, F = _projections(rng, (4, 7))
    key_mask = padding_mask([5, 3], 7)[:, None, :] if batched else padding_mask([5], 7)[0]  # (b, 1, s) or (s,)
    pads = ~key_mask[..., :, None]  # (..., s, 1)
    k_huge, v_huge = np.where(pads, 1e30, k), np.where(pads, -1e30, v)
    mask = tree.array(key_mask)
    clean = tree.linformer.linformer_attention(*tree.arrays(q, k, v, E, F), key_mask=mask)
    huge = tree.linformer.linformer_attention(*tree.arrays(q, k_huge, v_huge, E, F), key_mask=mask)
    np.testing.assert_allclose(tree.numpy(huge), tree.numpy(clean), rtol=1e-12, atol=1e-12)
    assert np.isfinite(tree.numpy(huge)).all()


def test_a_padded_batch_equals_each_sequence_alone(tree, rng):
    q, k, v = make_qkv(rng, lead=(2,), n=7)
    E, F = _projections(rng, (4, 9))
    lengths = [7, 4]
    batch = tree.numpy(tree.linformer.linformer_attention(*tree.arrays(q, k, v, E, F),
                                                          key_mask=tree.array(padding_mask(lengths, 7))))
    for i, s in enumerate(lengths):  # alone: only the s real keys, so E is sliced to E[:, :s]
        alone = tree.linformer.linformer_attention(*tree.arrays(q[i], k[i, :s], v[i, :s], E, F))
        np.testing.assert_allclose(batch[i], tree.numpy(alone), rtol=1e-12, atol=1e-12)


def test_shorter_inputs_use_the_first_columns(tree, rng):
    q, k, v = make_qkv(rng, n=5, s=5)
    E, F = _projections(rng, (3, 8))  # n_max = 8 > s = 5
    got = tree.linformer.linformer_attention(*tree.arrays(q, k, v, E, F))
    expected = np_full.softmax_attention(q, E[:, :5] @ k, F[:, :5] @ v)
    np.testing.assert_allclose(tree.numpy(got), expected, rtol=1e-12, atol=1e-12)


# --- the causal leak ------------------------------------------------------------------------

@pytest.mark.parametrize("t", [0, 3, 5])
def test_linformer_leaks_the_future_and_causal_softmax_does_not(tree, rng, t):
    q, k, v = tree.arrays(*make_qkv(rng, lead=(), n=7))
    E, F = tree.arrays(*_projections(rng, (3, 7)))
    linformer = lambda q, k, v: tree.linformer.linformer_attention(q, k, v, E, F)
    causal = lambda q, k, v: tree.full.softmax_attention(q, k, v, causal=True)
    assert tree.linformer.causal_leak(linformer, q, k, v, t) > 1e-3  # the output at t moved
    assert tree.linformer.causal_leak(causal, q, k, v, t) == 0.0


def test_the_module_refuses_causal_mode():
    with pytest.raises(ValueError, match="cannot be causal"):
        torch_lin.LinformerSelfAttention(8, 2, max_len=6, k=3, causal=True)
    module = torch_lin.LinformerSelfAttention(8, 2, max_len=6, k=3)
    with pytest.raises(TypeError, match="causal"):
        module(torch.randn(1, 6, 8), causal=True)  # causality is the constructor's, never a call's


# --- sharing modes --------------------------------------------------------------------------

@pytest.mark.parametrize("module", [np_lin, torch_lin])
def test_projection_matrix_counts_of_a_12_layer_12_head_model(module):
    counts = {mode: module.count_projection_matrices(12, 12, mode) for mode in module.SHARING_MODES}
    assert counts == {"none": 288, "headwise": 24, "key-value": 12, "layerwise": 1}


@pytest.mark.parametrize("sharing", torch_lin.SHARING_MODES)
@pytest.mark.parametrize("n_layers, n_heads", [(1, 2), (3, 4)])
def test_module_parameters_agree_with_the_count(sharing, n_layers, n_heads):
    max_len, k = 10, 4
    model = torch_lin.LinformerEncoder(n_layers, 8, n_heads, max_len, k, sharing)
    exact = torch_lin.LinformerEncoder(n_layers, 8, n_heads, max_len, None)
    count = torch_lin.count_projection_matrices(n_layers, n_heads, sharing)
    assert torch_lin.distinct_projection_matrices(model) == count
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in exact.parameters())
    assert extra == count * k * max_len


def test_layerwise_sharing_is_one_parameter_everywhere():
    model = torch_lin.LinformerEncoder(3, 8, 2, 10, 4, "layerwise")
    layers = [layer.attention for layer in model.layers]
    assert all(a.E is model.shared_projection and a.F is model.shared_projection for a in layers)
    x = torch.randint(0, 16, (2, 10))
    model(x).sum().backward()  # every layer's use adds to the one gradient
    assert model.shared_projection.grad is not None and model.shared_projection.grad.abs().sum() > 0


def test_key_value_sharing_uses_one_parameter_for_e_and_f():
    module = torch_lin.LinformerSelfAttention(8, 2, 10, 4, sharing="key-value")
    assert module.E is module.F and tuple(module.E.shape) == (4, 10)
    none = torch_lin.LinformerSelfAttention(8, 2, 10, 4, sharing="none")
    assert tuple(none.E.shape) == (2, 4, 10) and none.E is not none.F


def test_projections_start_as_n_0_1_over_k():
    torch.manual_seed(0)
    E = torch_lin.projection_parameter(64, 512)
    # 32768 draws: the sample variance is within 3 % of 1/k with overwhelming probability
    assert abs(E.var().item() * 64 - 1) < 0.03 and abs(E.mean().item()) < 0.01


def test_module_matches_the_function_withpadding_mask(rng):
    module = torch_lin.LinformerSelfAttention(8, 2, 10, 4, sharing="none").double()
    x = torch.as_tensor(rng.standard_normal((2, 6, 8)))
    key_mask = torch.as_tensor(padding_mask([6, 3], 6))
    heads = [torch_full.split_heads(proj(x), 2) for proj in (module.q_proj, module.k_proj, module.v_proj)]
    expected = torch_lin.linformer_attention(*heads, module.E, module.F, key_mask=key_mask[:, None, :])
    expected = module.out_proj(torch_full.merge_heads(expected))
    torch.testing.assert_close(module(x, key_mask=key_mask), expected)


@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_ignores_padding_tokens(norm_first):
    torch.manual_seed(0)
    model = torch_lin.LinformerEncoder(2, 8, 2, 10, 4, "headwise", norm_first=norm_first).double()
    tokens = torch.randint(0, 16, (1, 10))
    key_mask = torch.arange(10)[None, :] < 6
    other = tokens.clone()
    other[:, 6:] = (other[:, 6:] + 1) % 16  # different padding tokens
    a, b = model(tokens, key_mask=key_mask), model(other, key_mask=key_mask)
    torch.testing.assert_close(a[:, :6], b[:, :6])


# --- autograd and devices -------------------------------------------------------------------

def test_gradcheck_float64():
    q, k, v = (torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    E, F = (torch.randn(3, 6, dtype=torch.float64, requires_grad=True) for _ in range(2))
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    assert torch.autograd.gradcheck(lambda q, k, v, E, F: torch_lin.linformer_attention(q, k, v, E, F, key_mask=mask),
                                    (q, k, v, E, F))


@requires_cuda
def test_cuda_matches_cpu(rng):
    q, k, v = (torch.as_tensor(x) for x in make_qkv(rng))
    E, F = (torch.as_tensor(x) for x in _projections(rng, (3, 4, 9)))
    key_mask = torch.as_tensor(padding_mask([7, 4], 7))[:, None, :]
    cpu = torch_lin.linformer_attention(q, k, v, E, F, key_mask=key_mask)
    cuda = torch_lin.linformer_attention(*(x.cuda() for x in (q, k, v, E, F)), key_mask=key_mask.cuda())
    torch.testing.assert_close(cuda.cpu(), cpu)
    model = torch_lin.LinformerEncoder(2, 8, 2, 10, 4, "layerwise").cuda()
    assert model(torch.randint(0, 16, (2, 10), device="cuda")).shape == (2, 10, 16)


# --- properties -----------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), s=st.integers(1, 6), extra=st.integers(0, 3), d=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_rows_of_projected_weights_sum_to_one(n, s, extra, d, seed):
    rng = np.random.default_rng(seed)
    k_proj = rng.integers(1, s + 1)
    q, k = rng.standard_normal((n, d)) * 3, rng.standard_normal((s, d)) * 3
    E = rng.standard_normal((k_proj, s + extra))  # n_max = s + extra >= s
    weights = np_lin.linformer_weights(q, k, E)
    assert weights.shape == (n, k_proj) and (weights >= 0).all()
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-12)
    torch.testing.assert_close(torch_lin.linformer_weights(*(torch.as_tensor(x) for x in (q, k, E))),
                               torch.as_tensor(weights))


@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
       lead=st.lists(st.integers(1, 3), max_size=2), n=st.integers(1, 5), s=st.integers(2, 6),
       e=st.integers(1, 4))
def test_dtype_and_shape_are_preserved(dtype, lead, n, s, e):
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(*lead, m, 3, generator=gen).to(dtype) for m in (n, s))
    v = torch.randn(*lead, s, e, generator=gen).to(dtype)
    E, F = (torch.randn(2, s + 1, generator=gen).to(dtype) for _ in range(2))
    out = torch_lin.linformer_attention(q, k, v, E, F)
    assert out.dtype == dtype and tuple(out.shape) == (*lead, n, e)
    np_out = np_lin.linformer_attention(*(x.double().numpy() for x in (q, k, v, E, F)))
    assert np_out.dtype == np.float64 and np_out.shape == tuple(out.shape)


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("make, error, match", [
    (lambda a: (a((5, 3)), a((3, 5))), ValueError, r"E has k = 5 rows, more than its n = 3 columns"),
    (lambda a: (a((2, 4)), a((2, 4))), ValueError, r"E must have shape \(\.\.\., k, n\) with n >= s = 5"),
    (lambda a: (a((2, 6)), a((3, 6))), ValueError, r"E and F must have the same shape"),
    (lambda a: (a((2, 6)), a((2, 6))[..., :4]), ValueError, r"F must have shape \(\.\.\., k, n\) with n >= s"),
    (lambda a: (a((4, 2, 6)), a((4, 2, 6))), ValueError, r"E leading dims \(4,\) do not broadcast"),
    (lambda a: (a((6,)), a((6,))), ValueError, r"E must have shape \(\.\.\., k, n\)"),
])
def test_bad_projections_name_the_argument(tree, make, error, match):
    q, k, v = (tree.array(np.ones(shape)) for shape in ((3, 5, 2), (3, 5, 2), (3, 5, 2)))
    E, F = make(lambda shape: tree.array(np.ones(shape)))
    with pytest.raises(error, match=match):
        tree.linformer.linformer_attention(q, k, v, E, F)


def test_integer_projections_are_refused(tree):
    q = tree.array(np.ones((5, 2)))
    E = tree.array(np.ones((2, 5), dtype=np.int64))
    with pytest.raises(TypeError, match="E must hold floating-point numbers"):
        tree.linformer.linformer_attention(q, q, q, E, E * 1.0)
    with pytest.raises(TypeError, match="F must hold floating-point numbers"):
        tree.linformer.linformer_attention(q, q, q, E * 1.0, E)


@pytest.mark.parametrize("module", [np_lin, torch_lin])
def test_unknown_sharing_mode_lists_the_valid_ones(module):
    with pytest.raises(ValueError, match=r"sharing must be one of 'none', 'headwise', 'key-value', 'layerwise'"):
        module.count_projection_matrices(12, 12, "kv")
    with pytest.raises(ValueError, match="n_layers must be a positive integer"):
        module.count_projection_matrices(0, 12, "none")


def test_module_arguments_are_checked():
    with pytest.raises(ValueError, match=r"k must satisfy 1 <= k <= max_len.*max_len = 8.*k = 9"):
        torch_lin.LinformerSelfAttention(8, 2, max_len=8, k=9)
    with pytest.raises(ValueError, match="shared_projection is only used with sharing='layerwise'"):
        torch_lin.LinformerSelfAttention(8, 2, 8, 4, sharing="headwise", shared_projection=torch.zeros(4, 8))
    with pytest.raises(ValueError, match=r"shared_projection must have shape \(k, max_len\) = \(4, 8\)"):
        torch_lin.LinformerSelfAttention(8, 2, 8, 4, sharing="layerwise", shared_projection=torch.zeros(4, 9))
    with pytest.raises(ValueError, match="sharing must be one of"):
        torch_lin.LinformerSelfAttention(8, 2, 8, 4, sharing="kv")


# --- the lesson 05 task ---------------------------------------------------------------------

def test_reversal_batches_are_fixed_by_the_generator():
    a = tasks.reversal_batch(4, 6, 8, torch.Generator().manual_seed(3))
    b = tasks.reversal_batch(4, 6, 8, torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    tokens, targets = a
    assert tokens.shape == (4, 6) and tokens.dtype == torch.int64 and int(tokens.max()) < 8
    assert torch.equal(targets[:, 0], tokens[:, -1]) and torch.equal(targets.flip(-1), tokens)


def test_a_short_training_run_is_reproducible_and_learns():
    def run():
        torch.manual_seed(0)
        model = torch_lin.LinformerEncoder(1, 16, 2, 8, 4, "layerwise", vocab_size=4)
        history = tasks.train_reversal(model, n=8, vocab_size=4, steps=20, generator=torch.Generator().manual_seed(0))
        evaluation = tasks.evaluate_reversal(model, n=8, vocab_size=4, generator=torch.Generator().manual_seed(1),
                                             batch_size=32)
        return history, evaluation

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: tiny ops, and the same summation order on every machine
    try:
        first, second = run(), run()
    finally:
        torch.set_num_threads(threads)
    assert first == second  # same seeds, same losses to the last bit
    history, _ = first
    assert history["step"][-1] == 20 and history["loss"][-1] < history["loss"][0]


# --- lesson 04: mean pooling, fitted projections, the stored comparison -------------------------

@pytest.mark.parametrize("k, s", [(4, 16), (3, 10), (5, 5)])
def test_mean_pooling_averages_consecutive_blocks(tree, k, s):
    pool = tree.numpy(tree.linformer.mean_pooling(k, s))
    assert pool.shape == (k, s)
    np.testing.assert_allclose(pool.sum(axis=-1), 1.0, rtol=1e-6)  # each row an average (float32 on torch)
    assert np.all((pool > 0).sum(axis=0) == 1)  # every position in exactly one block
    columns = [np.flatnonzero(row) for row in pool]
    assert all(c[-1] + 1 == n[0] for c, n in zip(columns, columns[1:], strict=False))  # consecutive blocks
    if k == s:
        np.testing.assert_allclose(pool, np.eye(s), rtol=1e-6)


@pytest.mark.parametrize("k, s", [(0, 4), (5, 4), (2.0, 4)])
def test_mean_pooling_rejects_bad_sizes(tree, k, s):
    with pytest.raises(ValueError, match="must be an integer"):
        tree.linformer.mean_pooling(k, s)


def test_fit_projections_lowers_the_error_and_leaves_the_start_alone():
    torch.manual_seed(0)
    q, k, v = (torch.randn(6, 2, 16, 4, dtype=torch.float64) for _ in range(3))  # (passages, heads, n, d)
    start = torch_lin.mean_pooling(4, 16, dtype=torch.float64)
    before = start.clone()
    E, F, losses = torch_lin.fit_projections(q, k, v, start, start, steps=60, lr=1e-2)
    assert torch.equal(start, before) and not E.requires_grad and E.shape == (4, 16)
    assert len(losses) == 60 and losses[-1] < 0.8 * losses[0]  # Adam on a smooth loss: a clear fall in 60 steps
    exact = torch_full.softmax_attention(q, k, v)
    error = (torch_lin.linformer_attention(q, k, v, E, F) - exact).square().sum((-2, -1))
    start_error = (torch_lin.linformer_attention(q, k, v, start, start) - exact).square().sum((-2, -1))
    assert (error / exact.square().sum((-2, -1))).mean() < (start_error / exact.square().sum((-2, -1))).mean()


def test_fit_projections_stays_at_an_exact_start():
    q, k, v = (torch.randn(2, 8, 4, dtype=torch.float64) for _ in range(3))
    eye = torch.eye(8, dtype=torch.float64)  # k = n, E = F = I: Linformer is exact attention, loss 0
    _, _, losses = torch_lin.fit_projections(q, k, v, eye, eye, steps=3, lr=1e-3)
    assert losses[0] < 1e-20


def test_stored_learned_projections_are_complete_and_ordered():
    from course_lib import data_path

    stored = np.load(data_path("learned_projections.npz"))
    methods = [str(m) for m in stored["methods"]]
    ks = list(stored["ks"])
    assert ks == sorted(ks) and stored["heldout_errors"].shape == (len(ks), len(methods), 12)
    error = dict(zip(methods, stored["heldout_errors"].mean(axis=-1).T, strict=True))
    assert np.all(error["learned E, F"] < error["mean pooling"])  # the lesson's claim, on the stored data
    assert np.all(error["output-optimal (needs P V)"] < 1e-6)  # k >= e = 32: exact
    assert all(stored[f"E_k{k}"].shape == (k, 256) for k in ks)
