"""Checks for the lesson 01 exercises (attention recap)."""

import numpy as np

from course_lib.checks import Exercise, Mistake, to_numpy
from course_lib.numpy import full


def _qkv(seed, lead, n, d, e):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((*lead, n, d)), rng.standard_normal((*lead, n, d)),
            rng.standard_normal((*lead, n, e)))


# --- Exercise 1.1: one mask for causal attention and key padding (NumPy) ------------------
# Eq. (1.4) in NumPy: the causal mask and the key-padding mask combined into one, the softmax kept
# stable, and a query that sees no real key at all (left padding with causal=True) given an all-zero
# row and a zero output, as the library and PyTorch's SDPA do.

def _attention_reference(q, k, v, causal=False, key_mask=None):
    weights = full.attention_weights(q, k, causal=causal, key_mask=key_mask)
    return weights, full.softmax_attention(q, k, v, causal=causal, key_mask=key_mask)


def _attention_with(q, k, v, causal, key_mask, *, scale, axis=-1, allowed=None, renormalise=True, stable=True,
                    keys=lambda m: m[..., None, :], combine=np.logical_and, empty="zero", fill=-np.inf):
    """The exercise computed with one slip: a different scale, axis or mask, no max subtraction, or the
    rows that see no key left as the plain formula makes them."""
    scores = q @ np.swapaxes(k, -1, -2) * scale  # (..., n, s)
    n, s = scores.shape[-2:]
    mask = allowed(n, s) if (causal and allowed is not None) else None
    if key_mask is not None and keys is not None:
        padding = np.broadcast_to(keys(np.asarray(key_mask)), scores.shape)
        mask = padding if mask is None else combine(mask, padding)
    mask = np.ones(scores.shape, bool) if mask is None else np.broadcast_to(mask, scores.shape)
    if renormalise:
        scores = np.where(mask, scores, fill)
    # A slip may mask a whole row, or overflow exp without the max subtraction: NaN, as the learner would get.
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        top = scores.max(axis=axis, keepdims=True)
        if empty == "zero":
            top = np.where(np.isfinite(top), top, 0.0)
        weights = np.exp(scores - top if stable else scores)
        total = weights.sum(axis=axis, keepdims=True)
        weights = weights / (np.where(total == 0, 1.0, total) if empty == "zero" else total)
    if not renormalise:
        weights = weights * mask
    return weights, weights @ v


def _lower(n, s):
    return np.tril(np.ones((n, s), bool))


def _slip(*, scale=lambda d, e: d ** -0.5, axis=-1, allowed=_lower, **slip):
    """The exercise's function, made with one slip (``scale`` takes the head dims d and e)."""
    def attention(q, k, v, causal=False, key_mask=None):
        return _attention_with(q, k, v, causal, key_mask, scale=scale(q.shape[-1], v.shape[-1]), axis=axis,
                               allowed=allowed, **slip)
    return attention


