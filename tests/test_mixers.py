"""The recurrent mixers GatedLinearAttention and DeltaNet (torch/_mixers.py, exported by torch/modules.py):
shapes, the chunked form against the token loop, causality, padding, each decay option, gradients,
state_size, the recurrence inside, bad arguments and CUDA; and their state (notebook 14): prefill and
step from a state equal forward, any split of a prefill, a padded position writes no state."""

import pytest
import torch
from torch import nn

from course_lib.torch.delta import delta_product_attention, delta_rule_attention
from course_lib.torch.full import merge_heads, split_heads
from course_lib.torch.gated import DEFAULT_CHUNK_SIZE, gated_linear_attention
from course_lib.torch.modules import DeltaNet, DeltaProduct, GatedLinearAttention
from tests.conftest import requires_cuda

D_MODEL, HEADS = 16, 2
N = DEFAULT_CHUNK_SIZE + 13  # two chunks at the default size, the second ragged
KINDS = ["gla-none", "gla-fixed", "gla-head", "gla-channel", "deltanet", "gated-deltanet", "kda",
         "deltanet-negative", "deltaproduct", "gated-deltaproduct"]
DELTA_OPTIONS = {"deltanet": {}, "gated-deltanet": {"gated": True}, "kda": {"gated": "channel"},
                 "deltanet-negative": {"negative_eigenvalues": True}}


def _make(kind, seed=0, **options):
    torch.manual_seed(seed)
    if kind.startswith("gla"):
        return GatedLinearAttention(D_MODEL, HEADS, decay=kind.split("-")[1], **options)
    if kind.endswith("deltaproduct"):  # two reflections a token; the gated one with a decay per channel
        return DeltaProduct(D_MODEL, HEADS, n_householder=2, gated="channel" if kind.startswith("gated") else False,
                            **options)
    return DeltaNet(D_MODEL, HEADS, **DELTA_OPTIONS[kind], **options)


def _causal_conv_silu(x, weight):
    # x (b, n, c), weight (c, 1, size): torch's depthwise conv1d, padded on both sides, its right overhang cut
    size, n = weight.shape[-1], x.shape[1]
    y = nn.functional.conv1d(x.transpose(1, 2), weight, padding=size - 1, groups=weight.shape[0])  # (b, c, n+size−1)
    return nn.functional.silu(y[..., :n].transpose(1, 2))


