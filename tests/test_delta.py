"""The (gated) delta rule (numpy|torch/delta.py): the chunked WY/UT form against the token loop and the
loop against the matrix form of the update, the UT transform, overwrite semantics, initial_state, the
step, strong decays, precision, gradcheck, the two trees against each other, and bad input."""

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.numpy import delta as np_delta
from course_lib.numpy import gated as np_gated
from course_lib.torch import delta as torch_delta
from tests.conftest import requires_cuda

CHUNK_SIZES = [1, 5, 16, 64]  # 5, 16 and 64 do not divide n = 37 or 100; 64 > 37 is one ragged chunk
GATES = [False, True]


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _inputs(rng, lead=(2, 3), n=37, d=4, e=3, low=-0.5):
    """float64 ``q (*lead, n, d)``, unit keys, ``v (*lead, n, e)``, β in (0, 1) and a log decay in [low, 0]."""
    q, k = rng.standard_normal((*lead, n, d)), _unit(rng.standard_normal((*lead, n, d)))
    v = rng.standard_normal((*lead, n, e))
    return q, k, v, rng.uniform(0.05, 0.95, (*lead, n)), rng.uniform(low, 0.0, (*lead, n))


def _definition(q, k, v, beta, log_decay=None, state=None):
    """S_t = a_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ with explicit d × d matrices; o_t = S_tᵀ q_t."""
    d, e = k.shape[-1], v.shape[-1]
    state = np.zeros((*k.shape[:-2], d, e)) if state is None else state
    outputs = []
    for t in range(k.shape[-2]):
        k_t, b_t = k[..., t, :], beta[..., t, None, None]
        a_t = 1.0 if log_decay is None else np.exp(log_decay[..., t])[..., None, None]
        transition = a_t * (np.eye(d) - b_t * k_t[..., :, None] * k_t[..., None, :])  # (..., d, d)
        state = transition @ state + b_t * k_t[..., :, None] * v[..., t, None, :]
        outputs.append(np.einsum("...d,...de->...e", q[..., t, :], state))
    return np.stack(outputs, axis=-2), state


def _rms_relative(got, expected):
    return float(np.sqrt(np.mean((got - expected) ** 2) / np.mean(expected ** 2)))


def _delta(tree, q, k, v, beta, log_decay=None, **options):
    args = tree.arrays(q, k, v, beta)
    out = tree.delta.delta_rule_attention(*args, log_decay=None if log_decay is None else tree.array(log_decay),
                                          **options)
    if options.get("return_state"):
        return tree.numpy(out[0]), tree.numpy(out[1])
    return tree.numpy(out)


# --- each form against its definition, on every tree ----------------------------------------

@pytest.mark.parametrize("gated", GATES, ids=["deltanet", "gated"])
def test_loop_equals_the_matrix_form(tree, rng, gated):
    q, k, v, beta, log_decay = _inputs(rng, n=9)
    log_decay = log_decay if gated else None
    got, state = _delta(tree, q, k, v, beta, log_decay, chunk_size=None, return_state=True)
    expected, expected_state = _definition(q, k, v, beta, log_decay)
    assert got.shape == (2, 3, 9, 3) and state.shape == (2, 3, 4, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state, expected_state, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
@pytest.mark.parametrize("n", [37, 100])
@pytest.mark.parametrize("gated", GATES, ids=["deltanet", "gated"])
def test_chunked_equals_the_token_loop(tree, rng, chunk_size, n, gated):
    q, k, v, beta, log_decay = _inputs(rng, n=n)
    log_decay = log_decay if gated else None
    expected, expected_state = _delta(tree, q, k, v, beta, log_decay, chunk_size=None, return_state=True)
    got, state = _delta(tree, q, k, v, beta, log_decay, chunk_size=chunk_size, return_state=True)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state, expected_state, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 5])
