"""Swap an attention variant into every layer of the pretrained MiniLM and compare sentence embeddings.

Implements notebook 09, Section 9.4.  Each ``*_kernel`` function returns an attention kernel with
``softmax_attention``'s signature ``fn(q, k, v, *, causal=False, key_mask=None)``, ``q, k, v
(b, h, n, d)`` and ``key_mask (b, 1, s)``, ready for ``MiniLM.with_attention``.  The trained
weights stay as they are: no variant is fine-tuned, so the scores measure how well the kernel
imitates softmax attention inside a network that was trained with softmax attention.  Two
controls bracket them: ``zero_kernel`` (the attention outputs nothing) and ``uniform_kernel``
(every query takes the mean of the values).

    model = load_minilm()
    kernel = linformer_kernel(*gaussian_projections(128, 256, rng))
    swapped = embeddings(model.with_attention(kernel), texts, max_length=256)
    embedding_scores(swapped, embeddings(model, texts, max_length=256))   # cosine and its controls
"""

import copy
import math

import numpy as np
import torch

from course_lib.numpy import jl
from course_lib.torch.full import attention_weights, softmax_attention
from course_lib.torch.linear import elu_feature_map, linear_attention
from course_lib.torch.linformer import linformer_attention, mean_pooling
from course_lib.torch.performer import performer_attention, random_matrix


def _encoder_only(causal):
    if causal:
        raise ValueError("these kernels are for the (non-causal) MiniLM encoder; causal=True is not supported.")


def linformer_kernel(E, F):
    """Linformer with fixed projections ``E, F (k, n_max)``. Notebook 09, Section 9.4; notebook 05, Eq. (5.1).

    E is fixed-length: a text of s ≤ n_max tokens uses ``E[:, :s]`` (padded keys are zeroed
    first, so padding changes nothing).  Pass ``n_max`` = the passage length.
    """
    def linformer(q, k, v, *, causal=False, key_mask=None):
        _encoder_only(causal)
        E_, F_ = (x.to(dtype=q.dtype, device=q.device) for x in (E, F))  # (k, n_max) each
        return linformer_attention(q, k, v, E_, F_, key_mask=key_mask)  # (b, h, n, e)
    return linformer


def gaussian_projections(k, n, rng):
    """E, F with N(0, 1/k) entries, two independent draws ``(k, n)``. Notebook 03, Eq. (3.3)."""
    return (torch.from_numpy(jl.gaussian_projection(k, n, rng)), torch.from_numpy(jl.gaussian_projection(k, n, rng)))


def eckart_young_kernel(k_proj):
    """The oracle P_k v: each exact P truncated to rank k (Eckart–Young). Notebook 09, Section 9.4.

    P_k = P V_k V_kᵀ, V_k the top-k right singular vectors of that head's P for that input: the
    best rank-k approximation of P in Frobenius norm (Eckart–Young).  Not Linformer and not a
    fast method: it needs the n × s matrix P of every head and input (notebook 04, Section 4.4,
    "SVD-optimal for P"), and its k directions are mixtures of all s positions chosen anew for
    every input, where Linformer's E is one fixed k × n matrix.  It shows what rank k could give
    at best.  The SVD runs in float64: the tail singular values of a softmax matrix are far below
    float32 resolution and would make the basis arbitrary.  The top right singular vectors of P
    are the top eigenvectors of Pᵀ P (``eigh`` is several times faster than an SVD here, and the
    top eigenvalues are well separated from round-off).
    """
    def eckart_young(q, k, v, *, causal=False, key_mask=None):
        _encoder_only(causal)
        P = attention_weights(q, k, key_mask=key_mask).double()  # (b, h, n, s)
        vectors = torch.linalg.eigh(P.transpose(-1, -2) @ P)[1]  # (b, h, s, s), eigenvalues ascending
        top = vectors[..., -k_proj:].transpose(-1, -2)  # (b, h, k, s)
        v = v.double() if key_mask is None else v.double().masked_fill(~key_mask[..., :, None], 0.0)
        return (P @ top.transpose(-1, -2) @ (top @ v)).to(q.dtype)  # (b, h, n, e)
    return eckart_young


