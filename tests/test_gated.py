"""Gated linear attention (numpy|torch/gated.py): the chunked form against the token loop and the loop
against the written-out definition, the sub-chunked scores of a decay per channel, initial_state, the
step, strong decays, precision in float32 and half precision, gradcheck, the two trees against each
other, properties and bad input (more of it in test_recurrence_inputs.py)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib import _shared, _validate
from course_lib.numpy import gated as np_gated
from course_lib.torch import gated as torch_gated
from tests.conftest import requires_cuda

CHUNK_SIZES = [1, 5, 16, 64]  # 5, 16 and 64 do not divide n = 37 or 100; 64 > 37 is one ragged chunk


def _inputs(rng, lead=(2, 3), n=37, d=4, e=3, channels=False, low=-0.5):
    """float64 ``q, k (*lead, n, d)``, ``v (*lead, n, e)`` and a log decay in [low, 0] per head or channel."""
    q, k = rng.standard_normal((*lead, n, d)), rng.standard_normal((*lead, n, d))
    v = rng.standard_normal((*lead, n, e))
    log_decay = rng.uniform(low, 0.0, (*lead, n, d) if channels else (*lead, n))
    return q, k, v, log_decay


def _definition(q, k, v, log_decay):
    """o_i = Σ_{j ≤ i} Σ_d q_id exp(G_id − G_jd) k_jd v_j with G the cumulative log decay: the recurrence unrolled."""
    if log_decay.ndim == q.ndim - 1:
        log_decay = np.broadcast_to(log_decay[..., None], q.shape)  # one decay per head: the same for every channel
    G = np.cumsum(log_decay, axis=-2)  # (..., n, d)
    n = q.shape[-2]
    causal = np.tril(np.ones((n, n), bool))[..., None]  # (n, n, 1): j <= i
    decay = np.exp(np.where(causal, G[..., :, None, :] - G[..., None, :, :], -np.inf))  # (..., n, n, d)
    weights = np.einsum("...id,...jd,...ijd->...ij", q, k, decay)  # (..., n, n)
    return weights @ v


def _rms_relative(got, expected):
    return float(np.sqrt(np.mean((got - expected) ** 2) / np.mean(expected ** 2)))


def _gla(tree, q, k, v, log_decay, **options):
    out = tree.gated.gated_linear_attention(*tree.arrays(q, k, v, log_decay), **options)
    if options.get("return_state"):
        return tree.numpy(out[0]), tree.numpy(out[1])
    return tree.numpy(out)


# --- each form against its definition, on every tree ----------------------------------------

@pytest.mark.parametrize("channels", [False, True], ids=["per-head", "per-channel"])
def test_loop_equals_the_written_out_definition(tree, rng, channels):
    q, k, v, log_decay = _inputs(rng, n=9, channels=channels)
    got = _gla(tree, q, k, v, log_decay, chunk_size=None)
    assert got.shape == (2, 3, 9, 3)
    np.testing.assert_allclose(got, _definition(q, k, v, log_decay), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
@pytest.mark.parametrize("n", [37, 100])
@pytest.mark.parametrize("channels", [False, True], ids=["per-head", "per-channel"])
def test_chunked_equals_the_token_loop(tree, rng, chunk_size, n, channels):
    q, k, v, log_decay = _inputs(rng, n=n, channels=channels)
    expected, expected_state = _gla(tree, q, k, v, log_decay, chunk_size=None, return_state=True)
    got, state = _gla(tree, q, k, v, log_decay, chunk_size=chunk_size, return_state=True)
    assert got.shape == (2, 3, n, 3) and state.shape == (2, 3, 4, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state, expected_state, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 5])
@pytest.mark.parametrize("channels", [False, True], ids=["per-head", "per-channel"])
def test_leading_dims_broadcast(tree, rng, chunk_size, channels):
    n, d, e = 13, 4, 3
    q, k = rng.standard_normal((2, 1, n, d)), rng.standard_normal((1, 3, n, d))
    v = rng.standard_normal((3, n, e))  # fewer leading dims: broadcast from the left
    log_decay = rng.uniform(-0.5, 0.0, (2, 1, n, d) if channels else (1, 3, n))
    full = [np.broadcast_to(x, (2, 3, *x.shape[-2:])) for x in (q, k, v)]
    full_decay = np.broadcast_to(log_decay, (2, 3, n, d) if channels else (2, 3, n))
    got, state = _gla(tree, q, k, v, log_decay, chunk_size=chunk_size, return_state=True)
    assert got.shape == (2, 3, n, e) and state.shape == (2, 3, d, e)
    np.testing.assert_allclose(got, _definition(*full, full_decay), rtol=1e-12, atol=1e-12)
    unbatched = _gla(tree, q[1, 0], k[0, 2], v[2], log_decay[1, 0] if channels else log_decay[0, 2],
                     chunk_size=chunk_size)  # (n, e): no leading dims at all
    np.testing.assert_allclose(unbatched, got[1, 2], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 1, 5, 64])
def test_zero_log_decay_is_causal_linear_attention_without_normaliser(tree, rng, chunk_size):
    q, k, v, _ = _inputs(rng, n=37)
    expected = np.tril(q @ np.swapaxes(k, -1, -2)) @ v  # (..., n, e): Σ_{j ≤ i} (q_i · k_j) v_j
    for log_decay in (np.zeros((2, 3, 37)), np.zeros((2, 3, 37, 4))):
        got = _gla(tree, q, k, v, log_decay, chunk_size=chunk_size)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 5, 16])
@pytest.mark.parametrize("channels", [False, True], ids=["per-head", "per-channel"])
def test_initial_state_continues_a_sequence(tree, rng, chunk_size, channels):
    q, k, v, log_decay = _inputs(rng, n=37, channels=channels)
    whole, whole_state = _gla(tree, q, k, v, log_decay, chunk_size=chunk_size, return_state=True)
    cut = 20
    first, state = _gla(tree, q[..., :cut, :], k[..., :cut, :], v[..., :cut, :], log_decay[..., :cut, :] if channels
                        else log_decay[..., :cut], chunk_size=chunk_size, return_state=True)
    second, final = tree.gated.gated_linear_attention(
        *tree.arrays(q[..., cut:, :], k[..., cut:, :], v[..., cut:, :],
                     log_decay[..., cut:, :] if channels else log_decay[..., cut:]),
        chunk_size=chunk_size, initial_state=tree.array(state), return_state=True)
    np.testing.assert_allclose(np.concatenate([first, tree.numpy(second)], axis=-2), whole, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tree.numpy(final), whole_state, rtol=1e-12, atol=1e-12)


def test_initial_state_broadcasts_and_decays(tree, rng):
    q, k, v, log_decay = _inputs(rng, n=11)
    state = rng.standard_normal((4, 3))  # (d, e): one state for every batch and head
    expected = _definition(q, k, v, log_decay) + np.exp(np.cumsum(log_decay, -1))[..., None] * (q @ state)
    for chunk_size in (None, 4):
        got = tree.gated.gated_linear_attention(*tree.arrays(q, k, v, log_decay), chunk_size=chunk_size,
                                                initial_state=tree.array(state))
        np.testing.assert_allclose(tree.numpy(got), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("channels", [False, True], ids=["per-head", "per-channel"])
def test_steps_equal_the_parallel_form_and_never_mutate_the_state(tree, rng, channels):
    q, k, v, log_decay = _inputs(rng, n=9, channels=channels)
    parallel, parallel_state = _gla(tree, q, k, v, log_decay, chunk_size=4, return_state=True)
    state, outputs = None, []
    for t in range(9):
        before = None if state is None else tree.numpy(state).copy()
        out, new_state = tree.gated.gated_linear_attention_step(
            *tree.arrays(q[..., t, :], k[..., t, :], v[..., t, :], log_decay[..., t, :] if channels
                         else log_decay[..., t]), state)
        if state is not None:
            np.testing.assert_array_equal(tree.numpy(state), before)  # the caller's state is untouched
            assert new_state is not state
        assert tuple(out.shape) == (2, 3, 3)
        outputs.append(tree.numpy(out))
        state = new_state
    np.testing.assert_allclose(np.stack(outputs, axis=-2), parallel, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tree.numpy(state), parallel_state, rtol=1e-12, atol=1e-12)


def _masked_scores(q, k, G):
    """Σ_d q_id k_jd exp(G_id − G_jd) for j ≤ i, 0 above: the (c, c, d) form that sub-chunks avoid."""
    c = q.shape[-2]
    causal = np.tril(np.ones((c, c), bool))[..., None]  # (c, c, 1)
    decay = np.exp(np.where(causal, G[..., :, None, :] - G[..., None, :, :], -np.inf))  # (..., c, c, d)
    return np.einsum("...id,...jd,...ijd->...ij", q, k, decay)


@pytest.mark.parametrize("c", [5, 16, 21])
@pytest.mark.parametrize("sub", [1, 3, 8, 32])  # 32 > c: one sub-chunk, the masked form alone
def test_channel_scores_equal_the_masked_form(tree, rng, c, sub):
    q, k = rng.standard_normal((2, 2, 3, c, 4))
    G = np.cumsum(rng.uniform(-1, 0, (2, 3, c, 4)), axis=-2)
    got = tree.numpy(tree.gated.channel_scores(*tree.arrays(q, k, G), sub))
    np.testing.assert_allclose(got, _masked_scores(q, k, G), rtol=1e-12, atol=1e-12)
    strong = np.cumsum(np.full((c, 4), -30.0), axis=-2)  # e^-30 per token: e^{±G} alone would overflow
    got = tree.numpy(tree.gated.channel_scores(*tree.arrays(q[0, 0], k[0, 0], strong), sub))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, _masked_scores(q[0, 0], k[0, 0], strong), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("c, sub", [(7, 3), (16, 8), (21, 8), (9, 1)])
def test_channel_scores_gradcheck(rng, c, sub):
    q, k = rng.standard_normal((2, 2, c, 3))
    G = np.cumsum(rng.uniform(-0.8, 0, (2, c, 3)), axis=-2)
    inputs = [torch.tensor(x, requires_grad=True) for x in (q, k, G)]
    assert torch.autograd.gradcheck(lambda q, k, G: torch_gated.channel_scores(q, k, G, sub), inputs)


def test_masked_decay(tree):
    G = np.cumsum(np.array([-0.5, -1.0, -30.0, -2.0]))
    weights = tree.numpy(tree.gated.masked_decay(tree.array(G)))
    expected = np.tril(np.exp(G[:, None] - G[None, :]))
    np.testing.assert_allclose(weights, expected, rtol=1e-14, atol=0)
    strict = tree.numpy(tree.gated.masked_decay(tree.array(G), inclusive=False))
    np.testing.assert_allclose(strict, np.tril(expected, -1), rtol=1e-14, atol=0)


# --- strong decay and precision -------------------------------------------------------------

@pytest.mark.parametrize("channels", [False, True], ids=["per-head", "per-channel"])
def test_a_strong_decay_stays_finite(tree, rng, channels):
    # log a = -30 per token: the cumulative decay over a chunk of 64 is e^-1920, below float64's range;
    # the form must exponentiate only masked differences, never e^{+G} alone.
    n = 256
    q, k, v, _ = _inputs(rng, lead=(1, 2), n=n, channels=channels)
    log_decay = np.full((1, 2, n, 4) if channels else (1, 2, n), -30.0)
    expected = _gla(tree, q, k, v, log_decay, chunk_size=None)
    got = _gla(tree, q, k, v, log_decay, chunk_size=64)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    # with a_t ≈ 0, o_t is (q_t · k_t) v_t alone (summed per channel)
    np.testing.assert_allclose(got, (q * k).sum(-1)[..., None] * v, rtol=1e-10, atol=1e-10)
    low = _gla(tree, *(x.astype(np.float32) for x in (q, k, v, log_decay)), chunk_size=64)
    assert low.dtype == np.float32 and np.isfinite(low).all()
    np.testing.assert_allclose(low, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels", [False, True], ids=["per-head", "per-channel"])
def test_float32_chunked_is_close_to_the_float64_loop(tree, rng, channels):
    n, d = 1024, 64
    q, _, v, _ = _inputs(rng, lead=(1,), n=n, d=d, e=d)
    k = rng.standard_normal((1, n, d))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)  # unit keys
    q /= np.sqrt(d)
    log_decay = rng.uniform(-0.05, 0.0, (1, n, d) if channels else (1, n))
    low = [x.astype(np.float32) for x in (q, k, v, log_decay)]
    expected = _gla(tree, *(x.astype(np.float64) for x in low), chunk_size=None)  # the same numbers, float64
    got = _gla(tree, *low)  # the default chunk size
    assert got.dtype == np.float32
    assert _rms_relative(got, expected) < 1e-5


def test_half_precision_in_torch_returns_its_dtype_and_a_float32_state(rng):
    q, k, v, log_decay = _inputs(rng, lead=(2,), n=50, d=8, e=8, low=-0.2)
    for dtype in (torch.float16, torch.bfloat16):
        for channels in (False, True):
            decay = np.repeat(log_decay[..., None], 8, -1) if channels else log_decay
            half = [torch.as_tensor(x).to(dtype) for x in (q, k, v, decay)]
            reference = torch_gated.gated_linear_attention(*(x.float() for x in half), chunk_size=None)
            for chunk_size in (None, 16):
                out, state = torch_gated.gated_linear_attention(*half, chunk_size=chunk_size, return_state=True)
                assert out.dtype == dtype and state.dtype == torch.float32
                assert torch.isfinite(out).all()
                scale = reference.abs().max().item()
                torch.testing.assert_close(out.float(), reference, rtol=1e-2, atol=1e-2 * scale)
            # the float32 state a half-precision call returns continues the sequence
            first, state = torch_gated.gated_linear_attention(*(x[:, :20] for x in half), return_state=True)
            second = torch_gated.gated_linear_attention(*(x[:, 20:] for x in half), initial_state=state)
            assert second.dtype == dtype
            torch.testing.assert_close(torch.cat([first, second], 1).float(), reference, rtol=1e-2,
                                       atol=1e-2 * scale)
            step, step_state = torch_gated.gated_linear_attention_step(*(x[..., 0, :] for x in half[:3]),
                                                                       half[3][..., 0, :] if channels
                                                                       else half[3][..., 0], None)
            assert step.dtype == dtype and step_state.dtype == torch.float32


def test_float16_in_numpy_returns_float16_and_a_float32_state(rng):
    q, k, v, log_decay = (x.astype(np.float16) for x in _inputs(rng, lead=(2,), n=50, d=8, e=8, low=-0.2))
    reference = np_gated.gated_linear_attention(*(x.astype(np.float32) for x in (q, k, v, log_decay)),
                                                chunk_size=None)
    for chunk_size in (None, 16):
        out, state = np_gated.gated_linear_attention(q, k, v, log_decay, chunk_size=chunk_size, return_state=True)
        assert out.dtype == np.float16 and state.dtype == np.float32 and np.isfinite(out).all()
        np.testing.assert_allclose(out.astype(np.float32), reference, rtol=1e-2, atol=1e-2 * np.abs(reference).max())


@pytest.mark.parametrize("chunk_size", [None, 64])
def test_a_float16_sum_over_4096_tokens_stays_accurate(tree, chunk_size):
    # q = k = e_1, v = 1, no decay: o_t = t + 1.  A float16 running sum stops growing at 2048
    # (2048 + 1 rounds back to 2048); the state is accumulated in float32, only the output is rounded.
    n = 4096
    q = np.zeros((n, 2), np.float16)
    q[:, 0] = 1
    v = np.ones((n, 1), np.float16)
    q, v, log_decay = tree.arrays(q, v, np.zeros(n, np.float16))
    out = tree.numpy(tree.gated.gated_linear_attention(q, q, v, log_decay, chunk_size=chunk_size))
    assert out.dtype == np.float16
    np.testing.assert_allclose(out[:, 0].astype(np.float64), np.arange(1, n + 1), rtol=1e-3)  # float16's 2^-11


# --- autograd and the two trees -------------------------------------------------------------

@pytest.mark.parametrize("channels", [False, True], ids=["per-head", "per-channel"])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_gradcheck(rng, channels, chunk_size):
    q, k, v, log_decay = _inputs(rng, lead=(2,), n=7, d=3, e=2, channels=channels)
    log_decay = log_decay - 0.1  # ≤ -0.1: the finite differences (1e-6) stay at log a ≤ 0
    state = rng.standard_normal((2, 3, 2))
    inputs = [torch.tensor(x, requires_grad=True) for x in (q, k, v, log_decay, state)]

    def run(q, k, v, log_decay, state):
        return torch_gated.gated_linear_attention(q, k, v, log_decay, chunk_size=chunk_size, initial_state=state,
                                                  return_state=True)

    assert torch.autograd.gradcheck(run, inputs)


def test_gradcheck_across_sub_chunks(rng):
    # n = 21 in chunks of 16: two sub-chunks of 8 in each, the second chunk zero-padded from position 5
    q, k, v, log_decay = _inputs(rng, lead=(2,), n=21, d=3, e=2, channels=True)
    state = rng.standard_normal((2, 3, 2))
    inputs = [torch.tensor(x, requires_grad=True) for x in (q, k, v, log_decay - 0.1, state)]

    def run(q, k, v, log_decay, state):
        return torch_gated.gated_linear_attention(q, k, v, log_decay, chunk_size=16, initial_state=state,
                                                  return_state=True)

    assert torch.autograd.gradcheck(run, inputs)


@pytest.mark.parametrize("channels", [False, True], ids=["per-head", "per-channel"])
@pytest.mark.parametrize("chunk_size", [None, 5])
def test_numpy_and_torch_agree(rng, channels, chunk_size):
    q, k, v, log_decay = _inputs(rng, n=23, channels=channels)
    state = rng.standard_normal((2, 3, 4, 3))
    options = dict(chunk_size=chunk_size, initial_state=state, return_state=True)
    expected = np_gated.gated_linear_attention(q, k, v, log_decay, **options)
    got = torch_gated.gated_linear_attention(*map(torch.as_tensor, (q, k, v, log_decay)),
                                             **{**options, "initial_state": torch.as_tensor(state)})
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-12)
    step_decay = log_decay[..., 0, :] if channels else log_decay[..., 0]
    expected = np_gated.gated_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], step_decay, state)
    got = torch_gated.gated_linear_attention_step(*(torch.as_tensor(x) for x in (q[..., 0, :], k[..., 0, :],
                                                                               v[..., 0, :], step_decay, state)))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-12)
    G = np.cumsum(rng.uniform(-1, 0, (3, 6)), -1)
    np.testing.assert_allclose(torch_gated.masked_decay(torch.as_tensor(G)).numpy(), np_gated.masked_decay(G),
                               rtol=1e-14)
    G = np.cumsum(rng.uniform(-1, 0, (3, 19, 4)), -2)
    q, k = rng.standard_normal((2, 3, 19, 4))
    np.testing.assert_allclose(torch_gated.channel_scores(*map(torch.as_tensor, (q, k, G)), 4).numpy(),
                               np_gated.channel_scores(q, k, G, 4), rtol=1e-12, atol=1e-12)


def test_the_default_chunk_size_is_shared():
    import inspect

    assert torch_gated.DEFAULT_CHUNK_SIZE == np_gated.DEFAULT_CHUNK_SIZE == _shared.RECURRENT_CHUNK_SIZE
    assert torch_gated.SUB_CHUNK_SIZE == np_gated.SUB_CHUNK_SIZE == _shared.SUB_CHUNK_SIZE
    for module in (np_gated, torch_gated):
        default = inspect.signature(module.gated_linear_attention).parameters["chunk_size"].default
        assert default == np_gated.DEFAULT_CHUNK_SIZE


# --- properties -----------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 20), chunk_size=st.integers(1, 24), lead=st.lists(st.integers(1, 3), max_size=2),
       channels=st.booleans(), use_torch=st.booleans(), seed=st.integers(0, 2**16))
def test_chunked_equals_the_loop_for_any_sizes(n, chunk_size, lead, channels, use_torch, seed):
    q, k, v, log_decay = _inputs(np.random.default_rng(seed), lead=tuple(lead), n=n, d=3, e=2, channels=channels)
    module, wrap = (torch_gated, torch.as_tensor) if use_torch else (np_gated, np.asarray)
    got = module.gated_linear_attention(*map(wrap, (q, k, v, log_decay)), chunk_size=chunk_size)
    assert tuple(got.shape) == (*lead, n, 2)
    np.testing.assert_allclose(np.asarray(got), _definition(q, k, v, log_decay), rtol=1e-11, atol=1e-11)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 12), t=st.integers(0, 10), chunk_size=st.sampled_from([None, 1, 3, 5]),
       use_torch=st.booleans(), seed=st.integers(0, 2**16))
def test_outputs_ignore_the_future(n, t, chunk_size, use_torch, seed):
    t = min(t, n - 2)
    rng = np.random.default_rng(seed)
    q, k, v, log_decay = _inputs(rng, lead=(2,), n=n, d=3, e=2, channels=True)
    changed = [x.copy() for x in (q, k, v, log_decay)]
    for x in changed:
        x[:, t + 1:] = -np.abs(10 * rng.standard_normal(x[:, t + 1:].shape))  # ≤ 0: still a valid log decay
    module, wrap = (torch_gated, torch.as_tensor) if use_torch else (np_gated, np.asarray)
    before = np.asarray(module.gated_linear_attention(*map(wrap, (q, k, v, log_decay)), chunk_size=chunk_size))
    after = np.asarray(module.gated_linear_attention(*map(wrap, changed), chunk_size=chunk_size))
    np.testing.assert_allclose(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-13)
    assert not np.allclose(after[:, t + 1:], before[:, t + 1:])  # the future did change


# --- bad input ------------------------------------------------------------------------------

def _good(n=5, lead=(2, 3)):
    return np.ones((*lead, n, 4)), np.ones((*lead, n, 4)), np.ones((*lead, n, 2)), np.full((*lead, n), -0.1)


@pytest.mark.parametrize("log_decay, match", [
    (np.full((2, 3, 5), 0.5), r"log_decay must be <= 0"),
    (np.full((2, 3, 5), -np.inf), r"log_decay must be finite"),
    (np.full((2, 3, 5), np.nan), r"log_decay holds NaN values"),
    (np.full((2, 3, 5), np.inf), r"log_decay must be <= 0"),
    (np.full((2, 3, 6), -0.1), r"log_decay must have shape \(\.\.\., n\) = \(2, 3, 5\)"),
    (np.full((3, 5), -0.1), r"log_decay must have shape \(\.\.\., n\)"),  # (h, n) for (b, h, n, d): ambiguous
    (np.full((2, 3, 5, 3), -0.1), r"log_decay must have shape .* \(\.\.\., n, d\) = \(2, 3, 5, 4\)"),
])
def test_bad_log_decay_is_named(tree, log_decay, match):
    q, k, v, _ = _good()
    with pytest.raises(ValueError, match=match):
        tree.gated.gated_linear_attention(*tree.arrays(q, k, v, log_decay))


def test_bad_step_log_decay_is_named(tree):
    q, k, v, _ = _good()
    with pytest.raises(ValueError, match=r"log_decay_t must be <= 0"):
        tree.gated.gated_linear_attention_step(*tree.arrays(q[..., 0, :], k[..., 0, :], v[..., 0, :],
                                                            np.full((2, 3), 0.1)), None)


@pytest.mark.parametrize("shapes, match", [
    (((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 2)), r"a recurrence needs one query per key"),
    (((2, 3, 5, 4), (2, 4, 5, 4), (2, 4, 5, 2)), r"q and k leading \(batch/head\) dims do not broadcast"),
    (((2, 3, 5, 4), (2, 3, 5, 3), (2, 3, 5, 2)), r"q and k must share the head dim d"),
    (((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 4, 2)), r"k and v must have the same number of key positions"),
])
def test_bad_shapes_are_named(tree, shapes, match):
    q, k, v = (np.ones(shape) for shape in shapes)
    with pytest.raises(ValueError, match=match):
        tree.gated.gated_linear_attention(*tree.arrays(q, k, v, np.full(shapes[1][:-1], -0.1)))


@pytest.mark.parametrize("chunk_size, error", [(0, ValueError), (-1, ValueError), (2.5, TypeError),
                                               (True, TypeError), ("8", TypeError)])
def test_bad_chunk_size(tree, chunk_size, error):
    with pytest.raises(error, match="chunk_size must be"):
        tree.gated.gated_linear_attention(*tree.arrays(*_good()), chunk_size=chunk_size)


@pytest.mark.parametrize("shape", [(2, 3, 4, 3), (2, 3, 2, 4), (4,), (3, 3, 4, 2)])
def test_bad_initial_state_is_named(tree, shape):
    with pytest.raises(ValueError, match=r"initial_state must have shape \(\.\.\., d, e\) = \(2, 3, 4, 2\)"):
        tree.gated.gated_linear_attention(*tree.arrays(*_good()), initial_state=tree.array(np.zeros(shape)))
    q, k, v, log_decay = _good()
    with pytest.raises(ValueError, match=r"initial_state must have shape"):
        tree.gated.gated_linear_attention_step(*tree.arrays(q[..., 0, :], k[..., 0, :], v[..., 0, :],
                                                            log_decay[..., 0], np.zeros(shape)))


@pytest.mark.parametrize("which", ["q", "k", "v", "log_decay"])
def test_integer_inputs_are_refused(tree, which):
    arrays = dict(zip(("q", "k", "v", "log_decay"), _good(), strict=True))
    arrays[which] = arrays[which].astype(np.int64)
    with pytest.raises(TypeError, match=f"{which} must hold floating-point numbers"):
        tree.gated.gated_linear_attention(*tree.arrays(*arrays.values()))


def test_mixed_dtypes_are_refused_in_torch():
    q, k, v, log_decay = map(torch.as_tensor, _good())
    with pytest.raises(TypeError, match="must share one dtype"):
        torch_gated.gated_linear_attention(q, k.float(), v, log_decay)
    with pytest.raises(TypeError, match="must share one dtype"):
        torch_gated.gated_linear_attention(q, k, v.half(), log_decay)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        torch_gated.gated_linear_attention(q, k, v, log_decay.numpy())


def test_the_shared_checks_accept_the_edges():
    k = np.zeros((2, 3, 5, 4))
    assert _validate.per_channel(np.zeros((2, 3, 5)), k) is False
    assert _validate.per_channel(np.zeros((1, 3, 5, 4)), k) is True  # leading dims broadcast
    with pytest.raises(ValueError, match=r"gate must have shape \(\.\.\., n\) = \(2, 3, 5\)"):
        _validate.per_channel(np.zeros((2, 3, 4)), k, "gate")
    _validate.check_log_decay("log_decay", 0.0, True)  # a = 1 is allowed
    _validate.check_beta(np.zeros((2, 1, 5)), k, 0.0, 1.0)  # β = 0 and β = 1 are allowed
    _validate.check_chunk_size(None, False)
    _validate.check_state("initial_state", None, (2, 3), 4, 2)
    _validate.check_state("initial_state", np.zeros((3, 4, 2)), (2, 3), 4, 2)  # one state per head
    assert "up to 2.25 > 2" in _validate.key_norm_warning(2.25)


def test_numpy_accepts_a_numpy_integer_chunk_size(rng):
    q, k, v, log_decay = _inputs(rng, n=11)
    got = np_gated.gated_linear_attention(q, k, v, log_decay, chunk_size=np.int64(4))
    np.testing.assert_allclose(got, _definition(q, k, v, log_decay), rtol=1e-12, atol=1e-12)


# --- CUDA -----------------------------------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels", [False, True], ids=["per-head", "per-channel"])
def test_cuda_forward_and_backward_match_cpu(rng, dtype, channels):
    inputs = [torch.as_tensor(x).to(dtype) for x in _inputs(rng, lead=(2, 2), n=300, d=16, e=16, channels=channels,
                                                              low=-0.1)]
    results = {}
    for device in ("cpu", "cuda"):
        leaves = [x.to(device).requires_grad_() for x in inputs]
        out = torch_gated.gated_linear_attention(*leaves, chunk_size=64)
        assert out.dtype == dtype
        out.float().sum().backward()
        results[device] = [out.float().cpu()] + [leaf.grad.float().cpu() for leaf in leaves]
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2  # different summation orders; half outputs round
    for cuda, cpu in zip(results["cuda"], results["cpu"], strict=True):
        scale = cpu.abs().max().item()
        torch.testing.assert_close(cuda, cpu, rtol=tolerance, atol=tolerance * scale)
