"""What linearizing keeps: held-out scores of a model, and the shape of its attention rows.

Implements notebook 10, Sections 10.1 and 10.6.  ``heldout_scores`` measures a MiniLM-like
model against the exact one on texts it was not trained on: the embedding cosine with its
controls (``course_lib.swap_in.embedding_scores``) and retrieval scores that need no
download (``swap_in.retrieval_top1`` and the ranking score ``swap_in.mean_reciprocal_rank``,
on ``swap_in.split_halves``).  The attention helpers form the n × s weights of softmax,
elu+1, FAVOR+ and a learned kernel from the same q, k, and measure their rows: entropy
(Eq. 10.1) and how monotonically they follow qᵀk.
"""

import math

import numpy as np
import torch

from course_lib import swap_in
from course_lib.torch.feature_maps import linear_attention_weights, row_entropy
from course_lib.torch.full import attention_weights
from course_lib.torch.linear import elu_feature_map

VARIANTS = ("softmax", "elu+1", "FAVOR+", "learned")


def heldout_scores(model, texts, exact, *, max_length=256, retrieval=True):
    """How close ``model`` stays to the exact model on ``texts``. Notebook 10, Section 10.6.

    Args:
        model: a MiniLM-like model (``swap_in.embeddings`` runs it).
        texts: held-out passages (a list of strings), never trained on.
        exact: ``exact_reference(exact_model, texts)``: the exact model's embeddings and retrieval.
        max_length: tokens per text, [CLS] and [SEP] included.
        retrieval: False skips the retrieval score (half the cost).

    Returns:
        A dict: ``cosine``, ``control``, ``centred_cosine``, ``identification`` (see
        ``swap_in.embedding_scores``), ``cosines`` (one per text); with ``retrieval``, also
        ``retrieval`` (top-1 share, first halves retrieving second halves), ``retrieval_hits``
        (how many), ``retrieval_found`` (which texts, a list of bools), ``retrieval_lost``,
        ``retrieval_gained`` and ``retrieval_p`` (``swap_in.paired_retrieval`` against the exact
        model, text by text), ``half_cosine`` (the mean cosine of the half-passage embeddings to
        the exact model's) and ``retrieval_control`` (``swap_in.retrieval_noise_control`` at those
        cosines: the exact model's retrieval under an unstructured error of the same size); the
        ranking score over all second halves: ``mrr`` (``swap_in.mean_reciprocal_rank``),
        ``reciprocal_ranks`` (one per text), ``mrr_better``, ``mrr_worse``, ``mrr_statistic`` and
        ``mrr_p`` (``swap_in.paired_rank_test`` against the exact model's reciprocal ranks) and
        ``mrr_control`` (``swap_in.ranking_noise_control``).
    """
    if isinstance(texts, str) or not texts or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a non-empty list of strings.")
    if len(texts) != len(exact["embeddings"]):
        raise ValueError(f"exact holds {len(exact['embeddings'])} texts' embeddings but {len(texts)} texts were "
                         "given: build it with exact_reference(exact_model, texts).")
    embeddings = swap_in.embeddings(model, texts, max_length=max_length)  # (t, d_model)
    scores = swap_in.embedding_scores(embeddings, exact["embeddings"])
    if retrieval:
        queries, documents = (swap_in.embeddings(model, half, max_length=max_length)
                              for half in swap_in.split_halves(texts))
        found = swap_in.retrieval_found(queries, documents)  # (t,)
        scores["retrieval"], scores["retrieval_hits"] = float(found.mean()), int(found.sum())
        scores["retrieval_found"] = found.tolist()
        scores.update({f"retrieval_{key}": value for key, value in swap_in.paired_retrieval(
            found, exact["retrieval_found"]).items()})
        query_cosines, document_cosines = (np.einsum("td,td->t", mine.astype(np.float64), theirs)
                                           for mine, theirs in ((queries, exact["queries"]),
                                                                (documents, exact["documents"])))
        scores["half_cosine"] = float(np.concatenate([query_cosines, document_cosines]).mean())
        scores["retrieval_control"] = swap_in.retrieval_noise_control(exact["queries"], exact["documents"],
                                                                      query_cosines, document_cosines)[0]
        ranks = swap_in.reciprocal_ranks(queries, documents)  # (t,)
        scores["mrr"], scores["reciprocal_ranks"] = float(ranks.mean()), ranks.tolist()
        scores.update({f"mrr_{key}": value for key, value in swap_in.paired_rank_test(
            ranks, exact["reciprocal_ranks"]).items()})
        scores["mrr_control"] = swap_in.ranking_noise_control(exact["queries"], exact["documents"], query_cosines,
                                                              document_cosines)[0]
    scores["cosines"] = np.einsum("td,td->t", embeddings.astype(np.float64), exact["embeddings"]).tolist()
    return scores


