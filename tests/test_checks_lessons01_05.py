"""Answers a learner writes for the exercises of lessons 01-05, other than the reference: each right one
passes, and each classic slip that a reader is likely to make is named by its own hint."""

import math

import numpy as np
import pytest

from course_lib.checks import FAILED, NOT_ATTEMPTED, PASSED
from course_lib.checks.lesson01 import EXERCISES, check_split_heads, exercise_1_1, exercise_1_2
from course_lib.checks.lesson02 import exercise_2_2
from course_lib.checks.lesson03 import exercise_3_2, exercise_3_3
from course_lib.checks.lesson04 import exercise_4_1
from course_lib.checks.lesson05 import exercise_5_3

# --- 1.1: masks combined; a query with no real key gives zeros ------------------------------


def _scores(q, k):
    return q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])  # (..., n, s)


def attention_nan_to_num(q, k, v, causal=False, key_mask=None):
    """-inf for every forbidden score, the NaN rows turned into zeros afterwards."""
    scores = _scores(q, k)
    n, s = scores.shape[-2:]
    if causal:
        scores = np.where(np.tril(np.ones((n, s), bool)), scores, -np.inf)
    if key_mask is not None:
        scores = np.where(key_mask[..., None, :], scores, -np.inf)
    with np.errstate(invalid="ignore"):
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = np.nan_to_num(weights / weights.sum(axis=-1, keepdims=True))
    return weights, weights @ v


def attention_divide_where(q, k, v, causal=False, key_mask=None):
    """One boolean mask; exp only of allowed scores; np.divide where the row sum is positive."""
    scores = _scores(q, k)
    n, s = scores.shape[-2:]
    allowed = np.broadcast_to(np.tril(np.ones((n, s), bool)) if causal else np.ones((n, s), bool), scores.shape)
    if key_mask is not None:
        allowed = allowed & key_mask[..., None, :]
    top = np.where(allowed, scores, -np.inf).max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.where(allowed, np.exp(np.where(allowed, scores - top, 0.0)), 0.0)
    total = weights.sum(axis=-1, keepdims=True)
    weights = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    return weights, weights @ v


# --- 1.2: what h heads cost (FLOPs and the number of attention weights) -------------------------


def costs_in_integers(n, d_model, n_heads):
    """Python integers, per head then times h: (flops, weights) as a tuple."""
    d = d_model // n_heads
    return n_heads * (2 * n * n * d + 2 * n * n * d), n_heads * n * n


def costs_as_array(n, d_model, n_heads):
    """h heads of width d_model / h cost the FLOPs of one head of width d_model: 4 n² d_model, as an array."""
    return np.array([4.0 * n**2 * d_model, n_heads * n**2])


def costs_as_list_of_numpy_scalars(n, d_model, n_heads):
    scores = np.float64(n) * n * (d_model / n_heads)  # multiply-adds of one head's Q Kᵀ, as many for P V
    return [n_heads * 2 * 2 * scores, np.int64(n_heads) * n * n]


@pytest.mark.parametrize("answer", [costs_in_integers, costs_as_array, costs_as_list_of_numpy_scalars],
                         ids=lambda f: f.__name__)
def test_exercise_1_2_accepts_every_form_of_the_right_counts(answer, capsys):
    result = exercise_1_2(answer)
    assert result.status == PASSED, capsys.readouterr().out