def zero_kernel():
    """The control "attention outputs nothing": every layer keeps only its residual path. Notebook 09, Section 9.4."""
    def zero(q, k, v, *, causal=False, key_mask=None):
        return v.new_zeros(*v.shape[:-2], q.shape[-2], v.shape[-1])  # (b, h, n, e)
    return zero


def uniform_kernel():
    """The control "uniform attention": each query takes the mean of the real values. Notebook 09, Section 9.4."""
    def uniform(q, k, v, *, causal=False, key_mask=None):
        _encoder_only(causal)
        weights = torch.ones_like(v[..., :1]) if key_mask is None else key_mask[..., :, None].to(v.dtype)  # (.., s, 1)
        mean = (v * weights).sum(dim=-2, keepdim=True) / weights.sum(dim=-2, keepdim=True)  # (b, h, 1, e)
        return mean.expand(*v.shape[:-2], q.shape[-2], v.shape[-1])  # (b, h, n, e)
    return uniform


def linear_kernel(feature_map=elu_feature_map):
    """Linear attention with ``feature_map`` (elu+1). Notebook 06, Eq. (6.3)."""
    def linear(q, k, v, *, causal=False, key_mask=None):
        _encoder_only(causal)
        return linear_attention(q, k, v, feature_map=feature_map, key_mask=key_mask)  # (b, h, n, e)
    return linear


def performer_kernel(m, d, rng):
    """FAVOR+ with one draw of m orthogonal random features for every layer and head. Notebook 08, Eq. (8.6)."""
    omega = random_matrix(m, d, rng, dtype=torch.float32)  # (f, d)

    def performer(q, k, v, *, causal=False, key_mask=None):
        _encoder_only(causal)
        return performer_attention(q, k, v, omega.to(dtype=q.dtype, device=q.device), key_mask=key_mask)
    return performer


def with_module(model, make, *, layers=None):
    """A copy of ``model`` whose attention modules are replaced by ``make(layer.attention)``. Notebook 09, Section 9.4.

    ``make`` builds a module from a layer's ``MultiHeadAttention`` — e.g. ``LinearAttention.from_attention``
    of ``course_lib.torch.modules``, which copies its projections — called as ``module(x, key_mask=mask)``
    with ``x (b, n, d_model)`` and ``mask (b, n)``.  ``layers``: 0-based indices to replace (default: all).
    """
    if not callable(make):
        raise TypeError(f"make must build a module from a layer's attention, got {type(make).__name__}.")
    chosen = range(len(model.layers)) if layers is None else list(layers)
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(model.layers) for i in chosen):
        raise ValueError(f"layers must be indices from 0 to {len(model.layers) - 1}, got {layers!r}.")
    other = copy.deepcopy(model)
    other.attention_fn = None  # the modules carry their own attention
    for i in chosen:
        other.layers[i].attention = make(other.layers[i].attention)
    return other.eval()


@torch.inference_mode()
def attention_inputs(model, texts, *, max_length=256):
    """Every layer's ``(q, k, v, key_mask)`` of the exact model on ``texts``. Notebooks 08 and 09.

    ``q, k, v (b, h, n, d)`` are what each layer's kernel receives (after the projections and the
    head split), ``key_mask (b, 1, n)`` is True on real tokens; texts are cut to ``max_length``.
    """
    captured = []

    def capture(q, k, v, *, causal=False, key_mask=None):
        captured.append((q, k, v, key_mask))
        return softmax_attention(q, k, v, causal=causal, key_mask=key_mask)

    token_ids, key_mask = model.tokenize(list(texts), max_length=max_length, truncate=True)  # (b, n) each
    model.with_attention(capture)(token_ids, key_mask)
    return captured


