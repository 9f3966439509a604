"""Recall tasks where theory predicts a difference between the rules, and hand-set controls. Notebook 11, §11.4.

Three row generators, each with the rule-by-rule prediction it was built to test (Eqs. 11.1-11.5):

- ``overwrite_batch``: N keys written, some of them again at random places in the row; a query asks
  for the latest value.  The sum rule holds old + new under a rewritten key (a coin toss between
  them, worse with more writes); a decay favours the recent write but forgets the keys written once
  long ago; the delta rule with β = 1 replaces the old value.
- ``capacity_batch``: ``mqar_batch`` with N = ratio · d_head pairs for a head of d_head channels.  At
  ratio 1 the sum rule still recalls most pairs; past it, every rule that writes once loses some,
  the delta rule with β = 1 more than the sum rule (each write disturbs the older ones, §11.1).
- ``needle_batch``: one marked pair (the needle: its key from a reserved set) at a random depth among
  many distinct pairs, then the needle's key.  Pairs after the needle fill the state: the sum rule
  and the delta rule lose it as they pile up, a fixed decay loses it with its depth; a gate chosen per
  token (forget everything at the needle, write nothing after it) keeps it at any depth.

``HandSetRecall`` is each rule wired by hand as a model of tokens to logits, with random unit
embeddings for the keys and values: ``tasks.evaluate_batch`` scores it on the same rows, with the
same function, as a trained model.  It is the positive control of a trained comparison: what the
rule can do in this task and pipeline, with nothing learned.
"""

import torch
from torch import nn

from course_lib.tasks import IGNORED, mqar_batch
from course_lib.torch.delta import delta_rule_attention
from course_lib.torch.gated import gated_linear_attention

RULES = ("sum", "decay", "delta", "gated_delta", "token_gate")
FORGET_ALL = -30.0  # log a for "forget everything": e^-30 ≈ 1e-13, finite where log 0 would make the chunks NaN


def _check_positive(**named):
    for name, value in named.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}.")


def overwrite_batch(batch_size, n_pairs, n_writes, generator, *, n_keys=32, n_values=32):
    """Overwrite-MQAR: N keys written ``n_writes`` times in all, at random; a query asks for the latest value.

    A row is ``k v k v … (n_writes pairs) q_1 … q_N``: every one of the N distinct keys is written
    at least once and the ``n_writes − N`` extra writes rewrite keys drawn uniformly from the N, at
    random places among the others (not in blocks), each with a fresh value (repeats allowed).  The
    queries are the N keys in a random order; the target at a query is the value of that key's last
    write; every other target is ``IGNORED``.

    Args:
        batch_size: rows b.
        n_pairs: N, distinct keys per row (1 ≤ N ≤ n_keys).
        n_writes: writes per row (≥ N); ``n_writes = N`` is ``mqar_batch``'s task.
        generator: a ``torch.Generator``; the same generator state gives the same batch.
        n_keys, n_values: key tokens ``0 … n_keys − 1``, value tokens after them.

    Returns:
        ``(tokens, targets)``, both ``(b, 2 n_writes + N)`` int64.
    """
    _check_positive(batch_size=batch_size, n_pairs=n_pairs, n_writes=n_writes)
    if n_pairs > n_keys:
        raise ValueError(f"n_pairs must lie in 1 … n_keys = {n_keys} (the keys of a row are distinct), got {n_pairs}.")
    if n_writes < n_pairs:
        raise ValueError(f"n_writes must be at least n_pairs = {n_pairs} (every key is written), got {n_writes}.")
    keys = torch.rand(batch_size, n_keys, generator=generator).argsort(dim=1)[:, :n_pairs]  # (b, N), distinct
    extra = torch.randint(0, n_pairs, (batch_size, n_writes - n_pairs), generator=generator)  # (b, W − N)
    which = torch.cat([torch.arange(n_pairs).expand(batch_size, -1), extra], dim=1)  # (b, W): index into keys
    shuffle = torch.rand(batch_size, n_writes, generator=generator).argsort(dim=1)
    which = which.gather(1, shuffle)  # (b, W): rewrites interleaved at random
    values = n_keys + torch.randint(0, n_values, (batch_size, n_writes), generator=generator)  # (b, W)
    written = which[..., None] == torch.arange(n_pairs)  # (b, W, N)
    last = (written * torch.arange(1, n_writes + 1)[:, None]).amax(dim=1) - 1  # (b, N): each key's last write
    latest = values.gather(1, last)  # (b, N)
    order = torch.rand(batch_size, n_pairs, generator=generator).argsort(dim=1)  # (b, N): the queries' order
    pairs = torch.stack([keys.gather(1, which), values], dim=2).flatten(1)  # (b, 2W)
    tokens = torch.cat([pairs, keys.gather(1, order)], dim=1)  # (b, 2W + N)
    targets = torch.cat([torch.full_like(pairs, IGNORED), latest.gather(1, order)], dim=1)
    return tokens, targets