MISTAKES_1_1 = (
    Mistake("no-causal-mask", _slip(allowed=None),
            "causal=True, yet every query saw every key: mask the scores where key j > query i."),
    Mistake("future-leak", _slip(allowed=lambda n, s: np.triu(np.ones((n, s), bool))),
            "the mask lets query i see keys after i (the future): keep j <= i, the lower triangle (np.tril)."),
    Mistake("off-by-one", _slip(allowed=lambda n, s: np.tril(np.ones((n, s), bool), -1)),
            "a query may attend to itself: the causal mask includes the diagonal (j <= i, not j < i)."),
    Mistake("missing-scale", _slip(scale=lambda d, e: 1.0),
            "the scores are not scaled: divide q kᵀ by √d before the softmax (Eq. 1.2)."),
    Mistake("scale-by-d", _slip(scale=lambda d, e: 1.0 / d),
            "the scores are divided by d; the scale is 1/√d (Eq. 1.2)."),
    Mistake("scale-by-value-width", _slip(scale=lambda d, e: e ** -0.5),
            "the scores are divided by √e, the width of the values (v.shape[-1]); the scale is 1/√d with d the "
            "width of the queries and keys, q.shape[-1], the length of the dot products q·k (Eq. 1.2)."),
    Mistake("softmax-over-queries", _slip(axis=-2),
            "the softmax runs over the query axis; normalise over keys (the last axis) so each row of P sums to 1."),
    Mistake("mask-after-softmax", _slip(renormalise=False),
            "zeroing weights after the softmax leaves rows that no longer sum to 1: "
            "set masked scores to -inf before the softmax."),
    Mistake("unstable-softmax", _slip(stable=False),
            "exp overflows: scores of a few hundred give exp = inf and inf / inf = NaN. Subtract each row's "
            "maximum before exp (Eq. 1.3); the softmax is unchanged."),
    Mistake("key-mask-ignored", _slip(keys=None),
            "key_mask was not applied: a padded key (key_mask False) must get no weight from any query."),
    Mistake("inverted-key-mask", _slip(keys=lambda m: ~m[..., None, :]),
            "key_mask is True where the key is a real token: mask the scores where it is False."),
    Mistake("mask-on-queries", _slip(keys=lambda m: m[..., :, None]),
            "the padding mask hides queries instead of keys: it must broadcast as (..., 1, s), over the key axis "
            "(key_mask[..., None, :])."),
    Mistake("masks-or", _slip(combine=np.logical_or),
            "a key must pass both masks: combine them with & (the product in Eq. 1.4), not |."),
    Mistake("nan-on-empty-rows", _slip(empty="nan"),
            "a query that sees no real key (left padding with causal=True: the first queries see only padding) has "
            "every score -inf, so its maximum is -inf and exp(-inf - (-inf)) is NaN. Give such a row zero weights "
            "and a zero output: e.g. replace a non-finite row maximum by 0 and divide only where the row sum is "
            "above 0."),
    Mistake("large-negative-fill", _slip(fill=-1e9),
            "filling masked scores with a large negative number instead of -inf works while a row has an allowed "
            "key; a row with none becomes uniform over the forbidden keys. Use -inf and give such a row zero "
            "weights (and a zero output)."),
)


def _left_padded(seed, lead, n, d, e, real):
    """A batch whose sequences are padded on the left: ``(q, k, v, key_mask)``, key_mask ``(b, 1, s)``."""
    q, k, v = _qkv(seed, lead, n, d, e)
    key_mask = (np.arange(n)[None, :] >= (n - np.asarray(real))[:, None])[:, None, :]  # (b, 1, s)
    return q, k, v, key_mask


def _cases_1_1():
    q, k, v = _qkv(4, (2,), 6, 4, 3)
    right = (np.arange(6)[None, :] < np.array([6, 4])[:, None])[:, None, :]  # (b, 1, s): padding on the right
    *left_qkv, left = _left_padded(6, (2, 3), 6, 4, 2, [6, 3])
    return [
        ("n = s = 5, d = 4, e = 3, not causal", _qkv(1, (), 5, 4, 3), {}),
        ("n = s = 5, d = 4, e = 3, causal", _qkv(2, (), 5, 4, 3), {"causal": True}),
        ("batched (b, h) = (2, 3), n = 6, d = 8, causal", _qkv(3, (2, 3), 6, 8, 8), {"causal": True}),
        # q, k scaled by 30: scores reach the thousands, far past exp's float64 limit of 709.78.
        ("large scores (|q·k|/√d in the thousands), b = 2, n = 6, causal", (30 * q, 30 * k, v), {"causal": True}),
        ("(b, h) = (2, 3), n = 6, key_mask (b, 1, s): 6 and 4 real tokens, padded on the right, not causal",
         _qkv(5, (2, 3), 6, 4, 2), {"key_mask": right}),
        ("(b, h) = (2, 3), n = 6, padded on the left (6 and 3 real tokens), causal: the second sequence's first "
         "3 queries see no real key", tuple(left_qkv), {"causal": True, "key_mask": left}),
    ]


