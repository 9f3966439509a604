"""HybridLM and its cache (torch/hybrid.py): forward = prefill + steps, any split of the prompt, padding
that never writes a state, snapshots, rollback, generation, the cache's size and bad arguments.  Every mixer
alone, and a 3:1 hybrid; each invariant in float64 and float32, and each beside a broken variant that its check
catches (pads that write, a zero-padded last chunk, a restarted convolution or position offset, a snapshot that
is the cache itself, a rollback that only shortens the lengths)."""

import pytest
import torch
from torch import nn

from course_lib.torch import hybrid
from course_lib.torch._mixers import _RecurrentMixer
from course_lib.torch.gated import DEFAULT_CHUNK_SIZE
from course_lib.torch.hybrid import MIXERS, HybridCache, HybridLM, KeyValues
from course_lib.torch.modules import DeltaNet, GatedLinearAttention
from tests.conftest import requires_cuda

VOCAB, D_MODEL, HEADS, CHUNK, N = 11, 16, 2, 4, 13  # N: three chunks of 4 and a ragged one
HYBRID = ["gated_deltanet", "gated_deltanet", "gated_deltanet", "softmax"]
LAYERS = [[name] for name in MIXERS] + [HYBRID]
IDS = [*MIXERS, "hybrid"]
# float64: the chunked and step forms agree to rounding; float32: to its rounding over a few layers
TOLERANCES = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-5)}


RECURRENT = [layers for layers in LAYERS if layers != ["softmax"]]
RECURRENT_IDS = [name for name in IDS if name != "softmax"]


def _model(layers, dtype=torch.float64, seed=0, **options):
    torch.manual_seed(seed)
    options = dict(d_model=D_MODEL, n_heads=HEADS, chunk_size=CHUNK) | options
    return HybridLM(VOCAB, layers=layers, **options).to(dtype)


def _tokens(b=2, n=N, seed=1):
    return torch.randint(0, VOCAB, (b, n), generator=torch.Generator().manual_seed(seed))


def _steps(model, tokens, cache):
    """The logits of each of ``tokens (b, n)`` fed one step at a time: ``(b, n, vocab)``."""
    logits = [model.step(tokens[:, t], cache)[0] for t in range(tokens.shape[1])]
    return torch.stack(logits, dim=1)


def _sequence_state(cache, row):
    """What sequence ``row`` of a cache holds: its length and tokens, and per layer its real slots or its state."""
    length = int(cache.lengths[row])
    tensors = [cache.lengths[row], cache.tokens[row, :length]]
    for state in cache.states:
        if isinstance(state, KeyValues):
            tensors += [state.lengths[row], state.keys[row, :, :length], state.values[row, :, :length]]
        else:
            tensors += [state.conv[row], state.S[row]]
    return tensors


def _assert_same_state(cache, expected, rows=None, expected_rows=None, **tolerance):
    rows = range(len(cache.lengths)) if rows is None else rows
    for row, other in zip(rows, expected_rows or rows, strict=True):
        for got, want in zip(_sequence_state(cache, row), _sequence_state(expected, other), strict=True):
            torch.testing.assert_close(got, want, **tolerance)


def _check_prefill_then_steps(model, tokens, start, tolerance):
    """The logits of ``prefill(tokens[:, :start])`` and then one step a token equal ``forward(tokens)``."""
    expected, cache = model(tokens), model.empty_cache(len(tokens))
    if start:
        logits, cache = model.prefill(tokens[:, :start], cache)
        torch.testing.assert_close(logits, expected[:, :start], **tolerance)
    torch.testing.assert_close(_steps(model, tokens[:, start:], cache), expected[:, start:], **tolerance)