@pytest.mark.parametrize("gated", GATES, ids=["deltanet", "gated"])
def test_leading_dims_broadcast(tree, rng, chunk_size, gated):
    n, d, e = 13, 4, 3
    q, k = rng.standard_normal((2, 1, n, d)), _unit(rng.standard_normal((1, 3, n, d)))
    v = rng.standard_normal((3, n, e))  # fewer leading dims: broadcast from the left
    beta, log_decay = rng.uniform(0, 1, (2, 1, n)), rng.uniform(-0.5, 0, (1, 3, n)) if gated else None
    full = [np.broadcast_to(x, (2, 3, *x.shape[-2:])) for x in (q, k, v)]
    full_decay = None if log_decay is None else np.broadcast_to(log_decay, (2, 3, n))
    got = _delta(tree, q, k, v, beta, log_decay, chunk_size=chunk_size)
    assert got.shape == (2, 3, n, e)
    expected, _ = _definition(*full, np.broadcast_to(beta, (2, 3, n)), full_decay)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 1, 5, 64])
def test_a_gate_of_one_is_no_gate(tree, rng, chunk_size):
    q, k, v, beta, _ = _inputs(rng, n=37)
    plain = _delta(tree, q, k, v, beta, chunk_size=chunk_size)
    gated = _delta(tree, q, k, v, beta, np.zeros((2, 3, 37)), chunk_size=chunk_size)
    np.testing.assert_allclose(gated, plain, rtol=0, atol=1e-14)


