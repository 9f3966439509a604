"""Checks for the lesson 10 exercises (linearizing: Hedgehog's map, the distillation loss, the leak in a split of
overlapping windows, the window of Eq. 10.9 in linear memory)."""

import tracemalloc

import numpy as np

from course_lib.checks import Exercise, Mistake, Requirement
from course_lib.numpy import feature_maps


def _gaussians(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


def _softmax(u, axis=-1):
    e = np.exp(u - u.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# --- Exercise 10.1: Hedgehog's feature map ---------------------------------------------------

def _hedgehog_reference(x, weight, bias):
    return feature_maps.hedgehog_feature_map(x, weight, bias)  # (..., n, 2f)


def _hedgehog(*, positive=True, axis=-1, halves=2, transpose=True):
    """The exercise's function, made with one slip."""
    def features(x, weight, bias):
        w = np.swapaxes(weight, -1, -2) if transpose else weight  # (..., d, f)
        u = np.einsum("...nd,...df->...nf", x, w) + bias[..., None, :]  # (..., n, f)
        if not positive:
            return np.concatenate([u, -u], axis=-1)
        parts = [_softmax(u, axis), _softmax(-u, axis)][:halves]
        return np.concatenate(parts, axis=-1)
    return features


MISTAKES_10_1 = (
    Mistake("not-non-negative", _hedgehog(positive=False),
            "your features are Wx + b and −(Wx + b) themselves: half of them are negative, so a weight "
            "phi(q)·phi(k) can be negative and the normaliser can be 0. Apply softmax (exp, normalised) to each half."),
    Mistake("softmax-over-positions", _hedgehog(axis=-2),
            "the softmax runs over the n positions; it must run over the f features of each position "
            "(axis=-1), so each token's features sum to 1 on each half."),
    Mistake("one-half-only", _hedgehog(halves=1),
            "you returned softmax(Wx + b) only: Hedgehog concatenates softmax(−(Wx + b)) too (2f features), so "
            "a feature also grows where Wx + b is very negative."),
    Mistake("weight-not-transposed", _hedgehog(transpose=False),
            "u = W x for a column x is x @ Wᵀ for the rows of x: with weight (..., f, d) use "
            "np.einsum('...nd,...fd->...nf', x, weight), not x @ weight."),
)


def _cases_10_1():
    return [
        ("one head, n = 5, d = f = 4", (_gaussians(101, 5, 4), _gaussians(102, 4, 4), _gaussians(103, 4)), {}),
        ("one head, n = 6, d = 4, f = 3", (_gaussians(104, 6, 4), _gaussians(105, 3, 4), _gaussians(106, 3)), {}),
        ("batch 2, 3 heads with their own W, n = 5, d = 4, f = 4",
         (_gaussians(107, 2, 3, 5, 4), _gaussians(108, 3, 4, 4), _gaussians(109, 3, 4)), {}),
        ("large inputs (a bare exp would overflow)", (40 * _gaussians(110, 4, 4), _gaussians(111, 4, 4) * 20,
                                                      _gaussians(112, 4)), {}),
    ]


exercise_10_1 = Exercise("10.1", "Hedgehog's feature map", _hedgehog_reference, _cases_10_1, MISTAKES_10_1,
                         names=("phi",))


# --- Exercise 10.2: the attention-distillation loss -----------------------------------------

def _loss(*, key_axis=-1, sum_axis=-1, mask_keys=True, mask_rows=True, reverse=False, rows="real"):
    """Eq. (10.6) for linear attention's weights (Eq. 10.2), made with optional slips."""
    def loss(P, phi_q, phi_k, key_mask):
        kernel = np.einsum("...nf,...sf->...ns", phi_q, phi_k)  # (..., n, s)
        if mask_keys:
            kernel = np.where(key_mask[..., None, :], kernel, 0.0)  # padded keys weigh nothing
        A = kernel / (kernel.sum(axis=key_axis, keepdims=True) + 1e-6)  # (..., n, s)
        if reverse:
            terms = -(A * np.log(P + 1e-12))
        else:
            terms = -(P * np.log(A + 1e-12))
        per_row = terms.sum(axis=sum_axis)  # (..., n)
        if not mask_rows:
            return float(per_row.mean())
        real = per_row[np.broadcast_to(key_mask, per_row.shape)]  # the real rows of every text and head
        count = {"real": real.size, "all": per_row.size, "tokens": key_mask.sum()}[rows]
        return float(real.sum() / count)
    return loss


def _loss_reference(P, phi_q, phi_k, key_mask):
    A = feature_maps.linear_attention_weights(phi_q, phi_k, key_mask=key_mask)  # (..., n, s)
    return feature_maps.attention_cross_entropy(P, A, key_mask=key_mask)


MISTAKES_10_2 = (
    Mistake("normalised-over-queries", _loss(key_axis=-2),
            "each row of A must sum to 1 over the keys (axis=-1), as a row of P does; you normalised each "
            "column over the queries."),
    Mistake("summed-over-queries", _loss(sum_axis=-2),
            "the cross-entropy compares one query's row of P with the same row of A: sum P_ij ln A_ij over the "
            "keys j (axis=-1), then average over the query rows i."),
    Mistake("padded-keys-not-masked", _loss(mask_keys=False),
            "padded keys must carry no weight: zero their kernel values before normalising, or A's rows share "
            "weight with [PAD] tokens that P never attends to."),
    Mistake("padded-rows-counted", _loss(mask_rows=False),
            "a query at a padded position is never read: average the loss over the real query rows only (the "
            "key mask, with n = s, also marks the real queries)."),
    Mistake("divided-by-every-row", _loss(rows="all"),
            "you summed the real rows' losses but divided by every row, the padded ones too: the mean is over "
            "the real query rows, so divide by their count (or take .mean() of the masked rows)."),
    Mistake("rows-counted-once-per-text", _loss(rows="tokens"),
            "you divided by key_mask.sum(), the real tokens of each text counted once; every head has its own "
            "rows, so there are (real tokens) × h real rows: broadcast the mask to the rows' shape (b, h, n) "
            "and count there."),
    Mistake("teacher-and-student-swapped", _loss(reverse=True),
            "the teacher's P weighs the log of the student's A: −Σ_j P_ij ln A_ij, not −Σ_j A_ij ln P_ij."),
)


def _teacher(seed, shape, lengths):
    """Softmax weights ``(b, h, n, s)`` of random q, k with padded keys; the key mask ``(b, 1, s)``."""
    b, h, n, d = shape
    q, k = 0.7 * _gaussians(seed, b, h, n, d), 0.7 * _gaussians(seed + 1, b, h, n, d)
    mask = (np.arange(n)[None, :] < np.asarray(lengths)[:, None])[:, None, :]  # (b, 1, s)
    scores = np.where(mask[..., None, :], q @ np.swapaxes(k, -1, -2) / np.sqrt(d), -np.inf)
    return _softmax(scores), np.exp(0.5 * _gaussians(seed + 2, b, h, n, 6)), np.exp(
        0.5 * _gaussians(seed + 3, b, h, n, 6)), mask


def _cases_10_2():
    return [
        ("no padding, batch 1, 2 heads, n = 5", _teacher(201, (1, 2, 5, 4), [5]), {}),
        ("two texts of 6 and 4 tokens, 2 heads", _teacher(205, (2, 2, 6, 4), [6, 4]), {}),
        ("three texts of 7, 3 and 5 tokens, 3 heads", _teacher(209, (3, 3, 7, 4), [7, 3, 5]), {}),
    ]


exercise_10_2 = Exercise("10.2", "the attention-distillation loss", _loss_reference, _cases_10_2, MISTAKES_10_2,
                         names=("loss",), atol=1e-9, rtol=1e-7)


# --- Exercise 10.3: find the leak in a split of overlapping windows ----------------------------
# A corpus cut into windows of `length` words every `stride` words: window i covers the words
# starts[i] … starts[i] + length - 1. The last `n_heldout` windows are held out; a training
# window that shares a word with a held-out one leaks it.

def _starts(n_words, length, stride):
    return np.arange(0, n_words - length + 1, stride)  # (windows,)


def _leaky(n_words, length, stride, n_heldout):
    """The split of the exercise's statement: it leaks when stride < length."""
    starts = _starts(n_words, length, stride)
    return starts[:-n_heldout], starts[-n_heldout:]


def _leak_free_reference(n_words, length, stride, n_heldout):
    train, heldout = _leaky(n_words, length, stride, n_heldout)
    return train[train + length <= heldout[0]], heldout  # a window ends at start + length - 1


def _dropped_one(n_words, length, stride, n_heldout):
    train, heldout = _leaky(n_words, length, stride, n_heldout)
    return train[:-1], heldout


def _end_inclusive(n_words, length, stride, n_heldout):
    train, heldout = _leaky(n_words, length, stride, n_heldout)
    return train[train + length < heldout[0]], heldout


def _heldout_side(n_words, length, stride, n_heldout):
    train, heldout = _leaky(n_words, length, stride, n_heldout)
    return train, heldout[heldout >= train[-1] + length]


MISTAKES_10_3 = (
    Mistake("trained-on-the-heldout-passages", _leaky,
            "this is the split of the statement: with stride < length, window i and window i + 1 share "
            "length − stride words, so the last training windows contain the first held-out words. Drop every "
            "training window that reaches the first held-out start: keep start + length ≤ heldout[0]."),
    Mistake("dropped-one-window-only", _dropped_one,
            "one window dropped is not always enough: a window overlaps every window that starts fewer than "
            "`length` words after it, ceil(length / stride) − 1 of them. Compare positions, not counts: keep a "
            "training window when start + length ≤ heldout[0]."),
    Mistake("end-counted-inclusive", _end_inclusive,
            "a window of `length` words starting at s covers s … s + length − 1: one that ends with "
            "start + length == heldout[0] shares no word with the held-out text, keep it (≤, not <)."),
    Mistake("held-out-windows-dropped", _heldout_side,
            "the held-out windows are fixed (the last n_heldout, the ones every score is reported on): remove "
            "the overlap on the training side, not by dropping held-out windows."),
)


def _cases_10_3():
    return [
        ("100 words, windows of 16 every 8, the last 2 held out", (100, 16, 8, 2), {}),
        ("100 words, windows of 20 every 5, the last 3 held out", (100, 20, 5, 3), {}),
        ("57 words, windows of 12 every 5, the last 4 held out", (57, 12, 5, 4), {}),
        ("stride = length: windows that never overlap, the last 2 held out", (100, 10, 10, 2), {}),
        ("stride > length: gaps between the windows, the last 3 held out", (120, 8, 11, 3), {}),
    ]


exercise_10_3 = Exercise("10.3", "find the leak in a split of overlapping windows", _leak_free_reference,
                         _cases_10_3, MISTAKES_10_3, names=("train_starts", "heldout_starts"), atol=0, rtol=0)


# --- Exercise 10.4: Eq. (10.9) without the n × n weights -----------------------------------------
# The learner computes the window's softmax terms on the 2w + 1 keys of each query and linear
# attention's terms from the states phi(k)ᵀv and Σ phi(k), under one normaliser and one shift.

def _window_reference(q, k, v, phi_q, phi_k, window, gamma):
    return feature_maps.window_linear_attention(q, k, v, phi_q, phi_k, window=window, log_scale=np.log(gamma))


def _window_slip(*, near=lambda distance, w: np.abs(distance) <= w, scale=True, gamma_where="both",
                 kernel_keys="all", separate=False, shift_kernel=True, wrap=False):
    """Eq. (10.9)'s output formed densely, with one slip (the defaults: none)."""
    def attention(q, k, v, phi_q, phi_k, window, gamma):
        n = q.shape[-2]
        distance = np.arange(n)[None, :] - np.arange(n)[:, None]  # (n, s): j - i
        if wrap:  # np.roll's band: the key j - i ≡ o (mod n), so the ends see each other
            distance = (distance + n // 2) % n - n // 2
        band = near(distance, window)  # (n, s)
        scores = q @ np.swapaxes(k, -1, -2) / (np.sqrt(q.shape[-1]) if scale else 1.0)  # (..., n, s)
        scores = np.where(band, scores, -np.inf)
        shift = scores.max(axis=-1, keepdims=True)  # (..., n, 1)
        exact = np.exp(scores - shift)  # (..., n, s)
        kernel = phi_q @ np.swapaxes(phi_k, -1, -2)  # (..., n, s)
        if kernel_keys == "outside":
            kernel = np.where(band, 0.0, kernel)
        kernel = kernel * (np.exp(-shift) if shift_kernel else 1.0)
        g_num, g_den = {"both": (gamma, gamma), "none": (1.0, 1.0), "numerator": (gamma, 1.0)}[gamma_where]
        if separate:
            return (exact @ v / exact.sum(-1, keepdims=True)
                    + kernel @ v / kernel.sum(-1, keepdims=True))
        return (exact @ v + g_num * kernel @ v) / (exact.sum(-1, keepdims=True) + g_den * kernel.sum(-1, keepdims=True))
    return attention


def _peak_bytes(fn, *args):
    """Peak NumPy memory (tracemalloc) of ``fn(*args)``, in bytes."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        fn(*args)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()


LONG_N, BUDGET = 4096, 16 * 2**20  # n × n float64 at n = 4,096: 128 MiB; the linear form needs well under 1 MiB


def _linear_memory(candidate):
    """None if ``candidate`` stays within ``BUDGET`` at n = ``LONG_N``, else what it used."""
    args = _window_case(420, (), LONG_N, 4, 4, 3, window=3, gamma=0.5)
    peak = _peak_bytes(candidate, *args)
    if peak <= BUDGET:
        return None
    return (f"at n = {LONG_N:,} (w = 3, d = e = 4, f = 3) it needed {peak / 2**20:.0f} MiB at its peak; one "
            f"n × n float64 array is {LONG_N**2 * 8 / 2**20:.0f} MiB, and the budget is {BUDGET / 2**20:.0f} MiB.")


REQUIREMENTS_10_4 = (
    Requirement("formed-n-by-n", _linear_memory,
                "Eq. (10.9)'s point is that the n × n weights are never formed: score each query against its "
                "2w + 1 neighbours only (a loop over the offsets −w … w, each a slice of k and v), and add the "
                "kernel's terms from phi(k)ᵀv and Σ_j phi(k_j), computed once for every query.",
                _window_reference),
)

MISTAKES_10_4 = (
    Mistake("two-normalisers", _window_slip(separate=True),
            "the window's softmax and the kernel were each normalised on their own and then added: Eq. (10.9) has "
            "ONE normaliser, the sum of both terms over the keys, so a query's weights sum to 1 in all."),
    Mistake("wrapped-around", _window_slip(wrap=True),
            "the first and last queries reached keys at the other end of the text: np.roll wraps around. A query "
            "near an end has fewer than 2w + 1 keys in its window (slice the valid range, or pad with −inf)."),
    Mistake("gamma-missing", _window_slip(gamma_where="none"),
            "the kernel's terms are γ phi(q_i)·phi(k_j): multiply both the kernel's numerator and its share of the "
            "normaliser by γ."),
    Mistake("gamma-in-numerator-only", _window_slip(gamma_where="numerator"),
            "γ scales the kernel in the normaliser too: each weight is a numerator over the sum of the same "
            "numerators, [near] e^(score) + γ phi(q)·phi(k), over every key."),
    Mistake("kernel-outside-the-window-only", _window_slip(kernel_keys="outside"),
            "in Eq. (10.9) the kernel term covers EVERY key, those in the window too (the bracket multiplies the "
            "exponential only): φ(q)ᵀ(Σ_j φ(k_j) v_jᵀ) over all keys needs no correction for the window."),
    Mistake("one-sided-window", _window_slip(near=lambda distance, w: (distance <= 0) & (distance >= -w)),
            "MiniLM is an encoder: the window holds the keys on both sides of the query, |i − j| ≤ w (2w + 1 "
            "keys), not only the w before it."),
    Mistake("window-too-narrow", _window_slip(near=lambda distance, w: np.abs(distance) < w),
            "the window is |i − j| ≤ w, 2w + 1 keys (the query's own key and w on each side); you kept |i − j| < w."),
    Mistake("no-1/sqrt(d)", _window_slip(scale=False),
            "the exact terms are softmax's own, e^(q·k/√d): divide the scores by √d."),
    Mistake("shift-on-the-window-only", _window_slip(shift_kernel=False),
            "subtracting each row's maximum m_i from the scores divides the window's terms by e^(m_i): divide the "
            "kernel's terms by e^(m_i) too (multiply them by γ e^(−m_i)), or the two no longer share a normaliser."),
)


def _window_case(seed, lead, n, d, e, f, *, window, gamma, scale=1.0):
    """q, k, v, positive features of q and k, window and γ; ``scale`` > 1 makes e^(q·k/√d) overflow."""
    rng = np.random.default_rng(seed)
    q = scale * rng.standard_normal((*lead, n, d))
    k = q + 0.3 * scale * rng.standard_normal((*lead, n, d)) if scale > 1 else rng.standard_normal((*lead, n, d))
    v = rng.standard_normal((*lead, n, e))
    phi_q, phi_k = np.exp(0.5 * rng.standard_normal((2, *lead, n, f)))  # positive features
    return q, k, v, phi_q, phi_k, window, gamma


def _cases_10_4():
    return [
        ("one head, n = 9, d = e = 4, f = 3, w = 2, γ = 0.5", _window_case(401, (), 9, 4, 4, 3, window=2, gamma=0.5),
         {}),
        ("w = 0: the query's own key only, n = 6, d = 3, e = 2, f = 4, γ = 2",
         _window_case(402, (), 6, 3, 2, 4, window=0, gamma=2.0), {}),
        ("w = 7 > n - 1: every key in the window, n = 5, γ = 0.1",
         _window_case(403, (), 5, 4, 3, 2, window=7, gamma=0.1), {}),
        ("batched (b, h) = (2, 3), n = 10, w = 1, γ = 3", _window_case(404, (2, 3), 10, 4, 5, 3, window=1, gamma=3.0),
         {}),
        ("large scores: e^(q·k/√d) beyond float64 (subtract each row's maximum, from both terms)",
         _window_case(405, (), 8, 4, 4, 3, window=2, gamma=0.5, scale=20.0), {}),
    ]


exercise_10_4 = Exercise("10.4", "Eq. (10.9) in linear memory", _window_reference, _cases_10_4, MISTAKES_10_4,
                         names=("out",), atol=1e-9, rtol=1e-7, requirements=REQUIREMENTS_10_4)

EXERCISES = [exercise_10_1, exercise_10_2, exercise_10_3, exercise_10_4]