def _explain_mask_shapes(candidate):
    """``candidate``, with a broadcasting ValueError turned into one that names the mask's shapes (Exercise 1.1)."""
    def checked(q, k, v, **kwargs):
        try:
            return candidate(q, k, v, **kwargs)
        except ValueError as exc:
            key_mask = kwargs.get("key_mask")
            if "broadcast" not in str(exc) or key_mask is None:
                raise
            scores = (*q.shape[:-1], k.shape[-2])
            raise ValueError(
                f"{exc}\n  hint: key_mask has the documented shape (..., s) = {np.shape(key_mask)}, the scores "
                f"(..., n, s) = {scores}. Give the mask a query axis, key_mask[..., None, :], so that it broadcasts "
                f"over the queries (and the heads).") from None
    return checked


class _MaskExercise(Exercise):
    """Exercise 1.1's check: a key mask that does not broadcast gets a hint naming the shapes."""

    def __call__(self, candidate, *, verbose=True):
        return super().__call__(_explain_mask_shapes(candidate), verbose=verbose)


exercise_1_1 = _MaskExercise("1.1", "one mask for causal attention and key padding (NumPy)",
                             _attention_reference, _cases_1_1, MISTAKES_1_1, names=("weights", "output"))


# --- Exercise 1.2: what h heads cost ----------------------------------------------------------
# Eq. (1.5) counted: h heads of width d = d_model / h do the FLOPs of one head of width d_model,
# but each head keeps its own (n, n) matrix P, so the weights grow h-fold.  The learner returns
# (flops, weights) for one sequence; the check passes numbers, not data.

def _costs_reference(n, d_model, n_heads):
    d = d_model / n_heads  # each head's width: the heads split d_model
    flops = n_heads * 2 * (n * n * d + n * n * d)  # per head Q Kᵀ and P V, n·n·d multiply-adds each, 2 FLOPs each
    return float(flops), float(n_heads * n * n)  # one (n, n) matrix P per head


def _costs_with(*, head_width="split", heads_of_flops="all", products=2, p_matrices="per-head"):
    """Exercise 1.2's function, made with one slip in the head width, the products counted or the P matrices."""
    def costs(n, d_model, n_heads):
        d = d_model if head_width == "full" else d_model / n_heads
        flops = (n_heads if heads_of_flops == "all" else 1) * 2 * products * n * n * d  # 2 FLOPs a multiply-add
        weights = {"per-head": n_heads, "one": 1, "split": 1 / n_heads}[p_matrices] * n * n
        return float(flops), float(weights)
    return costs


MISTAKES_1_2 = (
    Mistake("heads-at-full-width", _costs_with(head_width="full"),
            "each head works at width d = d_model / h, not d_model: the heads split the width (Eq. 1.5, the "
            "reshape (n, h·d) → (h, n, d)), so h heads of width d_model / h do the FLOPs of one head of width "
            "d_model."),
    Mistake("one-head-only", _costs_with(heads_of_flops="one", p_matrices="one"),
            "these are one head's costs: a layer runs h heads side by side, each with its own two products and "
            "its own P; count all h."),
    Mistake("one-head-flops", _costs_with(heads_of_flops="one"),
            "the weights count all h matrices P, but the FLOPs are one head's: every head does its own two "
            "products, Q Kᵀ and P V at width d = d_model / h, so multiply one head's FLOPs by h (h heads of width "
            "d_model / h cost as much as one head of width d_model)."),
    Mistake("one-P-for-all-heads", _costs_with(p_matrices="one"),
            "each head has its own scores and its own softmax, so its own (n, n) matrix P: h heads store h·n² "
            "weights, not n²."),
    Mistake("P-split-among-heads", _costs_with(p_matrices="split"),
            "the heads split the width, not P: every head's P is n × n whatever its width d, so h heads store "
            "h·n² weights, not n²/h."),
    Mistake("half-the-flops", _costs_with(products=1),
            "half the FLOPs: count both products, the scores Q Kᵀ and the output P V (n·n·d multiply-adds each, "
            "per head), and a multiply-add as 2 FLOPs (a multiply and an add)."),
)