def rewritten(tokens, n_pairs):
    """Which queries of ``overwrite_batch`` rows ask for a key written more than once: ``(b, N)`` bool."""
    writes, queries = tokens[:, :-n_pairs:2], tokens[:, -n_pairs:]  # (b, W), (b, N)
    return (writes[:, None, :] == queries[..., None]).sum(-1) > 1


def capacity_batch(batch_size, ratio, d_head, generator, *, n_keys=32, n_values=32):
    """MQAR past a head's capacity: ``mqar_batch`` with N = ratio · d_head pairs, rows of 3N tokens.

    Args:
        batch_size: rows b.
        ratio: N / d_head, a positive int (1: as many pairs as a head has key channels).
        d_head: the key channels of one head (d_model / n_heads of the model it is for).
        generator, n_keys, n_values: as for ``mqar_batch`` (N ≤ n_keys).

    Returns:
        ``(tokens, targets)``, both ``(b, 3N)`` int64.
    """
    _check_positive(batch_size=batch_size, ratio=ratio, d_head=d_head)
    if ratio * d_head > n_keys:
        raise ValueError(f"ratio · d_head = {ratio * d_head} pairs need as many distinct keys, but n_keys = {n_keys}.")
    return mqar_batch(batch_size, ratio * d_head, generator, n_keys=n_keys, n_values=n_values)


