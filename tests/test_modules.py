"""The attention modules: the functional forms inside, padding, causality, state_dict, device and dtype,
from_attention, FAVOR+'s explicit redraw, and the recurrent form of the causal modules."""

import io

import pytest
import torch
from torch import nn

from course_lib.torch import linear, performer
from course_lib.torch.full import MultiHeadAttention, merge_heads, softmax_attention, split_heads
from course_lib.torch.linformer import linformer_attention
from course_lib.torch.modules import LinearAttention, LinformerSelfAttention, PerformerAttention, redraw_features
from tests.conftest import requires_cuda

D_MODEL, HEADS, N = 16, 2, 9


class SquaredLinear(nn.Module):
    """A learnable non-negative feature map, (x W)², to check that a Module map is registered."""

    def __init__(self, d, f):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d, f))

    def forward(self, x):
        return (x @ self.weight).square()


def _make(kind, causal=False, seed=0, **options):
    torch.manual_seed(seed)
    common = dict(causal=causal, dtype=torch.float64, **options)
    if kind == "linear":
        return LinearAttention(D_MODEL, HEADS, **common)
    if kind == "performer":
        generator = torch.Generator().manual_seed(seed + 1)
        return PerformerAttention(D_MODEL, HEADS, n_features=32, generator=generator, **common)
    return LinformerSelfAttention(D_MODEL, HEADS, N, 4, **common)


