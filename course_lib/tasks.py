"""Small tasks and a text corpus for the lessons: nothing here downloads anything.

The corpus (notebooks 02–04, 09) is real English prose that ships with Python itself: the
help texts of the Python Language Reference that ``help("topic")`` shows, stored in the
standard-library module ``pydoc_data.topics``.  A second source, never trained on, scores
notebook 10's models on other text: the standard library's module docstrings.  Training tasks
for the later lessons follow the corpus section.
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
        n_train: training passages (0 to all but the held-out ones; None: all of them).
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
    n_train = free if n_train is None else n_train
    if not 1 <= n_heldout <= HELDOUT_PASSAGES:
        raise ValueError(f"n_heldout must be between 1 and {HELDOUT_PASSAGES}, got {n_heldout}.")
    if not 0 <= n_train <= free:
        raise ValueError(f"n_train must be between 0 and {free} (the passages of at least {min_tokens} tokens "
                         f"that are not held out), got {n_train}.")
    return list(passages[:n_train]), list(passages[free:free + n_heldout])


DOCSTRING_SOURCE = "the module docstrings of the Python standard library (a second text source, never trained on)"
_NOT_LIBRARY = {"test", "tests", "idle_test", "idlelib", "turtledemo", "lib2to3", "ensurepip", "site-packages",
                "dist-packages", "__pycache__"}  # test suites, applications and installed packages


@functools.lru_cache(maxsize=4)
def module_docstrings(min_words=40, max_words=180):
    """The docstrings of the standard library's public modules: a second text source. Notebook 10, Section 10.6.

    Every lesson and tool trains on ``english_paragraphs()`` (the Language Reference help
    texts); these docstrings are another kind of English about Python, never trained on.  The
    ``.py`` files under the standard library's directory are read in sorted path order (never
    imported: a module's docstring is parsed from its source), test suites, applications
    (``idlelib``, ``turtledemo``, ``lib2to3``) and private modules (a name part starting with
    ``_``) left out; a docstring is kept, its whitespace collapsed to single spaces, when it has
    ``min_words`` to ``max_words`` words and no module before it has the same one.

    Returns:
        A tuple of ``(module name, docstring)`` pairs (the same on every machine with the same
        Python version).
    """
    import ast
    import pathlib
    import sysconfig

    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    kept, seen = [], set()
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if (_NOT_LIBRARY & set(parts) or parts[-1] == "__main__"
                or any(part.startswith("_") and part != "__init__" for part in parts)):
            continue
        try:
            docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a file that is not Python 3 source of this version
        text = " ".join((docstring or "").split())
        if min_words <= len(text.split()) <= max_words and text not in seen:
            kept.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), text))
            seen.add(text)
    return tuple(kept)


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


IGNORED = -100  # a target the loss and the accuracy skip (torch's cross_entropy ignores -100 by default)


def reversal_loss(model, tokens, targets):
    """Mean cross-entropy of ``model(tokens)`` (logits ``(b, n, vocab)``) against ``targets``.

    Positions whose target is ``IGNORED`` are left out of the mean (the lookup task's table).
    """
    import torch.nn.functional as F

    logits = model(tokens)  # (b, n, vocab)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORED)


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


def evaluate_batch(model, tokens, targets):
    """``(loss, accuracy)`` of ``model`` on one batch; accuracy per scored token (target not ``IGNORED``)."""
    import torch

    model.eval()
    with torch.no_grad():
        logits = model(tokens)  # (b, n, vocab)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORED)
        scored = targets != IGNORED  # (b, n)
        accuracy = (logits.argmax(-1) == targets)[scored].double().mean()
    return loss.item(), accuracy.item()


def evaluate_reversal(model, *, n, vocab_size, generator, batch_size=256):
    """``(loss, accuracy)`` of ``model`` on one held-out reversal batch; accuracy is per token."""
    return evaluate_batch(model, *reversal_batch(batch_size, n, vocab_size, generator))


def lookup_batch(batch_size, n, vocab_size, generator, *, table=8):
    """A batch of the table-lookup task, whose attention has rank at most ``table`` at every n. Notebook 05.

    The first ``table`` positions hold a table of random symbols (0 … vocab_size − 1); every
    later position holds an index into it (a token 0 … table − 1) and its target is the symbol
    stored there.  The attention that solves it in one head sends each query to one of the first
    ``table`` positions: its P has non-zero columns only there, so rank(P) ≤ ``table`` however
    long the sequence — the opposite of reversal's rank-n permutation.  The table positions have
    no target (``IGNORED``).

    Args:
        batch_size, n, vocab_size: batch size b, sequence length n (> table), number of token values.
        generator: a ``torch.Generator``; the same generator state gives the same batch.
        table: table entries, 1 ≤ table ≤ vocab_size (an index is a token).

    Returns:
        ``(tokens, targets)``, both ``(b, n)`` int64.
    """
    import torch

    if not 1 <= table <= vocab_size or table >= n:
        raise ValueError(f"table must satisfy 1 <= table <= vocab_size = {vocab_size} and table < n = {n}, "
                         f"got {table}.")
    symbols = torch.randint(0, vocab_size, (batch_size, table), generator=generator)  # (b, table)
    index = torch.randint(0, table, (batch_size, n - table), generator=generator)  # (b, n - table)
    targets = torch.cat([torch.full_like(symbols, IGNORED), symbols.gather(1, index)], dim=1)  # (b, n)
    return torch.cat([symbols, index], dim=1), targets


def evaluate_lookup(model, *, n, vocab_size, generator, batch_size=256, table=8):
    """``(loss, accuracy)`` of ``model`` on one held-out lookup batch; accuracy per looked-up token."""
    return evaluate_batch(model, *lookup_batch(batch_size, n, vocab_size, generator, table=table))


# --- Lesson 07: sequence duplication (the copy task) ---------------------------------------

COPY_SEPARATOR = 0  # token 0 separates the sequence from its copy and pads after it; symbols are 1 … n_symbols


def copy_batch(batch_size, length, n_symbols, generator, *, min_length=None):
    """A batch of the copy task: L random symbols, the separator, the same L symbols again. Notebook 07.

    Katharopoulos et al. 2020, §4.1 (sequence duplication), scaled down: sequences of varying
    length, as in the paper (up to 128 positions, 10 symbols).  Each row draws its own L
    uniformly from ``min_length … length``, so its copy starts at its own offset: a causal model
    reading it as next-token prediction must find where the copy began (the separator) rather
    than look a fixed number of positions back.  Position p of the copy (the separator at p = L
    included) predicts token p + 1, which equals token p − L: the symbol L positions back.  Rows
    shorter than ``length`` are padded with the separator after their copy; the scored positions
    of a causal model never see the padding.

    Args:
        batch_size, n_symbols: batch size b, number of symbols.
        length: the longest L (every row's L when ``min_length`` is None).
        generator: a ``torch.Generator``; the same generator state gives the same batch.
        min_length: the shortest L (1 ≤ min_length ≤ length), or None for a fixed L = length.

    Returns:
        ``(b, 2·length + 1)`` int64 tokens; ``copy_lengths(tokens)`` gives each row's L.
    """
    import torch

    min_length = length if min_length is None else min_length
    if not 1 <= min_length <= length:
        raise ValueError(f"min_length must lie in 1 … length = {length}, got {min_length}.")
    symbols = torch.randint(1, n_symbols + 1, (batch_size, length), generator=generator)  # (b, L_max)
    lengths = torch.randint(min_length, length + 1, (batch_size, 1), generator=generator)  # (b, 1)
    positions = torch.arange(2 * length + 1)  # (t,), t = 2 L_max + 1
    source = torch.where(positions < lengths, positions, positions - lengths - 1)  # (b, t): which symbol
    tokens = symbols.gather(1, source.clamp(0, length - 1))  # (b, t)
    is_symbol = (positions != lengths) & (positions <= 2 * lengths)  # not the separator, not padding
    return torch.where(is_symbol, tokens, COPY_SEPARATOR)


def copy_lengths(tokens):
    """Each row's L: the position of its first separator. ``tokens (b, t)`` → ``(b,)`` int64."""
    return (tokens == COPY_SEPARATOR).long().argmax(dim=1)


def _copy_scored(tokens):
    """``(b, t - 1)`` bool: the input positions whose next token is scored, L … 2L − 1 of each row."""
    import torch

    lengths = copy_lengths(tokens)[:, None]  # (b, 1)
    positions = torch.arange(tokens.shape[1] - 1, device=tokens.device)  # (t - 1,)
    return (positions >= lengths) & (positions < 2 * lengths)


def copy_loss(model, tokens):
    """Cross-entropy of the next-token prediction on the copied half only (the first half is random).

    ``model(tokens[:, :-1])`` gives logits ``(b, t - 1, vocab)``; in each row, position L (the
    separator) predicts the first copied symbol and position 2L − 1 the last.  The mean runs over
    every scored token of the batch.
    """
    import torch.nn.functional as F

    scored = _copy_scored(tokens)  # (b, t - 1)
    logits = model(tokens[:, :-1])  # (b, t - 1, vocab)
    return F.cross_entropy(logits[scored], tokens[:, 1:][scored])


def train_copy(model, *, length, n_symbols, steps, generator, min_length=None, batch_size=32, lr=3e-3,
               log_every=10, eval_every=0, eval_generator=None, eval_batch=256):
    """Train ``model`` on fresh copy-task batches drawn from ``generator`` (see ``train``).

    ``eval_every=E`` also scores the model on one held-out batch (``eval_generator``'s first draw,
    the same batch every time) after every E steps, before the next step's update: the keys
    ``eval_step``, ``eval_loss`` and ``eval_accuracy`` join the history.  Scoring draws nothing
    from ``generator`` and computes no gradient, so it leaves the training run unchanged.
    """
    history = {"eval_step": [], "eval_loss": [], "eval_accuracy": []}
    held_out = None
    if eval_every:
        held_out = copy_batch(eval_batch, length, n_symbols, eval_generator, min_length=min_length)
    done = 0

    def next_loss():
        nonlocal done
        if eval_every and done and done % eval_every == 0:
            loss, accuracy = _score_copy(model, held_out)
            model.train()
            history["eval_step"].append(done)
            history["eval_loss"].append(loss)
            history["eval_accuracy"].append(accuracy)
        done += 1
        return copy_loss(model, copy_batch(batch_size, length, n_symbols, generator, min_length=min_length))

    history.update(train(model, next_loss, steps=steps, lr=lr, log_every=log_every))
    if eval_every and steps % eval_every == 0:  # the score after the last step
        loss, accuracy = _score_copy(model, held_out)
        history["eval_step"].append(steps)
        history["eval_loss"].append(loss)
        history["eval_accuracy"].append(accuracy)
    return history if eval_every else {key: history[key] for key in ("step", "loss")}


def _score_copy(model, tokens):
    """``(loss, accuracy)`` of ``model`` on ``tokens``, in eval mode, without gradients."""
    import torch

    scored = _copy_scored(tokens)  # (b, t - 1)
    model.eval()
    with torch.no_grad():
        logits = model(tokens[:, :-1])  # (b, t - 1, vocab)
        loss = torch.nn.functional.cross_entropy(logits[scored], tokens[:, 1:][scored]).item()
        accuracy = (logits.argmax(-1)[scored] == tokens[:, 1:][scored]).double().mean().item()
    return loss, accuracy


def evaluate_copy(model, *, length, n_symbols, generator, min_length=None, batch_size=256):
    """``(loss, accuracy)`` on one held-out copy batch; accuracy is per copied token (teacher forcing)."""
    return _score_copy(model, copy_batch(batch_size, length, n_symbols, generator, min_length=min_length))


# --- Lesson 11: multi-query associative recall (MQAR) --------------------------------------

MIXERS = ("softmax", "linear", "retnet", "gate", "deltanet", "gated_deltanet")  # notebook 11's six token mixers


def mqar_batch(batch_size, n_pairs, generator, *, n_keys=32, n_values=32):
    """A batch of multi-query associative recall: N key-value pairs, then every key asked again. Notebook 11.

    Zoology's MQAR (Arora et al. 2023, arXiv 2312.04927, §3), in its simplest layout: a row is
    ``k_1 v_1 k_2 v_2 … k_N v_N q_1 … q_N`` where the N keys are distinct, drawn from tokens
    ``0 … n_keys − 1``, the values from tokens ``n_keys … n_keys + n_values − 1`` (repeats
    allowed), and the queries ``q_1 … q_N`` are the same N keys in a random order.  The target at a
    query's position is the value bound to that key; every other target is ``IGNORED``, so a loss
    and an accuracy count the queries only.  A query's pair lies between 1 and 2N positions back:
    the model must find it by content, not by offset.

    Args:
        batch_size: rows b.
        n_pairs: N, key-value pairs per row (1 ≤ N ≤ n_keys).
        generator: a ``torch.Generator``; the same generator state gives the same batch.
        n_keys, n_values: how many key tokens and value tokens; the vocabulary is their sum.

    Returns:
        ``(tokens, targets)``, both ``(b, 3N)`` int64.
    """
    import torch

    if not 1 <= n_pairs <= n_keys:
        raise ValueError(f"n_pairs must lie in 1 … n_keys = {n_keys} (the keys of a row are distinct), got {n_pairs}.")
    keys = torch.rand(batch_size, n_keys, generator=generator).argsort(dim=1)[:, :n_pairs]  # (b, N), distinct
    values = n_keys + torch.randint(0, n_values, (batch_size, n_pairs), generator=generator)  # (b, N)
    order = torch.rand(batch_size, n_pairs, generator=generator).argsort(dim=1)  # (b, N): the queries' order
    pairs = torch.stack([keys, values], dim=2).flatten(1)  # (b, 2N): k_1 v_1 k_2 v_2 …
    tokens = torch.cat([pairs, keys.gather(1, order)], dim=1)  # (b, 3N)
    targets = torch.cat([torch.full_like(pairs, IGNORED), values.gather(1, order)], dim=1)  # (b, 3N)
    return tokens, targets


def mqar_model(mixer, vocab_size, max_len, *, d_model=64, n_heads=1, n_layers=2, conv_size=4, chunk_size=32,
               positions=True):
    """Notebook 07's ``CausalLM`` with its attention swapped for one of ``MIXERS``. Notebook 11, Section 11.4.

    Every block stays ``x + mixer(norm(x))``, then ``x + mlp(norm(x))``; only the token mixer
    changes: ``"softmax"`` (causal ``MultiHeadAttention`` after the same short convolution, over the
    block's input rather than per projection), or a recurrent mixer of
    ``course_lib.torch.modules`` with one front end (short convolution, L2-normalised keys):
    ``"linear"`` (``GatedLinearAttention``, no decay), ``"retnet"`` (a fixed decay per head),
    ``"gate"`` (a data-dependent decay per head: simple GLA, Mamba-2 without Δ_t on the write),
    ``"deltanet"`` and ``"gated_deltanet"`` (``DeltaNet``).  A recurrent mixer's state is ``n_heads`` matrices of
    ``(d_model / n_heads)²`` numbers per layer: fewer heads, a larger state.  Only ``forward`` is
    for these models (``CausalLM.step`` knows softmax and linear attention alone).

    Args:
        mixer: one of ``MIXERS``.
        vocab_size, max_len, d_model, n_heads, n_layers: as for ``CausalLM``.
        conv_size: the short causal convolution's width, every mixer alike (0: none).
        chunk_size: the recurrent mixers' chunk length (None: the token loop).
        positions: keep ``CausalLM``'s learned absolute position embeddings (the default).  False
            sets them to zero and freezes them, as recurrent language models are built: order then
            comes from the short convolution and the recurrence alone (with them a trained model can
            weight later writes more and imitate an overwrite).  The other weights are drawn exactly
            as with positions, so a seed gives the same initial model either way.
    """
    import torch
    from torch import nn

    from course_lib.torch._mixers import ShortConvolution
    from course_lib.torch.causal_lm import CausalLM
    from course_lib.torch.modules import DeltaNet, GatedLinearAttention

    if mixer not in MIXERS:
        raise ValueError(f"mixer must be one of {MIXERS}, got {mixer!r}.")
    model = CausalLM(vocab_size, max_len, d_model=d_model, n_heads=n_heads, n_layers=n_layers, attention="softmax")
    decays = dict(linear="none", retnet="fixed", gate="head")
    for block in model.blocks:
        if mixer == "softmax":  # the recurrent mixers' short convolution in front of softmax too: one front end
            block.attn = nn.Sequential(ShortConvolution(d_model, conv_size), block.attn) if conv_size else block.attn
        elif mixer in decays:
            block.attn = GatedLinearAttention(d_model, n_heads, decay=decays[mixer], conv_size=conv_size,
                                              chunk_size=chunk_size)
        else:
            block.attn = DeltaNet(d_model, n_heads, gated=mixer == "gated_deltanet", conv_size=conv_size,
                                  chunk_size=chunk_size)
        block.attention = mixer
    model.attention = mixer
    if not positions:  # zero and frozen: x = embed(token) + 0 at every position
        with torch.no_grad():
            model.position.weight.zero_()
        model.position.weight.requires_grad_(False)
    return model


def state_numbers(model):
    """Numbers in a model's recurrent state per sequence, all layers (None for softmax: its cache grows with n)."""
    sizes = [block.attn.state_size() for block in model.blocks if hasattr(block.attn, "state_size")]
    return sum(sizes) if sizes else None


def train_scored(model, next_loss, score, *, steps, lr=3e-3, eval_every=100, stop_accuracy=None, plateau=None):
    """Adam on ``next_loss()`` every step, ``score()`` after every ``eval_every`` steps, and an early stop.

    The training loop of the stored runs of notebooks 11 and 14 (tools/train_recall.py,
    train_copy_state.py, train_hybrids.py): ``next_loss()`` draws the next batch and returns the
    model's loss on it; ``score()`` returns ``(loss, accuracy)`` on a fixed
    held-out batch without drawing from the training generator (it may leave the model in eval
    mode: training resumes in train mode).  The run stops when that accuracy reaches
    ``stop_accuracy``, when ``plateau_step`` (options in the dict ``plateau``) finds the held-out
    loss has stopped falling, or after ``steps``.

    Returns:
        ``{"step", "loss"}`` (the training loss every step), ``{"eval_step", "eval_loss",
        "eval_accuracy"}`` and ``"stop"``: ``"accuracy"``, ``"plateau"`` or ``"steps"``.
    """
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = {"step": [], "loss": [], "eval_step": [], "eval_loss": [], "eval_accuracy": [], "stop": "steps"}
    model.train()
    for step in range(1, steps + 1):
        loss = next_loss()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history["step"].append(step)
        history["loss"].append(loss.item())
        if step % eval_every == 0:
            held_loss, accuracy = score()
            model.train()
            for key, value in (("eval_step", step), ("eval_loss", held_loss), ("eval_accuracy", accuracy)):
                history[key].append(value)
            if stop_accuracy is not None and accuracy >= stop_accuracy:
                history["stop"] = "accuracy"
                break
            if plateau is not None and plateau_step(history["eval_step"], history["eval_loss"], **plateau) == step:
                history["stop"] = "plateau"
                break
    return history


def evaluate_mqar(model, *, n_pairs, generator, batch_size=256, n_keys=32, n_values=32):
    """``(loss, accuracy)`` on one held-out MQAR batch; accuracy per query (teacher forcing is moot: one pass)."""
    return evaluate_batch(model, *mqar_batch(batch_size, n_pairs, generator, n_keys=n_keys, n_values=n_values))


def plateau_step(eval_step, eval_loss, *, window=300, tol=0.01, min_step=600):
    """The first scored step at which the best held-out loss fell by less than ``tol`` over the last ``window``
    steps (not before ``min_step``): notebook 05's plateau test, read off a run's history; None if never."""
    for i, step in enumerate(eval_step):
        if step < max(min_step, window + eval_step[0]):
            continue
        before = min(loss for s, loss in zip(eval_step[:i + 1], eval_loss, strict=False) if s <= step - window)
        if before - min(eval_loss[:i + 1]) < tol:
            return step
    return None