@pytest.mark.parametrize("chunk_size", [None, 5, 16])
@pytest.mark.parametrize("gated", GATES, ids=["deltanet", "gated"])
def test_initial_state_continues_a_sequence(tree, rng, chunk_size, gated):
    q, k, v, beta, log_decay = _inputs(rng, n=37)
    log_decay = log_decay if gated else None
    whole, whole_state = _delta(tree, q, k, v, beta, log_decay, chunk_size=chunk_size, return_state=True)
    cut = 20
    head = [x[..., :cut, :] for x in (q, k, v)] + [beta[..., :cut], None if log_decay is None else log_decay[..., :cut]]
    tail = [x[..., cut:, :] for x in (q, k, v)] + [beta[..., cut:], None if log_decay is None else log_decay[..., cut:]]
    first, state = _delta(tree, *head, chunk_size=chunk_size, return_state=True)
    second, final = tree.delta.delta_rule_attention(
        *tree.arrays(*tail[:4]), log_decay=None if tail[4] is None else tree.array(tail[4]), chunk_size=chunk_size,
        initial_state=tree.array(state), return_state=True)
    np.testing.assert_allclose(np.concatenate([first, tree.numpy(second)], axis=-2), whole, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tree.numpy(final), whole_state, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gated", GATES, ids=["deltanet", "gated"])
def test_initial_state_against_the_definition(tree, rng, gated):
    q, k, v, beta, log_decay = _inputs(rng, n=11)
    log_decay = log_decay if gated else None
    state = rng.standard_normal((3, 4, 3))  # (h, d, e): broadcast over the batch
    expected, _ = _definition(q, k, v, beta, log_decay, np.broadcast_to(state, (2, 3, 4, 3)))
    for chunk_size in (None, 4):
        got = tree.delta.delta_rule_attention(*tree.arrays(q, k, v, beta), chunk_size=chunk_size,
                                              log_decay=None if log_decay is None else tree.array(log_decay),
                                              initial_state=tree.array(state))
        np.testing.assert_allclose(tree.numpy(got), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gated", GATES, ids=["deltanet", "gated"])
def test_steps_equal_the_parallel_form_and_never_mutate_the_state(tree, rng, gated):
    q, k, v, beta, log_decay = _inputs(rng, n=9)
    parallel, parallel_state = _delta(tree, q, k, v, beta, log_decay if gated else None, chunk_size=4,
                                      return_state=True)
    state, outputs = None, []
    for t in range(9):
        before = None if state is None else tree.numpy(state).copy()
        options = {"log_decay_t": tree.array(log_decay[..., t])} if gated else {}
        out, new_state = tree.delta.delta_rule_step(*tree.arrays(q[..., t, :], k[..., t, :], v[..., t, :],
                                                                 beta[..., t]), state, **options)
        if state is not None:
            np.testing.assert_array_equal(tree.numpy(state), before)  # the caller's state is untouched
            assert new_state is not state
        assert tuple(out.shape) == (2, 3, 3)
        outputs.append(tree.numpy(out))
        state = new_state
    np.testing.assert_allclose(np.stack(outputs, axis=-2), parallel, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tree.numpy(state), parallel_state, rtol=1e-12, atol=1e-12)


# --- the UT transform and what the rule does ------------------------------------------------

@pytest.mark.parametrize("gated", GATES, ids=["no-decay", "decay"])
def test_ut_transform_inverts_the_unit_lower_triangle(tree, rng, gated):
    c = 9
    k, beta = rng.standard_normal((2, c, 4)), rng.uniform(0, 1, (2, c))  # keys not unit: a harder solve
    log_decay = rng.uniform(-1, 0, (2, c)) if gated else None
    T = tree.numpy(tree.delta.ut_transform(*tree.arrays(k, beta), None if log_decay is None
                                           else tree.array(log_decay)))
    gram = k @ np.swapaxes(k, -1, -2)  # (2, c, c)
    if gated:
        G = np.cumsum(log_decay, -1)
        gram = gram * np.exp(G[:, :, None] - G[:, None, :])  # Γ_ij = a_{j+1} ⋯ a_i; only j < i is kept below
    lower = np.eye(c) + np.tril(beta[:, :, None] * gram, -1)
    assert T.shape == (2, c, c)
    # lower triangular: exactly in torch (a triangular solve); np.linalg.solve factors with pivoting and
    # may leave rounding-level entries above the diagonal
    above = np.abs(np.triu(T, 1)).max()
    assert above == 0 if tree.name == "torch" else above <= 1e-14 * np.abs(T).max()
    # T = (I + tril(Diag(β) (Γ ⊙ K Kᵀ), -1))⁻¹ Diag(β): the triangle times T is Diag(β)
    np.testing.assert_allclose(lower @ T, beta[:, :, None] * np.eye(c), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 16])
@pytest.mark.parametrize("gated", GATES, ids=["deltanet", "gated"])
def test_a_second_write_under_a_key_replaces_the_first(tree, rng, chunk_size, gated):
    # orthonormal keys k1, k2, β = 1: write (k1, a), (k2, b), (k1, c); the delta rule then reads c at k1 and
    # b at k2, while the sum rule (gated linear attention without decay) reads a + c at k1.
    basis = np.linalg.qr(rng.standard_normal((4, 4)))[0]  # columns orthonormal
    k1, k2 = basis[:, 0], basis[:, 1]
    a, b, c = rng.standard_normal((3, 3))
    k = np.stack([k1, k2, k1, k1, k2])  # (n, d): the last two rows only read (β = 0 there)
    v = np.stack([a, b, c, np.zeros(3), np.zeros(3)])
    beta = np.array([1.0, 1.0, 1.0, 0.0, 0.0])
    options = {"log_decay": np.zeros(5)} if gated else {}  # a = 1 through the gated code path
    out = _delta(tree, k, k, v, beta, chunk_size=chunk_size, **options)
    np.testing.assert_allclose(out[2], c, rtol=1e-12, atol=1e-12)  # overwrite
    np.testing.assert_allclose(out[3], c, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[4], b, rtol=1e-12, atol=1e-12)  # k2's value is untouched
    summed = tree.numpy(tree.gated.gated_linear_attention(*tree.arrays(k[:3], k[:3], v[:3], np.zeros(3)),
                                                          chunk_size=chunk_size))
    np.testing.assert_allclose(summed[2], a + c, rtol=1e-12, atol=1e-12)


# --- strong decay and precision -------------------------------------------------------------

def test_a_strong_decay_stays_finite(tree, rng):
    n = 256
    q, k, v, beta, _ = _inputs(rng, lead=(1, 2), n=n)
    log_decay = np.full((1, 2, n), -30.0)  # e^-1920 over a chunk of 64: below float64's range
    expected = _delta(tree, q, k, v, beta, log_decay, chunk_size=None)
    got = _delta(tree, q, k, v, beta, log_decay, chunk_size=64)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    # with a_t ≈ 0 the state is β_t k_t v_tᵀ alone: o_t = β_t (q_t · k_t) v_t
    np.testing.assert_allclose(got, (beta * (q * k).sum(-1))[..., None] * v, rtol=1e-10, atol=1e-10)
    low, state = _delta(tree, *(x.astype(np.float32) for x in (q, k, v, beta, log_decay)), chunk_size=64,
                        return_state=True)
    assert low.dtype == state.dtype == np.float32 and np.isfinite(low).all()  # float32 throughout, not promoted
    np.testing.assert_allclose(low, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("gated", GATES, ids=["deltanet", "gated"])
def test_float32_chunked_is_close_to_the_float64_loop(tree, rng, gated):
    n, d = 1024, 64
    q, k, v, beta, log_decay = _inputs(rng, lead=(1,), n=n, d=d, e=d, low=-0.05)
    low = [x.astype(np.float32) for x in (q / np.sqrt(d), k, v, beta, log_decay if gated else None) if x is not None]
    expected = _delta(tree, *(x.astype(np.float64) for x in low), chunk_size=None)  # the same numbers, float64
    got = _delta(tree, *low)  # the default chunk size
    assert got.dtype == np.float32
    assert _rms_relative(got, expected) < 1e-5


@pytest.mark.parametrize("gated", GATES, ids=["deltanet", "gated"])
def test_half_precision_in_torch_returns_its_dtype_and_a_float32_state(rng, gated):
    q, k, v, beta, log_decay = _inputs(rng, lead=(2,), n=50, d=8, e=8, low=-0.2)
    for dtype in (torch.float16, torch.bfloat16):
        half = [torch.as_tensor(x).to(dtype) for x in (q, k, v, beta, log_decay)]
        decay = half[4] if gated else None
        reference = torch_delta.delta_rule_attention(*(x.float() for x in half[:4]), chunk_size=None,
                                                     log_decay=None if decay is None else decay.float())
        scale = reference.abs().max().item()
        for chunk_size in (None, 16):
            out, state = torch_delta.delta_rule_attention(*half[:4], log_decay=decay, chunk_size=chunk_size,
                                                          return_state=True)
            assert out.dtype == dtype and state.dtype == torch.float32 and torch.isfinite(out).all()
            torch.testing.assert_close(out.float(), reference, rtol=1e-2, atol=1e-2 * scale)
        first, state = torch_delta.delta_rule_attention(*(x[:, :20] for x in half[:4]), return_state=True,
                                                        log_decay=None if decay is None else decay[:, :20])
        second = torch_delta.delta_rule_attention(*(x[:, 20:] for x in half[:4]), initial_state=state,
                                                  log_decay=None if decay is None else decay[:, 20:])
        torch.testing.assert_close(torch.cat([first, second], 1).float(), reference, rtol=1e-2, atol=1e-2 * scale)
        step, step_state = torch_delta.delta_rule_step(*(x[..., 0, :] for x in half[:3]), half[3][..., 0], None,
                                                       log_decay_t=None if decay is None else decay[..., 0])
        assert step.dtype == dtype and step_state.dtype == torch.float32


def test_float16_in_numpy_returns_float16_and_a_float32_state(rng):
    q, k, v, beta, log_decay = (x.astype(np.float16) for x in _inputs(rng, lead=(2,), n=50, d=8, e=8, low=-0.2))
    reference = np_delta.delta_rule_attention(*(x.astype(np.float32) for x in (q, k, v, beta)),
                                              log_decay=log_decay.astype(np.float32), chunk_size=None)
    for chunk_size in (None, 16):
        out, state = np_delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, chunk_size=chunk_size,
                                                   return_state=True)
        assert out.dtype == np.float16 and state.dtype == np.float32 and np.isfinite(out).all()
        np.testing.assert_allclose(out.astype(np.float32), reference, rtol=1e-2, atol=1e-2 * np.abs(reference).max())


# --- autograd and the two trees -------------------------------------------------------------

@pytest.mark.parametrize("gated", GATES, ids=["deltanet", "gated"])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_gradcheck(rng, gated, chunk_size):
    q, k, v, beta, log_decay = _inputs(rng, lead=(2,), n=7, d=3, e=2)
    log_decay = log_decay - 0.1  # ≤ -0.1 and β in (0.05, 0.95): finite differences (1e-6) stay valid
    state = rng.standard_normal((2, 3, 2))
    inputs = [torch.tensor(x, requires_grad=True) for x in (q, k, v, beta, state, log_decay)]

    def run(q, k, v, beta, state, log_decay=None):
        return torch_delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, chunk_size=chunk_size,
                                                initial_state=state, return_state=True)

    assert torch.autograd.gradcheck(run, inputs if gated else inputs[:5])


