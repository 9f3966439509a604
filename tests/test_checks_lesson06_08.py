"""Answers a learner writes for the exercises of lessons 06-08, other than the reference: the rules of 6.1,
6.2, 6.4, 7.1 and 8.1 hold however the answer is written (torch instead of NumPy, a helper in another cell,
a call into the library), each probed slip is named by its own hint, and right answers written other ways
pass."""

import math

import numpy as np
import pytest

from course_lib.checks import FAILED, PASSED
from course_lib.checks.lesson06 import exercise_6_1, exercise_6_2, exercise_6_3, exercise_6_4
from course_lib.checks.lesson07 import exercise_7_1
from course_lib.checks.lesson08 import exercise_8_1, exercise_8_2
from course_lib.numpy import linear, performer
from course_lib.numpy.linear import elu_feature_map, linear_attention_step


def _in_another_cell(source, name):
    """``name`` defined by ``source`` compiled as a notebook cell of its own (its own file name)."""
    namespace = {"np": np, "elu_feature_map": elu_feature_map, "linear_attention_step": linear_attention_step}
    exec(compile(source, "<ipython-input-7-helper>", "exec"), namespace)
    return namespace[name]



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


# --- 6.2: every chunk at once; c from the budget in closed form ---------------------------------------


def _largest_root(n, f, e, itemsize, budget_bytes):
    beta = budget_bytes / (itemsize * n)
    return min(math.floor((beta + math.sqrt(beta * beta - 4 * f * e)) / 2), n)


