"""Checks for the lesson 01 exercises (attention recap)."""

import numpy as np
import torch

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import full
from course_lib.torch import full as torch_full


def _qkv(seed, lead, n, d, e):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((*lead, n, d)), rng.standard_normal((*lead, n, d)),
            rng.standard_normal((*lead, n, e)))


# --- Exercise 1.1: scaled dot-product attention with a causal mask (NumPy) -----------------

def _attention_reference(q, k, v, causal=False):
    weights = full.attention_weights(q, k, causal=causal)
    return weights, full.softmax_attention(q, k, v, causal=causal)


def _attention_with(q, k, v, causal, *, scale, axis=-1, allowed=None, renormalise=True, stable=True):
    """The exercise computed with one slip: a different scale, axis or mask, or no max subtraction."""
    scores = q @ np.swapaxes(k, -1, -2) * scale  # (..., n, s)
    n, s = scores.shape[-2:]
    mask = allowed(n, s) if (causal and allowed is not None) else np.ones((n, s), bool)
    if renormalise:
        scores = np.where(mask, scores, -np.inf)
    # A slip may mask a whole row, or overflow exp without the max subtraction: NaN, as the learner would get.
    with np.errstate(invalid="ignore", over="ignore"):
        weights = np.exp(scores - scores.max(axis=axis, keepdims=True) if stable else scores)
        weights = weights / weights.sum(axis=axis, keepdims=True)
    if not renormalise:
        weights = weights * mask
    return weights, weights @ v


def _lower(n, s):
    return np.tril(np.ones((n, s), bool))


def _slip(*, scale=lambda d: d ** -0.5, axis=-1, allowed=_lower, renormalise=True, stable=True):
    """The exercise's function, made with one slip."""
    def attention(q, k, v, causal=False):
        return _attention_with(q, k, v, causal, scale=scale(q.shape[-1]), axis=axis, allowed=allowed,
                               renormalise=renormalise, stable=stable)
    return attention


MISTAKES_1_1 = (
    Mistake("no-causal-mask", _slip(allowed=None),
            "causal=True, yet every query saw every key: mask the scores where key j > query i."),
    Mistake("future-leak", _slip(allowed=lambda n, s: np.triu(np.ones((n, s), bool))),
            "the mask lets query i see keys after i (the future): keep j <= i, the lower triangle (np.tril)."),
    Mistake("off-by-one", _slip(allowed=lambda n, s: np.tril(np.ones((n, s), bool), -1)),
            "a query may attend to itself: the causal mask includes the diagonal (j <= i, not j < i)."),
    Mistake("missing-scale", _slip(scale=lambda d: 1.0),
            "the scores are not scaled: divide q kᵀ by √d before the softmax (Eq. 1.2)."),
    Mistake("scale-by-d", _slip(scale=lambda d: 1.0 / d),
            "the scores are divided by d; the scale is 1/√d (Eq. 1.2)."),
    Mistake("softmax-over-queries", _slip(axis=-2),
            "the softmax runs over the query axis; normalise over keys (the last axis) so each row of P sums to 1."),
    Mistake("mask-after-softmax", _slip(renormalise=False),
            "zeroing weights after the softmax leaves rows that no longer sum to 1: "
            "set masked scores to -inf before the softmax."),
    Mistake("unstable-softmax", _slip(stable=False),
            "exp overflows: scores of a few hundred give exp = inf and inf / inf = NaN. Subtract each row's "
            "maximum before exp (Eq. 1.3); the softmax is unchanged."),
)


def _cases_1_1():
    q, k, v = _qkv(4, (2,), 6, 4, 3)
    return [
        ("n = s = 5, d = 4, e = 3, not causal", _qkv(1, (), 5, 4, 3), {}),
        ("n = s = 5, d = 4, e = 3, causal", _qkv(2, (), 5, 4, 3), {"causal": True}),
        ("batched (b, h) = (2, 3), n = 6, d = 8, causal", _qkv(3, (2, 3), 6, 8, 8), {"causal": True}),
        # q, k scaled by 30: scores reach the thousands, far past exp's float64 limit of about 709.
        ("large scores (|q·k|/√d in the thousands), b = 2, n = 6, causal", (30 * q, 30 * k, v), {"causal": True}),
    ]


exercise_1_1 = Exercise("1.1", "scaled dot-product attention with a causal mask (NumPy)",
                        _attention_reference, _cases_1_1, MISTAKES_1_1, names=("weights", "output"))


# --- Exercise 1.2: splitting the model width into heads ------------------------------------

