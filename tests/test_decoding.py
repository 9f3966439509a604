"""One token at a time: the in-place recurrent step against the teaching step and the parallel causal form,
and the preallocated key/value cache against softmax attention over the prefix."""

import pytest
import torch

from course_lib.torch.decoding import KeyValueCache, RecurrentLinearAttention
from course_lib.torch.full import softmax_attention
from course_lib.torch.linear import causal_linear_attention, linear_attention_step, relu_feature_map
from tests.conftest import requires_cuda

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=requires_cuda)]


def _qkv(b=2, h=3, n=11, d=5, dtype=torch.float64, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=gen, dtype=dtype).to(device) for _ in range(3)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_ones", [False, True])
def test_recurrent_steps_equal_the_teaching_step_and_the_parallel_form(device, with_ones):
    q, k, v = _qkv(device=device)
    rnn = RecurrentLinearAttention((2, 3), 5, 5, dtype=torch.float64, device=device)
    ones = torch.ones(2, 3, 11, 1, dtype=torch.float64, device=device)
    values = torch.cat([v, ones], dim=-1) if with_ones else v  # (b, h, n, e [+ 1])
    state, lean, teaching = None, [], []
    with torch.no_grad():
        for t in range(11):
            lean.append(rnn.step(torch.stack([q[..., t, :], k[..., t, :]]), values[..., t, :]).clone())
            out, state = linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], state)
            teaching.append(out)
    lean, teaching = torch.stack(lean, dim=-2), torch.stack(teaching, dim=-2)
    # float64: the forms differ only in summation order (~1e-16); 1e-12 leaves room, a real bug is O(1)
    torch.testing.assert_close(lean, teaching, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lean, causal_linear_attention(q, k, v), rtol=1e-12, atol=1e-12)
    kv_state, key_sum = rnn.functional_state()
    torch.testing.assert_close(kv_state, state[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(key_sum, state[1], rtol=1e-12, atol=1e-12)
    assert rnn.position == 11


def test_the_state_is_updated_in_place_and_keeps_its_size():
    q, k, v = _qkv(n=4)
    rnn = RecurrentLinearAttention((2, 3), 5, 5, dtype=torch.float64)
    address, shape = rnn.state.data_ptr(), rnn.state.shape
    with torch.no_grad():
        for t in range(4):
            rnn.step(torch.stack([q[..., t, :], k[..., t, :]]), v[..., t, :])
    assert rnn.state.data_ptr() == address and rnn.state.shape == shape == (2 * 3, 5, 6)  # (b·h, f, e + 1)
    assert rnn.state.abs().sum() > 0
    rnn.reset()
    assert rnn.state.abs().sum() == 0 and rnn.position == 0


def test_half_precision_inputs_are_summed_in_float32():
    q, k, v = (x.half() for x in _qkv(dtype=torch.float32, n=6))
    rnn = RecurrentLinearAttention((2, 3), 5, 5, dtype=torch.float16)
    assert rnn.state.dtype == torch.float32  # a float16 running sum of ones stalls at 2048
    with torch.no_grad():
        out = [rnn.step(torch.stack([q[..., t, :], k[..., t, :]]), v[..., t, :]).clone() for t in range(6)]
    expected = causal_linear_attention(q.float(), k.float(), v.float())
    torch.testing.assert_close(torch.stack(out, dim=-2), expected, rtol=1e-5, atol=1e-5)


def test_relu_features_with_eps_and_a_bad_feature_map():
    q, k, v = _qkv(n=5)
    rnn = RecurrentLinearAttention((2, 3), 5, 5, dtype=torch.float64,
                                   features=lambda qk: relu_feature_map(qk).unbind(0))
    with torch.no_grad():
        out = [rnn.step(torch.stack([q[..., t, :], k[..., t, :]]), v[..., t, :]).clone() for t in range(5)]
    expected = causal_linear_attention(q, k, v, feature_map=relu_feature_map)
    torch.testing.assert_close(torch.stack(out, dim=-2), expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"features\(qk\) must return two non-negative"):
        RecurrentLinearAttention((2, 3), 5, 5, features=lambda qk: (qk - 1).unbind(0))


@pytest.mark.parametrize("device", DEVICES)
def test_key_value_cache_equals_softmax_over_the_prefix(device):
    q, k, v = _qkv(device=device)
    cache = KeyValueCache((2, 3), 11, 5, 5, dtype=torch.float64, device=device)
    with torch.no_grad():
        steps = torch.stack([cache.step(q[..., t, :], k[..., t, :], v[..., t, :]) for t in range(11)], dim=-2)
    torch.testing.assert_close(steps, softmax_attention(q, k, v, causal=True), rtol=1e-12, atol=1e-12)
    assert cache.position == 11 and cache.keys.shape == (2, 3, 11, 5)  # preallocated, never grown
    with pytest.raises(ValueError, match="max_len = 11"):
        cache.step(q[..., 0, :], k[..., 0, :], v[..., 0, :])
    cache.reset()
    assert cache.position == 0