def chunks_by_vector_search_and_a_chunk_mask(q, k, v, budget_bytes, eps=1e-6):
    """c by testing every candidate at once in NumPy (a float); states by a strictly-lower g × g mask, no cumsum."""
    n, f, e = q.shape[-2], q.shape[-1], v.shape[-1]
    candidates = np.arange(1, n + 1)
    fits = q.dtype.itemsize * n * (f * e / candidates + candidates) <= budget_bytes
    c = float(candidates[fits].max())
    size = int(c)
    g = -(-n // size)
    pad = [(0, 0)] * (q.ndim - 2) + [(0, g * size - n), (0, 0)]
    a, b, w = (np.pad(x, pad).reshape(*x.shape[:-2], g, size, x.shape[-1])
               for x in (elu_feature_map(q), elu_feature_map(k), v))
    earlier = np.tril(np.ones((g, g)), -1)  # (g, g): chunk h before chunk g
    states = np.einsum("gh,...hjf,...hje->...gfe", earlier, b, w)  # (..., g, f, e)
    keys = np.einsum("gh,...hjf->...gf", earlier, b)  # (..., g, f)
    kernel = np.tril(np.einsum("...gif,...gjf->...gij", a, b))
    numerator = np.einsum("...gif,...gfe->...gie", a, states) + kernel @ w
    normaliser = np.einsum("...gif,...gf->...gi", a, keys) + kernel.sum(-1)
    out = (numerator / (normaliser[..., None] + eps)).reshape(*q.shape[:-2], g * size, e)[..., :n, :]
    return c, states, out


def chunks_in_torch(q, k, v, budget_bytes, eps=1e-6):
    torch = pytest.importorskip("torch")
    n, f, e = q.shape[-2], q.shape[-1], v.shape[-1]
    c = _largest_root(n, f, e, q.dtype.itemsize, budget_bytes)
    g = -(-n // c)
    q, k, v = (torch.nn.functional.pad(torch.from_numpy(x), (0, 0, 0, g * c - n)) for x in (q, k, v))
    a, b, w = (x.reshape(*x.shape[:-2], g, c, x.shape[-1]) for x in (torch.nn.functional.elu(q) + 1,
                                                                     torch.nn.functional.elu(k) + 1, v))
    per_chunk = b.transpose(-1, -2) @ w  # (..., g, f, e)
    states = per_chunk.cumsum(-3) - per_chunk
    keys = b.sum(-2).cumsum(-2) - b.sum(-2)
    kernel = torch.tril(a @ b.transpose(-1, -2))
    out = (a @ states + kernel @ w) / ((a * keys[..., None, :]).sum(-1) + kernel.sum(-1) + eps)[..., None]
    return c, states, out.reshape(*out.shape[:-3], g * c, e)[..., :n, :]


_CHUNK_LOOP_HELPER = _in_another_cell('''
def chunk_loop(phi_q, phi_k, v, c, eps):
    S, z = np.zeros((*v.shape[:-2], phi_k.shape[-1], v.shape[-1])), np.zeros((*v.shape[:-2], phi_k.shape[-1]))
    states, out = [], []
    for start in range(0, v.shape[-2], c):
        a, b, w = phi_q[..., start:start + c, :], phi_k[..., start:start + c, :], v[..., start:start + c, :]
        states.append(S)
        scores = np.tril(a @ np.swapaxes(b, -1, -2))
        out.append((a @ S + scores @ w) / (np.einsum("...if,...f->...i", a, z) + scores.sum(-1) + eps)[..., None])
        S, z = S + np.swapaxes(b, -1, -2) @ w, z + b.sum(axis=-2)
    return np.stack(states, axis=-3), np.concatenate(out, axis=-2)
''', "chunk_loop")


def chunks_through_a_looping_helper(q, k, v, budget_bytes, eps=1e-6):
    c = _largest_root(q.shape[-2], q.shape[-1], v.shape[-1], q.dtype.itemsize, budget_bytes)
    return c, *_CHUNK_LOOP_HELPER(elu_feature_map(q), elu_feature_map(k), v, c, eps)


def chunks_with_c_by_a_search(q, k, v, budget_bytes, eps=1e-6):
    """Every chunk at once, but c found by trying lengths from n down: Python work that grows as c shrinks."""
    n, f, e = q.shape[-2], q.shape[-1], v.shape[-1]
    c = n
    while q.dtype.itemsize * n * (f * e / c + c) > budget_bytes:
        c -= 1
    states, out = _chunks_numpy(q, k, v, c, eps)
    return c, states, out


def _chunks_numpy(q, k, v, c, eps):
    n, e = q.shape[-2], v.shape[-1]
    g = -(-n // c)
    pad = [(0, 0)] * (q.ndim - 2) + [(0, g * c - n), (0, 0)]
    a, b, w = (np.pad(x, pad).reshape(*x.shape[:-2], g, c, x.shape[-1])
               for x in (elu_feature_map(q), elu_feature_map(k), v))
    per_chunk = np.swapaxes(b, -1, -2) @ w
    states = np.cumsum(per_chunk, axis=-3) - per_chunk
    keys = np.cumsum(b.sum(-2), axis=-2) - b.sum(-2)
    kernel = np.tril(a @ np.swapaxes(b, -1, -2))
    out = (a @ states + kernel @ w) / (np.einsum("...gif,...gf->...gi", a, keys) + kernel.sum(-1) + eps)[..., None]
    return states, out.reshape(*out.shape[:-3], g * c, e)[..., :n, :]


def chunks_with_the_library_output(q, k, v, budget_bytes, eps=1e-6):
    c = _largest_root(q.shape[-2], q.shape[-1], v.shape[-1], q.dtype.itemsize, budget_bytes)
    states, _ = _chunks_numpy(q, k, v, c, eps)
    return c, states, linear.causal_linear_attention(q, k, v, chunk_size=c)


# --- 6.3: the worst first-order move, in other forms; it is attained ------------------------------------


def _weights(q, k, feature_map):
    weights = feature_map(q) @ np.swapaxes(feature_map(k), -1, -2)  # (..., n, s)
    return weights, weights.sum(axis=-1), np.abs(weights).sum(axis=-1)


def sensitivity_by_expanding(q, k, v, feature_map, eps):
    """Ratio by np.where; the worst move from the normalised weights p_ij = w_ij / z_i: ε Σ_j |p_ij| |v_j − o_i|."""
    weights, normaliser, size = _weights(q, k, feature_map)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(size > 0, np.abs(normaliser) / size, 1.0)
        p = np.nan_to_num(weights / normaliser[..., None])  # (..., n, s); rows without weights: 0
    output = p @ v
    moved = eps * (np.abs(p)[..., None] * np.abs(v[..., None, :, :] - output[..., :, None, :])).sum(axis=-2)
    return ratio, moved


def sensitivity_in_torch(q, k, v, feature_map, eps):
    """The first-order move from autograd: |∂o_ie / ∂w_ij| times ε |w_ij|, summed over j."""
    torch = pytest.importorskip("torch")
    weights = torch.from_numpy(feature_map(q) @ np.swapaxes(feature_map(k), -1, -2)).requires_grad_()
    values = torch.from_numpy(v)
    size = weights.detach().abs().sum(-1)
    live = size > 0
    ratio = torch.where(live, weights.detach().sum(-1).abs() / torch.where(live, size, 1.0), 1.0)
    normaliser = torch.where(live, weights.sum(-1), 1.0)
    output = weights @ values / normaliser[..., None]  # (..., n, e)
    moved = torch.zeros(output.shape, dtype=torch.float64)
    for entry in range(output.shape[-1]):  # one output entry at a time: its gradient with respect to every w_ij
        (grad,) = torch.autograd.grad(output[..., entry].sum(), weights, retain_graph=True)
        moved[..., entry] = eps * (grad.abs() * weights.detach().abs()).sum(-1)
    return ratio, moved


def sensitivity_empty_rows_zero(q, k, v, feature_map, eps):
    weights, normaliser, size = _weights(q, k, feature_map)
    ratio = np.divide(np.abs(normaliser), size, out=np.zeros_like(size), where=size > 0)
    return ratio, sensitivity_by_expanding(q, k, v, feature_map, eps)[1]


def test_6_3_the_worst_case_is_attained_to_first_order():
    # Errors δ_ij = ε |w_ij| sign(z_i) sign(v_je − o_ie) push entry e of o_i as far as it goes: the move equals
    # the reference's worst case up to O(ε²) (ε = 1e-7: a relative gap of order ε / ρ_i, well below 1e-3).
    for _, (q, k, v, feature_map, _eps), _ in exercise_6_3.cases()[:3]:
        eps = 1e-7
        _, worst = exercise_6_3.reference(q, k, v, feature_map, eps)
        weights = feature_map(q) @ np.swapaxes(feature_map(k), -1, -2)
        output = weights @ v / weights.sum(-1)[..., None]
        for entry in range(v.shape[-1]):
            push = np.sign(weights.sum(-1))[..., None] * np.sign(v[..., None, :, entry] - output[..., :, None, entry])
            moved = weights + eps * np.abs(weights) * push  # (..., n, s)
            change = np.abs((moved @ v / moved.sum(-1)[..., None])[..., entry] - output[..., entry])
            assert np.allclose(change, worst[..., entry], rtol=1e-3, atol=0)


# --- 7.1: a block from a carried state; no loop anywhere, and no call into the library's causal form --


_RNN_HELPER = _in_another_cell('''
def run_rnn(q, k, v, S, Z):
    state, outputs = (S, Z), []
    for t in range(q.shape[-2]):
        out, state = linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], state)
        outputs.append(out)
    return np.stack(outputs, axis=-2), *state
''', "run_rnn")

_PARALLEL_HELPER = _in_another_cell('''
def block_part(phi_q, phi_k, v):
    weights = np.tril(phi_q @ np.swapaxes(phi_k, -1, -2))  # (..., c, c)
    return weights @ v, weights.sum(axis=-1)
''', "block_part")


def block_through_a_looping_helper(q, k, v, S, Z):
    return _RNN_HELPER(q, k, v, S, Z)


def block_through_a_parallel_helper(q, k, v, S, Z):
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    numerator, normaliser = _PARALLEL_HELPER(phi_q, phi_k, v)
    normaliser = normaliser + np.einsum("...cf,...f->...c", phi_q, Z)
    return ((numerator + phi_q @ S) / (normaliser[..., None] + 1e-6), S + np.swapaxes(phi_k, -1, -2) @ v,
            Z + phi_k.sum(axis=-2))


def block_by_prefix_sums(q, k, v, S, Z):
    """The carried state as the first term of every prefix sum: S_i = S + Σ_{j ≤ i} phi(k_j) v_jᵀ."""
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)  # (..., c, f)
    states = S[..., None, :, :] + np.cumsum(phi_k[..., :, :, None] * v[..., :, None, :], axis=-3)  # (..., c, f, e)
    keys = Z[..., None, :] + np.cumsum(phi_k, axis=-2)  # (..., c, f)
    normaliser = np.einsum("...cf,...cf->...c", phi_q, keys)
    return (np.einsum("...cf,...cfe->...ce", phi_q, states) / (normaliser[..., None] + 1e-6), states[..., -1, :, :],
            keys[..., -1, :])


def block_by_einsum_path_search(q, k, v, S, Z):
    """np.einsum with optimize=True: NumPy's path search runs more Python lines for longer blocks, not a loop."""
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)  # (..., c, f)
    causal = np.tril(np.ones((q.shape[-2], q.shape[-2])))  # (c, c)
    numerator = np.einsum("...nf,...sf,ns,...se->...ne", phi_q, phi_k, causal, v, optimize=True)
    numerator = numerator + np.einsum("...nf,...fe->...ne", phi_q, S, optimize=True)
    normaliser = np.einsum("...nf,...sf,ns->...n", phi_q, phi_k, causal, optimize=True) + np.einsum(
        "...nf,...f->...n", phi_q, Z)
    return (numerator / (normaliser[..., None] + 1e-6), S + np.einsum("...nf,...ne->...fe", phi_k, v, optimize=True),
            Z + phi_k.sum(axis=-2))


def block_in_torch(q, k, v, S, Z):
    torch = pytest.importorskip("torch")
    q, k, v, S, Z = (torch.from_numpy(x) for x in (q, k, v, S, Z))
    phi_q, phi_k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    weights = torch.tril(phi_q @ phi_k.transpose(-1, -2))
    normaliser = (phi_q * Z[..., None, :]).sum(-1) + weights.sum(-1)
    outputs = (phi_q @ S + weights @ v) / (normaliser[..., None] + 1e-6)
    return outputs, S + phi_k.transpose(-1, -2) @ v, Z + phi_k.sum(-2)


def block_by_mapping_numpy(q, k, v, S, Z):
    """A loop with no Python loop of its own: C-level maps over positions calling NumPy's Python functions."""
    import itertools

    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    rows = [np.moveaxis(x, -2, 0) for x in (phi_k, v)]  # (c, ..., w)
    outer = map(np.einsum, itertools.repeat("...f,...e->...fe"), rows[0], rows[1])  # (..., f, e) per position
    states = np.stack(list(itertools.accumulate(outer, initial=S))[1:], axis=-3)  # (..., c, f, e)
    keys = Z[..., None, :] + np.cumsum(phi_k, axis=-2)
    normaliser = np.einsum("...cf,...cf->...c", phi_q, keys)
    return (np.einsum("...cf,...cfe->...ce", phi_q, states) / (normaliser[..., None] + 1e-6), states[..., -1, :, :],
            keys[..., -1, :])


def block_by_the_library(q, k, v, S, Z):
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    within, within_normaliser = linear.chunked_causal_sums(phi_q, phi_k, v, q.shape[-2])
    normaliser = within_normaliser + np.einsum("...cf,...f->...c", phi_q, Z)
    return ((within + phi_q @ S) / (normaliser[..., None] + 1e-6), S + np.swapaxes(phi_k, -1, -2) @ v,
            Z + phi_k.sum(axis=-2))


def block_by_the_checks_reference(q, k, v, S, Z):
    return exercise_7_1.reference(q, k, v, S, Z)


def block_by_mapping_the_step(q, k, v, S, Z):
    """The RNN with no Python loop of its own: a C-level accumulate over the library's step."""
    import itertools

    def step(carry, t):
        return linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], carry[1])

    steps = list(itertools.accumulate(range(q.shape[-2]), step, initial=(None, (S, Z))))[1:]
    return np.stack([out for out, _ in steps], axis=-2), *steps[-1][1]


