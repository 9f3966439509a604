"""State-tracking tasks: parity, counting mod m and composing permutations of S3. Notebook 13.

Each task is a finite automaton read one token at a time, with an answer at every position: the
automaton's state after the prefix.  A model that tracks the state must answer every prefix, so one
sequence of length n scores lengths 1 … n at once (a causal model's answer at t sees only tokens ≤ t).

* parity: tokens 0/1, the answer is the number of 1s so far mod 2 (Grazzi et al. 2025, arXiv 2411.12537);
* counting mod m: tokens 0/1, the answer is the number of 1s so far mod m (the cyclic group Z_m);
* S3: tokens are the 6 permutations of three items, the answer is the product of the prefix (the word
  problem of S3; Merrill et al. 2024, arXiv 2404.08819; Siems et al. 2025, arXiv 2502.10297).

Randomness is an argument (``rng``, a ``numpy.random.Generator``); tokens and answers are int64 arrays.
"""

import itertools

import numpy as np

S3 = tuple(itertools.permutations(range(3)))  # the 6 elements; S3[0] is the identity; p[i] is where i goes
TASKS = ("parity", "mod", "s3")


def compose(later, earlier):
    """The permutation "``earlier``, then ``later``": ``i ↦ later[earlier[i]]``."""
    return tuple(later[i] for i in earlier)


COMPOSE = np.array([[S3.index(compose(S3[a], S3[b])) for b in range(6)] for a in range(6)])  # (6, 6): a after b


def sizes(task, m=3):
    """``(symbols, classes)``: the token alphabet's size and the number of answers of ``task``."""
    if task == "parity":
        return 2, 2
    if task == "mod":
        return 2, m
    if task == "s3":
        return 6, 6
    raise ValueError(f"task must be one of {TASKS}, got {task!r}.")


def count_mod_answers(bits, m):
    """The number of 1s up to and including each position, mod m: ``bits (..., n)`` → ``(..., n)``."""
    return np.cumsum(np.asarray(bits, dtype=np.int64), axis=-1) % m


def parity_answers(bits):
    """The parity of the 1s up to and including each position: ``bits (..., n)`` → ``(..., n)`` in {0, 1}."""
    return count_mod_answers(bits, 2)


def s3_answers(tokens):
    """The running product g_t ∘ … ∘ g_1 of permutations ``tokens (..., n)`` (indices into ``S3``) → ``(..., n)``."""
    tokens = np.asarray(tokens, dtype=np.int64)
    answers = np.empty_like(tokens)
    state = np.zeros(tokens.shape[:-1], np.int64)  # the identity
    for t in range(tokens.shape[-1]):
        state = COMPOSE[tokens[..., t], state]  # the new token acts after everything before it
        answers[..., t] = state
    return answers


def answers(task, tokens, m=3):
    """The answer at every position of ``task`` for ``tokens (..., n)``."""
    if task == "parity":
        return parity_answers(tokens)
    if task == "mod":
        return count_mod_answers(tokens, m)
    if task == "s3":
        return s3_answers(tokens)
    raise ValueError(f"task must be one of {TASKS}, got {task!r}.")


def sample(task, batch, length, rng, m=3):
    """``(tokens, answers)``, each ``(batch, length)`` int64: uniform random tokens and their answers."""
    symbols, _ = sizes(task, m)
    tokens = rng.integers(0, symbols, size=(batch, length))
    return tokens, answers(task, tokens, m)


def accuracy_by_length(predicted, target, edges):
    """Accuracy of the answers at positions in each bin ``(edges[i], edges[i + 1]]`` (1-based positions).

    Args:
        predicted, target: ``(batch, n)`` answers.
        edges: increasing positions, ``edges[0] ≥ 0`` and ``edges[-1] ≤ n``.

    Returns:
        A list of ``len(edges) − 1`` floats.
    """
    right = np.asarray(predicted) == np.asarray(target)  # (batch, n)
    return [float(right[:, lo:hi].mean()) for lo, hi in itertools.pairwise(edges)]


def predict(model, tokens, classes):
    """A torch model's answer at every position: the most likely of its first ``classes`` logits. ``(b, n)`` ints."""
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(tokens))[..., :classes].argmax(-1).numpy()


def learning_rate_scores(runs, *, last=5):
    """The score each learning rate of each cell earns in a sweep: ``{(task, mixer): {lr: score}}``. Notebook 13.

    A cell is a ``(task, mixer)``; its score at one learning rate is the held-out accuracy at the training length
    (``val_accuracy``), averaged over each run's last ``last`` evaluations and then over the seeds.

    Args:
        runs: dicts with ``task``, ``mixer``, ``lr`` and ``val_accuracy`` (a list, one entry per evaluation).
    """
    scores = {}
    for run in runs:
        scores.setdefault((run["task"], run["mixer"]), {}).setdefault(run["lr"], []).append(
            float(np.mean(run["val_accuracy"][-last:])))
    return {cell: {lr: float(np.mean(by_lr[lr])) for lr in sorted(by_lr)} for cell, by_lr in scores.items()}


def best_learning_rates(runs, *, last=5):
    """The learning rate of each cell, chosen as Zoology's protocol does: the best of a sweep. Notebook 13.

    The best score of ``learning_rate_scores``: the choice never sees the test lengths, so accuracy beyond the
    training length stays a held-out measurement.  Ties go to the smaller learning rate.

    Returns:
        ``{(task, mixer): lr}``.
    """
    return {cell: max(by_lr, key=by_lr.get) for cell, by_lr in learning_rate_scores(runs, last=last).items()}


def train(model, task, *, seed, steps, length=40, batch_size=32, lr=3e-3, eval_batch=128, eval_every=100,
          stop_accuracy=1.0, m=3, held_out_seed=12346):
    """Adam on fresh batches of ``task`` at one ``length``, cross-entropy at every position. Notebook 13.

    Every ``eval_every`` steps the model answers one held-out batch (its own generator, ``held_out_seed``);
    training stops once that accuracy reaches ``stop_accuracy`` (1.0: every held-out answer right; None: never).

    Returns:
        ``{"step": [...], "val_accuracy": [...], "loss": [...]}`` at each evaluation.
    """
    import torch

    _, classes = sizes(task, m)
    rng, held_out = np.random.default_rng(1000 + seed), np.random.default_rng(held_out_seed)
    val_tokens, val_answers = sample(task, eval_batch, length, held_out, m)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    history = dict(step=[], val_accuracy=[], loss=[])
    for step in range(1, steps + 1):
        tokens, target = sample(task, batch_size, length, rng, m)
        logits = model(torch.as_tensor(tokens))[..., :classes]  # (b, n, classes)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.as_tensor(target).flatten())
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if step % eval_every == 0 or step == steps:
            accuracy = float((predict(model, val_tokens, classes) == val_answers).mean())
            history["step"].append(step)
            history["val_accuracy"].append(accuracy)
            history["loss"].append(float(loss.detach()))
            if stop_accuracy is not None and accuracy >= stop_accuracy:
                break
    return history