def _inputs(b=2, n=N, seed=2):
    return torch.randn(b, n, D_MODEL, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


KINDS = [("linear", False), ("linear", True), ("performer", False), ("performer", True), ("linformer", False)]


def _functional(module, x, key_mask=None):
    """The module's output written with the functional form of its kernel."""
    q, k, v = (split_heads(p(x), HEADS) for p in (module.q_proj, module.k_proj, module.v_proj))  # (b, h, n, d)
    mask = None if key_mask is None else key_mask[:, None, :]  # (b, 1, n)
    if isinstance(module, LinformerSelfAttention):
        heads = linformer_attention(q, k, v, module.E, module.F, key_mask=mask)
    elif isinstance(module, PerformerAttention):
        heads = performer.performer_attention(q, k, v, module.omega, causal=module.causal, key_mask=mask)
    elif module.causal:
        heads = linear.causal_linear_attention(q, k, v)
    else:
        heads = linear.linear_attention(q, k, v, key_mask=mask)
    return module.out_proj(merge_heads(heads))


@pytest.mark.parametrize("kind, causal", KINDS)
def test_module_equals_its_functional_form(kind, causal):
    module, x = _make(kind, causal), _inputs()
    key_mask = None if causal and kind == "linear" else torch.arange(N)[None, :] < torch.tensor([[N], [5]])
    torch.testing.assert_close(module(x, key_mask=key_mask), _functional(module, x, key_mask), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind, causal", KINDS)
def test_padding_changes_nothing_at_the_real_positions(kind, causal):
    module, x = _make(kind, causal), _inputs()
    lengths = [N, 5]
    key_mask = torch.arange(N)[None, :] < torch.tensor(lengths)[:, None]  # (b, n)
    x = x.masked_fill(~key_mask[..., None], 1e3)  # huge padding: it must add nothing
    padded = module(x, key_mask=key_mask)
    for i, n in enumerate(lengths):
        alone = module(x[i:i + 1, :n])  # the sequence without its padding
        torch.testing.assert_close(padded[i:i + 1, :n], alone, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["linear", "performer"])
@pytest.mark.parametrize("chunk_size", [None, 4, "default"])
def test_causal_outputs_ignore_future_inputs(kind, chunk_size):
    options = {} if chunk_size == "default" else {"chunk_size": chunk_size}
    module, x = _make(kind, causal=True, **options), _inputs()
    changed = x.clone()
    changed[:, 5:] = torch.randn(2, N - 5, D_MODEL, dtype=torch.float64)
    before, after = module(x), module(changed)
    torch.testing.assert_close(before[:, :5], after[:, :5], rtol=0, atol=1e-13)
    assert not torch.allclose(before[:, 5:], after[:, 5:])  # the future did change


def test_causal_linear_with_padding_and_left_padding():
    module, x = _make("linear", causal=True), _inputs(b=1)
    key_mask = torch.ones(1, N, dtype=torch.bool)
    key_mask[:, :3] = False  # three pads on the left: the real tokens must not see them
    padded = module(x, key_mask=key_mask)
    torch.testing.assert_close(padded[:, 3:], module(x[:, 3:]), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind, causal", KINDS)
def test_state_dict_round_trip(kind, causal):
    module, x = _make(kind, causal), _inputs()
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    other = _make(kind, causal, seed=99)  # a fresh module with other weights (and, for FAVOR+, another ω)
    assert not torch.allclose(other(x), module(x))
    buffer.seek(0)
    other.load_state_dict(torch.load(buffer))
    torch.testing.assert_close(other(x), module(x), rtol=0, atol=0)


def test_a_module_feature_map_trains_and_is_saved():
    module = LinearAttention(D_MODEL, HEADS, feature_map=SquaredLinear(8, 5), dtype=torch.float64)
    assert "feature_map.weight" in module.state_dict() and module.feature_map.weight.dtype == torch.float64
    assert any(p is module.feature_map.weight for p in module.parameters())
    module(_inputs()).sum().backward()
    assert module.feature_map.weight.grad is not None and module.feature_map.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kind, causal", KINDS)
def test_dtype_and_to(kind, causal):
    module = _make(kind, causal)
    assert all(p.dtype == torch.float64 for p in module.parameters())
    assert module(_inputs()).dtype == torch.float64
    module = module.to(torch.float32)
    assert all(t.dtype == torch.float32 for t in [*module.parameters(), *module.buffers()])
    assert module(_inputs().float()).dtype == torch.float32


@requires_cuda
@pytest.mark.parametrize("kind, causal", KINDS)
def test_cuda_module_matches_cpu(kind, causal):
    module, x = _make(kind, causal), _inputs()
    expected = module(x)
    cuda = module.to("cuda")
    torch.testing.assert_close(cuda(x.cuda()).cpu(), expected, rtol=1e-10, atol=1e-10)
    made_there = LinearAttention(D_MODEL, HEADS, device="cuda")
    assert made_there.q_proj.weight.is_cuda


@pytest.mark.parametrize("kind, causal", KINDS)
def test_from_attention_copies_the_projections(kind, causal):
    torch.manual_seed(3)
    template = _make(kind, causal)
    options = {"max_len": N, "k": 4} if kind == "linformer" else {}
    if kind == "performer":
        options["generator"] = torch.Generator().manual_seed(1)
        options["n_features"] = 32

    def kernel(q, k, v, *, causal=False, key_mask=None):  # the module's kernel, for MultiHeadAttention
        return module.attend(q, k, v, key_mask)

    mha = MultiHeadAttention(D_MODEL, HEADS, attention=kernel).double()
    module = type(template).from_attention(mha, causal=causal, **options)
    assert module.q_proj.weight.dtype == torch.float64 and module.n_heads == HEADS
    x = _inputs()
    torch.testing.assert_close(module(x), mha(x), rtol=0, atol=0)  # same projections, same kernel
    with torch.no_grad():
        module.q_proj.weight.add_(1.0)
    assert not torch.equal(module.q_proj.weight, mha.q_proj.weight)  # copied, not shared


def test_from_attention_refuses_a_module_without_projections():
    with pytest.raises(TypeError, match="from_attention needs a module with n_heads"):
        LinearAttention.from_attention(nn.Linear(4, 4))


def test_linformer_cannot_be_causal():
    with pytest.raises(ValueError, match="Linformer cannot be causal"):
        LinformerSelfAttention(D_MODEL, HEADS, N, 4, causal=True)


def test_bad_input_names_the_argument():
    module = _make("linear")
    with pytest.raises(ValueError, match=r"x must have shape \(b, n, d_model\) with d_model = 16"):
        module(torch.zeros(2, N, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="key_mask must be boolean"):
        module(_inputs(), key_mask=torch.ones(2, N))
    with pytest.raises(ValueError, match="key_mask must have shape"):
        module(_inputs(), key_mask=torch.ones(2, N + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="n_heads must be a positive divisor"):
        LinearAttention(10, 3)


# --- FAVOR+: ω belongs to the module and changes only when asked ----------------------------------

def test_omega_changes_only_on_an_explicit_redraw():
    module, x = _make("performer"), _inputs()
    first = module(x)
    torch.testing.assert_close(module(x), first, rtol=0, atol=0)  # no hidden counter: calls repeat
    module.train()
    torch.testing.assert_close(module(x), first, rtol=0, atol=0)  # nor in training without the policy
    before = module.omega.clone()
    module.redraw()
    assert not torch.equal(module.omega, before) and module.omega.shape == (32, 8)
    module.redraw(torch.Generator().manual_seed(5))
    again = module.omega.clone()
    module.redraw(torch.Generator().manual_seed(5))
    torch.testing.assert_close(module.omega, again, rtol=0, atol=0)  # the generator is the only randomness


def test_redraw_policy_is_one_explicit_flag():
    module = _make("performer", redraw_in_training=True)
    x = _inputs()
    module.eval()
    torch.testing.assert_close(module(x), module(x), rtol=0, atol=0)  # evaluation never redraws
    module.train()
    before = module.omega.clone()
    module(x)
    assert not torch.equal(module.omega, before)  # every training forward draws a new ω
    model = nn.Sequential(_make("performer"), _make("performer"))
    olds = [m.omega.clone() for m in model]
    assert redraw_features(model, torch.Generator().manual_seed(0)) == 2
    assert all(not torch.equal(m.omega, old) for m, old in zip(model, olds, strict=True))


# --- the recurrent form of the causal modules -----------------------------------------------------

@pytest.mark.parametrize("kind", ["linear", "performer"])
def test_recurrent_state_equals_the_causal_module(kind):
    module, x = _make(kind, causal=True), _inputs()
    q, k, v = module.heads(x)  # (b, h, n, d)
    parallel = module.attend(q, k, v, None)  # (b, h, n, e)
    rnn = module.recurrent((2, HEADS))
    with torch.no_grad():  # the recurrent state is for inference
        steps = [rnn.step(torch.stack([q[..., t, :], k[..., t, :]]), v[..., t, :]).clone() for t in range(N)]
    torch.testing.assert_close(torch.stack(steps, dim=-2), parallel, rtol=1e-10, atol=1e-12)


def test_trig_features_have_no_recurrent_form():
    with pytest.raises(ValueError, match="trig features can be negative"):
        _make("performer", causal=True, features="trig").recurrent((1, HEADS))


def test_softmax_module_reference():
    # the MultiHeadAttention these modules copy from, checked against its own kernel written out
    mha = MultiHeadAttention(D_MODEL, HEADS).double()
    x = _inputs()
    q, k, v = (split_heads(p(x), HEADS) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
    torch.testing.assert_close(mha(x), mha.out_proj(merge_heads(softmax_attention(q, k, v))))