def needle_batch(batch_size, n_pairs, generator, *, depth=None, n_keys=128, n_values=32, n_needle_keys=4,
                 return_depth=False):
    """One marked pair among ``n_pairs`` distinct ones, then its key: retention against filtering.

    A row is ``k_1 v_1 … k_T v_T q`` (T = ``n_pairs``).  The needle is pair ``depth`` (0: the first),
    its key one of the ``n_needle_keys`` marked tokens ``0 … n_needle_keys − 1``; the other T − 1 keys are
    distinct unmarked ones; values are drawn with repeats.  The query is the needle's key and its
    target the needle's value (the only scored position); ``T − 1 − depth`` pairs come after the needle.

    Args:
        batch_size: rows b.
        n_pairs: T, pairs per row (T − 1 ≤ n_keys − n_needle_keys).
        generator: a ``torch.Generator``.
        depth: the needle's pair index in every row, or None: uniform over ``0 … T − 1`` per row.
        n_keys, n_values: key tokens ``0 … n_keys − 1`` (the first ``n_needle_keys`` marked), values after them.
        n_needle_keys: how many key tokens mark a needle (≥ 1).
        return_depth: also return each row's depth ``(b,)``.

    Returns:
        ``(tokens, targets)``, both ``(b, 2T + 1)`` int64, and ``depth (b,)`` if asked.
    """
    _check_positive(batch_size=batch_size, n_pairs=n_pairs, n_needle_keys=n_needle_keys)
    plain = n_keys - n_needle_keys
    if n_pairs - 1 > plain:
        raise ValueError(f"n_pairs − 1 = {n_pairs - 1} distinct unmarked keys are needed, but n_keys − n_needle_keys "
                         f"= {plain}.")
    if depth is not None and not 0 <= depth < n_pairs:
        raise ValueError(f"depth must lie in 0 … n_pairs − 1 = {n_pairs - 1} (a pair index), got {depth}.")
    others = n_needle_keys + torch.rand(batch_size, plain, generator=generator).argsort(dim=1)[:, :n_pairs - 1]
    needle = torch.randint(0, n_needle_keys, (batch_size,), generator=generator)  # (b,)
    if depth is None:
        depths = torch.randint(0, n_pairs, (batch_size,), generator=generator)  # (b,)
    else:
        depths = torch.full((batch_size,), depth)
    slot = torch.arange(n_pairs)  # pair j takes distractor j before the needle, j − 1 after it, the needle at depth
    pick = torch.where(slot < depths[:, None], slot, slot - 1).masked_fill(slot == depths[:, None], n_pairs - 1)
    keys = torch.cat([others, needle[:, None]], dim=1).gather(1, pick)  # (b, T): the needle at its depth
    values = n_keys + torch.randint(0, n_values, (batch_size, n_pairs), generator=generator)  # (b, T)
    pairs = torch.stack([keys, values], dim=2).flatten(1)  # (b, 2T)
    tokens = torch.cat([pairs, needle[:, None]], dim=1)  # (b, 2T + 1)
    targets = torch.full_like(tokens, IGNORED)
    targets[:, -1] = values.gather(1, depths[:, None])[:, 0]
    return (tokens, targets, depths) if return_depth else (tokens, targets)