@pytest.mark.parametrize("gated", GATES, ids=["deltanet", "gated"])
@pytest.mark.parametrize("chunk_size", [None, 5])
def test_numpy_and_torch_agree(rng, gated, chunk_size):
    q, k, v, beta, log_decay = _inputs(rng, n=23)
    log_decay = log_decay if gated else None
    state = rng.standard_normal((2, 3, 4, 3))
    expected = np_delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, chunk_size=chunk_size,
                                             initial_state=state, return_state=True)
    got = torch_delta.delta_rule_attention(*map(torch.as_tensor, (q, k, v, beta)), chunk_size=chunk_size,
                                           log_decay=None if log_decay is None else torch.as_tensor(log_decay),
                                           initial_state=torch.as_tensor(state), return_state=True)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-12)
    step_decay = None if log_decay is None else log_decay[..., 0]
    expected = np_delta.delta_rule_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], beta[..., 0], state,
                                        log_decay_t=step_decay)
    got = torch_delta.delta_rule_step(*(torch.as_tensor(x) for x in (q[..., 0, :], k[..., 0, :], v[..., 0, :],
                                                                     beta[..., 0], state)),
                                      log_decay_t=None if step_decay is None else torch.as_tensor(step_decay))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-12)
    T = np_delta.ut_transform(k[..., :6, :], beta[..., :6], None if log_decay is None else log_decay[..., :6])
    got_T = torch_delta.ut_transform(torch.as_tensor(k[..., :6, :]), torch.as_tensor(beta[..., :6]),
                                     None if log_decay is None else torch.as_tensor(log_decay[..., :6]))
    np.testing.assert_allclose(got_T.numpy(), T, rtol=1e-12, atol=1e-12)