def _cases_1_2():
    rng = np.random.default_rng(12)
    drawn = [(int(rng.integers(2, 3000)), int(rng.choice([16, 32, 64])), int(rng.choice([2, 4, 8, 16])))
             for _ in range(2)]  # (n, d, h): d_model = h·d
    return [
        ("n = 8 tokens, d_model = 12, h = 3 heads", (8, 12, 3), {}),
        ("BERT-base's layer: n = 512, d_model = 768, h = 12", (512, 768, 12), {}),
        ("one head: n = 1,024, d_model = 64, h = 1", (1024, 64, 1), {}),
        *[(f"n = {n:,}, d_model = {h * d}, h = {h}", (n, h * d, h), {}) for n, d, h in drawn],
    ]


def _as_two_numbers(candidate):
    """``candidate``, with a result of two numbers (a tuple, a list, an array) returned as two floats."""
    def checked(n, d_model, n_heads):
        out = candidate(n, d_model, n_heads)
        parts = out if isinstance(out, (tuple, list)) else [out]
        try:
            values = np.concatenate([np.ravel(to_numpy(x)) for x in parts]).astype(float)
        except (TypeError, ValueError):  # not numbers: shown to the learner as it came back
            return out
        return tuple(float(x) for x in values) if values.size == 2 else out
    return checked


class _CostExercise(Exercise):
    """Exercise 1.2's check: ``(flops, weights)`` accepted as a tuple, a list or an array, ints or floats."""

    def __call__(self, candidate, *, verbose=True):
        return super().__call__(_as_two_numbers(candidate), verbose=verbose)


exercise_1_2 = _CostExercise("1.2", "what h heads cost", _costs_reference, _cases_1_2, MISTAKES_1_2,
                             names=("flops", "weights"))


# --- Lesson 00's demonstration of a check (not an exercise) ----------------------------------
# Lesson 00 shows what a check reports, on lesson 01's split_heads (section 1.4): "not attempted"
# for a stub, "failed" with the slip named, "passed".  It is numbered 0.1 and is in no EXERCISES list.