class HandSetRecall(nn.Module):
    """A rule of §11.1-11.3 wired by hand as a model of tokens to logits: the positive control of a trained run.

    Each key token has a random unit vector per head, each value token too (``(h, n_keys, d)`` and
    ``(h, n_values, d)``, fixed by ``generator``).  At a value token that follows a key token the rule
    writes (k = the key's vector, v = the value's); every token decays the state for ``"decay"`` and
    ``"gated_delta"``; a key token reads ``S_tᵀ k`` in every head, and the logit of value j is the
    read-out's dot product with value j's vectors, summed over heads (a key token's logit is −1e4:
    never predicted).  The state is h matrices of d × d, as in a trained mixer with h heads of d.

    Rules (``RULES``), each through the library's kernel:

    - ``"sum"``: S ← S + k vᵀ (``gated_linear_attention`` with a = 1);
    - ``"decay"``: S ← γ S + k vᵀ, γ at every token;
    - ``"delta"``: S ← S + β k (v − Sᵀk)ᵀ (``delta_rule_attention``);
    - ``"gated_delta"``: the delta rule after a decay γ at every token;
    - ``"token_gate"``: the delta rule with a gate chosen by the token: at a write under a marked key
      (``needle_batch``'s needle) a = e^-30 and β = 1 (forget everything, keep the needle); at any other
      write β = 0 (nothing written); a = 1 elsewhere.

    Args:
        rule: one of ``RULES``.
        n_keys, n_values: the task's key and value tokens.
        n_heads, head_dim: h and d of the state.
        beta: β of the delta rules, in (0, 1].
        gamma: γ of the decays, in (0, 1).
        n_marked: marked key tokens ``0 … n_marked − 1`` (``"token_gate"`` only, ≥ 1).
        generator: a ``torch.Generator`` for the embeddings (None: torch's global one).
    """

    def __init__(self, rule, n_keys, n_values, *, n_heads=1, head_dim=8, beta=1.0, gamma=None, n_marked=0,
                 generator=None):
        super().__init__()
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")
        if rule in ("decay", "gated_delta") and (gamma is None or not 0 < gamma < 1):
            raise ValueError(f"rule {rule!r} needs a decay gamma in (0, 1), got {gamma!r}.")
        if not 0 < beta <= 1:
            raise ValueError(f"beta must lie in (0, 1], got {beta!r}.")
        if rule == "token_gate" and n_marked < 1:
            raise ValueError("rule 'token_gate' needs n_marked ≥ 1 marked key tokens (the needles' keys).")
        self.rule, self.n_keys, self.beta, self.gamma, self.n_marked = rule, n_keys, beta, gamma, n_marked
        unit = nn.functional.normalize
        self.register_buffer("key_vectors", unit(torch.randn(n_heads, n_keys, head_dim, generator=generator), dim=-1))
        self.register_buffer("value_vectors", unit(torch.randn(n_heads, n_values, head_dim, generator=generator),
                                                   dim=-1))

    def gates(self, tokens):
        """``(write, beta, log_decay)``, each ``(b, n)``: where the rule writes, its β, and log a_t."""
        is_key = tokens < self.n_keys  # (b, n)
        write = torch.zeros_like(is_key)
        write[:, 1:] = is_key[:, :-1] & ~is_key[:, 1:]  # a value right after a key
        beta = write * self.beta  # (b, n)
        log_decay = torch.zeros(tokens.shape, dtype=torch.float32)
        if self.rule in ("decay", "gated_delta"):
            log_decay += torch.log(torch.tensor(self.gamma))
        if self.rule == "token_gate":
            previous = torch.cat([tokens[:, :1], tokens[:, :-1]], dim=1)  # (b, n): the token before
            marked = write & (previous < self.n_marked)
            beta = marked * 1.0
            log_decay = log_decay.masked_fill(marked, FORGET_ALL)
        return write, beta, log_decay

    def forward(self, tokens):
        """``tokens (b, n)`` → logits ``(b, n, n_keys + n_values)``."""
        is_key = tokens < self.n_keys  # (b, n)
        write, beta, log_decay = self.gates(tokens)
        key_ids = tokens.clamp(max=self.n_keys - 1)
        value_ids = (tokens - self.n_keys).clamp(min=0)
        previous = torch.cat([key_ids[:, :1], key_ids[:, :-1]], dim=1)  # (b, n): the key a value follows
        q = self.key_vectors[:, key_ids] * is_key[None, ..., None]  # (h, b, n, d): reads at key tokens
        k = self.key_vectors[:, previous] * write[None, ..., None]  # (h, b, n, d): writes at values after keys
        v = self.value_vectors[:, value_ids]  # (h, b, n, d)
        q, k, v = (x.transpose(0, 1) for x in (q, k, v))  # (b, h, n, d)
        log_decay = log_decay[:, None].expand(-1, q.shape[1], -1)  # (b, h, n)
        if self.rule in ("sum", "decay"):
            reads = gated_linear_attention(q, k, v, log_decay)
        else:
            decay = None if self.rule == "delta" else log_decay
            reads = delta_rule_attention(q, k, v, beta[:, None].expand_as(log_decay), log_decay=decay)
        value_logits = torch.einsum("bhnd,hjd->bnj", reads, self.value_vectors)  # (b, n, n_values)
        key_logits = torch.full((*tokens.shape, self.n_keys), -1e4)  # (b, n, n_keys)
        return torch.cat([key_logits, value_logits], dim=-1)


# --- Zoology's protocol, read off stored runs (tools/train_recall.py) ---------------------------

def validation_at(run, budget):
    """A stored run's validation accuracy at step ``budget`` (its last score when it stopped sooner)."""
    scored = [a for s, a in zip(run["eval_step"], run["eval_accuracy"], strict=True) if s <= budget]
    return scored[-1]