def _reshape_only(x, n_heads):
    *lead, n, width = x.shape
    return x.reshape(*lead, n_heads, n, width // n_heads)


def _heads_inner(x, n_heads):
    *lead, n, width = x.shape
    x = x.reshape(*lead, n, width // n_heads, n_heads)  # (..., n, d, h)
    return np.moveaxis(x, -1, -3)  # (..., h, n, d)


MISTAKES_1_2 = (
    Mistake("reshape-without-transpose", _reshape_only,
            "reshaping straight to (..., h, n, d) mixes positions into heads: reshape to "
            "(..., n, h, d) first, then swap the n and h axes."),
    Mistake("heads-inner", _heads_inner,
            "head j owns the j-th block of d consecutive columns: split the width as (h, d), not (d, h)."),
)


def _cases_1_2():
    rng = np.random.default_rng(12)
    return [
        ("(n, h*d) = (4, 2*3)", (rng.standard_normal((4, 6)), 2), {}),
        ("(b, n, h*d) = (2, 5, 4*2)", (rng.standard_normal((2, 5, 8)), 4), {}),
    ]


exercise_1_2 = Exercise("1.2", "split the model width into heads", full.split_heads, _cases_1_2,
                        MISTAKES_1_2, names=("heads",))


# --- Exercise 1.3: a key-padding mask in PyTorch -------------------------------------------

def _cases_1_3():
    gen = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    lengths = torch.tensor([5, 3])
    key_mask = (torch.arange(5)[None, :] < lengths[:, None])[:, None, :]  # (b, 1, s)
    return [
        ("(b, h, n, d) = (2, 3, 5, 4), sequence lengths 5 and 3", (q, k, v, key_mask), {}),
        ("(b, h, n, d) = (2, 3, 5, 4), all keys real", (q, k, v, torch.ones(2, 1, 5, dtype=torch.bool)), {}),
    ]


def _padded_reference(q, k, v, key_mask):
    return torch_full.softmax_attention(q, k, v, key_mask=key_mask)


def _masked(allowed_of, *, renormalise=True, scaled=True):
    """The exercise's function, made with one slip in how the mask or the scale is applied."""
    def attention(q, k, v, key_mask):
        allowed = allowed_of(key_mask)  # broadcasts against (..., n, s)
        scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5 if scaled else 1.0)
        if renormalise:
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return (weights if renormalise else weights * allowed) @ v
    return attention


MISTAKES_1_3 = (
    Mistake("inverted-mask", _masked(lambda m: ~m[..., None, :]),
            "key_mask is True where the key is a real token; mask the scores where it is False."),
    Mistake("mask-on-queries", _masked(lambda m: m[..., :, None]),
            "the mask hides queries instead of keys: it must broadcast as (..., 1, s) over the key axis."),
    Mistake("mask-after-softmax", _masked(lambda m: m[..., None, :], renormalise=False),
            "zeroing weights after the softmax leaves rows that no longer sum to 1: "
            "fill masked scores with -inf before it."),
    Mistake("missing-scale", _masked(lambda m: m[..., None, :], scaled=False),
            "the scores are not scaled: divide q kᵀ by √d before the softmax (Eq. 1.2)."),
)


def _explain_shape_errors(candidate):
    """``candidate``, with a broadcasting RuntimeError turned into an error that names the shapes."""
    def checked(q, k, v, key_mask):
        try:
            out = candidate(q, k, v, key_mask)
        except NotImplementedError:  # a subclass of RuntimeError: the untouched stub
            raise
        except RuntimeError as exc:
            if "size" not in str(exc) and "shape" not in str(exc):
                raise
            scores = (*q.shape[:-1], k.shape[-2])
            raise ValueError(
                f"{exc}\n  hint: key_mask has the documented shape (b, 1, s) = {tuple(key_mask.shape)}, the scores "
                f"(b, h, n, s) = {scores}. Give the mask a query axis, key_mask[..., None, :] of shape "
                f"(b, 1, 1, s), so that it broadcasts over heads and queries.") from None
        if getattr(out, "ndim", q.ndim) > q.ndim:  # e.g. key_mask[:, None, None, :] adds a second head axis
            raise ValueError(
                f"the output has shape {tuple(out.shape)}, one axis too many for the expected "
                f"{(*q.shape[:-1], v.shape[-1])}.\n  hint: key_mask (b, 1, s) already has its head axis; "
                f"add only a query axis, key_mask[..., None, :] of shape (b, 1, 1, s).")
        return out
    return checked


class _KeyMaskExercise(Exercise):
    """Exercise 1.3's check: a mask that does not broadcast gets a hint naming the shapes."""

    def __call__(self, candidate, *, verbose=True):
        return super().__call__(_explain_shape_errors(candidate), verbose=verbose)


exercise_1_3 = _KeyMaskExercise("1.3", "attention with a key-padding mask (PyTorch)", _padded_reference,
                                _cases_1_3, MISTAKES_1_3, names=("output",))

EXERCISES = [exercise_1_1, exercise_1_2, exercise_1_3]