# --- 8.1: the running maximum, in other forms; the library's shift where it underflows ------------------


def _exponents(q, k, omega):
    scale = q.shape[-1] ** -0.25
    y = k * scale
    return (q * scale) @ omega.T, y @ omega.T - 0.5 * np.sum(y * y, axis=-1, keepdims=True)  # (..., n, m) each


def tight_by_a_decay_matrix(q, k, v, omega):
    """exp(a_j − M_i) = exp(a_j − M_j) · exp(M_j − M_i): keys shifted at their own position, then a causal (n, n)
    matrix of exp(M_j − M_i) ≤ 1, like the decay of exercise 7.2."""
    projections, exponents = _exponents(q, k, omega)
    shift = np.maximum.accumulate(exponents.max(axis=-1), axis=-1)  # (..., n)
    phi_q = np.exp(projections - projections.max(axis=-1, keepdims=True))
    phi_k = np.exp(exponents - shift[..., None])  # (..., n, m)
    gap = shift[..., None, :] - shift[..., :, None]  # (..., n, n): M_j − M_i
    decay = np.where(np.tril(np.ones(gap.shape[-2:], bool)), np.exp(np.minimum(gap, 0.0)), 0.0)
    weights = decay * (phi_q @ np.swapaxes(phi_k, -1, -2))
    return shift, weights @ v / weights.sum(axis=-1, keepdims=True)


