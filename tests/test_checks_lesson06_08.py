"""Answers a learner writes for the exercises of lessons 06-08, other than the reference: the rules of 6.1,
6.4 and 7.1 hold however the answer is written (torch instead of NumPy, a helper in another cell, a call
into the library), each probed slip is named by its own hint, and right answers written other ways pass."""

import numpy as np
import pytest

from course_lib.checks import FAILED, PASSED
from course_lib.checks.lesson06 import exercise_6_1, exercise_6_2, exercise_6_3, exercise_6_4
from course_lib.checks.lesson07 import exercise_7_1
from course_lib.checks.lesson08 import exercise_8_1, exercise_8_2
from course_lib.numpy import linear
from course_lib.numpy.linear import elu_feature_map, linear_attention_step


def _fails_with(exercise, answer, mistake, capsys):
    result = exercise(answer)
    out = capsys.readouterr().out
    assert result.status == FAILED and result.mistake == mistake, out
    hints = [m.hint for m in exercise.mistakes] + [r.hint for r in exercise.requirements]
    assert any(hint in out for hint in hints), out
    return out


def _passes(exercise, answer, capsys):
    result = exercise(answer)
    assert result.status == PASSED, capsys.readouterr().out


# --- 6.1: never the (n, s) kernel, in NumPy or in torch --------------------------------------------


def _torch_features(q, k, v, key_mask):
    torch = pytest.importorskip("torch")
    q, k, v, real = (torch.from_numpy(np.asarray(x)) for x in (q, k, v, key_mask))
    phi_q = torch.nn.functional.elu(q) + 1  # (..., n, f)
    phi_k = torch.where(real[..., None], torch.nn.functional.elu(k) + 1, 0.0)  # (..., s, f)
    return torch, phi_q, phi_k, torch.where(real[..., None], v, 0.0)


def masked_torch(q, k, v, key_mask, eps=1e-6):
    torch, phi_q, phi_k, v = _torch_features(q, k, v, key_mask)
    kv_state = phi_k.transpose(-1, -2) @ v  # (..., f, e)
    normaliser = torch.einsum("...nf,...f->...n", phi_q, phi_k.sum(dim=-2))  # (..., n)
    return kv_state, normaliser, phi_q @ kv_state / (normaliser[..., None] + eps)


def masked_torch_kernel(q, k, v, key_mask, eps=1e-6):
    torch, phi_q, phi_k, v = _torch_features(q, k, v, key_mask)
    kernel = phi_q @ phi_k.transpose(-1, -2)  # (..., n, s): what tracemalloc cannot see
    normaliser = kernel.sum(dim=-1)
    return phi_k.transpose(-1, -2) @ v, normaliser, kernel @ v / (normaliser[..., None] + eps)


def masked_torch_einsum(q, k, v, key_mask, eps=1e-6):
    torch, phi_q, phi_k, v = _torch_features(q, k, v, key_mask)
    normaliser = torch.einsum("...nf,...sf->...n", phi_q, phi_k)  # the (n, s) product inside einsum
    numerator = torch.einsum("...nf,...sf,...se->...ne", phi_q, phi_k, v)
    return phi_k.transpose(-1, -2) @ v, normaliser, numerator / (normaliser[..., None] + eps)


def test_6_1_a_right_answer_in_torch_passes(capsys):
    _passes(exercise_6_1, masked_torch, capsys)


@pytest.mark.parametrize("answer", [masked_torch_kernel, masked_torch_einsum], ids=lambda f: f.__name__)
def test_6_1_a_kernel_formed_in_torch_is_caught(answer, capsys):
    out = _fails_with(exercise_6_1, answer, "forms-the-kernel", capsys)
    assert "torch tensor of shape" in out and "2048, 2048)" in out


def backward_torch_all_states(phi_q, phi_k, v, grad):
    """Exercise 6.4's gradients from the n states, in torch: right values, the memory Eq. (6.5) avoids."""
    torch = pytest.importorskip("torch")
    phi_q, phi_k, v, grad = (torch.from_numpy(x) for x in (phi_q, phi_k, v, grad))
    states = torch.cumsum(phi_k[..., :, :, None] * v[..., :, None, :], dim=-3)  # (..., n, f, e)
    reads = phi_q[..., :, :, None] * grad[..., :, None, :]  # (..., n, f, e)
    future = reads.flip(-3).cumsum(-3).flip(-3)  # Σ_{i ≥ j}
    return (torch.einsum("...nfe,...ne->...nf", states, grad), torch.einsum("...nfe,...ne->...nf", future, v),
            torch.einsum("...nfe,...nf->...ne", future, phi_k))


def test_6_4_all_states_held_in_torch_are_caught(capsys):
    out = _fails_with(exercise_6_4, backward_torch_all_states, "keeps-all-states", capsys)
    assert "torch tensor of shape" in out


# --- 6.2: the state stored after the update ---------------------------------------------------------