def best_rates(runs, budget):
    """The learning rate of each ``(cell, mixer)`` with the highest validation accuracy at ``budget``, seeds averaged.

    The test rows play no part: the choice is made on the validation batch alone (Zoology's best of a
    sweep per cell, without choosing on the numbers reported).  Ties go to the smaller rate.

    Returns:
        ``{(cell, mixer): lr}``.
    """
    means = {}
    for run in runs:
        means.setdefault((run["cell"], run["mixer"]), {}).setdefault(run["lr"], []).append(validation_at(run, budget))
    return {key: max(sorted(by_lr), key=lambda lr: sum(by_lr[lr]) / len(by_lr[lr])) for key, by_lr in means.items()}


def test_accuracies(runs, cell, mixer, lr, budget):
    """The test accuracy at ``budget`` of every seed of one ``(cell, mixer, lr)``, in seed order."""
    chosen = sorted((r for r in runs if (r["cell"], r["mixer"], r["lr"]) == (cell, mixer, lr)), key=lambda r: r["seed"])
    return [r["test_accuracy"][str(budget)] for r in chosen]


def task_batch(task, batch_size, generator):
    """A batch of a stored cell's task: ``task`` is its keyword arguments, ``kind`` naming the generator.

    ``kind``: ``"overwrite"`` (``overwrite_batch``), ``"capacity"`` (``capacity_batch``) or ``"needle"``
    (``needle_batch``); the other keys are that generator's arguments, e.g.
    ``dict(kind="overwrite", n_pairs=8, n_writes=24, n_keys=32, n_values=32)``.
    """
    options = dict(task)
    kind = options.pop("kind", None)
    if kind == "overwrite":
        return overwrite_batch(batch_size, options.pop("n_pairs"), options.pop("n_writes"), generator, **options)
    if kind == "capacity":
        return capacity_batch(batch_size, options.pop("ratio"), options.pop("d_head"), generator, **options)
    if kind == "needle":
        return needle_batch(batch_size, options.pop("n_pairs"), generator, **options)
    raise ValueError(f"task kind must be 'overwrite', 'capacity' or 'needle', got {kind!r}.")


def row_correct(model, tokens, targets):
    """Right answers per row ``(b,)`` int64: the scored positions whose argmax logit is the target."""
    model.eval()
    with torch.no_grad():
        right = (model(tokens).argmax(-1) == targets) & (targets != IGNORED)  # (b, n)
    return right.sum(dim=1)


def paired_sign_flip_test(scores, reference_scores, *, n_flips=20_000, seed=0):
    """Is the mean of ``scores − reference_scores`` over paired units zero? A sign-flip permutation test.

    Under "neither is better" each unit's difference is as likely positive as negative: the mean
    difference is compared with its distribution over ``n_flips`` random sign patterns (seeded, so the
    p-value is reproducible); p = (1 + flips at least as extreme) / (1 + n_flips), two-sided, so it
    never falls below 1 / (1 + n_flips).  Used where the units (test rows) are too many for
    ``swap_in.paired_rank_test``'s exact count.

    Args:
        scores, reference_scores: ``(t,)`` floats for the same units.

    Returns:
        A dict: ``better``, ``worse`` (units where ``scores`` is higher, lower), ``difference`` (the
        mean of ``scores − reference_scores``) and ``p``.
    """
    import numpy as np

    scores, reference_scores = np.asarray(scores, np.float64), np.asarray(reference_scores, np.float64)
    if scores.shape != reference_scores.shape or scores.ndim != 1 or not len(scores):
        raise ValueError(f"scores and reference_scores must be (t,) floats for the same units, got {scores.shape} "
                         f"and {reference_scores.shape}.")
    difference = scores - reference_scores
    observed = abs(difference.mean())
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_flips, len(difference)))
    extreme = int((np.abs(signs @ difference / len(difference)) >= observed - 1e-12).sum())
    return dict(better=int((difference > 0).sum()), worse=int((difference < 0).sum()),
                difference=float(difference.mean()), p=(1 + extreme) / (1 + n_flips))
