"""The two distillation stages that turn MiniLM's softmax attention into linear attention.

Implements notebook 10, Sections 10.3 and 10.4.

* Stage 1, attention distillation (Zhang et al. 2024, §4): every layer's kernel is trained on
  the exact model's own q, k, v of that layer, so the layers learn independently and no
  error travels from one layer to the next.  For a feature map the loss is the cross-entropy
  from softmax's P to the kernel's weights (Eq. 10.6); for Linformer, lesson 04's relative
  error of the attention output (Eq. 4.6).
* Stage 2, output distillation: the linearized model runs end to end and its final hidden
  states are pulled towards the exact model's (Eq. 10.8); now each layer also learns to undo
  the errors of the layers below it.

Only the kernels (and low-rank adapters, if any) train; every pretrained weight stays frozen.
Both stages train on the texts they are given: pass training passages
(``course_lib.tasks.passage_split``), never the held-out ones the results are reported on.
"""

import math
import time

import torch

from course_lib.linearize.kernels import LowRankAdapter, check_minilm
from course_lib.torch.full import split_heads


@torch.no_grad()
def layer_inputs(model, token_ids, key_mask):
    """q, k, v of every layer as the exact model computes them: a list of ``(q, k, v)``, each ``(b, h, n, d)``."""
    x = model.embeddings(token_ids)  # (b, n, d_model)
    inputs = []
    for layer in model.layers:
        attention = layer.attention
        inputs.append(tuple(split_heads(proj(x), attention.n_heads)  # (b, h, n, d)
                            for proj in (attention.q_proj, attention.k_proj, attention.v_proj)))
        x = layer(x, key_mask)
    return inputs