@torch.inference_mode()
def embeddings(model, texts, *, max_length=256, batch_size=16):
    """Sentence embeddings ``(texts, d_model)`` of texts cut to ``max_length`` tokens. Notebook 02, Section 2.3.

    The same mean pooling and unit scaling as ``MiniLM.encode``, at a length of our choosing.
    """
    out = []
    for start in range(0, len(texts), batch_size):
        token_ids, key_mask = model.tokenize(list(texts[start:start + batch_size]), max_length=max_length,
                                             truncate=True)  # (b, n) each
        hidden = model(token_ids, key_mask)  # (b, n, d_model)
        weights = key_mask[..., None].to(hidden.dtype)  # (b, n, 1): 1 on real tokens
        mean = (hidden * weights).sum(dim=1) / weights.sum(dim=1)  # (b, d_model); every text has ≥ 2 tokens
        out.append(torch.nn.functional.normalize(mean, dim=-1))
    return torch.cat(out).float().cpu().numpy()


def embedding_cosines(model, attention, texts, *, max_length=256, reference=None):
    """Cosine of each text's embedding with ``attention`` in every layer to the exact model's. Notebook 09, Eq. (9.3).

    Args:
        model: a ``MiniLM`` (exact softmax attention).
        attention: a kernel with ``softmax_attention``'s signature.
        texts: list of strings.
        max_length: tokens per text, [CLS] and [SEP] included (longer texts are cut).
        reference: the exact model's ``embeddings(model, texts, max_length=...)``, to reuse.

    Returns:
        NumPy ``(texts,)``: 1 means the same direction.
    """
    if not texts or isinstance(texts, str):
        raise TypeError("texts must be a non-empty list of strings.")
    exact = embeddings(model, texts, max_length=max_length) if reference is None else reference
    swapped = embeddings(model.with_attention(attention), texts, max_length=max_length)
    return np.einsum("td,td->t", exact.astype(np.float64), swapped.astype(np.float64))  # unit rows: the cosine