def _chunk_loop(q, k, v, chunk_size, *, store_after, eps=1e-6):
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)  # (..., n, f)
    n, f, e = q.shape[-2], phi_k.shape[-1], v.shape[-1]
    S, z = np.zeros((*q.shape[:-2], f, e)), np.zeros((*q.shape[:-2], f))
    states, within, output = [], np.zeros(v.shape), np.zeros(v.shape)
    for start in range(0, n, chunk_size):
        a, b, w = (x[..., start:start + chunk_size, :] for x in (phi_q, phi_k, v))
        if not store_after:
            states.append(S.copy())
        scores = np.tril(a @ np.swapaxes(b, -1, -2))  # (..., c, c)
        within[..., start:start + chunk_size, :] = scores @ w
        normaliser = np.einsum("...if,...f->...i", a, z) + scores.sum(axis=-1)
        output[..., start:start + chunk_size, :] = (a @ S + scores @ w) / (normaliser[..., None] + eps)
        S = S + np.swapaxes(b, -1, -2) @ w
        z = z + b.sum(axis=-2)
        if store_after:
            states.append(S.copy())  # the slip: chunk g's own sum is already in
    return np.stack(states, axis=-3), within, output


def chunks_in_a_loop(q, k, v, chunk_size, eps=1e-6):
    return _chunk_loop(q, k, v, chunk_size, store_after=False)


def chunks_stored_after_the_update(q, k, v, chunk_size, eps=1e-6):
    return _chunk_loop(q, k, v, chunk_size, store_after=True)


# --- 6.3: rows without weights, and zero weights ----------------------------------------------------


def _weights(q, k, feature_map):
    weights = feature_map(q) @ np.swapaxes(feature_map(k), -1, -2)  # (..., n, s)
    return weights, weights.sum(axis=-1), np.abs(weights).sum(axis=-1)


def cancellation_by_where(q, k, feature_map):
    weights, normaliser, size = _weights(q, k, feature_map)
    with np.errstate(invalid="ignore"):
        ratio = np.where(size > 0, np.abs(normaliser) / size, 1.0)
    return normaliser, (weights < 0).sum() / weights.size, ratio


def cancellation_empty_rows_zero(q, k, feature_map):
    weights, normaliser, size = _weights(q, k, feature_map)
    ratio = np.divide(np.abs(normaliser), size, out=np.zeros_like(size), where=size > 0)
    return normaliser, np.mean(weights < 0), ratio


def cancellation_zero_counted_negative(q, k, feature_map):
    weights, normaliser, size = _weights(q, k, feature_map)
    ratio = np.divide(np.abs(normaliser), size, out=np.ones_like(size), where=size > 0)
    return normaliser, np.mean(weights <= 0), ratio


# --- 7.1: no loop anywhere, and no call into the library's causal form ------------------------------


def _in_another_cell(source, name):
    """``name`` defined by ``source`` compiled as a notebook cell of its own (its own file name)."""
    namespace = {"np": np, "elu_feature_map": elu_feature_map, "linear_attention_step": linear_attention_step}
    exec(compile(source, "<ipython-input-7-helper>", "exec"), namespace)
    return namespace[name]


_RNN_HELPER = _in_another_cell('''
def run_rnn(q, k, v):
    state, outputs = None, []
    for t in range(q.shape[-2]):
        out, state = linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], state)
        outputs.append(out)
    return np.stack(outputs, axis=-2), *state
''', "run_rnn")

_PARALLEL_HELPER = _in_another_cell('''
def causal_outputs(phi_q, phi_k, v):
    weights = np.tril(phi_q @ np.swapaxes(phi_k, -1, -2))  # (..., n, n)
    return weights @ v / (weights.sum(axis=-1, keepdims=True) + 1e-6)
''', "causal_outputs")


def prefill_through_a_looping_helper(q, k, v):
    return _RNN_HELPER(q, k, v)


def prefill_through_a_parallel_helper(q, k, v):
    phi_k = elu_feature_map(k)
    return _PARALLEL_HELPER(elu_feature_map(q), phi_k, v), np.swapaxes(phi_k, -1, -2) @ v, phi_k.sum(axis=-2)


def prefill_by_prefix_sums(q, k, v):
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)  # (..., n, f)
    S = np.cumsum(phi_k[..., :, :, None] * v[..., :, None, :], axis=-3)  # (..., n, f, e)
    Z = np.cumsum(phi_k, axis=-2)  # (..., n, f)
    normaliser = np.einsum("...nf,...nf->...n", phi_q, Z)
    return np.einsum("...nf,...nfe->...ne", phi_q, S) / (normaliser[..., None] + 1e-6), S[..., -1, :, :], Z[..., -1, :]


def prefill_by_einsum_path_search(q, k, v):
    """np.einsum with optimize=True: NumPy's path search runs more Python lines for longer prompts, not a loop."""
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)  # (..., n, f)
    causal = np.tril(np.ones((q.shape[-2], q.shape[-2])))  # (n, n)
    numerator = np.einsum("...nf,...sf,ns,...se->...ne", phi_q, phi_k, causal, v, optimize=True)
    normaliser = np.einsum("...nf,...sf,ns->...n", phi_q, phi_k, causal, optimize=True)
    return (numerator / (normaliser[..., None] + 1e-6), np.einsum("...nf,...ne->...fe", phi_k, v, optimize=True),
            phi_k.sum(axis=-2))