def tight_in_log_space(q, k, v, omega):
    """The weights in log space with torch's logsumexp; the shift as a cumulative maximum in torch."""
    torch = pytest.importorskip("torch")

    projections, exponents = _exponents(q, k, omega)
    shift = torch.cummax(torch.from_numpy(exponents).amax(-1), dim=-1).values  # (..., n)
    pairs = torch.from_numpy(projections[..., :, None, :] + exponents[..., None, :, :])  # (..., n, s, m)
    log_w = torch.logsumexp(pairs, dim=-1).numpy()  # (..., n, s)
    log_w = np.where(np.tril(np.ones(log_w.shape[-2:], bool)), log_w, -np.inf)
    weights = np.exp(log_w - log_w.max(axis=-1, keepdims=True))
    return shift, weights @ v / weights.sum(axis=-1, keepdims=True)


def tight_shift_with_the_library_output(q, k, v, omega):
    _, exponents = _exponents(q, k, omega)
    shift = np.maximum.accumulate(exponents.max(axis=-1), axis=-1)
    return shift, performer.performer_attention(q, k, v, omega, causal=True, chunk_size=None)


def test_8_1_the_library_shift_fails_where_its_features_underflow(capsys):
    result = exercise_8_1(tight_shift_with_the_library_output)
    out = capsys.readouterr().out
    assert result.status == FAILED and "keys of norm 100" in out, out


