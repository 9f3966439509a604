"""The offline English corpus of course_lib.tasks: real text, long enough, the same every time."""

import pytest

from course_lib import tasks
from course_lib.pretrained import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_at_least_100_passages_of_512_tokens(tokenizer):
    passages = tasks.english_passages(100, tokenizer=tokenizer)
    assert len(passages) == 100 == len(set(passages))
    lengths = [len(e.ids) for e in tokenizer.encode_batch(passages)]
    assert min(lengths) >= 512


def test_passages_are_deterministic(tokenizer):
    first = tasks.english_passages(100)
    tasks.english_paragraphs.cache_clear()
    tasks._passages.cache_clear()
    assert tasks.english_passages(100) == first
    assert tasks.english_passages(100, tokenizer=tokenizer) == first
    assert tasks.english_passages(3) == first[:3]


def test_passages_are_runs_of_prose_paragraphs(tokenizer):
    paragraphs = tasks.english_paragraphs()
    text = " ".join(paragraphs)
    for passage in tasks.english_passages(20, tokenizer=tokenizer):
        assert passage in text
        letters = sum(c.isalpha() or c.isspace() for c in passage)
        assert letters > 0.85 * len(passage)
    assert not any(">>>" in p or "::=" in p for p in paragraphs)


def test_shorter_passages_are_more_numerous(tokenizer):
    short = tasks.english_passages(1, min_tokens=128, tokenizer=tokenizer)
    assert len(tokenizer.encode(short[0]).ids) >= 128
    with pytest.raises(ValueError, match="n_passages must be between 1 and"):
        tasks.english_passages(10_000, min_tokens=128, tokenizer=tokenizer)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_passages": 0}, "n_passages must be between 1 and"),
    ({"n_passages": 1, "min_tokens": 1}, "min_tokens must be between 2 and 512"),
    ({"n_passages": 1, "min_tokens": 513}, "min_tokens must be between 2 and 512"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tasks.english_passages(**kwargs)


def test_passage_split_never_overlaps(tokenizer):
    train, heldout = tasks.passage_split(150, 48, min_tokens=256, tokenizer=tokenizer)
    assert len(train) == 150 and len(heldout) == 48 and not set(train) & set(heldout)
    # the held-out passages are the corpus's last ones, whatever n_train asks for
    assert tasks.passage_split(3, 5, min_tokens=256, tokenizer=tokenizer)[1] == heldout[:5]
    everything = tasks.english_passages(len(tasks._passages(256, tokenizer)), min_tokens=256, tokenizer=tokenizer)
    assert heldout == everything[-tasks.HELDOUT_PASSAGES:]
    every_other, _ = tasks.passage_split(None, 48, min_tokens=256, tokenizer=tokenizer)  # None: all but held out
    assert every_other == everything[:-tasks.HELDOUT_PASSAGES]


def test_passage_split_refuses_to_train_on_heldout(tokenizer):
    total = len(tasks._passages(256, tokenizer))
    with pytest.raises(ValueError, match="n_train"):
        tasks.passage_split(total - tasks.HELDOUT_PASSAGES + 1, 1, min_tokens=256, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="n_heldout"):
        tasks.passage_split(1, tasks.HELDOUT_PASSAGES + 1, min_tokens=256, tokenizer=tokenizer)


def test_module_docstrings_are_a_second_source_never_trained_on():
    docstrings = tasks.module_docstrings()
    names, texts = zip(*docstrings, strict=True)
    assert len(docstrings) >= 48 and list(names) == sorted(names, key=lambda n: n.replace(".", "/"))  # path order
    assert len(set(texts)) == len(texts) and all(40 <= len(t.split()) <= 180 for t in texts)
    assert not any(part.startswith("_") for name in names for part in name.split("."))
    assert not any(part in ("test", "tests", "idlelib") for name in names for part in name.split("."))
    training = " ".join(tasks.english_paragraphs())
    assert not any(text in training for text in texts)  # none of them is in the training source
    tasks.module_docstrings.cache_clear()
    assert tasks.module_docstrings() == docstrings  # the same on every call