def test_the_default_chunk_size_is_shared():
    import inspect

    for module in (np_delta, torch_delta):
        default = inspect.signature(module.delta_rule_attention).parameters["chunk_size"].default
        assert default == np_gated.DEFAULT_CHUNK_SIZE


# --- properties -----------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 20), chunk_size=st.integers(1, 24), lead=st.lists(st.integers(1, 3), max_size=2),
       gated=st.booleans(), use_torch=st.booleans(), seed=st.integers(0, 2**16))
def test_chunked_equals_the_definition_for_any_sizes(n, chunk_size, lead, gated, use_torch, seed):
    q, k, v, beta, log_decay = _inputs(np.random.default_rng(seed), lead=tuple(lead), n=n, d=3, e=2)
    log_decay = log_decay if gated else None
    module, wrap = (torch_delta, torch.as_tensor) if use_torch else (np_delta, np.asarray)
    got = module.delta_rule_attention(*map(wrap, (q, k, v, beta)), chunk_size=chunk_size,
                                      log_decay=None if log_decay is None else wrap(log_decay))
    assert tuple(got.shape) == (*lead, n, 2)
    np.testing.assert_allclose(np.asarray(got), _definition(q, k, v, beta, log_decay)[0], rtol=1e-11, atol=1e-11)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 12), t=st.integers(0, 10), chunk_size=st.sampled_from([None, 1, 3, 5]),
       use_torch=st.booleans(), seed=st.integers(0, 2**16))