def split_halves(texts):
    """Each text cut into its first and second half of words: the queries and documents of ``retrieval_top1``."""
    if not texts or isinstance(texts, str):
        raise TypeError("texts must be a non-empty list of strings.")
    words = [text.split() for text in texts]
    if min(len(w) for w in words) < 2:
        raise ValueError("every text needs at least two words to be cut in halves.")
    return [" ".join(w[:len(w) // 2]) for w in words], [" ".join(w[len(w) // 2:]) for w in words]


def retrieval_found(queries, documents):
    """Whether each query's most similar document (cosine) is its own, ``(t,)`` booleans. Notebooks 09 and 10.

    Args:
        queries: unit embeddings ``(t, d_model)``; query i belongs to document i.
        documents: unit embeddings ``(t, d_model)``.
    """
    queries, documents = np.asarray(queries, np.float64), np.asarray(documents, np.float64)
    if queries.shape != documents.shape or queries.ndim != 2:
        raise ValueError(f"queries and documents must both be (t, d_model), got {queries.shape} and {documents.shape}.")
    similarity = queries @ documents.T  # (t, t)
    return similarity.argmax(axis=1) == np.arange(len(queries))


def retrieval_top1(queries, documents):
    """Share of queries whose most similar document (cosine) is their own. Notebooks 09 and 10.

    Args:
        queries, documents: as for ``retrieval_found``.

    Returns:
        A float in [0, 1]; chance is 1 / t.
    """
    return float(np.mean(retrieval_found(queries, documents)))


def paired_retrieval(found, reference_found):
    """A variant's retrieval against the exact model's, text by text: McNemar's exact test. Notebook 10.

    Two scores of the same texts differ only where one model finds a text and the other does
    not; the texts both find, or both miss, say nothing about which is better.  Under "neither
    is better" each such text is a fair coin, so the p-value is the two-sided binomial tail of
    the smaller count among ``lost + gained`` tosses.

    Args:
        found, reference_found: ``(t,)`` booleans from ``retrieval_found`` (variant, reference).

    Returns:
        A dict: ``lost`` (texts the reference finds and the variant misses), ``gained`` (the
        reverse) and ``p`` (two-sided; 1.0 when they never disagree).
    """
    found, reference_found = np.asarray(found, bool), np.asarray(reference_found, bool)
    if found.shape != reference_found.shape or found.ndim != 1:
        raise ValueError(f"found and reference_found must be (t,) booleans for the same texts, got {found.shape} and "
                         f"{reference_found.shape}.")
    lost, gained = int(np.sum(reference_found & ~found)), int(np.sum(found & ~reference_found))
    tosses = lost + gained
    tail = sum(math.comb(tosses, i) for i in range(min(lost, gained) + 1)) / 2**tosses
    return {"lost": lost, "gained": gained, "p": min(1.0, 2 * tail)}


def reciprocal_ranks(queries, documents):
    """1 / the rank of each query's own document among all documents (cosine), ``(t,)``. Notebook 10, Section 10.6.

    Rank 1 is the most similar document; a document exactly as similar as the query's own
    counts as ranked above it (ties never flatter a model).  Their mean is the mean reciprocal
    rank: 1 when every query ranks its own document first, about ``ln(t) / t`` at chance.

    Args:
        queries, documents: as for ``retrieval_found``.
    """
    queries, documents = np.asarray(queries, np.float64), np.asarray(documents, np.float64)
    if queries.shape != documents.shape or queries.ndim != 2:
        raise ValueError(f"queries and documents must both be (t, d_model), got {queries.shape} and {documents.shape}.")
    similarity = queries @ documents.T  # (t, t)
    own = np.diag(similarity)[:, None]  # (t, 1)
    rank = (similarity >= own).sum(axis=1)  # the own document itself and every one at least as similar
    return 1.0 / rank


def mean_reciprocal_rank(queries, documents):
    """The mean of ``reciprocal_ranks``: a ranking score over all documents, in (0, 1]. Notebook 10, Section 10.6."""
    return float(np.mean(reciprocal_ranks(queries, documents)))


def _signed_rank_counts(doubled_ranks):
    """How many of the 2^t sign patterns give each sum of the positive (doubled) ranks: index = the sum."""
    counts = np.zeros(int(sum(doubled_ranks)) + 1)
    counts[0] = 1.0  # float64 counts stay exact up to 2^53 patterns: t ≤ 53 paired texts
    for r in doubled_ranks:
        counts[r:] = counts[r:] + counts[:len(counts) - r].copy()
    return counts


def paired_rank_test(scores, reference_scores):
    """A variant's per-text scores against the reference's on the same texts: Wilcoxon's signed-rank test. Notebook 10.

    The differences ``scores - reference_scores`` are ranked by size (equal sizes share their
    mean rank; texts with no difference are dropped, Wilcoxon's rule); the statistic is the sum
    of the ranks of the positive differences.  Under "neither is better" every difference is
    as likely positive as negative, so all 2^t sign patterns are equally likely: the exact
    p-value counts them (no normal approximation), two-sided.

    Args:
        scores, reference_scores: ``(t,)`` floats for the same texts (e.g. ``reciprocal_ranks``
            of a variant and of the exact model); at most 53 texts may differ.

    Returns:
        A dict: ``better`` (texts where the variant scores higher), ``worse`` (lower),
        ``statistic`` (the sum of the positive ranks) and ``p`` (two-sided; 1.0 when no text
        differs).
    """
    scores, reference_scores = np.asarray(scores, np.float64), np.asarray(reference_scores, np.float64)
    if scores.shape != reference_scores.shape or scores.ndim != 1:
        raise ValueError(f"scores and reference_scores must be (t,) floats for the same texts, got {scores.shape} and "
                         f"{reference_scores.shape}.")
    difference = np.round(scores - reference_scores, 12)  # equal differences reached by other roundings tie
    difference = difference[difference != 0]
    if len(difference) > 53:
        raise ValueError(f"at most 53 texts may differ for the exact test, got {len(difference)}.")
    size = np.abs(difference)
    order = np.argsort(size, kind="stable")
    doubled = np.empty(len(size), dtype=np.int64)  # twice the mean rank: an integer even with ties
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and size[order[j + 1]] == size[order[i]]:
            j += 1
        doubled[order[i:j + 1]] = i + j + 2  # ranks i + 1 … j + 1, their mean doubled
        i = j + 1
    positive = int(doubled[difference > 0].sum())
    counts = _signed_rank_counts(doubled.tolist())
    below, above = counts[:positive + 1].sum(), counts[positive:].sum()
    p = 1.0 if len(difference) == 0 else min(1.0, 2 * min(below, above) / counts.sum())
    return {"better": int(np.sum(difference > 0)), "worse": int(np.sum(difference < 0)), "statistic": positive / 2,
            "p": float(p)}


def _turned(embeddings, cosines, rng):
    """Each unit row of ``embeddings`` turned by a random direction to cosine ``cosines[i]`` with itself."""
    noise = rng.standard_normal(embeddings.shape)  # (t, d_model)
    noise -= np.einsum("td,td->t", noise, embeddings)[:, None] * embeddings  # orthogonal to the row
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    cosines = np.clip(np.asarray(cosines, np.float64), -1.0, 1.0)[:, None]  # (t, 1)
    return cosines * embeddings + np.sqrt(1 - cosines**2) * noise  # unit rows at the given cosine


def retrieval_noise_control(queries, documents, query_cosines, document_cosines, *, draws=200, seed=0):
    """What ``retrieval_top1`` gives when exact embeddings are turned at random by a variant's own error. Notebook 10.

    Each exact query and document embedding is turned in a random direction until its cosine
    with itself is the variant's cosine for that text: an error of the same size with no
    structure.  Split-half retrieval is decided by small margins (many texts' own half is
    barely the nearest), so even such an error costs hits; a variant's retrieval is read
    beside this control, not beside the exact model alone.

    Args:
        queries, documents: the exact model's unit embeddings ``(t, d_model)``.
        query_cosines, document_cosines: ``(t,)``, a variant's cosine to the exact embedding of each.
        draws: random turns averaged; seed: their generator's seed.

    Returns:
        ``(mean, sd)`` of the retrieval share over the draws.
    """
    queries, documents = np.asarray(queries, np.float64), np.asarray(documents, np.float64)
    if queries.shape != documents.shape or not len(query_cosines) == len(document_cosines) == len(queries):
        raise ValueError(f"queries and documents must both be (t, d_model) with t cosines each, got {queries.shape}, "
                         f"{documents.shape}, {len(query_cosines)} and {len(document_cosines)} cosines.")
    rng = np.random.default_rng(seed)
    shares = [retrieval_top1(_turned(queries, query_cosines, rng), _turned(documents, document_cosines, rng))
              for _ in range(draws)]
    return float(np.mean(shares)), float(np.std(shares))


def ranking_noise_control(queries, documents, query_cosines, document_cosines, *, draws=200, seed=0):
    """``retrieval_noise_control`` for ``mean_reciprocal_rank``: the exact MRR under a random error. Notebook 10.

    The same random turns (same arguments, same seed) scored by the mean reciprocal rank instead
    of the top-1 share.

    Returns:
        ``(mean, sd)`` of the mean reciprocal rank over the draws.
    """
    queries, documents = np.asarray(queries, np.float64), np.asarray(documents, np.float64)
    if queries.shape != documents.shape or not len(query_cosines) == len(document_cosines) == len(queries):
        raise ValueError(f"queries and documents must both be (t, d_model) with t cosines each, got {queries.shape}, "
                         f"{documents.shape}, {len(query_cosines)} and {len(document_cosines)} cosines.")
    rng = np.random.default_rng(seed)
    scores = [mean_reciprocal_rank(_turned(queries, query_cosines, rng), _turned(documents, document_cosines, rng))
              for _ in range(draws)]
    return float(np.mean(scores)), float(np.std(scores))


def embedding_scores(swapped, exact):
    """How a variant's embeddings relate to the exact model's, with the controls. Notebooks 09 and 10.

    Args:
        swapped: unit embeddings ``(t, d_model)`` of t texts from the variant.
        exact: unit embeddings ``(t, d_model)`` of the same texts from the exact model.

    Returns:
        A dict of floats:
        ``cosine``: mean cos(swapped_i, exact_i);
        ``control``: mean cos(swapped_i, exact_j) over j ≠ i — what ``cosine`` is worth with the wrong text;
        ``centred_cosine``: ``cosine`` after each set is centred on its own mean embedding, so that a
        direction shared by every text (a collapsed model) earns nothing;
        ``identification``: share of texts whose swapped embedding is closest to its own exact one;
        ``between_texts``: mean cosine between the swapped embeddings of different texts (the exact
        model's own value is ``between_texts(exact)``): how far the variant collapses every text
        towards one direction.
    """
    swapped, exact = np.asarray(swapped, np.float64), np.asarray(exact, np.float64)
    if swapped.shape != exact.shape or swapped.ndim != 2 or len(swapped) < 2:
        raise ValueError(f"swapped and exact must both be (t, d_model) with t ≥ 2, got {swapped.shape} and "
                         f"{exact.shape}.")
    t = len(exact)
    cross = swapped @ exact.T  # (t, t): cos(swapped_i, exact_j) for unit rows
    centred = [x - x.mean(axis=0) for x in (swapped, exact)]
    centred = [x / np.linalg.norm(x, axis=1, keepdims=True) for x in centred]
    return {"cosine": float(np.trace(cross) / t),
            "control": float((cross.sum() - np.trace(cross)) / (t * (t - 1))),
            "centred_cosine": float(np.einsum("td,td->t", *centred).mean()),
            "identification": retrieval_top1(swapped, exact),
            "between_texts": between_texts(swapped)}


def between_texts(embeddings):
    """Mean cosine between the unit embeddings ``(t, d_model)`` of *different* texts: near 1 is a collapse."""
    embeddings = np.asarray(embeddings, np.float64)
    t = len(embeddings)
    gram = embeddings @ embeddings.T  # (t, t)
    return float((gram.sum() - np.trace(gram)) / (t * (t - 1)))


TRUNCATED_P = "rank-k truncation of P (oracle)"
CONTROLS = ("attention output zero", "uniform attention (mean of V)")


def swap_in_settings(n, d, *, ks=(32, 64, 128), ms=(64, 256), seed=0):
    """The variants and settings of notebook 09's table: ``[(variant, setting, kernel), ...]``.

    The two controls first (zero output, uniform attention), then the Eckart–Young oracle, the
    Linformer and linear variants and FAVOR+.  Linformer's random E, F and FAVOR+'s ω come from
    one seeded generator each, drawn here.
    """
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    rows = [(CONTROLS[0], "–", zero_kernel()), (CONTROLS[1], "–", uniform_kernel())]
    rows += [(TRUNCATED_P, f"rank {k}", eckart_young_kernel(k)) for k in ks]
    rows += [("Linformer, mean pooling E = F", f"k = {k}", linformer_kernel(mean_pooling(k, n), mean_pooling(k, n)))
             for k in ks]
    rows += [("Linformer, Gaussian E, F", f"k = {k}", linformer_kernel(*gaussian_projections(k, n, rng))) for k in ks]
    rows.append(("linear, elu+1", "–", linear_kernel()))
    rows += [("FAVOR+", f"m = {m}", performer_kernel(m, d, generator)) for m in ms]
    return rows
