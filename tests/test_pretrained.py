"""course_lib.pretrained: the course's own encoder equals the packaged reference implementations."""

import os

import numpy as np
import pytest
import torch

from course_lib.pretrained import load_minilm, model_dir, untrained_minilm
from course_lib.tasks import english_passages
from course_lib.torch.full import softmax_attention

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the reference models load from the package folder only
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TEXTS = ["Attention maps of a trained transformer are close to low rank.",
         "Short.",
         "The quick brown fox jumps over the lazy dog, " * 70]  # > 256 tokens: truncated by encode()


@pytest.fixture(scope="module")
def model():
    return load_minilm()


@pytest.fixture(scope="module")
def reference_bert():
    transformers = pytest.importorskip("transformers")
    return transformers.BertModel.from_pretrained(str(model_dir()), attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def passage():
    return english_passages(1)[0]


def test_attention_maps_equal_transformers(model, reference_bert, passage):
    for text, max_length in ((TEXTS[0], 512), (passage, 160)):
        maps = model.attention_maps(text, max_length=max_length, truncate=True)
        token_ids, key_mask = model.tokenize([text], max_length=max_length, truncate=True)
        with torch.no_grad():
            out = reference_bert(input_ids=token_ids, attention_mask=key_mask.long(), output_attentions=True)
        expected = torch.stack(out.attentions, dim=1)[0]  # (layers, heads, n, n)
        assert maps.shape == expected.shape == (6, 12, token_ids.shape[1], token_ids.shape[1])
        torch.testing.assert_close(maps, expected, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(model(token_ids, key_mask), out.last_hidden_state, atol=5e-5, rtol=1e-4)


def test_encode_equals_sentence_transformers(model):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(str(model_dir()), device="cpu")
    assert reference.max_seq_length == model.config.max_seq_length
    expected = reference.encode(TEXTS)
    got = model.encode(TEXTS)
    assert got.shape == expected.shape == (3, 384)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(model.encode(TEXTS[0]), expected[0], atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-6)


def test_padding_does_not_change_a_text_maps(model):
    batch = model.attention_maps(TEXTS[:2])  # TEXTS[1] is padded to TEXTS[0]'s length
    alone = model.attention_maps(TEXTS[1])
    n = alone.shape[-1]
    torch.testing.assert_close(batch[1, ..., :n, :n], alone, atol=1e-5, rtol=1e-4)
    assert torch.all(batch[1, ..., :n, n:] == 0)  # no weight on padding keys


def test_maps_are_row_stochastic_and_numpy_on_request(model):
    maps = model.attention_maps(TEXTS[0], as_numpy=True)
    assert isinstance(maps, np.ndarray) and maps.dtype == np.float64
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    assert (maps >= 0).all()


SHORT = TEXTS[:2]


def test_swapping_in_softmax_attention_changes_nothing(model):
    same = model.with_attention(softmax_attention)
    np.testing.assert_array_equal(same.encode(SHORT), model.encode(SHORT))
    torch.testing.assert_close(same.attention_maps(TEXTS[0]), model.attention_maps(TEXTS[0]))


def test_swapping_in_another_kernel_changes_the_outputs(model):
    calls = []

    def uniform_attention(q, k, v, *, causal=False, key_mask=None):
        calls.append(q.shape)
        weights = torch.ones(*q.shape[:-1], k.shape[-2], dtype=q.dtype)  # (..., n, s)
        weights = weights.masked_fill(~key_mask[..., None, :], 0) if key_mask is not None else weights
        return (weights / weights.sum(-1, keepdim=True)) @ v

    before = model.encode(SHORT)
    swapped = model.with_attention(uniform_attention)
    after = swapped.encode(SHORT)
    assert len(calls) == 6  # every layer, one batch
    assert np.abs(after - before).max() > 1e-2
    np.testing.assert_array_equal(model.encode(SHORT), before)  # the original model is untouched
    also = load_minilm(attention=uniform_attention).encode(SHORT)
    np.testing.assert_allclose(also, after, atol=1e-6)


def test_untrained_model_is_seeded(model):
    a, b, c = untrained_minilm(seed=0), untrained_minilm(seed=0), untrained_minilm(seed=1)
    maps = a.attention_maps(TEXTS[0])
    assert maps.shape == model.attention_maps(TEXTS[0]).shape
    torch.testing.assert_close(maps, b.attention_maps(TEXTS[0]), atol=0, rtol=0)
    assert not torch.allclose(maps, c.attention_maps(TEXTS[0]))
    assert not torch.allclose(maps, model.attention_maps(TEXTS[0]))


def test_bad_input_raises(model, passage):
    with pytest.raises(ValueError, match="max_length is 64; pass a shorter text or truncate=True"):
        model.attention_maps(passage, max_length=64)
    assert model.attention_maps(passage, max_length=64, truncate=True).shape == (6, 12, 64, 64)
    with pytest.raises(ValueError, match="max_length must be between 2 and 512"):
        model.attention_maps(TEXTS[0], max_length=1024)
    with pytest.raises(TypeError, match="texts must be a non-empty list of strings"):
        model.tokenize([])
    with pytest.raises(TypeError, match="attention must be a function"):
        model.with_attention("softmax")