def prefill_by_mapping_numpy(q, k, v):
    """A loop with no Python loop of its own: C-level maps over positions calling NumPy's Python functions."""
    import itertools

    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    rows = [np.moveaxis(x, -2, 0) for x in (phi_q, phi_k, v)]  # (n, ..., w)
    outer = map(np.einsum, itertools.repeat("...f,...e->...fe"), rows[1], rows[2])  # (..., f, e) per position
    S = np.stack(list(itertools.accumulate(outer)), axis=-3)  # (..., n, f, e)
    Z = np.cumsum(phi_k, axis=-2)
    normaliser = np.einsum("...nf,...nf->...n", phi_q, Z)
    return np.einsum("...nf,...nfe->...ne", phi_q, S) / (normaliser[..., None] + 1e-6), S[..., -1, :, :], Z[..., -1, :]


def prefill_by_the_library(q, k, v):
    phi_k = elu_feature_map(k)
    return (linear.causal_linear_attention(q, k, v, chunk_size=None), np.swapaxes(phi_k, -1, -2) @ v,
            phi_k.sum(axis=-2))


def prefill_by_the_checks_reference(q, k, v):
    return exercise_7_1.reference(q, k, v)


def prefill_by_mapping_the_step(q, k, v):
    """The RNN with no Python loop of its own: a C-level accumulate over the library's step."""
    import itertools

    def step(carry, t):
        return linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], carry[1])

    steps = list(itertools.accumulate(range(q.shape[-2]), step, initial=(None, None)))[1:]
    return np.stack([out for out, _ in steps], axis=-2), *steps[-1][1]


# --- 8.1, 8.2 ---------------------------------------------------------------------------------------


def features_norm_not_halved(x, omega):
    phi = np.exp(x @ omega.T - np.sum(x * x, axis=-1, keepdims=True)) / np.sqrt(omega.shape[0])
    return phi, phi @ np.swapaxes(phi, -1, -2)


def features_needed_lemma_as_written(x, y, rel_error):
    """Eq. (8.3) as printed, divided by SM² = exp(2 xᵀy): the trig one in e^‖z‖² and SM⁻⁴."""
    z_sq, delta_sq, sm = np.sum((x + y) ** 2, -1), np.sum((x - y) ** 2, -1), np.exp(np.sum(x * y, -1))
    trig = np.exp(z_sq) * sm**-4 * (1 - np.exp(-delta_sq)) ** 2 / 2
    return np.ceil(np.expm1(z_sq) / rel_error**2).astype(int), np.ceil(trig / rel_error**2).astype(int)


def features_needed_trig_absolute(x, y, rel_error):
    z_sq, delta_sq, sm = np.sum((x + y) ** 2, -1), np.sum((x - y) ** 2, -1), np.exp(np.sum(x * y, -1))
    trig = np.exp(z_sq) * sm**-2 * (1 - np.exp(-delta_sq)) ** 2 / 2  # the MSE itself, not divided by SM²
    return np.ceil(np.expm1(z_sq) / rel_error**2).astype(int), np.ceil(trig / rel_error**2).astype(int)


@pytest.mark.parametrize("exercise, answer", [
    (exercise_6_2, chunks_in_a_loop),
    (exercise_6_3, cancellation_by_where),
    (exercise_7_1, prefill_through_a_parallel_helper), (exercise_7_1, prefill_by_prefix_sums),
    (exercise_7_1, prefill_by_einsum_path_search),
    (exercise_8_2, features_needed_lemma_as_written),
], ids=lambda x: getattr(x, "number", getattr(x, "__name__", "")))
def test_a_right_answer_written_another_way_passes(exercise, answer, capsys):
    _passes(exercise, answer, capsys)


@pytest.mark.parametrize("exercise, answer, mistake", [
    (exercise_6_2, chunks_stored_after_the_update, "state-stored-after-the-update"),
    (exercise_6_3, cancellation_empty_rows_zero, "ratio-0-for-rows-without-weights"),
    (exercise_6_3, cancellation_zero_counted_negative, "zero-weights-counted-negative"),
    (exercise_7_1, prefill_through_a_looping_helper, "loops-over-positions"),
    (exercise_7_1, prefill_by_mapping_the_step, "loops-over-positions"),
    (exercise_7_1, prefill_by_mapping_numpy, "loops-over-positions"),
    (exercise_7_1, prefill_by_the_library, "calls-the-library"),
    (exercise_7_1, prefill_by_the_checks_reference, "calls-the-library"),
    (exercise_8_1, features_norm_not_halved, "norm-not-halved"),
    (exercise_8_2, features_needed_trig_absolute, "trig-not-relative"),
], ids=lambda x: getattr(x, "number", getattr(x, "__name__", x)))
def test_a_probed_slip_or_bypass_is_named(exercise, answer, mistake, capsys):
    _fails_with(exercise, answer, mistake, capsys)


def test_7_1_names_the_library_function_that_was_called(capsys):
    exercise_7_1(prefill_by_the_library)
    assert "calls causal_linear_attention from course_lib." in capsys.readouterr().out
