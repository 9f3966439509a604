"""The small causal model of notebook 07: parallel form = recurrent form, caches, causality, errors."""

import pytest
import torch

from course_lib import tasks
from course_lib.torch.causal_lm import CausalLM, Decoder, generate, stepwise_logits
from course_lib.torch.linear import DEFAULT_CHUNK_SIZE
from course_lib.torch.modules import LinearAttention, PerformerAttention
from tests.conftest import requires_cuda

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=requires_cuda)]
# (attention, chunk_size): the default chunked form, prefix sums, and a chunk that does not divide n = 19
ATTENTIONS = [("softmax", None), ("linear", "default"), ("linear", None), ("linear", 4), ("performer", "default")]


def _model(attention, chunk_size="default", device="cpu", vocab=11, max_len=24):
    torch.manual_seed(0)
    options = {} if chunk_size == "default" else {"chunk_size": chunk_size}
    model = CausalLM(vocab, max_len, d_model=32, n_heads=4, n_layers=2, attention=attention, **options)
    return model.double().to(device).eval()


def _tokens(b=3, n=19, vocab=11, device="cpu"):
    return torch.randint(0, vocab, (b, n), generator=torch.Generator().manual_seed(1)).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("attention", "chunk_size"), ATTENTIONS)
def test_parallel_equals_token_by_token(attention, chunk_size, device):
    # float64: the two forms differ only by rounding (~1e-15); 1e-10 leaves room, a real bug is O(1)
    model, tokens = _model(attention, chunk_size, device), _tokens(device=device)
    with torch.no_grad():
        parallel = model(tokens)
        assert torch.allclose(stepwise_logits(model, tokens), parallel, atol=1e-10, rtol=0)
        assert torch.allclose(stepwise_logits(model, tokens, decoder=True), parallel, atol=1e-10, rtol=0)
        assert torch.allclose(stepwise_logits(model, tokens, cache=False), parallel, atol=1e-10, rtol=0)


def test_the_model_uses_the_attention_modules_with_the_default_chunk():
    assert isinstance(_model("linear").blocks[0].attn, LinearAttention)
    assert isinstance(_model("performer").blocks[0].attn, PerformerAttention)
    assert _model("linear").blocks[1].attn.chunk_size == DEFAULT_CHUNK_SIZE
    assert _model("linear", None).blocks[1].attn.chunk_size is None


@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_float32_recurrent_form_close(attention):
    # float32: the running sums of the RNN and the parallel prefix sums round differently (~1e-6)
    model, tokens = _model(attention).float(), _tokens()
    with torch.no_grad():
        assert torch.allclose(stepwise_logits(model, tokens), model(tokens), atol=1e-4, rtol=1e-4)
        assert torch.allclose(stepwise_logits(model, tokens, decoder=True), model(tokens), atol=1e-4, rtol=1e-4)


def test_decoder_state_is_constant_size_and_changed_in_place():
    model, tokens = _model("linear"), _tokens(n=6)
    decoder = Decoder(model, 3)
    states = [state for _, _, state in decoder.layers]
    storage = [state.state.data_ptr() for state in states]
    with torch.no_grad():
        for t in range(6):
            decoder.step(tokens[:, t])
    assert decoder.position == 6 and [state.state.data_ptr() for state in states] == storage
    assert all(state.state.shape == (3 * 4, 8, 9) for state in states)  # (b·h, f, e + 1), whatever the position
    with pytest.raises(ValueError, match="max_len = 24"):
        decoder.position = 24
        decoder.step(tokens[:, 0])


@pytest.mark.parametrize("attention", ["softmax", "linear", "performer"])
def test_cached_generation_equals_uncached(attention):
    model, prompt = _model(attention), _tokens(n=3)
    cached, uncached = generate(model, prompt, 12), generate(model, prompt, 12, cache=False)
    assert cached.shape == (3, 15)
    assert torch.equal(cached[:, :3], prompt)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize(("attention", "chunk_size"), ATTENTIONS)
def test_no_dependence_on_future_tokens(attention, chunk_size):
    model, tokens = _model(attention, chunk_size), _tokens()
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 5) % 11  # change every token after position 9
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.allclose(before[:, :10], after[:, :10], atol=1e-12, rtol=0)
    assert not torch.allclose(before[:, 10:], after[:, 10:])  # the change is visible where it may be


def test_step_does_not_mutate_state():
    model, tokens = _model("linear"), _tokens()
    with torch.no_grad():
        _, state = model.step(tokens[:, 0], 0)
        saved = [tuple(x.clone() for x in layer) for layer in state]
        first, _ = model.step(tokens[:, 1], 1, state)
        second, _ = model.step(tokens[:, 1], 1, state)
    assert torch.equal(first, second)
    for layer, kept in zip(state, saved, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(layer, kept, strict=True))


def test_linear_state_is_constant_size():
    model, tokens = _model("linear"), _tokens(n=20)
    with torch.no_grad():
        state, sizes = None, set()
        for t in range(20):
            _, state = model.step(tokens[:, t], t, state)
            sizes.add(sum(x.numel() for layer in state for x in layer))
    assert len(sizes) == 1  # (S, Z) per layer: h · f · (e + 1) numbers, whatever the position


def test_errors_are_clear():
    model = _model("linear")
    with pytest.raises(ValueError, match="attention must be one of"):
        CausalLM(11, 8, attention="linformer")  # not causal: no Linformer language model
    with pytest.raises(ValueError, match="longer than max_len"):
        model(_tokens(n=30))
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 11\)"):
        model(torch.full((1, 4), 11))
    with pytest.raises(TypeError, match="int64"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"shape \(b, n\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token must have shape \(b,\)"):
        model.step(torch.zeros(1, 2, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="longer than max_len"):
        model.step(torch.zeros(1, dtype=torch.long), 24)
    with pytest.raises(ValueError, match="prompt must have shape"):
        generate(model, torch.zeros(2, 0, dtype=torch.long), 3)


def test_copy_batch_and_loss():
    tokens = tasks.copy_batch(4, 5, 10, torch.Generator().manual_seed(0))
    assert tokens.shape == (4, 11) and torch.all(tokens[:, 5] == tasks.COPY_SEPARATOR)
    assert torch.equal(tokens[:, :5], tokens[:, 6:]) and tokens[:, :5].min() >= 1 and tokens[:, :5].max() <= 10
    again = tasks.copy_batch(4, 5, 10, torch.Generator().manual_seed(0))
    assert torch.equal(tokens, again)  # the generator fixes the batch

    class Oracle(torch.nn.Module):  # predicts the token L + 1 positions back: a perfect copier
        def forward(self, x):
            shifted = torch.roll(x, 5, dims=1)  # position i ≥ L predicts token i + 1 = token i - L (L = 5)
            return 50.0 * torch.nn.functional.one_hot(shifted, 11).double()

    loss = tasks.copy_loss(Oracle(), tokens)
    assert loss.item() < 1e-6  # the copied half is predicted exactly; the random half is not scored