@pytest.mark.parametrize("layers", LAYERS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("start", [0, 1, 5])
def test_forward_equals_prefill_then_steps_at_every_position(layers, dtype, start):
    model = _model(layers, dtype)
    _check_prefill_then_steps(model, _tokens(), start, TOLERANCES[dtype])


def _check_split(model, tokens, pieces, tolerance):
    """Prefilling ``tokens`` in ``pieces`` gives the logits and the state of one prefill of them all."""
    expected_logits, expected = model.prefill(tokens)
    cache, logits, start = model.empty_cache(len(tokens)), [], 0
    for length in pieces:
        piece_logits, cache = model.prefill(tokens[:, start:start + length], cache)
        logits.append(piece_logits)
        start += length
    torch.testing.assert_close(torch.cat(logits, dim=1), expected_logits, **tolerance)
    _assert_same_state(cache, expected, **tolerance)


@pytest.mark.parametrize("layers", LAYERS, ids=IDS)
@pytest.mark.parametrize("pieces", [(1,) * N, (3, 10), (1, 2, 3, 7), (4, 4, 5), (5, 5, 3), (2, 11)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_any_split_of_the_prompt_gives_the_same_state_and_logits(layers, pieces, dtype):
    # pieces shorter than a chunk, a last partial chunk, pieces that are not multiples of the chunk size
    _check_split(_model(layers, dtype), _tokens(), pieces, TOLERANCES[dtype])


def test_a_softmax_layer_that_restarts_its_positions_fails_the_split_check(monkeypatch):
    # The check has teeth for a softmax layer: a cache that forgets its offset (every piece's positions and slots
    # counted from 0, as if the cache were empty) fails it
    original = hybrid._slots
    monkeypatch.setattr(hybrid, "_slots", lambda lengths, real: original(torch.zeros_like(lengths), real))
    with pytest.raises(AssertionError):
        _check_split(_model(["softmax"]), _tokens(), (4, 4, 5), TOLERANCES[torch.float64])


@pytest.mark.parametrize("layers", RECURRENT, ids=RECURRENT_IDS)
def test_a_prefill_that_restarts_the_convolution_fails_the_split_check(layers, monkeypatch):
    # ... and for a recurrent one: a prefill that carries S but not the short convolution's last inputs
    original = _RecurrentMixer.prefill

    def conv_restarts(self, x, state=None, *, key_mask=None):
        state = None if state is None else state._replace(conv=torch.zeros_like(state.conv))
        return original(self, x, state, key_mask=key_mask)
    monkeypatch.setattr(_RecurrentMixer, "prefill", conv_restarts)
    with pytest.raises(AssertionError):
        _check_split(_model(layers), _tokens(), (4, 4, 5), TOLERANCES[torch.float64])


def _padded(tokens, lengths, side):
    """``tokens (b, n)``, sequence i cut to ``lengths[i]`` and padded on ``side`` with token 0; and the key_mask."""
    n = tokens.shape[1]
    key_mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (b, n): right padding
    if side == "left":
        key_mask = key_mask.flip(1)
        tokens = torch.stack([row.roll(n - length) for row, length in zip(tokens, lengths, strict=True)])
    return tokens.masked_fill(~key_mask, 0), key_mask


def _check_padded_batch(model, side, tolerance, pieces=(N,)):
    """A padded batch prefilled in ``pieces`` gives each sequence the logits and state it gets alone; steps too."""
    lengths, tokens = [N, 9, 4], _tokens(b=3)
    padded, key_mask = _padded(tokens, lengths, side)
    cache, logits, start = model.empty_cache(3), [], 0
    for length in pieces:
        piece = slice(start, start + length)
        piece_logits, cache = model.prefill(padded[:, piece], cache, key_mask=key_mask[:, piece])
        logits.append(piece_logits)
        start += length
    logits, alone = torch.cat(logits, dim=1), []
    for row, length in enumerate(lengths):
        alone_logits, alone_cache = model.prefill(tokens[row:row + 1, :length])
        torch.testing.assert_close(logits[row][key_mask[row]], alone_logits[0], **tolerance)
        _assert_same_state(cache, alone_cache, rows=[row], expected_rows=[0], **tolerance)
        alone.append(alone_cache)
    following = _tokens(b=3, n=3, seed=2)
    after = _steps(model, following, cache)  # every sequence from its own length on
    for row, alone_cache in enumerate(alone):
        torch.testing.assert_close(after[row], _steps(model, following[row:row + 1], alone_cache)[0], **tolerance)


@pytest.mark.parametrize("layers", LAYERS, ids=IDS)
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_padded_batch_gives_each_sequence_what_it_gets_alone(layers, side, dtype):
    _check_padded_batch(_model(layers, dtype), side, TOLERANCES[dtype])


@pytest.mark.parametrize("layers", LAYERS, ids=IDS)
@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_batch_prefilled_in_pieces_too(layers, side):
    # (5, 8): a piece that is all pads for the shortest sequence on the left, all pads on the right
    _check_padded_batch(_model(layers), side, TOLERANCES[torch.float64], pieces=(5, 8))


def test_a_pad_in_the_middle_is_as_if_removed():
    model, tokens = _model(HYBRID), _tokens(b=1)
    key_mask = torch.ones(1, N, dtype=torch.bool)
    key_mask[:, [0, 6, 7]] = False
    logits, cache = model.prefill(tokens, key_mask=key_mask)
    alone_logits, alone = model.prefill(tokens[key_mask][None])
    torch.testing.assert_close(logits[key_mask], alone_logits[0], **TOLERANCES[torch.float64])
    _assert_same_state(cache, alone, **TOLERANCES[torch.float64])


@pytest.mark.parametrize("layers", LAYERS, ids=IDS)
def test_a_piece_of_pads_alone_changes_nothing(layers):
    model, tokens = _model(layers), _tokens()
    logits, cache = model.prefill(tokens[:, :4], key_mask=torch.zeros(2, 4, dtype=torch.bool))
    assert torch.isfinite(logits).all() and cache.lengths.tolist() == [0, 0]
    _assert_same_state(model.prefill(tokens, cache)[1], model.prefill(tokens)[1], **TOLERANCES[torch.float64])


@pytest.mark.parametrize("layers", RECURRENT, ids=RECURRENT_IDS)
@pytest.mark.parametrize("side", ["right", "left"])
def test_a_prefill_that_lets_pads_write_fails_the_padding_check(layers, side, monkeypatch):
    # The check above has teeth: the same model with a recurrent prefill that ignores key_mask fails it
    original = _RecurrentMixer.prefill

    def pads_write(self, x, state=None, *, key_mask=None):
        return original(self, x, state)
    monkeypatch.setattr(_RecurrentMixer, "prefill", pads_write)
    with pytest.raises(AssertionError):
        _check_padded_batch(_model(layers), side, TOLERANCES[torch.float64])


@pytest.mark.parametrize("layers", RECURRENT, ids=RECURRENT_IDS)
def test_a_zero_padded_last_chunk_that_updates_the_state_fails_prefill_then_steps(layers, monkeypatch):
    # A known bug of a reference implementation: the prompt zero-padded to whole chunks and the padding
    # run as tokens.  The logits of the prompt stay right (causal), but the convolution carries the last
    # real inputs into the pads' keys and the decays forget: the state, and every later step, is off.
    original = _RecurrentMixer.prefill

    def zero_padded(self, x, state=None, *, key_mask=None):
        n = x.shape[1]
        out, state = original(self, nn.functional.pad(x, (0, 0, 0, -n % self.chunk_size)), state)
        return out[:, :n], state
    model, tokens = _model(layers), _tokens()
    _check_prefill_then_steps(model, tokens, 5, TOLERANCES[torch.float64])  # 5: a last chunk of 1
    logits = model(tokens)
    monkeypatch.setattr(_RecurrentMixer, "prefill", zero_padded)
    torch.testing.assert_close(model(tokens), logits, **TOLERANCES[torch.float64])  # the prompt's own: unchanged
    with pytest.raises(AssertionError):
        _check_prefill_then_steps(model, tokens, 5, TOLERANCES[torch.float64])


def _check_snapshot(model, tokens, tolerance):
    """A ``copy()`` taken after 6 tokens does not move while the cache goes on, and continues exactly."""
    _, cache = model.prefill(tokens[:, :6])
    snapshot, untouched = cache.copy(), cache.copy()
    model.prefill(_tokens(seed=5)[:, :7], cache)  # the original moves on, with other tokens
    model.step(tokens[:, 0], cache)
    _assert_same_state(snapshot, untouched, rtol=0, atol=0)  # the snapshot did not move
    continued = torch.cat([model.prefill(tokens[:, 6:9], snapshot)[0], _steps(model, tokens[:, 9:], snapshot)], dim=1)
    torch.testing.assert_close(continued, model(tokens)[:, 6:], **tolerance)
    _assert_same_state(untouched, model.prefill(tokens[:, :6])[1], **tolerance)  # nor did the copy


@pytest.mark.parametrize("layers", LAYERS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_snapshot_continues_exactly(layers, dtype):
    _check_snapshot(_model(layers, dtype), _tokens(), TOLERANCES[dtype])


@pytest.mark.parametrize("layers", LAYERS, ids=IDS)
def test_a_snapshot_that_shares_the_caches_buffers_fails_the_snapshot_check(layers, monkeypatch):
    # The check has teeth: a "snapshot" that is the cache itself (a reference kept, not a copy) moves with it
    monkeypatch.setattr(HybridCache, "copy", lambda self: self)
    with pytest.raises(AssertionError):
        _check_snapshot(_model(layers), _tokens(), TOLERANCES[torch.float64])


def _check_rollback(model, tokens, j, tolerance, rollback=None):
    """Rolling back the last ``j`` of 13 tokens (a snapshot after 5) equals a cache that saw only ``13 − j``."""
    _, cache = model.prefill(tokens[:, :5])
    snapshot = cache.copy()
    model.prefill(tokens[:, 5:11], cache)
    _steps(model, tokens[:, 11:], cache)  # 13 tokens seen
    rolled = (rollback or model.rollback)(cache, j, snapshot=snapshot)
    _, expected = model.prefill(tokens[:, :N - j])
    _assert_same_state(rolled, expected, **tolerance)
    following = _tokens(n=2, seed=3)
    torch.testing.assert_close(_steps(model, following, rolled), _steps(model, following, expected), **tolerance)


@pytest.mark.parametrize("layers", LAYERS, ids=IDS)
@pytest.mark.parametrize("j", [0, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rollback_of_j_tokens_equals_never_having_seen_them(layers, j, dtype):
    _check_rollback(_model(layers, dtype), _tokens(), j, TOLERANCES[dtype])


def _cut(cache, j, *, snapshot):
    """A transformer server's rollback: every length shortened by ``j``, every other buffer kept as it is."""
    cut = cache.copy()
    cut.lengths -= j
    cut.states = [KeyValues(s.keys, s.values, s.lengths - j) if isinstance(s, KeyValues) else s for s in cut.states]
    return cut


def test_cutting_the_lengths_rolls_back_a_softmax_layer():
    # For keys and values, forgetting is shortening: the rollback check passes ...
    _check_rollback(_model(["softmax"]), _tokens(), 3, TOLERANCES[torch.float64], rollback=_cut)


@pytest.mark.parametrize("layers", RECURRENT, ids=RECURRENT_IDS)
def test_cutting_the_lengths_fails_the_rollback_check_with_a_state(layers):
    # ... but a state has summed the last tokens in: a cut rollback keeps them, and the check catches it
    with pytest.raises(AssertionError):
        _check_rollback(_model(layers), _tokens(), 3, TOLERANCES[torch.float64], rollback=_cut)


def test_rollback_of_a_padded_batch_and_its_bad_snapshots():
    model = _model(HYBRID)
    padded, key_mask = _padded(_tokens(b=3), [N, 9, 4], "right")
    _, cache = model.prefill(padded[:, :3], key_mask=key_mask[:, :3])
    snapshot = cache.copy()
    model.prefill(padded[:, 3:], cache, key_mask=key_mask[:, 3:])
    rolled = model.rollback(cache, 1, snapshot=snapshot)
    _, expected = model.prefill(padded, key_mask=key_mask & (key_mask.cumsum(1) < key_mask.sum(1, keepdim=True)))
    _assert_same_state(rolled, expected, **TOLERANCES[torch.float64])
    with pytest.raises(ValueError, match="a snapshot of this cache taken at least j tokens before it"):
        model.rollback(cache, 2, snapshot=snapshot)  # the last sequence had one token since the snapshot
    _, other = model.prefill(_tokens(b=3, n=3, seed=9))
    with pytest.raises(ValueError, match="a snapshot of this cache"):
        model.rollback(cache, 0, snapshot=other)  # another prefix


@pytest.mark.parametrize("layers", LAYERS, ids=IDS)
def test_generate_greedy_equals_argmax_of_repeated_forward(layers):
    model, prompt = _model(layers), _tokens(n=5)
    made = model.generate(prompt, 6)
    tokens = prompt
    for _ in range(6):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(made, tokens) and not made.is_inference()


def test_generate_a_padded_prompt_and_by_sampling():
    model = _model(HYBRID)
    padded, key_mask = _padded(_tokens(b=3, n=7), [7, 5, 2], "right")
    made = model.generate(padded, 4, key_mask=key_mask)
    for row, length in enumerate([7, 5, 2]):
        assert torch.equal(made[row, 7:], model.generate(padded[row:row + 1, :length], 4)[0, length:])
    sampled = [model.generate(padded, 8, temperature=1.0, generator=torch.Generator().manual_seed(4)) for _ in "ab"]
    assert torch.equal(*sampled)  # the generator alone decides the draws
    assert not torch.equal(sampled[0], model.generate(padded, 8))


@pytest.mark.parametrize("layers", LAYERS, ids=IDS)
def test_nbytes_per_sequence(layers):
    model = _model(layers, torch.float32)
    _, cache = model.prefill(_tokens())
    h, d = HEADS, D_MODEL // HEADS
    recurrent = (h * d * d + 3 * 3 * D_MODEL) * 4  # S and the convolution's last 3 inputs of q, k, v, float32
    per_layer = {name: recurrent for name in MIXERS} | {"softmax": 2 * N * D_MODEL * 4}  # keys and values
    per_layer["deltaproduct"] = (h * d * d + 3 * 5 * D_MODEL) * 4  # the same S; q and 2 keys, 2 values convolved
    assert cache.nbytes() == sum(per_layer[name] for name in layers)
    model.step(_tokens(n=1)[:, 0], cache)
    growth = 2 * D_MODEL * 4 * layers.count("softmax")  # one more key and value per softmax layer
    assert cache.nbytes() == sum(per_layer[name] for name in layers) + growth


def test_the_key_value_buffers_are_preallocated_and_doubled():
    model = _model(["softmax"])
    _, cache = model.prefill(_tokens())
    keys = cache.states[0].keys  # (b, h, capacity, d)
    assert keys.shape[2] == N
    model.step(_tokens(n=1)[:, 0], cache)
    grown = cache.states[0].keys
    assert grown.shape[2] == 2 * N  # full: doubled, so that n tokens cost O(n) copies in all
    model.step(_tokens(n=1)[:, 0], cache)
    assert cache.states[0].keys.data_ptr() == grown.data_ptr()  # room left: written in place
    assert repr(cache) == f"HybridCache(lengths=[{N + 2}, {N + 2}], layers=['softmax'], nbytes={cache.nbytes()})"


def test_the_names_are_the_courses_mixers():
    model = _model(list(MIXERS))
    mixers = [block.mixer for block in model.blocks]
    assert [m.decay for m in mixers[1:5]] == ["none", "fixed", "head", "channel"]
    assert all(isinstance(m, GatedLinearAttention) for m in mixers[1:5])
    assert isinstance(mixers[5], DeltaNet) and not mixers[5].gated and mixers[6].gated
    assert HybridLM(VOCAB, layers=["gla"]).chunk_size == DEFAULT_CHUNK_SIZE
    assert not any("position" in name for name, _ in model.named_parameters())  # no absolute positions


def test_training_through_forward_with_padding():
    model = _model(HYBRID, torch.float32)
    padded, key_mask = _padded(_tokens(b=3), [N, 9, 4], "left")
    logits = model(padded, key_mask=key_mask)
    nn.functional.cross_entropy(logits[key_mask], padded[key_mask]).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name


SPECS = [("deltanet", {"negative_eigenvalues": True}), ("deltaproduct", {"n_householder": 3, "gated": "channel"}),
         "softmax"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_layer_specs_with_options(dtype):
    # (name, options) pairs reach the mixer: beta in (0, 2), three reflections a token with a decay per channel
    model = _model(SPECS, dtype)
    mixers = [block.mixer for block in model.blocks]
    assert mixers[0].negative_eigenvalues and mixers[1].n_householder == 3 and mixers[1].gated == "channel"
    _check_prefill_then_steps(model, _tokens(), 5, TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_sliding_window_sees_its_last_w_keys(dtype):
    # window >= n: the full layer; a window of w: a change w or more tokens back changes nothing; the cache
    # counts what a ring buffer of w keys holds, and prefill + steps = forward as for every mixer
    full, wide = _model(["softmax"], dtype), _model([("softmax", {"window": N})], dtype)
    torch.testing.assert_close(wide(_tokens()), full(_tokens()), **TOLERANCES[dtype])
    model, tokens = _model(HYBRID[:3] + [("softmax", {"window": 3})], dtype), _tokens()
    _check_prefill_then_steps(model, tokens, 5, TOLERANCES[dtype])
    alone = _model([("softmax", {"window": 3})], dtype)
    changed = tokens.clone()
    changed[:, 4] = (changed[:, 4] + 1) % VOCAB
    same = alone(changed)[:, 7:] - alone(tokens)[:, 7:]  # positions 7 on: token 4 is 3 or more back
    assert same.abs().max() == 0 and (alone(changed)[:, 4:7] - alone(tokens)[:, 4:7]).abs().amax(-1).min() > 0
    _, cache = alone.prefill(tokens)
    assert cache.nbytes() == 2 * 3 * D_MODEL * torch.finfo(dtype).bits // 8
    assert "window=3" in repr(alone)
    with pytest.raises(ValueError, match="window must be None"):
        HybridLM(VOCAB, layers=[("softmax", {"window": 0})])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"layers must be a non-empty sequence of mixer names .*unknown: \['mamba'\]"):
        HybridLM(VOCAB, layers=["softmax", "mamba"])
    with pytest.raises(ValueError, match=r"unknown: \[\('mamba', \{\}\)\]"):
        HybridLM(VOCAB, layers=[("mamba", {})])
    with pytest.raises(TypeError, match="negative_eigenvalue"):
        HybridLM(VOCAB, layers=[("deltanet", {"negative_eigenvalue": True})])  # a misspelt option
    with pytest.raises(ValueError, match="layers must be a non-empty sequence"):
        HybridLM(VOCAB, layers="softmax")
    with pytest.raises(ValueError, match="head dim d_model / n_heads must be even"):
        HybridLM(VOCAB, layers=["softmax"], d_model=6, n_heads=2)
    model = _model(HYBRID)
    _, cache = model.prefill(_tokens())
    with pytest.raises(ValueError, match=r"tokens_t must be int64 token ids of shape \(b,\)"):
        model.step(_tokens(n=1), cache)  # (b, 1)
    with pytest.raises(ValueError, match="the cache holds 2 sequences, the tokens 3"):
        model.step(_tokens(b=3, n=1)[:, 0], cache)
    with pytest.raises(ValueError, match="a cache from another model"):
        _model(HYBRID).step(_tokens(n=1)[:, 0], cache)  # the same architecture and weights, another model
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 11\)"):
        model.prefill(_tokens() + VOCAB)
    with pytest.raises(ValueError, match="tokens must be int64"):
        model(_tokens().float())
    with pytest.raises(ValueError, match="key_mask must be boolean with the shape of tokens"):
        model(_tokens(), key_mask=torch.ones(2, N - 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="generate needs a prompt"):
        model.generate(_tokens(n=0), 3)


@requires_cuda
def test_cuda_matches_cpu():
    model, tokens = _model(HYBRID), _tokens()
    expected = model(tokens)
    cuda, tokens = model.to("cuda"), tokens.cuda()
    torch.testing.assert_close(cuda(tokens).cpu(), expected, **TOLERANCES[torch.float64])
    _check_prefill_then_steps(cuda, tokens, 5, TOLERANCES[torch.float64])
    assert cuda.generate(tokens, 3).is_cuda