def _inputs(b=2, n=N, seed=1, dtype=torch.float32):
    return torch.randn(b, n, D_MODEL, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("kind", KINDS)
def test_output_shape_and_dtype(kind):
    module = _make(kind)
    out = module(_inputs())
    assert out.shape == (2, N, D_MODEL) and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert module.chunk_size == DEFAULT_CHUNK_SIZE  # chunked by default


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk_size", ["default", 5])
def test_chunked_equals_the_token_loop(kind, chunk_size):
    options = {} if chunk_size == "default" else {"chunk_size": chunk_size}
    module, x = _make(kind, **options), _inputs()
    chunked = module(x)
    module.chunk_size = None
    torch.testing.assert_close(chunked, module(x), rtol=1e-5, atol=1e-6)  # float32, different summation orders


@pytest.mark.parametrize("kind", [kind for kind in KINDS if "deltaproduct" not in kind])  # its own test below
def test_the_recurrence_inside_is_the_library_function(kind):
    # the module written out: projections, short convolutions, L2-normalised heads, the recurrence, norm, W_o
    module, x = _make(kind, dtype=torch.float64), _inputs(dtype=torch.float64)
    weight = module.conv.conv.weight  # (3 d_model, 1, size): the filters of q, k and v, in that order
    q, k, v = (_causal_conv_silu(p(x), w) for p, w in zip((module.q_proj, module.k_proj, module.v_proj),
                                                          weight.split(D_MODEL), strict=True))
    q, k, v = (split_heads(t, HEADS) for t in (q, k, v))  # (b, h, n, d)
    q = nn.functional.normalize(q, dim=-1) / (D_MODEL // HEADS) ** 0.5
    k = nn.functional.normalize(k, dim=-1)
    if isinstance(module, GatedLinearAttention):
        log_decay = module.log_decay(x)
        expected_shape = {"none": None, "fixed": (2, HEADS, N), "head": (2, HEADS, N),
                          "channel": (2, HEADS, N, D_MODEL // HEADS)}[module.decay]
        assert (None if log_decay is None else tuple(log_decay.shape)) == expected_shape
        if log_decay is None:
            log_decay = torch.zeros(2, HEADS, N, dtype=torch.float64)
        assert (log_decay <= 0).all() and torch.isfinite(log_decay).all()
        heads = gated_linear_attention(q, k, v, log_decay, chunk_size=None)
    else:
        beta = torch.sigmoid(module.b_proj(x)).transpose(1, 2)  # (b, h, n)
        beta = 2 * beta if kind == "deltanet-negative" else beta  # β in (0, 2)
        log_decay = None
        if module.gated:
            rate = -torch.exp(module.A_log) * nn.functional.softplus(module.a_proj(x))  # (b, n, h | d_model)
            log_decay = rate.transpose(1, 2) if module.gated == "head" else split_heads(rate, HEADS)
        assert tuple(log_decay.shape)[3:] == ((D_MODEL // HEADS,) if kind == "kda" else ()) if module.gated else True
        heads = delta_rule_attention(q, k, v, beta, log_decay=log_decay, chunk_size=None)
    expected = module.out_proj(merge_heads(module.norm(heads)))
    torch.testing.assert_close(module(x), expected, rtol=1e-10, atol=1e-10)


def test_the_fixed_decays_are_retnets():
    module = _make("gla-fixed", dtype=torch.float64)
    gammas = torch.exp(module.fixed_log_decay)
    expected = 1 - 2.0 ** torch.tensor([-5.0, -12.0], dtype=torch.float64)  # heads 0 and 7 of RetNet's 8
    torch.testing.assert_close(gammas, expected)
    assert not any(name.startswith("fixed") for name, _ in module.named_parameters())  # a buffer, not learned
    assert "fixed_log_decay" in module.state_dict()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk_size", ["default", None])
def test_outputs_ignore_future_inputs(kind, chunk_size):
    options = {} if chunk_size == "default" else {"chunk_size": chunk_size}
    module, x = _make(kind, **options), _inputs()
    t = 20
    changed = x.clone()
    changed[:, t + 1:] = 10 * torch.randn(2, N - t - 1, D_MODEL)
    before, after = module(x), module(changed)
    torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, t + 1:], before[:, t + 1:])  # the future did change


@pytest.mark.parametrize("kind", KINDS)
def test_padding_at_the_end_changes_nothing_at_the_real_positions(kind):
    module, x = _make(kind), _inputs()
    lengths = [N, N - 9]
    key_mask = torch.arange(N)[None, :] < torch.tensor(lengths)[:, None]  # (b, n)
    x = x.masked_fill(~key_mask[..., None], 1e3)  # huge padding: it must add nothing
    padded = module(x, key_mask=key_mask)
    assert torch.isfinite(padded).all()
    for i, n in enumerate(lengths):
        torch.testing.assert_close(padded[i:i + 1, :n], module(x[i:i + 1, :n]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bias", [False, True])
def test_left_padding_changes_nothing_at_the_real_positions(kind, bias):
    module, x = _make(kind, bias=bias), _inputs(b=1)
    key_mask = torch.ones(1, N, dtype=torch.bool)
    key_mask[:, :6] = False  # six pads on the left: the real tokens must neither read nor see them
    x = x.masked_fill(~key_mask[..., None], 1e3)
    padded = module(x, key_mask=key_mask)
    torch.testing.assert_close(padded[:, 6:], module(x[:, 6:]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bias", [False, True])
def test_a_padded_position_in_the_middle_is_as_if_removed(kind, bias):
    # Without the short convolution each token's q, k, v depend on that token alone, so a pad that
    # neither writes nor forgets leaves the real positions as if it were not there at all.
    module, x = _make(kind, bias=bias, conv_size=0, chunk_size=5), _inputs(b=1, n=23)
    key_mask = torch.ones(1, 23, dtype=torch.bool)
    key_mask[:, 7] = False
    padded = module(x.masked_fill(~key_mask[..., None], 1e3), key_mask=key_mask)
    torch.testing.assert_close(padded[key_mask], module(x[key_mask][None])[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bias", [False, True])
def test_a_pad_in_the_middle_writes_nothing_despite_the_convolution(kind, bias, monkeypatch):
    # The convolution carries the tokens before a pad into its q, k and v; what reaches the recurrence
    # must still write nothing there: a zero key (and β = 0, a = 1 where the layer has them).
    seen = {}

    def spy(name, function):
        def recorded(q, k, v, *args, **options):
            seen.update(k=k, args=args, options=options)
            return function(q, k, v, *args, **options)
        monkeypatch.setattr(f"course_lib.torch._mixers.{name}", recorded)

    spy("gated_linear_attention", gated_linear_attention)
    spy("delta_rule_attention", delta_rule_attention)
    spy("delta_product_attention", delta_product_attention)
    module, x = _make(kind, bias=bias), _inputs(b=1, n=23)
    key_mask = torch.ones(1, 23, dtype=torch.bool)
    key_mask[:, 7] = False
    module(x, key_mask=key_mask)
    steps = getattr(module, "n_householder", 1)  # a token's keys, one after another
    pad, after = slice(7 * steps, 8 * steps), slice(8 * steps, 9 * steps)
    assert (seen["k"][:, :, pad] == 0).all() and (seen["k"][:, :, after].abs().sum() > 0)
    log_decay = seen["args"][0] if kind.startswith("gla") else seen["options"]["log_decay"]
    if log_decay is not None:
        assert (log_decay[:, :, 7] == 0).all()  # no forgetting at a pad
    if not kind.startswith("gla"):
        assert (seen["args"][0][:, :, pad] == 0).all()  # β = 0


@pytest.mark.parametrize("kind", KINDS)
def test_backward_gives_finite_gradients_for_every_parameter(kind):
    module, x = _make(kind, chunk_size=5), _inputs(n=23).requires_grad_()
    module(x).square().mean().backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_of_the_chunked_form_equal_the_token_loops(kind):
    x = _inputs(n=23, dtype=torch.float64)
    grads = []
    for chunk_size in (5, None):
        module = _make(kind, chunk_size=chunk_size, dtype=torch.float64)
        module(x).square().mean().backward()
        grads.append([p.grad for p in module.parameters()])
    for chunked, loop in zip(*grads, strict=True):
        torch.testing.assert_close(chunked, loop, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_state_size(kind):
    assert _make(kind).state_size() == HEADS * (D_MODEL // HEADS) ** 2
    assert GatedLinearAttention(64, 4).state_size() == 4 * 16 * 16


@pytest.mark.parametrize("kind", KINDS)
def test_dtype_device_and_extra_repr(kind):
    module = _make(kind, dtype=torch.float64)
    assert all(t.dtype == torch.float64 for t in [*module.parameters(), *module.buffers()])
    assert module(_inputs(dtype=torch.float64)).dtype == torch.float64
    assert f"n_heads={HEADS}" in repr(module) and f"chunk_size={DEFAULT_CHUNK_SIZE}" in repr(module)


@pytest.mark.parametrize("kind", KINDS)
def test_without_the_short_convolution(kind):
    module = _make(kind, conv_size=0, chunk_size=5)
    assert module.conv is None
    x = _inputs(n=23)
    chunked = module(x)
    module.chunk_size = None
    torch.testing.assert_close(chunked, module(x), rtol=1e-5, atol=1e-6)


def test_a_bad_decay_name_raises():
    with pytest.raises(ValueError, match=r"decay must be one of 'none', 'fixed', 'head', 'channel'; got 'channels'"):
        GatedLinearAttention(D_MODEL, HEADS, decay="channels")


@pytest.mark.parametrize("make", [GatedLinearAttention, DeltaNet])
@pytest.mark.parametrize("n_heads", [3, 0])
def test_heads_must_divide_the_width(make, n_heads):
    with pytest.raises(ValueError, match=r"n_heads must be a positive divisor of the model width: d_model = 16"):
        make(D_MODEL, n_heads)


def _same_state(got, expected, **tolerance):
    for a, b in zip(got, expected, strict=True):  # MixerState(conv, S)
        torch.testing.assert_close(a, b, **tolerance)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("conv_size", [4, 0])
def test_prefill_then_steps_equals_forward(kind, conv_size):
    module, x = _make(kind, conv_size=conv_size, chunk_size=4, dtype=torch.float64), _inputs(n=23, dtype=torch.float64)
    out, state = module.prefill(x[:, :7])
    outs = [out]
    for t in range(7, 23):
        out_t, state = module.step(x[:, t], state)
        outs.append(out_t[:, None])
    torch.testing.assert_close(torch.cat(outs, dim=1), module(x), rtol=1e-10, atol=1e-10)
    assert state.conv.shape == (2, max(conv_size - 1, 0), module.channels)
    assert state.S.shape == (2, HEADS, D_MODEL // HEADS, D_MODEL // HEADS)


@pytest.mark.parametrize("kind", KINDS)
def test_any_split_of_a_prefill_gives_the_same_outputs_and_state(kind):
    module, x = _make(kind, chunk_size=4, dtype=torch.float64), _inputs(n=23, dtype=torch.float64)
    expected_out, expected = module.prefill(x)
    for pieces in [(1, 2, 20), (3, 5, 15), (4, 8, 11), (23,)]:  # shorter than a chunk, ragged, whole chunks
        state, outs, start = module.empty_state(2), [], 0
        for length in pieces:
            out, state = module.prefill(x[:, start:start + length], state)
            outs.append(out)
            start += length
        torch.testing.assert_close(torch.cat(outs, dim=1), expected_out, rtol=1e-10, atol=1e-10)
        _same_state(state, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pads", ["right", "left", "middle"])
def test_a_padded_position_writes_no_state(kind, pads):
    # from a state that is not empty, so a pad on the left must not push the state's inputs out of the window
    module, x = _make(kind, chunk_size=4, bias=True, dtype=torch.float64), _inputs(b=1, n=23, dtype=torch.float64)
    _, state = module.prefill(x[:, :5])
    key_mask = torch.ones(1, 18, dtype=torch.bool)
    key_mask[:, {"right": slice(13, 18), "left": slice(0, 5), "middle": slice(6, 11)}[pads]] = False
    chunk = x[:, 5:].masked_fill(~key_mask[..., None], 1e3)  # huge pads: they must add nothing
    out, padded_state = module.prefill(chunk, state, key_mask=key_mask)
    alone_out, alone = module.prefill(chunk[key_mask][None], state)
    torch.testing.assert_close(out[key_mask], alone_out[0], rtol=1e-10, atol=1e-10)
    _same_state(padded_state, alone, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_a_zero_padded_last_chunk_would_change_the_state(kind):
    # What the key_mask prevents: run the prompt zero-padded to whole chunks, and the outputs at the
    # real positions stay right (causal) while the state does not.
    module, x = _make(kind, chunk_size=4, dtype=torch.float64), _inputs(n=13, dtype=torch.float64)
    out, state = module.prefill(x)
    padded = nn.functional.pad(x, (0, 0, 0, 3))  # (b, 16, d_model): whole chunks
    padded_out, padded_state = module.prefill(padded)
    torch.testing.assert_close(padded_out[:, :13], out, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(padded_state.S, state.S) and not torch.allclose(padded_state.conv, state.conv)
    key_mask = torch.arange(16)[None, :] < 13
    _same_state(module.prefill(padded, key_mask=key_mask.expand(2, 16))[1], state, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_and_step_never_change_the_state_they_are_given(kind):
    module, x = _make(kind), _inputs(n=9)
    _, state = module.prefill(x[:, :5])
    kept = [t.clone() for t in state]
    module.prefill(x[:, 5:], state)
    module.step(x[:, 5], state)
    _same_state(state, kept, rtol=0, atol=0)


@requires_cuda
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_module_matches_cpu(kind):
    module, x = _make(kind, dtype=torch.float64), _inputs(dtype=torch.float64)
    expected = module(x)
    cuda = module.to("cuda")
    torch.testing.assert_close(cuda(x.cuda()).cpu(), expected, rtol=1e-10, atol=1e-10)
    made_there = _make(kind, device="cuda")
    assert all(p.is_cuda for p in made_there.parameters())


@pytest.mark.parametrize("gated", [False, "head", "channel"])
def test_deltaproduct_is_the_delta_product_of_its_projections(gated):
    # DeltaProduct written out: n_h keys, values and β a token from widened projections, token-major,
    # each key L2-normalised, β = 2 sigmoid, one decay a token; the library's delta_product_attention.
    torch.manual_seed(0)
    n_h, d = 3, D_MODEL // HEADS
    module = DeltaProduct(D_MODEL, HEADS, n_householder=n_h, gated=gated, dtype=torch.float64)
    x = _inputs(dtype=torch.float64)
    b, n = x.shape[:2]
    weight = module.conv.conv.weight  # (7 d_model, 1, size): q, then n_h keys, then n_h values
    q, k, v = (_causal_conv_silu(p(x), w) for p, w in zip(
        (module.q_proj, module.k_proj, module.v_proj), weight.split([D_MODEL, n_h * D_MODEL, n_h * D_MODEL]),
        strict=True))
    q = nn.functional.normalize(split_heads(q, HEADS), dim=-1) / d**0.5  # (b, h, n, d)
    k, v = (t.reshape(b, n, n_h, HEADS, d).permute(0, 3, 1, 2, 4).reshape(b, HEADS, n * n_h, d) for t in (k, v))
    k = nn.functional.normalize(k, dim=-1)  # (b, h, n n_h, d)
    beta = 2 * torch.sigmoid(module.b_proj(x)).reshape(b, n, n_h, HEADS).permute(0, 3, 1, 2).reshape(b, HEADS, -1)
    log_decay = module.log_decay(x)
    assert log_decay is None if not gated else log_decay.shape[:3] == (b, HEADS, n)
    heads = delta_product_attention(q, k, v, beta, n_householder=n_h, log_decay=log_decay, chunk_size=None)
    expected = module.out_proj(merge_heads(module.norm(heads)))
    torch.testing.assert_close(module(x), expected, rtol=1e-10, atol=1e-10)
    assert (beta > 1).any() and module.state_size() == HEADS * d * d  # reflections reachable; the state keeps its size


def test_bad_mixer_options_raise():
    with pytest.raises(ValueError, match="gated must be"):
        DeltaNet(D_MODEL, HEADS, gated="token")
    with pytest.raises(ValueError, match="n_householder must be a positive int"):
        DeltaProduct(D_MODEL, HEADS, n_householder=0)