@pytest.mark.parametrize("answer, mistake", [
    (lambda n, d_model, h: (4 * h * n * n * d_model, h * n * n), "heads-at-full-width"),
    (lambda n, d_model, h: (4 * n * n * d_model / h, n * n), "one-head-only"),
    (lambda n, d_model, h: (4 * n * n * d_model, n * n), "one-P-for-all-heads"),
    (lambda n, d_model, h: np.array([4 * n * n * d_model, n * n / h]), "P-split-among-heads"),
    (lambda n, d_model, h: [h * 2 * n * n * (d_model // h), h * n * n], "half-the-flops"),  # Q Kᵀ only
], ids=["full-width", "one-head", "shared-P", "split-P", "scores-only"])
def test_exercise_1_2_names_each_slip_written_by_hand(answer, mistake, capsys):
    result = exercise_1_2(answer)
    out = capsys.readouterr().out
    assert result.status == FAILED and result.mistake == mistake, out
    assert next(m for m in exercise_1_2.mistakes if m.name == mistake).hint in out


def test_exercise_1_2_models_at_least_three_slips_each_wrong_on_the_first_case():
    # The first case has h = 3 heads: every modelled slip must differ there from the right counts, and from
    # every other slip, so the hint that comes back is that slip's own.
    description, args, kwargs = exercise_1_2.cases()[0]
    answers = [exercise_1_2.reference(*args)] + [m.fn(*args) for m in exercise_1_2.mistakes]
    assert len(exercise_1_2.mistakes) >= 3 and len(set(answers)) == len(answers), answers


def test_exercise_1_2_reports_a_result_of_the_wrong_length(capsys):
    result = exercise_1_2(lambda n, d_model, h: 4 * n * n * d_model)
    assert result.status == FAILED and "expected 2 result(s) (flops, weights), got 1" in capsys.readouterr().out


# --- lesson 00's demonstration: split_heads, a check that is not an exercise ------------------------


def test_the_lesson00_demonstration_is_not_an_exercise_and_reports_all_three_outcomes(capsys):
    from course_lib.numpy import full

    assert check_split_heads not in EXERCISES
    assert check_split_heads(full.split_heads).status == PASSED

    def stub(x, n_heads):
        raise NotImplementedError("Exercise 0.1: split the model width into heads")

    assert check_split_heads(stub).status == NOT_ATTEMPTED
    for mistake in check_split_heads.mistakes:
        result = check_split_heads(mistake.fn)
        assert result.status == FAILED and result.mistake == mistake.name
        assert mistake.hint in capsys.readouterr().out


# --- 2.2: the rank for a relative Frobenius error ---------------------------------------------


def rank_by_building_each_copy(P, tol):
    """Every P_k built and measured: slow, and right."""
    out = np.zeros(P.shape[:-2], int)
    for index in np.ndindex(*P.shape[:-2]):
        matrix = P[index]
        u, sigma, vh = np.linalg.svd(matrix, full_matrices=False)
        out[index] = next(k for k in range(1, len(sigma) + 1)
                          if np.linalg.norm(matrix - (u[:, :k] * sigma[:k]) @ vh[:k]) <= tol * np.linalg.norm(matrix))
    return out


def rank_by_energy_share(P, tol):
    """The squared spectrum's share 1 − tol², with the first k that reaches it."""
    energy = np.linalg.svd(P, compute_uv=False) ** 2
    share = np.cumsum(energy, axis=-1) / energy.sum(axis=-1, keepdims=True)
    return np.argmax(share >= 1 - tol**2, axis=-1) + 1


# --- 3.3: rows for a target error --------------------------------------------------------------


def _predicted(P, v, k):
    exact = np.linalg.norm(np.einsum("...ns,...s->...n", P, v), axis=-1)
    mean_square = (np.linalg.norm(P, axis=(-2, -1)) ** 2 * np.linalg.norm(v, axis=-1) ** 2 + exact**2) / k
    return np.sqrt(mean_square) / exact


def rows_by_search(P, v, target):
    """k = 1, 2, … until exercise 3.2's prediction meets the target."""
    out = np.zeros(P.shape[:-2], int)
    for index in np.ndindex(*P.shape[:-2]):
        k = 1
        while _predicted(P[index], v[index], k) > target:
            k += 1
        out[index] = k
    return out


def rows_nearest(P, v, target):
    a_squared = (np.linalg.norm(P, axis=(-2, -1)) * np.linalg.norm(v, axis=-1)
                 / np.linalg.norm(np.einsum("...ns,...s->...n", P, v), axis=-1)) ** 2
    return np.round((a_squared + 1) / target**2).astype(int)


def predicted_without_root(P, v, k):
    exact = np.linalg.norm(np.einsum("...ns,...s->...n", P, v), axis=-1)
    return (np.linalg.norm(P, axis=(-2, -1)) ** 2 * np.linalg.norm(v, axis=-1) ** 2 + exact**2) / k / exact


# --- 4.1: the best fixed projection --------------------------------------------------------------


def _second_moment(P):
    rows = P.reshape(-1, P.shape[-1])
    return rows.T @ rows


def projection_by_sorted_eig(P, k):
    values, vectors = np.linalg.eig(_second_moment(P))
    return np.real(vectors[:, np.argsort(values.real)[::-1][:k]]).T


def projection_by_svd_of_rows(P, k):
    return np.linalg.svd(P.reshape(-1, P.shape[-1]), full_matrices=False)[2][:k]


def projection_by_unsorted_eig(P, k):
    return np.real(np.linalg.eig(_second_moment(P))[1][:, :k]).T


# --- 5.3: the plateau test, read literally --------------------------------------------------------


def plateau_literal(steps, losses, *, window, tol, min_steps):
    """The best loss over the evaluations at steps t′ <= t − window, found by comparing steps."""
    for i, t in enumerate(steps):
        before = [loss for step, loss in zip(steps, losses, strict=True) if step <= t - window]
        if t >= min_steps and before and min(before) - min(losses[:i + 1]) < tol:
            return t, True
    return steps[-1], False


def plateau_running_best(steps, losses, *, window, tol, min_steps):
    best = np.minimum.accumulate(losses)
    back = math.ceil(window / (steps[1] - steps[0]))
    for i, t in enumerate(steps):
        if t >= min_steps and i >= back and best[i - back] - best[i] < tol:
            return t, True
    return steps[-1], False


@pytest.mark.parametrize("exercise, answer", [
    (exercise_1_1, attention_nan_to_num), (exercise_1_1, attention_divide_where),
    (exercise_2_2, rank_by_building_each_copy), (exercise_2_2, rank_by_energy_share),
    (exercise_3_3, rows_by_search),
    (exercise_4_1, projection_by_sorted_eig), (exercise_4_1, projection_by_svd_of_rows),
    (exercise_5_3, plateau_literal), (exercise_5_3, plateau_running_best),
], ids=lambda x: getattr(x, "number", getattr(x, "__name__", "")))
def test_a_right_answer_written_another_way_passes(exercise, answer, capsys):
    result = exercise(answer)
    assert result.status == PASSED, capsys.readouterr().out


@pytest.mark.parametrize("exercise, answer, mistake", [
    (exercise_3_2, predicted_without_root, "no-square-root"),
    (exercise_3_3, rows_nearest, "rounded-down"),
    (exercise_4_1, projection_by_unsorted_eig, "eig-unsorted"),
], ids=lambda x: getattr(x, "number", getattr(x, "__name__", x)))
def test_a_classic_slip_written_by_hand_is_named(exercise, answer, mistake, capsys):
    result = exercise(answer)
    assert result.status == FAILED and result.mistake == mistake, capsys.readouterr().out


# --- slips found by probing the checkers, each written the way a learner writes it -------------------


def attention_scaled_by_value_width(q, k, v, causal=False, key_mask=None):
    """Exercise 1.1 right in every way but the scale: √e, the values' width, for √d."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(v.shape[-1])  # (..., n, s)
    n, s = scores.shape[-2:]
    allowed = np.tril(np.ones((n, s), bool)) if causal else np.ones((n, s), bool)
    if key_mask is not None:
        allowed = allowed & key_mask[..., None, :]
    scores = np.where(allowed, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = weights.sum(axis=-1, keepdims=True)
    weights = weights / np.where(total > 0, total, 1.0)
    return weights, weights @ v


def costs_of_one_head_with_every_P(n, d_model, n_heads):
    d = d_model // n_heads
    return 2 * (n * n * d + n * n * d), n_heads * n * n  # one head's products, all heads' P


def merge_with_swapped_weights(out_a, lse_a, out_b, lse_b):
    lse = np.logaddexp(lse_a, lse_b)
    return np.exp(lse_b - lse)[..., None] * out_a + np.exp(lse_a - lse)[..., None] * out_b, lse


def _real(scores, lengths):
    return np.arange(scores.shape[-1]) < np.asarray(lengths)[..., None]  # (..., n)


def padded_by_the_gram_matrix(scores, lengths):
    """A large negative score instead of −inf; σ from the eigenvalues of P Pᵀ (Eq. 2.3), largest first."""
    real = _real(scores, lengths)
    kept = np.where(real[..., None, :], scores, -1e9)
    weights = np.exp(kept - kept.max(axis=-1, keepdims=True)) * real[..., :, None]  # padded rows: 0
    total = weights.sum(axis=-1, keepdims=True)
    P = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    sigma = np.sqrt(np.clip(np.linalg.eigvalsh(P @ np.swapaxes(P, -1, -2)), 0, None))[..., ::-1]
    return P, np.cumsum(sigma, axis=-1) / sigma.sum(axis=-1, keepdims=True)


def padded_in_torch(scores, lengths):
    torch = pytest.importorskip("torch")
    scores, real = torch.from_numpy(scores), torch.from_numpy(_real(scores, lengths))
    P = torch.softmax(scores.masked_fill(~real[..., None, :], float("-inf")), dim=-1)  # padded rows: NaN
    P = torch.where(real[..., :, None], P, 0.0)
    sigma = torch.linalg.svdvals(P)
    return P, sigma.cumsum(-1) / sigma.sum(-1, keepdim=True)


def padded_block_by_block(scores, lengths):
    """Right values, one real block at a time: a loop over the matrices."""
    P, curves = np.zeros(scores.shape), np.ones(scores.shape[:-1])
    lengths = np.broadcast_to(lengths, scores.shape[:-2])
    for index in np.ndindex(scores.shape[:-2]):
        L = int(lengths[index])
        block = np.exp(scores[index][:L, :L] - scores[index][:L, :L].max(axis=-1, keepdims=True))
        P[index][:L, :L] = block / block.sum(axis=-1, keepdims=True)
        sigma = np.linalg.svd(P[index][:L, :L], compute_uv=False)
        curves[index][:L] = np.cumsum(sigma) / sigma.sum()
    return P, curves


def _padded_spectrum(P):
    sigma = np.linalg.svd(P, compute_uv=False)
    return P, np.cumsum(sigma, axis=-1) / sigma.sum(axis=-1, keepdims=True)


def padded_zeroed_after_the_softmax(scores, lengths):
    real = _real(scores, lengths)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    P = weights / weights.sum(axis=-1, keepdims=True) * real[..., None, :] * real[..., :, None]
    return _padded_spectrum(P)


def padded_lengths_inclusive(scores, lengths):
    real = np.arange(scores.shape[-1]) <= np.asarray(lengths)[..., None]
    kept = np.where(real[..., None, :], scores, -np.inf)
    weights = np.exp(kept - kept.max(axis=-1, keepdims=True))
    return _padded_spectrum(np.where(real[..., :, None], weights / weights.sum(axis=-1, keepdims=True), 0.0))


def padded_query_rows_left(scores, lengths):
    real = _real(scores, lengths)
    kept = np.where(real[..., None, :], scores, -np.inf)
    weights = np.exp(kept - kept.max(axis=-1, keepdims=True))
    return _padded_spectrum(weights / weights.sum(axis=-1, keepdims=True))


def shared_by_the_stacked_svd(P, k):
    """The heads stacked into one (h·n, s) matrix; its SVD gives the projector and, by Eckart–Young, the error."""
    stacked = P.reshape(*P.shape[:-3], -1, P.shape[-1])
    _, sigma, vh = np.linalg.svd(stacked, full_matrices=False)
    own = np.linalg.svd(P, compute_uv=False)[..., k:] ** 2
    total = (sigma**2).sum(axis=-1)
    return (np.swapaxes(vh[..., :k, :], -1, -2) @ vh[..., :k, :], np.sqrt((sigma[..., k:] ** 2).sum(axis=-1) / total),
            np.sqrt(own.sum(axis=(-2, -1)) / total))


def shared_in_torch(P, k):
    torch = pytest.importorskip("torch")
    P = torch.from_numpy(P)
    gram = (P.transpose(-1, -2) @ P).sum(-3)
    energy, vectors = torch.linalg.eigh(gram)
    top = vectors.flip(-1)[..., :k]
    total = (P**2).sum((-3, -2, -1))
    shared = (total - (top.transpose(-1, -2) @ gram @ top).diagonal(dim1=-2, dim2=-1).sum(-1)).clamp(min=0) / total
    own = (torch.linalg.svdvals(P)[..., k:] ** 2).sum((-2, -1)) / total
    return top @ top.transpose(-1, -2), shared.sqrt(), own.sqrt()


def shared_from_the_mean_head(P, k):
    _, _, vh = np.linalg.svd(P.mean(axis=-3), full_matrices=False)  # one (n, s) matrix: the heads averaged
    projector = np.swapaxes(vh[..., :k, :], -1, -2) @ vh[..., :k, :]
    total = (P**2).sum(axis=(-3, -2, -1))
    left = P - P @ projector[..., None, :, :]
    own = (np.linalg.svd(P, compute_uv=False)[..., k:] ** 2).sum(axis=(-2, -1))
    return projector, np.sqrt((left**2).sum(axis=(-3, -2, -1)) / total), np.sqrt(own / total)


def projection_of_unit_rows(P, k):
    rows = P.reshape(-1, P.shape[-1])
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return np.linalg.eigh(rows.T @ rows)[1][:, ::-1][:, :k].T


def flops_of_one_sequence(b, h, n, s, d, e, k):
    exact = 2 * h * n * s * (d + e)
    return float(exact), float(2 * h * k * s * (d + e) + 2 * h * n * k * (d + e))


def flops_one_per_multiply_add(b, h, n, s, d, e, k):
    exact = b * h * n * s * (d + e)
    return float(exact), float(b * h * k * s * (d + e) + b * h * n * k * (d + e))


def merge_by_the_larger_lse(out_a, lse_a, out_b, lse_b):
    top = np.maximum(lse_a, lse_b)  # (..., n): subtract before exp
    w_a, w_b = np.exp(lse_a - top), np.exp(lse_b - top)
    out = (w_a[..., None] * out_a + w_b[..., None] * out_b) / (w_a + w_b)[..., None]
    return out, top + np.log(w_a + w_b)


def flops_in_integers(b, h, n, s, d, e, k):
    return 2 * b * h * n * s * (d + e), 2 * b * h * (k * s + n * k) * (d + e)


@pytest.mark.parametrize("number, answer", [
    ("1.1", attention_divide_where), ("1.3", merge_by_the_larger_lse),
    ("2.1", padded_by_the_gram_matrix), ("2.1", padded_in_torch),
    ("2.3", shared_by_the_stacked_svd), ("2.3", shared_in_torch),
    ("4.3", flops_in_integers),
], ids=lambda x: getattr(x, "__name__", x))
def test_a_right_answer_beside_the_probed_slips_passes(number, answer, capsys):
    from course_lib.checks import all_exercises

    exercise = next(e for e in all_exercises() if e.number == number)
    assert exercise(answer).status == PASSED, capsys.readouterr().out


@pytest.mark.parametrize("number, answer, mistake", [
    ("1.1", attention_scaled_by_value_width, "scale-by-value-width"),
    ("1.2", costs_of_one_head_with_every_P, "one-head-flops"),
    ("1.3", merge_with_swapped_weights, "weights-swapped"),
    ("2.1", padded_zeroed_after_the_softmax, "padded-keys-zeroed-after-the-softmax"),
    ("2.1", padded_lengths_inclusive, "length-off-by-one"),
    ("2.1", padded_query_rows_left, "padded-queries-kept"),
    ("2.3", shared_from_the_mean_head, "heads-added-not-stacked"),
    ("4.1", projection_of_unit_rows, "rows-normalised-first"),
    ("4.3", flops_of_one_sequence, "batch-forgotten"),
    ("4.3", flops_one_per_multiply_add, "one-flop-per-multiply-add"),
], ids=lambda x: getattr(x, "__name__", x))
def test_a_probed_slip_written_by_hand_gets_its_own_hint(number, answer, mistake, capsys):
    from course_lib.checks import all_exercises

    exercise = next(e for e in all_exercises() if e.number == number)
    result = exercise(answer)
    out = capsys.readouterr().out
    assert result.status == FAILED and result.mistake == mistake, out
    assert next(m for m in exercise.mistakes if m.name == mistake).hint in out


def test_2_1_a_loop_over_the_matrices_is_named(capsys):
    from course_lib.checks.lesson02 import exercise_2_1

    result = exercise_2_1(padded_block_by_block)
    out = capsys.readouterr().out
    assert result.status == FAILED and result.mistake == "loops-over-matrices", out
    assert "for 32 matrices your function ran" in out
