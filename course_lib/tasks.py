"""Small tasks and a text corpus for the lessons: nothing here downloads anything.

The corpus (notebooks 02–04, 09) is real English prose that ships with Python itself: the
help texts of the Python Language Reference that ``help("topic")`` shows, stored in the
standard-library module ``pydoc_data.topics``.  Training tasks for the later lessons follow
the corpus section.
"""

import functools
import re

# --- Text corpus ---------------------------------------------------------------------------

CORPUS_SOURCE = "pydoc_data.topics (the Python Language Reference help texts in the standard library)"


@functools.lru_cache(maxsize=1)
def english_paragraphs():
    """The prose paragraphs of ``pydoc_data.topics``, in a fixed order, one line each. Notebook 02, Section 2.2.

    Topics are taken in sorted order and split at blank lines.  Code, grammar rules and tables
    are dropped: a paragraph is kept when it has at least 8 words, no ``>>>`` prompt and no
    ``::=`` rule, and at least 90 % of its characters are letters, spaces or plain punctuation.
    A paragraph that appears under several topics is kept once.

    Returns:
        A tuple of strings (the same on every machine with the same Python version).
    """
    from pydoc_data.topics import topics

    kept, seen = [], set()
    for key in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[key]):
            text = " ".join(block.split())
            if len(text.split()) < 8 or ">>>" in text or "::=" in text or text in seen:
                continue
            prose = sum(c.isalpha() or c in " .,;:'()-\"" for c in text)
            if prose >= 0.9 * len(text):
                kept.append(text)
                seen.add(text)
    return tuple(kept)


@functools.lru_cache(maxsize=8)
def _passages(min_tokens, tokenizer):
    counts = [len(e.ids) for e in tokenizer.encode_batch(list(english_paragraphs()))]  # with [CLS], [SEP]
    passages, current, tokens = [], [], 2
    for paragraph, count in zip(english_paragraphs(), counts, strict=True):
        current.append(paragraph)
        tokens += count - 2
        if tokens >= min_tokens:
            passages.append(" ".join(current))
            current, tokens = [], 2
    return tuple(passages)


def english_passages(n_passages, min_tokens=512, tokenizer=None):
    """The first ``n_passages`` passages of English text, each ``min_tokens`` long or more. Notebook 02, Section 2.2.

    A passage is a run of consecutive paragraphs of ``english_paragraphs()``, closed as soon as
    it reaches ``min_tokens`` tokens ([CLS] and [SEP] included), so
    ``load_minilm().attention_maps(passage, max_length=min_tokens, truncate=True)`` gives
    exactly ``n = min_tokens``.  Passages never overlap.  With the default 512 there are more
    than 100 of them.

    Args:
        n_passages: how many passages (at least 1).
        min_tokens: the least number of tokens per passage (2 to 512).
        tokenizer: a ``tokenizers.Tokenizer`` that counts tokens (default: MiniLM's).

    Returns:
        A list of ``n_passages`` strings, the same on every call.
    """
    if not 2 <= min_tokens <= 512:
        raise ValueError(f"min_tokens must be between 2 and 512 (the model's positions), got {min_tokens}.")
    if tokenizer is None:
        from course_lib.pretrained import load_tokenizer

        tokenizer = _default_tokenizer(load_tokenizer)
    passages = _passages(min_tokens, tokenizer)
    if not 1 <= n_passages <= len(passages):
        raise ValueError(f"n_passages must be between 1 and {len(passages)} (the passages of at least "
                         f"{min_tokens} tokens in {CORPUS_SOURCE}), got {n_passages}.")
    return list(passages[:n_passages])


HELDOUT_PASSAGES = 48  # the last 48 passages of each length are held out: no lesson or tool trains on them


def passage_split(n_train, n_heldout, min_tokens=256, tokenizer=None):
    """Training passages from the start of the corpus and held-out passages from its end. Notebooks 04, 09, 10.

    Every lesson and tool that fits something to MiniLM (learned E, F; learned feature maps)
    trains on the first split and reports on the second, so a result is never measured on the
    text it was fitted to.  The held-out passages are the last ``HELDOUT_PASSAGES`` passages of
    ``english_passages(…, min_tokens)`` — other help topics than the training ones — and the
    same ``n_heldout`` always gives the same passages.

    Args:
        n_train: training passages (0 to all but the held-out ones).
        n_heldout: held-out passages (1 to ``HELDOUT_PASSAGES``).
        min_tokens: the least number of tokens per passage (2 to 512).
        tokenizer: as for ``english_passages``.

    Returns:
        ``(train, heldout)``: two lists of strings with no passage in common.
    """
    if tokenizer is None:
        from course_lib.pretrained import load_tokenizer

        tokenizer = _default_tokenizer(load_tokenizer)
    passages = _passages(min_tokens, tokenizer)
    free = len(passages) - HELDOUT_PASSAGES
    if not 1 <= n_heldout <= HELDOUT_PASSAGES:
        raise ValueError(f"n_heldout must be between 1 and {HELDOUT_PASSAGES}, got {n_heldout}.")
    if not 0 <= n_train <= free:
        raise ValueError(f"n_train must be between 0 and {free} (the passages of at least {min_tokens} tokens "
                         f"that are not held out), got {n_train}.")
    return list(passages[:n_train]), list(passages[free:free + n_heldout])


_TOKENIZERS = {}


def _default_tokenizer(load):
    """MiniLM's tokenizer, loaded once (one object, so ``_passages`` caches on it)."""
    if "minilm" not in _TOKENIZERS:
        _TOKENIZERS["minilm"] = load()
    return _TOKENIZERS["minilm"]