def _batches(n_texts, batch_size, generator):
    """Endless minibatches of text indices: a fresh seeded permutation each pass over the texts."""
    while True:
        order = torch.randperm(n_texts, generator=generator)
        for start in range(0, n_texts - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def _check_texts(token_ids, key_mask, batch_size):
    if token_ids.shape != key_mask.shape or token_ids.dim() != 2:
        raise ValueError(f"token_ids and key_mask must both be (b, n) (from model.tokenize), got "
                         f"{tuple(token_ids.shape)} and {tuple(key_mask.shape)}.")
    if not 1 <= batch_size <= len(token_ids):
        raise ValueError(f"batch_size must be between 1 and the {len(token_ids)} texts, got {batch_size}.")


def _snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def distill_attention(student, teacher, token_ids, key_mask, *, steps=200, lr=1e-2, batch_size=8, rows=64, seed=0,
                      checkpoints=(), log_every=0):
    """Stage 1: each layer's kernel learns to reproduce its layer's softmax attention. Notebook 10, Eq. (10.6).

    The layers' losses are summed and minimised by one Adam; their parameters are disjoint, so
    this is the same as training each layer on its own with the same minibatches.  A layer with
    a sliding window (Eq. 10.9) first sets its γ from the first ``batch_size`` texts
    (``LearnedLinearAttention.start_scale``).

    Args:
        student: a model from ``linearize`` (its maps or E, F train; adapters, if any, do not).
        teacher: the exact ``MiniLM`` whose q, k, v are the data.
        token_ids, key_mask: ``(b, n)`` training texts, from ``teacher.tokenize``.
        steps: Adam steps; lr: its learning rate; batch_size: texts per step.
        rows: query positions scored per step, drawn at random (None: every row).
        seed: the minibatch order and the rows.
        checkpoints: steps after which to keep a copy of the trained parameters.
        log_every: print the losses every this many steps (0: silent).

    Returns:
        A dict: ``losses`` (steps, layers) before each step, ``checkpoints`` {step: state},
        ``seconds`` (wall time of the loop, the teacher's forward pass included).
    """
    check_minilm(student, "student")
    check_minilm(teacher, "teacher")
    _check_texts(token_ids, key_mask, batch_size)
    start = time.perf_counter()
    inputs = layer_inputs(teacher, token_ids, key_mask)
    kernels = [layer.attention for layer in student.layers]
    for kernel, (q, k, _) in zip(kernels, inputs, strict=True):
        if getattr(kernel, "window", None) is not None:  # γ of Eq. (10.9) from the first texts, before any step
            kernel.start_scale(q[:batch_size], k[:batch_size], key_mask[:batch_size, None, :])
    adapters = {id(p) for kernel in kernels for m in kernel.modules() if isinstance(m, LowRankAdapter)
                for p in m.parameters()}  # stage 1 feeds the exact q, k, v: adapters play no part
    parameters = [p for kernel in kernels for p in kernel.parameters() if p.requires_grad and id(p) not in adapters]
    optimizer = torch.optim.Adam(parameters, lr=lr)
    generator = torch.Generator().manual_seed(seed)
    batches = _batches(len(token_ids), batch_size, generator)
    losses, kept = [], {0: _snapshot(student)} if 0 in checkpoints else {}
    n = token_ids.shape[-1]
    for step in range(1, steps + 1):
        index = next(batches)
        mask = key_mask[index][:, None, :]  # (b, 1, s): one mask for every head
        chosen = None if rows is None or rows >= n else torch.randperm(n, generator=generator)[:rows]  # (r,)
        layer_losses = [kernel.stage1_loss(q[index], k[index], v[index], mask, chosen)
                        for kernel, (q, k, v) in zip(kernels, inputs, strict=True)]
        optimizer.zero_grad()
        torch.stack(layer_losses).sum().backward()
        optimizer.step()
        losses.append([loss.item() for loss in layer_losses])
        if step in checkpoints:
            kept[step] = _snapshot(student)
        if log_every and step % log_every == 0:
            print(f"  stage 1 step {step:>4}/{steps}: loss per layer "
                  + " ".join(f"{x:.3f}" for x in losses[-1]) + f" ({time.perf_counter() - start:.0f} s)", flush=True)
    return {"losses": losses, "checkpoints": kept, "seconds": time.perf_counter() - start}


def output_loss(hidden, target, key_mask, *, embedding_weight=1.0):
    """Stage 2's loss: relative squared error of the final hidden states plus 1 − cos of the embeddings. Eq. (10.8).

    Args:
        hidden: the student's final hidden states ``(b, n, d_model)``; target: the exact model's.
        key_mask: ``(b, n)``, True on real tokens (padded positions count for nothing).
        embedding_weight: the weight of the embedding term (λ in Eq. 10.8).

    Returns:
        A 0-dim tensor.
    """
    real = key_mask[..., None].to(hidden.dtype)  # (b, n, 1)
    tokens = (((hidden - target) * real).square().sum() / (target * real).square().sum())
    pooled = [(x * real).sum(dim=1) / real.sum(dim=1) for x in (hidden, target)]  # (b, d_model) each
    cosine = torch.nn.functional.cosine_similarity(*pooled, dim=-1)  # (b,)
    return tokens + embedding_weight * (1 - cosine).mean()


@torch.no_grad()
def hidden_states(model, token_ids, key_mask, *, batch_size=8):
    """Every layer's output hidden states: ``(layers, b, n, d_model)``, in batches of ``batch_size`` texts."""
    return torch.cat([torch.stack(_layer_outputs(model, token_ids[i:i + batch_size], key_mask[i:i + batch_size]))
                      for i in range(0, len(token_ids), batch_size)], dim=1)


def _layer_outputs(model, token_ids, key_mask):
    x = model.embeddings(token_ids)  # (b, n, d_model)
    outputs = []
    for layer in model.layers:
        x = layer(x, key_mask)
        outputs.append(x)
    return outputs


def _learning_rate(step, steps, schedule):
    """The factor on the learning rate before ``step`` (1-based): 1, or a cosine from 1 to 0 ("cosine")."""
    return 1.0 if schedule == "constant" else 0.5 * (1 + math.cos(math.pi * (step - 1) / steps))


def distill_outputs(student, teacher, token_ids, key_mask, *, steps=100, lr=3e-3, batch_size=4, embedding_weight=1.0,
                    layer_weight=0.0, schedule="constant", seed=0, checkpoints=(), log_every=0):
    """Stage 2: the whole linearized model learns the exact model's outputs. Notebook 10, Eq. (10.8).

    With ``layer_weight`` > 0 the hidden states after every layer, not only the last, are pulled
    towards the exact model's (relative squared error per layer, the mean over the layers below
    the last, times ``layer_weight``): each layer gets its own signal, as in layer-wise
    distillation of BERT (Jiao et al. 2020, TinyBERT, arXiv 1909.10351, Eq. 8).

    Args:
        student: a model from ``linearize``; every trainable parameter trains (kernels, adapters).
        teacher: the exact ``MiniLM``; its hidden states are the targets.
        token_ids, key_mask: ``(b, n)`` training texts.
        steps, lr, batch_size, seed, checkpoints, log_every: as in ``distill_attention``.
        embedding_weight: λ of Eq. (10.8), the weight of the sentence-embedding term.
        layer_weight: the weight of the intermediate layers' term (0: the final hidden states only).
        schedule: ``"constant"`` learning rate or ``"cosine"`` decay from ``lr`` to 0 over the steps.

    Returns:
        A dict: ``losses`` (steps,) of Eq. (10.8) before each step, ``total_losses`` (steps,) of
        what was minimised (Eq. 10.8 plus the layers' term), ``checkpoints``, ``seconds``.
    """
    check_minilm(student, "student")
    check_minilm(teacher, "teacher")
    _check_texts(token_ids, key_mask, batch_size)
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule must be 'constant' or 'cosine', got {schedule!r}.")
    if layer_weight < 0:
        raise ValueError(f"layer_weight must be >= 0, got {layer_weight!r}.")
    start = time.perf_counter()
    targets = hidden_states(teacher, token_ids, key_mask)  # (layers, b, n, d_model)
    if not layer_weight:
        targets = targets[-1:]  # the final hidden states are all it needs
    parameters = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=lr)
    batches = _batches(len(token_ids), batch_size, torch.Generator().manual_seed(seed))
    losses, totals, kept = [], [], {0: _snapshot(student)} if 0 in checkpoints else {}
    for step in range(1, steps + 1):
        index = next(batches)
        mask = key_mask[index]  # (b, n)
        outputs = _layer_outputs(student, token_ids[index], mask) if layer_weight else [
            student(token_ids[index], mask)]
        loss = output_loss(outputs[-1], targets[-1, index], mask, embedding_weight=embedding_weight)
        losses.append(loss.item())
        if layer_weight:
            real = mask[..., None].to(outputs[0].dtype)  # (b, n, 1)
            loss = loss + layer_weight * torch.stack([
                ((out - target[index]) * real).square().sum() / (target[index] * real).square().sum()
                for out, target in zip(outputs[:-1], targets[:-1], strict=True)]).mean()
        for group in optimizer.param_groups:
            group["lr"] = lr * _learning_rate(step, steps, schedule)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        totals.append(loss.item())
        if step in checkpoints:
            kept[step] = _snapshot(student)
        if log_every and step % log_every == 0:
            print(f"  stage 2 step {step:>4}/{steps}: loss {losses[-1]:.4f} (with the layers' term {totals[-1]:.4f}; "
                  f"{time.perf_counter() - start:.0f} s)", flush=True)
    return {"losses": losses, "total_losses": totals, "checkpoints": kept, "seconds": time.perf_counter() - start}