def test_8_1_reference_equals_the_library_on_ordinary_inputs():
    for description, args, _ in exercise_8_1.cases():
        if "norm" not in description:
            assert np.allclose(exercise_8_1.reference(*args)[1],
                               performer.performer_attention(*args, causal=True, chunk_size=None), atol=1e-12)


# --- 8.2 -------------------------------------------------------------------------------------------


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
    (exercise_6_2, chunks_by_vector_search_and_a_chunk_mask), (exercise_6_2, chunks_in_torch),
    (exercise_6_3, sensitivity_by_expanding), (exercise_6_3, sensitivity_in_torch),
    (exercise_7_1, block_through_a_parallel_helper), (exercise_7_1, block_by_prefix_sums),
    (exercise_7_1, block_by_einsum_path_search), (exercise_7_1, block_in_torch),
    (exercise_8_1, tight_by_a_decay_matrix), (exercise_8_1, tight_in_log_space),
    (exercise_8_2, features_needed_lemma_as_written),
], ids=lambda x: getattr(x, "number", getattr(x, "__name__", "")))
def test_a_right_answer_written_another_way_passes(exercise, answer, capsys):
    _passes(exercise, answer, capsys)


@pytest.mark.parametrize("exercise, answer, mistake", [
    (exercise_6_2, chunks_through_a_looping_helper, "loops-over-chunks"),
    (exercise_6_2, chunks_with_c_by_a_search, "loops-over-chunks"),
    (exercise_6_2, chunks_with_the_library_output, "calls-the-library"),
    (exercise_6_3, sensitivity_empty_rows_zero, "ratio-0-for-rows-without-weights"),
    (exercise_7_1, block_through_a_looping_helper, "loops-over-positions"),
    (exercise_7_1, block_by_mapping_the_step, "loops-over-positions"),
    (exercise_7_1, block_by_mapping_numpy, "loops-over-positions"),
    (exercise_7_1, block_by_the_library, "calls-the-library"),
    (exercise_7_1, block_by_the_checks_reference, "calls-the-library"),
    (exercise_8_2, features_needed_trig_absolute, "trig-not-relative"),
], ids=lambda x: getattr(x, "number", getattr(x, "__name__", x)))
def test_a_probed_slip_or_bypass_is_named(exercise, answer, mistake, capsys):
    _fails_with(exercise, answer, mistake, capsys)


def test_7_1_names_the_library_function_that_was_called(capsys):
    exercise_7_1(block_by_the_library)
    assert "calls chunked_causal_sums from course_lib." in capsys.readouterr().out


def test_6_2_names_the_library_function_that_was_called(capsys):
    exercise_6_2(chunks_with_the_library_output)
    assert "calls causal_linear_attention from course_lib." in capsys.readouterr().out