def exact_reference(model, texts, *, max_length=256):
    """The exact model's embeddings of ``texts`` and of their halves, and its retrieval: ``heldout_scores``' input."""
    embeddings = swap_in.embeddings(model, texts, max_length=max_length)  # (t, d_model)
    queries, documents = (swap_in.embeddings(model, half, max_length=max_length).astype(np.float64)
                          for half in swap_in.split_halves(texts))
    found = swap_in.retrieval_found(queries, documents)  # (t,)
    return {"embeddings": embeddings, "queries": queries, "documents": documents, "retrieval": float(found.mean()),
            "retrieval_hits": int(found.sum()), "retrieval_found": found.tolist(),
            "reciprocal_ranks": swap_in.reciprocal_ranks(queries, documents).tolist()}


def variant_weights(variant, q, k, *, key_mask=None, kernel=None, omega=None):
    """The n × s attention weights of one variant on the same q, k ``(..., n, d)``. Notebook 10, Section 10.1.

    ``"softmax"``: P (Eq. 1.2); ``"elu+1"``: linear attention's weights with elu+1 (Eq. 10.2);
    ``"FAVOR+"``: those of positive random features ``omega (m, d)`` on q, k scaled by d^(-1/4),
    the estimate of P (computed in float64: the exponentials of MiniLM's large qᵀk overflow
    float32); ``"learned"``: ``kernel.weights`` of a trained ``LearnedLinearAttention``.

    Returns:
        ``(..., n, s)``, rows summing to 1.
    """
    if variant == "softmax":
        return attention_weights(q, k, key_mask=key_mask)
    if variant == "elu+1":
        return linear_attention_weights(elu_feature_map(q), elu_feature_map(k), key_mask=key_mask)
    if variant == "FAVOR+":
        if omega is None:
            raise ValueError("FAVOR+ needs omega (m, d) from course_lib.torch.performer.random_matrix.")
        return _favor_weights(q, k, omega, key_mask).to(q.dtype)
    if variant == "learned":
        if kernel is None:
            raise ValueError("the learned variant needs kernel: a LearnedLinearAttention (a linearized layer's "
                             "attention).")
        return kernel.weights(q, k, key_mask=key_mask)
    raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}, got {variant!r}.")


def _favor_weights(q, k, omega, key_mask):
    """FAVOR+'s weights, stabilised as in notebook 08: a shift per query row and one for all keys cancel."""
    scale = q.shape[-1] ** -0.25  # exp(qᵀk/√d) = exp((q d^-1/4)ᵀ(k d^-1/4))
    logs = []
    for x in (q.double() * scale, k.double() * scale):
        logs.append(x @ omega.double().T - x.square().sum(-1, keepdim=True) / 2)  # (..., n, f): ln phi + ln √m
    log_q, log_k = logs
    log_q = log_q - log_q.amax(dim=-1, keepdim=True)  # per query: cancels in its own row's normaliser
    if key_mask is not None:
        log_k = log_k.masked_fill(~key_mask[..., :, None], -torch.inf)  # padded keys: no weight, no shift
    log_k = log_k - log_k.amax(dim=(-2, -1), keepdim=True)  # one shift for every key: cancels too
    return linear_attention_weights(log_q.exp(), log_k.exp(), key_mask=key_mask, eps=torch.finfo(torch.float64).tiny)


def mean_entropy(weights, *, key_mask=None):
    """Mean row entropy (nats) over every head and real query row of ``weights (b, h, n, s)``. Eq. (10.1)."""
    entropy = row_entropy(weights, key_mask=key_mask)  # (b, h, n)
    if key_mask is None:
        return float(entropy.mean())
    return float(entropy[key_mask.expand(entropy.shape)].mean())


def _ranks(x):
    return x.argsort(dim=-1).argsort(dim=-1).to(torch.float64)  # rank of each entry within its row


def monotonicity(q, k, weights):
    """Spearman rank correlation, row by row, between qᵀk and the weights; the mean. Notebook 10, Section 10.1.

    1 when every row orders its keys exactly as qᵀk does, as softmax's rows always do; 0 when
    the order is unrelated.  No padding: pass texts of full length.

    Args:
        q: ``(..., n, d)``; k: ``(..., s, d)``; weights: ``(..., n, s)``.

    Returns:
        A float in [-1, 1].
    """
    scores = q @ k.transpose(-1, -2)  # "...nd,...sd->...ns" (..., n, s)
    a, b = (_ranks(x) for x in (scores, weights))  # (..., n, s)
    a, b = a - a.mean(dim=-1, keepdim=True), b - b.mean(dim=-1, keepdim=True)
    rho = (a * b).sum(dim=-1) / (a.norm(dim=-1) * b.norm(dim=-1))  # (..., n)
    return float(rho.mean())


def uniform_entropy(key_mask):
    """ln s of each text's s real keys, averaged over texts: the entropy of uniform attention."""
    return float(np.mean([math.log(int(s)) for s in key_mask.reshape(len(key_mask), -1).sum(dim=-1)]))