# --- Lesson 05: sequence reversal ----------------------------------------------------------

def reversal_batch(batch_size, n, vocab_size, generator):
    """A batch of the reversal task: read n random tokens, emit them in reverse order. Notebook 05.

    A non-causal relative of the copy task of Katharopoulos et al. 2020, §4.1: the target at
    position i is the input token at position n - 1 - i, so every output needs a token from
    elsewhere in the sequence, and the attention that solves it is a permutation matrix —
    rank n, the opposite of the low-rank attention of notebook 02.

    Args:
        batch_size, n, vocab_size: batch size b, sequence length n, number of token values.
        generator: a ``torch.Generator``; the same generator state gives the same batch.

    Returns:
        ``(tokens, targets)``, both ``(b, n)`` int64.
    """
    import torch

    tokens = torch.randint(0, vocab_size, (batch_size, n), generator=generator)  # (b, n)
    return tokens, tokens.flip(-1)


def reversal_loss(model, tokens, targets):
    """Mean cross-entropy of ``model(tokens)`` (logits ``(b, n, vocab)``) against ``targets``."""
    import torch.nn.functional as F

    logits = model(tokens)  # (b, n, vocab)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train(model, next_loss, *, steps, lr=3e-3, log_every=10):
    """Adam on a fresh batch every step; return the logged training losses.

    ``next_loss()`` draws the next batch (from the task's generator) and returns the model's loss
    on it, so a run is fixed by the generator's seed and the model's initial weights (seed torch
    before building the model).

    Returns:
        ``{"step": [...], "loss": [...]}``: the loss every ``log_every`` steps (and the last).
    """
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = {"step": [], "loss": []}
    model.train()
    for step in range(1, steps + 1):
        loss = next_loss()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % log_every == 0 or step == steps:
            history["step"].append(step)
            history["loss"].append(loss.item())
    return history


def train_reversal(model, *, n, vocab_size, steps, generator, batch_size=32, lr=3e-3, log_every=10):
    """Train ``model`` on fresh reversal batches drawn from ``generator`` (see ``train``)."""
    return train(model, lambda: reversal_loss(model, *reversal_batch(batch_size, n, vocab_size, generator)),
                 steps=steps, lr=lr, log_every=log_every)


def evaluate_reversal(model, *, n, vocab_size, generator, batch_size=256):
    """``(loss, accuracy)`` of ``model`` on one held-out reversal batch; accuracy is per token."""
    import torch

    tokens, targets = reversal_batch(batch_size, n, vocab_size, generator)
    model.eval()
    with torch.no_grad():
        loss = reversal_loss(model, tokens, targets).item()
        accuracy = (model(tokens).argmax(-1) == targets).double().mean().item()
    return loss, accuracy


# --- Lesson 07: sequence duplication (the copy task) ---------------------------------------

COPY_SEPARATOR = 0  # token 0 separates the sequence from its copy; symbols are 1 … n_symbols


def copy_batch(batch_size, length, n_symbols, generator):
    """A batch of the copy task: ``length`` random symbols, the separator, the same symbols again. Notebook 07.

    Katharopoulos et al. 2020, §4.1 (sequence duplication), scaled down: a fixed ``length`` and
    ``n_symbols`` symbols (the paper: up to 128 positions, 10 symbols).  Read by a causal model
    as next-token prediction, the second half can only be predicted by attending ``length + 1``
    positions back.

    Args:
        batch_size, length, n_symbols: batch size b, symbols per half L, number of symbols.
        generator: a ``torch.Generator``; the same generator state gives the same batch.

    Returns:
        ``(b, 2 L + 1)`` int64 tokens.
    """
    import torch

    symbols = torch.randint(1, n_symbols + 1, (batch_size, length), generator=generator)  # (b, L)
    separator = torch.full((batch_size, 1), COPY_SEPARATOR, dtype=torch.long)  # (b, 1)
    return torch.cat([symbols, separator, symbols], dim=1)  # (b, 2L + 1)


def copy_loss(model, tokens):
    """Cross-entropy of the next-token prediction on the copied half only (the first half is random).

    ``model(tokens[:, :-1])`` gives logits ``(b, 2L, vocab)``; position L (the separator)
    predicts the first copied symbol, position 2L - 1 the last.
    """
    import torch.nn.functional as F

    length = (tokens.shape[1] - 1) // 2
    logits = model(tokens[:, :-1])[:, length:]  # (b, L, vocab): the predictions of the copy
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, length + 1:].flatten())


def train_copy(model, *, length, n_symbols, steps, generator, batch_size=32, lr=3e-3, log_every=10):
    """Train ``model`` on fresh copy-task batches drawn from ``generator`` (see ``train``)."""
    return train(model, lambda: copy_loss(model, copy_batch(batch_size, length, n_symbols, generator)),
                 steps=steps, lr=lr, log_every=log_every)


def evaluate_copy(model, *, length, n_symbols, generator, batch_size=256):
    """``(loss, accuracy)`` on one held-out copy batch; accuracy is per copied token (teacher forcing)."""
    import torch

    tokens = copy_batch(batch_size, length, n_symbols, generator)
    model.eval()
    with torch.no_grad():
        loss = copy_loss(model, tokens).item()
        predicted = model(tokens[:, :-1])[:, length:].argmax(-1)  # (b, L)
        accuracy = (predicted == tokens[:, length + 1:]).double().mean().item()
    return loss, accuracy