def _reshape_only(x, n_heads):
    *lead, n, width = x.shape
    return x.reshape(*lead, n_heads, n, width // n_heads)


def _heads_first(x, n_heads):
    *lead, n, width = x.shape
    return np.moveaxis(x.reshape(*lead, n, n_heads, width // n_heads), -2, 0)  # (h, ..., n, d)


def _heads_inner(x, n_heads):
    *lead, n, width = x.shape
    x = x.reshape(*lead, n, width // n_heads, n_heads)  # (..., n, d, h)
    return np.moveaxis(x, -1, -3)  # (..., h, n, d)


MISTAKES_SPLIT_HEADS = (
    Mistake("reshape-without-transpose", _reshape_only,
            "reshaping straight to (..., h, n, d) mixes positions into heads: reshape to "
            "(..., n, h, d) first, then swap the n and h axes."),
    Mistake("heads-inner", _heads_inner,
            "head j owns the j-th block of d consecutive columns: split the width as (h, d), not (d, h)."),
    Mistake("heads-before-batch", _heads_first,
            "np.moveaxis(x, -2, 0) puts the head axis in front of the batch axis, which is right only without "
            "leading axes: move it to -3, just before n, so that (..., n, h, d) becomes (..., h, n, d)."),
)


def _cases_split_heads():
    rng = np.random.default_rng(12)
    return [
        ("(n, h*d) = (4, 2*3)", (rng.standard_normal((4, 6)), 2), {}),
        ("(b, n, h*d) = (2, 5, 4*2)", (rng.standard_normal((2, 5, 8)), 4), {}),
    ]


check_split_heads = Exercise("0.1", "split the model width into heads (lesson 00's demonstration)",
                             full.split_heads, _cases_split_heads, MISTAKES_SPLIT_HEADS, names=("heads",))


# --- Exercise 1.3: two blocks of keys, merged without P -------------------------------------
# Attention over keys A and over keys B, each given as (output, log-normaliser), merged into the
# attention over A and B together: the step a fused kernel repeats block after block so that it
# never holds an (n, s) matrix.  The learner derives the weights exp(ℓ_a − ℓ) and exp(ℓ_b − ℓ).

def _block(q, k, v):
    """Attention of q over one block of keys: ``(output (..., n, e), ℓ (..., n))``, ℓ = ln Σ_j exp(q·k_j/√d)."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])  # (..., n, s_block)
    top = scores.max(axis=-1, keepdims=True)  # (..., n, 1)
    unnormalised = np.exp(scores - top)  # (..., n, s_block), every exponent <= 0
    total = unnormalised.sum(axis=-1, keepdims=True)  # (..., n, 1)
    return unnormalised @ v / total, (top + np.log(total))[..., 0]


def _merge_reference(out_a, lse_a, out_b, lse_b):
    lse = np.logaddexp(lse_a, lse_b)  # (..., n): ln(e^ℓa + e^ℓb) without overflow
    return np.exp(lse_a - lse)[..., None] * out_a + np.exp(lse_b - lse)[..., None] * out_b, lse


def _merge_with(*, weights="shares", lse="logaddexp", normalise=True):
    """Exercise 1.3's function, made with one slip in the weights of the two outputs or in ℓ."""
    def merge(out_a, lse_a, out_b, lse_b):
        with np.errstate(over="ignore", invalid="ignore"):
            total = {"logaddexp": np.logaddexp(lse_a, lse_b), "max": np.maximum(lse_a, lse_b),
                     "sum": lse_a + lse_b, "naive": np.log(np.exp(lse_a) + np.exp(lse_b))}[lse]
            if weights == "average":
                w_a = w_b = np.full_like(lse_a, 0.5)
            elif weights == "by-lse":
                w_a, w_b = lse_a / (lse_a + lse_b), lse_b / (lse_a + lse_b)
            elif weights == "swapped":  # each block weighted by the other's share
                w_a, w_b = np.exp(lse_b - np.logaddexp(lse_a, lse_b)), np.exp(lse_a - np.logaddexp(lse_a, lse_b))
            elif weights == "naive":  # exp of the log-normalisers themselves: overflows in the thousands
                total_exp = np.exp(lse_a) + np.exp(lse_b)
                w_a, w_b = np.exp(lse_a) / total_exp, np.exp(lse_b) / total_exp
            else:
                top = np.maximum(lse_a, lse_b)
                w_a, w_b = np.exp(lse_a - top), np.exp(lse_b - top)
                if normalise:
                    w_a, w_b = w_a / (w_a + w_b), w_b / (w_a + w_b)
            return w_a[..., None] * out_a + w_b[..., None] * out_b, total
    return merge


MISTAKES_1_3 = (
    Mistake("plain-average", _merge_with(weights="average"),
            "the two blocks do not count equally: block A's output carries the weight e^ℓa / (e^ℓa + e^ℓb), its "
            "share of the row's normaliser, and block B the rest."),
    Mistake("weights-by-lse", _merge_with(weights="by-lse"),
            "the weights are shares of the normalisers Σ_j exp(·) = e^ℓ, not of the logarithms ℓ: use "
            "exp(ℓa − ℓ) and exp(ℓb − ℓ)."),
    Mistake("weights-swapped", _merge_with(weights="swapped"),
            "the weights are swapped: block A's output gets block A's own share, exp(ℓa − ℓ), the part of the "
            "normaliser its keys contribute, and block B's output exp(ℓb − ℓ) — not each the other's."),
    Mistake("not-normalised", _merge_with(normalise=False),
            "each block's output is already an average: after exp(ℓa − m) and exp(ℓb − m) divide by their sum, "
            "so that the two weights add up to 1."),
    Mistake("overflow", _merge_with(weights="naive", lse="naive"),
            "exp(ℓ) overflows: ℓ is in the thousands in one case, and exp overflows above 709.78 in float64. "
            "Subtract max(ℓa, ℓb) before exp (Eq. 1.3), or use np.logaddexp for ℓ."),
    Mistake("lse-is-the-max", _merge_with(lse="max"),
            "the merged ℓ is ln(e^ℓa + e^ℓb), the log of the summed normalisers (np.logaddexp), not the larger ℓ: "
            "it exceeds the larger one by up to ln 2."),
    Mistake("lse-summed", _merge_with(lse="sum"),
            "adding ℓa + ℓb multiplies the normalisers; the normalisers add: ℓ = ln(e^ℓa + e^ℓb) (np.logaddexp)."),
)


def _split_case(seed, lead, n, s_a, s_b, d, e, scale=1.0, shift_b=0.0):
    """Blocks A and B of one attention: ``(out_a, lse_a, out_b, lse_b)``, checked against the whole."""
    rng = np.random.default_rng(seed)
    q = scale * rng.standard_normal((*lead, n, d))
    k = scale * rng.standard_normal((*lead, s_a + s_b, d))
    v = rng.standard_normal((*lead, s_a + s_b, e))
    out_a, lse_a = _block(q, k[..., :s_a, :], v[..., :s_a, :])
    out_b, lse_b = _block(q, k[..., s_a:, :], v[..., s_a:, :])
    lse_b = lse_b + shift_b  # as if every score of block B were shifted: its weights move, its output does not
    merged, _ = _merge_reference(out_a, lse_a, out_b, lse_b)
    if shift_b == 0.0:
        assert np.allclose(merged, full.softmax_attention(q, k, v)), "the merge must equal attention over A and B"
    return out_a, lse_a, out_b, lse_b


def _cases_1_3():
    return [
        ("n = 4 queries, blocks of 3 and 5 keys, e = 2", _split_case(14, (), 4, 3, 5, 4, 2), {}),
        ("batched (b, h) = (2, 3), n = 5, blocks of 4 and 6 keys, e = 3", _split_case(15, (2, 3), 5, 4, 6, 8, 3), {}),
        # q, k scaled by 30: the log-normalisers reach the thousands, far past exp's float64 limit of 709.78.
        ("large scores (ℓ in the thousands), n = 6, blocks of 5 and 3", _split_case(16, (2,), 6, 5, 3, 4, 2, 30.0), {}),
        ("block B far weaker (its ℓ lowered by 50), n = 3, blocks of 2 and 2",
         _split_case(17, (), 3, 2, 2, 4, 2, 1.0, -50.0), {}),
    ]


def _explain_broadcasting(candidate):
    """``candidate``, with a broadcasting ValueError turned into one that names the shapes (Exercise 1.3)."""
    def checked(out_a, lse_a, out_b, lse_b):
        try:
            return candidate(out_a, lse_a, out_b, lse_b)
        except ValueError as exc:
            if "broadcast" not in str(exc):
                raise
            raise ValueError(f"{exc}\n  hint: the weights have the shape of ℓ, (..., n) = {lse_a.shape}, the "
                             f"outputs (..., n, e) = {out_a.shape}: give the weights a last axis with w[..., None] "
                             f"(w[:, None] puts it after the first axis, wrong once there are leading axes), so "
                             f"that each query's weight scales its whole output row.") from None
    return checked


class _MergeExercise(Exercise):
    """Exercise 1.3's check: weights without their last axis get a hint naming the shapes."""

    def __call__(self, candidate, *, verbose=True):
        return super().__call__(_explain_broadcasting(candidate), verbose=verbose)


exercise_1_3 = _MergeExercise("1.3", "two blocks of keys merged without P", _merge_reference, _cases_1_3,
                              MISTAKES_1_3, names=("output", "lse"))

EXERCISES = [exercise_1_1, exercise_1_2, exercise_1_3]