def test_outputs_ignore_the_future(n, t, chunk_size, use_torch, seed):
    t = min(t, n - 2)
    rng = np.random.default_rng(seed)
    inputs = _inputs(rng, lead=(2,), n=n, d=3, e=2)
    changed = [x.copy() for x in inputs]
    changed[0][:, t + 1:] = rng.standard_normal(changed[0][:, t + 1:].shape)
    changed[1][:, t + 1:] = _unit(rng.standard_normal(changed[1][:, t + 1:].shape))
    changed[2][:, t + 1:] = 10 * rng.standard_normal(changed[2][:, t + 1:].shape)
    changed[3][:, t + 1:] = rng.uniform(0, 1, changed[3][:, t + 1:].shape)
    changed[4][:, t + 1:] = -rng.uniform(0, 5, changed[4][:, t + 1:].shape)
    module, wrap = (torch_delta, torch.as_tensor) if use_torch else (np_delta, np.asarray)

    def run(q, k, v, beta, log_decay):
        return np.asarray(module.delta_rule_attention(*map(wrap, (q, k, v, beta)), log_decay=wrap(log_decay),
                                                      chunk_size=chunk_size))

    before, after = run(*inputs), run(*changed)
    np.testing.assert_allclose(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-13)
    assert not np.allclose(after[:, t + 1:], before[:, t + 1:])  # the future did change


# --- bad input ------------------------------------------------------------------------------

def _good(n=5, lead=(2, 3)):
    k = np.zeros((*lead, n, 4))
    k[..., 0] = 1  # unit keys
    return np.ones((*lead, n, 4)), k, np.ones((*lead, n, 2)), np.full((*lead, n), 0.5)


@pytest.mark.parametrize("beta, match", [
    (np.full((2, 3, 5), 1.5), r"beta must lie in \[0, 1\]"),
    (np.full((2, 3, 5), -0.1), r"beta must lie in \[0, 1\]"),
    (np.full((2, 3, 5), np.nan), r"beta must lie in \[0, 1\]"),
    (np.full((2, 3, 6), 0.5), r"beta must have shape \(\.\.\., n\) = \(2, 3, 5\)"),
    (np.full((2, 3, 5, 1), 0.5), r"beta must have shape \(\.\.\., n\)"),
])
def test_bad_beta_is_named(tree, beta, match):
    q, k, v, _ = _good()
    with pytest.raises(ValueError, match=match):
        tree.delta.delta_rule_attention(*tree.arrays(q, k, v, beta))


@pytest.mark.parametrize("log_decay, match", [
    (np.full((2, 3, 5), 0.5), r"log_decay must be <= 0"),
    (np.full((2, 3, 5), -np.inf), r"log_decay must be finite"),
    (np.full((2, 3, 4), -0.1), r"log_decay must have shape \(\.\.\., n\)"),
    (np.full((2, 3, 5, 4), -0.1), r"log_decay must have shape \(\.\.\., n\) = \(2, 3, 5\) for the delta rule"),
])
def test_bad_log_decay_is_named(tree, log_decay, match):
    with pytest.raises(ValueError, match=match):
        tree.delta.delta_rule_attention(*tree.arrays(*_good()), log_decay=tree.array(log_decay))


def test_bad_step_arguments_are_named(tree):
    q, k, v, beta = (x[..., 0, :] if x.ndim == 4 else x[..., 0] for x in _good())
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        tree.delta.delta_rule_step(*tree.arrays(q, k, v, beta + 1), None)
    with pytest.raises(ValueError, match=r"log_decay must be <= 0"):
        tree.delta.delta_rule_step(*tree.arrays(q, k, v, beta), None, log_decay_t=tree.array(np.full((2, 3), 0.1)))
    with pytest.raises(ValueError, match=r"initial_state must have shape"):
        tree.delta.delta_rule_step(*tree.arrays(q, k, v, beta, np.zeros((2, 3, 2, 4))))


@pytest.mark.parametrize("shapes, match", [
    (((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 2)), r"a recurrence needs one query per key"),
    (((2, 3, 5, 4), (2, 4, 5, 4), (2, 4, 5, 2)), r"q and k leading \(batch/head\) dims do not broadcast"),
])
def test_bad_shapes_are_named(tree, shapes, match):
    q, k, v = (np.ones(shape) for shape in shapes)
    with pytest.raises(ValueError, match=match):
        tree.delta.delta_rule_attention(*tree.arrays(q, k, v, np.full(shapes[1][:-1], 0.5)))


@pytest.mark.parametrize("chunk_size, error", [(0, ValueError), (-1, ValueError), (2.5, TypeError),
                                               (True, TypeError)])
def test_bad_chunk_size(tree, chunk_size, error):
    with pytest.raises(error, match="chunk_size must be"):
        tree.delta.delta_rule_attention(*tree.arrays(*_good()), chunk_size=chunk_size)


@pytest.mark.parametrize("shape", [(2, 3, 4, 3), (2, 3, 2, 4), (4,)])
def test_bad_initial_state_is_named(tree, shape):
    with pytest.raises(ValueError, match=r"initial_state must have shape \(\.\.\., d, e\) = \(2, 3, 4, 2\)"):
        tree.delta.delta_rule_attention(*tree.arrays(*_good()), initial_state=tree.array(np.zeros(shape)))


@pytest.mark.parametrize("which", ["q", "k", "v", "beta"])
def test_integer_inputs_are_refused(tree, which):
    arrays = dict(zip(("q", "k", "v", "beta"), _good(), strict=True))
    arrays[which] = np.ones_like(arrays[which], dtype=np.int64) * (which != "beta")  # β = 0: valid but integer
    with pytest.raises(TypeError, match=f"{which} must hold floating-point numbers"):
        tree.delta.delta_rule_attention(*tree.arrays(*arrays.values()))


def test_mixed_dtypes_are_refused_in_torch():
    q, k, v, beta = map(torch.as_tensor, _good())
    with pytest.raises(TypeError, match="must share one dtype"):
        torch_delta.delta_rule_attention(q.float(), k, v, beta)
    with pytest.raises(TypeError, match="beta must be a torch.Tensor"):
        torch_delta.delta_rule_attention(q, k, v, 0.5)


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_long_keys_warn_and_unit_keys_do_not(tree, rng, chunk_size):
    q, k, v, beta = _good()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails: unit keys with β = 1 are exactly at the edge, 1 < 2
        tree.delta.delta_rule_attention(*tree.arrays(q, _unit(rng.standard_normal(k.shape)), v, np.ones_like(beta)),
                                        chunk_size=chunk_size)
    long_keys = 1.5 * k  # β‖k‖² = 1 · 2.25 > 2
    with pytest.warns(RuntimeWarning, match=r"beta \* \|\|k\|\|\^2 up to 2.25 > 2"):
        tree.delta.delta_rule_attention(*tree.arrays(q, long_keys, v, np.ones_like(beta)), chunk_size=chunk_size)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # β = 0.5 brings the same keys back to 1.125 ≤ 2
        tree.delta.delta_rule_attention(*tree.arrays(q, long_keys, v, beta), chunk_size=chunk_size)


# --- CUDA -----------------------------------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gated", GATES, ids=["deltanet", "gated"])
def test_cuda_forward_and_backward_match_cpu(rng, dtype, gated):
    q, k, v, beta, log_decay = (torch.as_tensor(x).to(dtype) for x in _inputs(rng, lead=(2, 2), n=300, d=16, e=16,
                                                                             low=-0.1))
    results = {}
    for device in ("cpu", "cuda"):
        leaves = [x.to(device).requires_grad_() for x in (q, k, v, beta, log_decay)]
        out = torch_delta.delta_rule_attention(*leaves[:4], log_decay=leaves[4] if gated else None, chunk_size=64)
        assert out.dtype == dtype
        out.float().sum().backward()
        results[device] = [out.float().cpu()] + [leaf.grad.float().cpu() for leaf in leaves[:4 + gated]]
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2  # different summation orders; half outputs round
    for cuda, cpu in zip(results["cuda"], results["cpu"], strict=True):
        scale = cpu.abs().max().item()
        torch.testing.assert_close(cuda, cpu, rtol=tolerance, atol=tolerance * scale)
