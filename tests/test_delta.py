"""The delta rule and DeltaProduct (numpy|torch/delta.py): the chunked WY/UT form against the token loop and the
loop against the matrix form of the update, with no gate, a gate per head (Gated DeltaNet) and per channel (Kimi
Delta Attention), β in [0, 2]; the UT transform and the decayed products by sub-chunks, overwrite and reflection
semantics, initial_state, the steps, strong decays, precision, gradcheck, the two trees against each other, and
bad input."""

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
GATES = ["none", "head", "channel"]  # DeltaNet, Gated DeltaNet, Kimi Delta Attention
BETA_RANGE = (0.05, 1.95)  # β in (0, 2): negative eigenvalues included


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _inputs(rng, lead=(2, 3), n=37, d=4, e=3, low=-0.5, gate="head", beta=(0.05, 0.95)):
    """float64 ``q (*lead, n, d)``, unit keys, ``v (*lead, n, e)``, β in ``beta`` and a log decay in [low, 0].

    The decay is None (``gate="none"``), ``(*lead, n)`` (``"head"``) or ``(*lead, n, d)`` (``"channel"``).
    """
    q, k = rng.standard_normal((*lead, n, d)), _unit(rng.standard_normal((*lead, n, d)))
    v = rng.standard_normal((*lead, n, e))
    log_decay = {"none": None, "head": lambda: rng.uniform(low, 0.0, (*lead, n)),
                 "channel": lambda: rng.uniform(low, 0.0, (*lead, n, d))}[gate]
    return q, k, v, rng.uniform(*beta, (*lead, n)), None if log_decay is None else log_decay()


def _decay_matrix(log_decay_t, d, channels):
    """Diag(a_t) ``(..., d, d)`` for one token's log decay ``(...)`` (per head) or ``(..., d)`` (per channel)."""
    if log_decay_t is None:
        return np.eye(d)
    a = np.exp(log_decay_t)
    return a[..., :, None] * np.eye(d) if channels else a[..., None, None] * np.eye(d)


def _definition(q, k, v, beta, log_decay=None, state=None):
    """S_t = (I − β_t k_t k_tᵀ) Diag(a_t) S_{t−1} + β_t k_t v_tᵀ with explicit d × d matrices; o_t = S_tᵀ q_t."""
    d, e = k.shape[-1], v.shape[-1]
    channels = log_decay is not None and log_decay.ndim == k.ndim
    state = np.zeros((*k.shape[:-2], d, e)) if state is None else state
    outputs = []
    for t in range(k.shape[-2]):
        k_t, b_t = k[..., t, :], beta[..., t, None, None]
        decay = _decay_matrix(None if log_decay is None else log_decay[..., t, :] if channels else log_decay[..., t],
                              d, channels)
        transition = (np.eye(d) - b_t * k_t[..., :, None] * k_t[..., None, :]) @ decay  # (..., d, d)
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


def _cut(x, part, rank=4):
    """Positions ``part``: the last axis of β and a per-head decay (rank − 1), the one before it otherwise."""
    if x is None:
        return None
    return x[..., part] if x.ndim == rank - 1 else x[..., part, :]


# --- each form against its definition, on every tree ----------------------------------------

@pytest.mark.parametrize("gate", GATES)
def test_loop_equals_the_matrix_form(tree, rng, gate):
    q, k, v, beta, log_decay = _inputs(rng, n=9, gate=gate, beta=BETA_RANGE)
    got, state = _delta(tree, q, k, v, beta, log_decay, chunk_size=None, return_state=True)
    expected, expected_state = _definition(q, k, v, beta, log_decay)
    assert got.shape == (2, 3, 9, 3) and state.shape == (2, 3, 4, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state, expected_state, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
@pytest.mark.parametrize("n", [37, 100])
@pytest.mark.parametrize("gate", GATES)
def test_chunked_equals_the_token_loop(tree, rng, chunk_size, n, gate):
    q, k, v, beta, log_decay = _inputs(rng, n=n, gate=gate, beta=BETA_RANGE)
    expected, expected_state = _delta(tree, q, k, v, beta, log_decay, chunk_size=None, return_state=True)
    got, state = _delta(tree, q, k, v, beta, log_decay, chunk_size=chunk_size, return_state=True)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state, expected_state, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 5])
@pytest.mark.parametrize("gate", GATES)
def test_leading_dims_broadcast(tree, rng, chunk_size, gate):
    n, d, e = 13, 4, 3
    q, k = rng.standard_normal((2, 1, n, d)), _unit(rng.standard_normal((1, 3, n, d)))
    v = rng.standard_normal((3, n, e))  # fewer leading dims: broadcast from the left
    beta = rng.uniform(0, 2, (2, 1, n))
    log_decay = {"none": None, "head": rng.uniform(-0.5, 0, (1, 3, n)),
                 "channel": rng.uniform(-0.5, 0, (1, 3, n, d))}[gate]
    full = [np.broadcast_to(x, (2, 3, *x.shape[-2:])) for x in (q, k, v)]
    full_decay = None if log_decay is None else np.broadcast_to(log_decay, (2, 3, *log_decay.shape[2:]))
    got = _delta(tree, q, k, v, beta, log_decay, chunk_size=chunk_size)
    assert got.shape == (2, 3, n, e)
    expected, _ = _definition(*full, np.broadcast_to(beta, (2, 3, n)), full_decay)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 1, 5, 64])
@pytest.mark.parametrize("shape", [(2, 3, 37), (2, 3, 37, 4)], ids=["head", "channel"])
def test_a_gate_of_one_is_no_gate(tree, rng, chunk_size, shape):
    q, k, v, beta, _ = _inputs(rng, n=37, beta=BETA_RANGE)
    plain = _delta(tree, q, k, v, beta, chunk_size=chunk_size)
    gated = _delta(tree, q, k, v, beta, np.zeros(shape), chunk_size=chunk_size)
    np.testing.assert_allclose(gated, plain, rtol=0, atol=1e-13)


@pytest.mark.parametrize("chunk_size", [None, 5, 16])
@pytest.mark.parametrize("gate", GATES)
def test_initial_state_continues_a_sequence(tree, rng, chunk_size, gate):
    q, k, v, beta, log_decay = _inputs(rng, n=37, gate=gate, beta=BETA_RANGE)
    whole, whole_state = _delta(tree, q, k, v, beta, log_decay, chunk_size=chunk_size, return_state=True)
    cut = 20
    head = [_cut(x, slice(None, cut)) for x in (q, k, v, beta, log_decay)]
    tail = [_cut(x, slice(cut, None)) for x in (q, k, v, beta, log_decay)]
    first, state = _delta(tree, *head, chunk_size=chunk_size, return_state=True)
    second, final = tree.delta.delta_rule_attention(
        *tree.arrays(*tail[:4]), log_decay=None if tail[4] is None else tree.array(tail[4]), chunk_size=chunk_size,
        initial_state=tree.array(state), return_state=True)
    np.testing.assert_allclose(np.concatenate([first, tree.numpy(second)], axis=-2), whole, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tree.numpy(final), whole_state, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gate", GATES)
def test_initial_state_against_the_definition(tree, rng, gate):
    q, k, v, beta, log_decay = _inputs(rng, n=11, gate=gate, beta=BETA_RANGE)
    state = rng.standard_normal((3, 4, 3))  # (h, d, e): broadcast over the batch
    expected, _ = _definition(q, k, v, beta, log_decay, np.broadcast_to(state, (2, 3, 4, 3)))
    for chunk_size in (None, 4):
        got = tree.delta.delta_rule_attention(*tree.arrays(q, k, v, beta), chunk_size=chunk_size,
                                              log_decay=None if log_decay is None else tree.array(log_decay),
                                              initial_state=tree.array(state))
        np.testing.assert_allclose(tree.numpy(got), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gate", GATES)
def test_steps_equal_the_parallel_form_and_never_mutate_the_state(tree, rng, gate):
    q, k, v, beta, log_decay = _inputs(rng, n=9, gate=gate, beta=BETA_RANGE)
    parallel, parallel_state = _delta(tree, q, k, v, beta, log_decay, chunk_size=4, return_state=True)
    state, outputs = None, []
    for t in range(9):
        before = None if state is None else tree.numpy(state).copy()
        options = {} if log_decay is None else {"log_decay_t": tree.array(_cut(log_decay, t))}
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


# --- the UT transform, the decayed products, and what the rule does --------------------------

def _explicit_decay(log_decay, k):
    """Γ for the gram: ``(..., c, c)`` per head, ``(..., c, c, d)`` per channel, exp(G_i − G_j), 0 for j ≥ i."""
    channels = log_decay.ndim == k.ndim
    G = np.cumsum(log_decay, axis=-2 if channels else -1)
    diff = G[..., :, None, :] - G[..., None, :, :] if channels else G[..., :, None] - G[..., None, :]
    c = k.shape[-2]
    below = np.tril(np.ones((c, c), bool), -1)
    return np.where(below[:, :, None] if channels else below, np.exp(np.minimum(diff, 0)), 0.0)


@pytest.mark.parametrize("gate", GATES)
def test_ut_transform_inverts_the_unit_lower_triangle(tree, rng, gate):
    c = 9
    k, beta = rng.standard_normal((2, c, 4)), rng.uniform(0, 2, (2, c))  # keys not unit: a harder solve
    log_decay = {"none": None, "head": rng.uniform(-1, 0, (2, c)), "channel": rng.uniform(-1, 0, (2, c, 4))}[gate]
    T = tree.numpy(tree.delta.ut_transform(*tree.arrays(k, beta), None if log_decay is None
                                           else tree.array(log_decay)))
    if gate == "channel":  # Γ inside the sum: Σ_d k_id k_jd exp(G_id − G_jd)
        gram = np.einsum("xid,xjd,xijd->xij", k, k, _explicit_decay(log_decay, k))
    else:
        gram = k @ np.swapaxes(k, -1, -2) * (1.0 if log_decay is None else _explicit_decay(log_decay, k))
    lower = np.eye(c) + np.tril(beta[:, :, None] * gram, -1)
    assert T.shape == (2, c, c)
    assert np.abs(np.triu(T, 1)).max() == 0  # a triangular solve (forward substitution): exactly lower triangular
    # T = (I + tril(Diag(β) (Γ ⊙ K Kᵀ), -1))⁻¹ Diag(β): the triangle times T is Diag(β)
    np.testing.assert_allclose(lower @ T, beta[:, :, None] * np.eye(c), rtol=1e-12, atol=1e-12)


def test_numpy_ut_transform_uses_no_general_solver(rng, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a general LU solve or inverse was called")

    monkeypatch.setattr(np.linalg, "solve", refuse)
    monkeypatch.setattr(np.linalg, "inv", refuse)
    k, beta = _unit(rng.standard_normal((3, 8, 4))), rng.uniform(0, 2, (3, 8))
    T = np_delta.ut_transform(k, beta)
    lower = np.eye(8) + np.tril(beta[:, :, None] * (k @ np.swapaxes(k, -1, -2)), -1)
    np.testing.assert_allclose(lower @ T, beta[:, :, None] * np.eye(8), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("c, sub", [(1, 8), (7, 8), (16, 8), (32, 8), (33, 4), (12, 5), (12, 12)])
def test_kdas_decayed_products_by_sub_chunks_equal_the_full_sum(tree, rng, c, sub):
    # Kimi Delta Attention's scores and gram are gated linear attention's per-channel scores (channel_scores):
    # Σ_d x_id k_jd exp(G_id − G_jd) for j <= i, against the (c, c, d) tensor it avoids
    x, k = rng.standard_normal((2, 3, c, 5)), rng.standard_normal((2, 3, c, 5))
    log_decay = rng.uniform(-2, 0, (2, 3, c, 5))
    log_decay[..., ::3, 0] = -30.0  # strong decays mixed with weak ones: e^-30 per token in one channel
    G = np.cumsum(log_decay, axis=-2)
    inclusive = np.tril(np.ones((c, c), bool))[:, :, None]
    weights = np.where(inclusive, np.exp(np.minimum(G[..., :, None, :] - G[..., None, :, :], 0)), 0.0)
    expected = np.einsum("...id,...jd,...ijd->...ij", x, k, weights)
    got = tree.numpy(tree.gated.channel_scores(*tree.arrays(x, k, G), sub))
    assert got.shape == (2, 3, c, c) and np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 16])
@pytest.mark.parametrize("gate", ["none", "head"])
def test_a_second_write_under_a_key_replaces_the_first(tree, rng, chunk_size, gate):
    # orthonormal keys k1, k2, β = 1: write (k1, a), (k2, b), (k1, c); the delta rule then reads c at k1 and
    # b at k2, while the sum rule (gated linear attention without decay) reads a + c at k1.
    basis = np.linalg.qr(rng.standard_normal((4, 4)))[0]  # columns orthonormal
    k1, k2 = basis[:, 0], basis[:, 1]
    a, b, c = rng.standard_normal((3, 3))
    k = np.stack([k1, k2, k1, k1, k2])  # (n, d): the last two rows only read (β = 0 there)
    v = np.stack([a, b, c, np.zeros(3), np.zeros(3)])
    beta = np.array([1.0, 1.0, 1.0, 0.0, 0.0])
    options = {"log_decay": np.zeros(5)} if gate == "head" else {}  # a = 1 through the gated code path
    out = _delta(tree, k, k, v, beta, chunk_size=chunk_size, **options)
    np.testing.assert_allclose(out[2], c, rtol=1e-12, atol=1e-12)  # overwrite
    np.testing.assert_allclose(out[3], c, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[4], b, rtol=1e-12, atol=1e-12)  # k2's value is untouched
    summed = tree.numpy(tree.gated.gated_linear_attention(*tree.arrays(k[:3], k[:3], v[:3], np.zeros(3)),
                                                          chunk_size=chunk_size))
    np.testing.assert_allclose(summed[2], a + c, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 2, 16])
def test_beta_two_reflects_and_twice_restores(tree, rng, chunk_size):
    # β = 2 with a unit key: S ← (I − 2 k kᵀ) S + 2 k vᵀ.  With v = 0 it is the reflection I − 2 k kᵀ, eigenvalue −1
    # along k: the value read at k flips sign, and a second reflection restores it (what parity needs; Grazzi et al.)
    basis = np.linalg.qr(rng.standard_normal((4, 4)))[0]
    k1, k2 = basis[:, 0], basis[:, 1]
    a, b = rng.standard_normal((2, 3))
    k = np.stack([k1, k2, k1, k1])
    v = np.stack([a, b, np.zeros(3), np.zeros(3)])
    beta = np.array([1.0, 1.0, 2.0, 2.0])
    out = _delta(tree, k, k, v, beta, chunk_size=chunk_size)
    np.testing.assert_allclose(out[2], -a, rtol=1e-12, atol=1e-12)  # reflected
    np.testing.assert_allclose(out[3], a, rtol=1e-12, atol=1e-12)  # restored
    read_k2 = _delta(tree, np.stack([k1, k2, k1, k2]), k, v, beta, chunk_size=chunk_size)[3]
    np.testing.assert_allclose(read_k2, b, rtol=1e-12, atol=1e-12)  # the orthogonal direction never moves


# --- strong decay and precision -------------------------------------------------------------

@pytest.mark.parametrize("gate", ["head", "channel"])
def test_a_strong_decay_stays_finite(tree, rng, gate):
    n = 256
    q, k, v, beta, _ = _inputs(rng, lead=(1, 2), n=n, beta=BETA_RANGE)
    log_decay = np.full((1, 2, n) if gate == "head" else (1, 2, n, 4), -30.0)  # e^-1920 over a chunk of 64
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


def test_a_strong_decay_in_some_channels_only(tree, rng):
    # channel 0 forgets at e^-30 a token, the others keep everything: the chunked form must keep them apart
    n = 100
    q, k, v, beta, log_decay = _inputs(rng, lead=(2,), n=n, gate="channel", low=-0.05, beta=BETA_RANGE)
    log_decay[..., 0] = -30.0
    expected, _ = _definition(q, k, v, beta, log_decay)
    for chunk_size in (None, 16, 64):
        got = _delta(tree, q, k, v, beta, log_decay, chunk_size=chunk_size)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_strong_per_channel_decay_has_finite_gradients(rng, dtype):
    # exponents masked or split before exp: nothing overflows forward, and no 0 · inf turns a gradient into NaN
    q, k, v, beta, log_decay = _inputs(rng, lead=(2,), n=70, d=8, e=4, gate="channel", beta=BETA_RANGE)
    log_decay[..., ::2] = -30.0
    leaves = [torch.tensor(x, dtype=dtype, requires_grad=True) for x in (q, k, v, beta, log_decay)]
    out = torch_delta.delta_rule_attention(*leaves[:4], log_decay=leaves[4], chunk_size=32)
    out.square().sum().backward()
    assert all(torch.isfinite(leaf.grad).all() for leaf in leaves)


@pytest.mark.parametrize("gate", GATES)
def test_float32_chunked_is_close_to_the_float64_loop(tree, rng, gate):
    n, d = 1024, 64
    q, k, v, beta, log_decay = _inputs(rng, lead=(1,), n=n, d=d, e=d, low=-0.05, gate=gate)
    low = [None if x is None else x.astype(np.float32) for x in (q / np.sqrt(d), k, v, beta, log_decay)]
    expected = _delta(tree, *(None if x is None else x.astype(np.float64) for x in low), chunk_size=None)
    got = _delta(tree, *low)  # the default chunk size
    assert got.dtype == np.float32
    assert _rms_relative(got, expected) < 1e-5


@pytest.mark.parametrize("gate", GATES)
def test_half_precision_in_torch_returns_its_dtype_and_a_float32_state(rng, gate):
    q, k, v, beta, log_decay = _inputs(rng, lead=(2,), n=50, d=8, e=8, low=-0.2, gate=gate)
    for dtype in (torch.float16, torch.bfloat16):
        half = [torch.as_tensor(x).to(dtype) for x in (q, k, v, beta)]
        decay = None if log_decay is None else torch.as_tensor(log_decay).to(dtype)
        reference = torch_delta.delta_rule_attention(*(x.float() for x in half), chunk_size=None,
                                                     log_decay=None if decay is None else decay.float())
        scale = reference.abs().max().item()
        for chunk_size in (None, 16):
            out, state = torch_delta.delta_rule_attention(*half, log_decay=decay, chunk_size=chunk_size,
                                                          return_state=True)
            assert out.dtype == dtype and state.dtype == torch.float32 and torch.isfinite(out).all()
            torch.testing.assert_close(out.float(), reference, rtol=1e-2, atol=1e-2 * scale)
        first, state = torch_delta.delta_rule_attention(*(x[:, :20] for x in half), return_state=True,
                                                        log_decay=None if decay is None else decay[:, :20])
        second = torch_delta.delta_rule_attention(*(x[:, 20:] for x in half), initial_state=state,
                                                  log_decay=None if decay is None else decay[:, 20:])
        torch.testing.assert_close(torch.cat([first, second], 1).float(), reference, rtol=1e-2, atol=1e-2 * scale)
        step, step_state = torch_delta.delta_rule_step(*(x[..., 0, :] for x in half[:3]), half[3][..., 0], None,
                                                       log_decay_t=None if decay is None else decay[:, 0])
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

@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("chunk_size", [None, 3, 7])  # 7: two chunks of sub-chunks of 2, the last one padded
def test_gradcheck(rng, gate, chunk_size):
    q, k, v, beta, log_decay = _inputs(rng, lead=(2,), n=9, d=3, e=2, gate=gate, beta=BETA_RANGE)
    state = rng.standard_normal((2, 3, 2))
    inputs = [torch.tensor(x, requires_grad=True) for x in (q, k, v, beta, state)]
    if log_decay is not None:  # ≤ -0.1 and β in (0.05, 1.95): finite differences (1e-6) stay valid
        inputs.append(torch.tensor(log_decay - 0.1, requires_grad=True))

    def run(q, k, v, beta, state, log_decay=None):
        return torch_delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, chunk_size=chunk_size,
                                                initial_state=state, return_state=True)

    assert torch.autograd.gradcheck(run, inputs)


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("chunk_size", [None, 5])
def test_numpy_and_torch_agree(rng, gate, chunk_size):
    q, k, v, beta, log_decay = _inputs(rng, n=23, gate=gate, beta=BETA_RANGE)
    state = rng.standard_normal((2, 3, 4, 3))
    expected = np_delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, chunk_size=chunk_size,
                                             initial_state=state, return_state=True)
    got = torch_delta.delta_rule_attention(*map(torch.as_tensor, (q, k, v, beta)), chunk_size=chunk_size,
                                           log_decay=None if log_decay is None else torch.as_tensor(log_decay),
                                           initial_state=torch.as_tensor(state), return_state=True)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-12)
    step_decay = _cut(log_decay, 0)
    expected = np_delta.delta_rule_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], beta[..., 0], state,
                                        log_decay_t=step_decay)
    got = torch_delta.delta_rule_step(*(torch.as_tensor(x) for x in (q[..., 0, :], k[..., 0, :], v[..., 0, :],
                                                                     beta[..., 0], state)),
                                      log_decay_t=None if step_decay is None else torch.as_tensor(step_decay))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-12)
    chunk_decay = _cut(log_decay, slice(None, 6))
    T = np_delta.ut_transform(k[..., :6, :], beta[..., :6], chunk_decay)
    got_T = torch_delta.ut_transform(torch.as_tensor(k[..., :6, :]), torch.as_tensor(beta[..., :6]),
                                     None if chunk_decay is None else torch.as_tensor(chunk_decay))
    np.testing.assert_allclose(got_T.numpy(), T, rtol=1e-12, atol=1e-12)


def test_the_default_chunk_size_is_shared():
    import inspect

    for module in (np_delta, torch_delta):
        for name in ("delta_rule_attention", "delta_product_attention"):
            default = inspect.signature(getattr(module, name)).parameters["chunk_size"].default
            assert default == np_gated.DEFAULT_CHUNK_SIZE


# --- DeltaProduct: n_h delta-rule steps a token ----------------------------------------------

def _product_inputs(rng, n_householder, gate, lead=(2, 3), n=11, d=4, e=3):
    """``q (*lead, n, d)``, unit keys ``(*lead, n·n_h, d)``, ``v (*lead, n·n_h, e)``, β in (0, 2), a decay a token."""
    q = rng.standard_normal((*lead, n, d))
    k = _unit(rng.standard_normal((*lead, n * n_householder, d)))
    v, beta = rng.standard_normal((*lead, n * n_householder, e)), rng.uniform(*BETA_RANGE, (*lead, n * n_householder))
    log_decay = {"none": None, "head": lambda: rng.uniform(-0.5, 0, (*lead, n)),
                 "channel": lambda: rng.uniform(-0.5, 0, (*lead, n, d))}[gate]
    return q, k, v, beta, None if log_decay is None else log_decay()


def _product_definition(q, k, v, beta, n_householder, log_decay=None, state=None):
    """Per token: S ← Diag(a_t) S, then n_h explicit (I − β k kᵀ) S + β k vᵀ; o_t = Sᵀ q_t after the last."""
    d, e = k.shape[-1], v.shape[-1]
    channels = log_decay is not None and log_decay.ndim == q.ndim
    state = np.zeros((*k.shape[:-2], d, e)) if state is None else state
    outputs = []
    for t in range(q.shape[-2]):
        state = _decay_matrix(None if log_decay is None else _cut(log_decay, t, q.ndim), d, channels) @ state
        for step in range(t * n_householder, (t + 1) * n_householder):
            k_s, b_s = k[..., step, :], beta[..., step, None, None]
            householder = np.eye(d) - b_s * k_s[..., :, None] * k_s[..., None, :]  # (..., d, d)
            state = householder @ state + b_s * k_s[..., :, None] * v[..., step, None, :]
        outputs.append(np.einsum("...d,...de->...e", q[..., t, :], state))
    return np.stack(outputs, axis=-2), state


def _product(tree, q, k, v, beta, log_decay=None, **options):
    out = tree.delta.delta_product_attention(*tree.arrays(q, k, v, beta), **options,
                                             log_decay=None if log_decay is None else tree.array(log_decay))
    return (tree.numpy(out[0]), tree.numpy(out[1])) if options.get("return_state") else tree.numpy(out)


@pytest.mark.parametrize("chunk_size", [None, 1, 5, 16])
@pytest.mark.parametrize("n_householder", [1, 2, 3])
@pytest.mark.parametrize("gate", GATES)
def test_delta_product_equals_its_definition(tree, rng, chunk_size, n_householder, gate):
    q, k, v, beta, log_decay = _product_inputs(rng, n_householder, gate)
    state = rng.standard_normal((3, 4, 3))
    expected, expected_state = _product_definition(q, k, v, beta, n_householder, log_decay,
                                                   np.broadcast_to(state, (2, 3, 4, 3)))
    got, final = _product(tree, q, k, v, beta, log_decay, n_householder=n_householder, chunk_size=chunk_size,
                          initial_state=tree.array(state), return_state=True)
    assert got.shape == (2, 3, 11, 3) and final.shape == (2, 3, 4, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(final, expected_state, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 5])
@pytest.mark.parametrize("gate", GATES)
def test_delta_product_with_one_step_is_the_delta_rule(tree, rng, chunk_size, gate):
    q, k, v, beta, log_decay = _inputs(rng, n=23, gate=gate, beta=BETA_RANGE)
    rule = _delta(tree, q, k, v, beta, log_decay, chunk_size=chunk_size)
    product = _product(tree, q, k, v, beta, log_decay, n_householder=1, chunk_size=chunk_size)
    np.testing.assert_array_equal(product, rule)


@pytest.mark.parametrize("gate", GATES)
def test_delta_product_steps_equal_the_parallel_form(tree, rng, gate):
    n_h = 2
    q, k, v, beta, log_decay = _product_inputs(rng, n_h, gate, n=7)
    parallel, parallel_state = _product(tree, q, k, v, beta, log_decay, n_householder=n_h, chunk_size=4,
                                        return_state=True)
    state, outputs = None, []
    for t in range(7):
        before = None if state is None else tree.numpy(state).copy()
        steps = slice(t * n_h, (t + 1) * n_h)
        options = {} if log_decay is None else {"log_decay_t": tree.array(_cut(log_decay, t))}
        out, new_state = tree.delta.delta_product_step(*tree.arrays(q[..., t, :], k[..., steps, :], v[..., steps, :],
                                                                    beta[..., steps]), state, **options)
        if state is not None:
            np.testing.assert_array_equal(tree.numpy(state), before)  # the caller's state is untouched
        outputs.append(tree.numpy(out))
        state = new_state
    np.testing.assert_allclose(np.stack(outputs, axis=-2), parallel, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tree.numpy(state), parallel_state, rtol=1e-12, atol=1e-12)


def test_two_reflections_a_token_rotate_the_state(tree, rng):
    # DeltaProduct with n_h = 2 and β = 2: a product of two reflections, a rotation by twice the keys' angle
    # (Siems et al. 2025): with keys 45° apart in a plane, the value read along e1 moves to e2 after one token.
    e1, e2 = np.eye(2)
    k = np.stack([e1, (e1 + e2) / np.sqrt(2)])  # (n·n_h, d), one token of two steps
    v, beta = np.zeros((2, 1)), np.full(2, 2.0)
    state = np.array([[1.0], [0.0]])  # the value 1 stored along e1
    q = np.stack([e2])
    out, final = _product(tree, q, k, v, beta, n_householder=2, initial_state=tree.array(state), return_state=True)
    np.testing.assert_allclose(final, [[0.0], [1.0]], rtol=0, atol=1e-14)  # rotated by 90°: now along e2
    np.testing.assert_allclose(out, [[1.0]], rtol=0, atol=1e-14)


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("chunk_size", [None, 4])
def test_delta_product_gradcheck(rng, gate, chunk_size):
    q, k, v, beta, log_decay = _product_inputs(rng, 2, gate, lead=(2,), n=4, d=3, e=2)
    inputs = [torch.tensor(x, requires_grad=True) for x in (q, k, v, beta, rng.standard_normal((2, 3, 2)))]
    if log_decay is not None:
        inputs.append(torch.tensor(log_decay - 0.1, requires_grad=True))

    def run(q, k, v, beta, state, log_decay=None):
        return torch_delta.delta_product_attention(q, k, v, beta, n_householder=2, log_decay=log_decay,
                                                   chunk_size=chunk_size, initial_state=state, return_state=True)

    assert torch.autograd.gradcheck(run, inputs)


@pytest.mark.parametrize("gate", GATES)
def test_delta_product_numpy_and_torch_agree(rng, gate):
    q, k, v, beta, log_decay = _product_inputs(rng, 3, gate)
    expected = np_delta.delta_product_attention(q, k, v, beta, n_householder=3, log_decay=log_decay, chunk_size=4)
    got = torch_delta.delta_product_attention(*map(torch.as_tensor, (q, k, v, beta)), n_householder=3, chunk_size=4,
                                              log_decay=None if log_decay is None else torch.as_tensor(log_decay))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)
    step_decay = _cut(log_decay, 0)
    expected = np_delta.delta_product_step(q[..., 0, :], k[..., :3, :], v[..., :3, :], beta[..., :3], None,
                                           log_decay_t=step_decay)
    got = torch_delta.delta_product_step(*map(torch.as_tensor, (q[..., 0, :], k[..., :3, :], v[..., :3, :],
                                                                beta[..., :3])), None,
                                         log_decay_t=None if step_decay is None else torch.as_tensor(step_decay))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-12)


# --- properties -----------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 20), chunk_size=st.integers(1, 24), lead=st.lists(st.integers(1, 3), max_size=2),
       gate=st.sampled_from(GATES), use_torch=st.booleans(), seed=st.integers(0, 2**16))
def test_chunked_equals_the_definition_for_any_sizes(n, chunk_size, lead, gate, use_torch, seed):
    q, k, v, beta, log_decay = _inputs(np.random.default_rng(seed), lead=tuple(lead), n=n, d=3, e=2, gate=gate,
                                       beta=BETA_RANGE)
    module, wrap = (torch_delta, torch.as_tensor) if use_torch else (np_delta, np.asarray)
    got = module.delta_rule_attention(*map(wrap, (q, k, v, beta)), chunk_size=chunk_size,
                                      log_decay=None if log_decay is None else wrap(log_decay))
    assert tuple(got.shape) == (*lead, n, 2)
    np.testing.assert_allclose(np.asarray(got), _definition(q, k, v, beta, log_decay)[0], rtol=1e-11, atol=1e-11)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 12), t=st.integers(0, 10), chunk_size=st.sampled_from([None, 1, 3, 5]),
       gate=st.sampled_from(["head", "channel"]), use_torch=st.booleans(), seed=st.integers(0, 2**16))
def test_outputs_ignore_the_future(n, t, chunk_size, gate, use_torch, seed):
    t = min(t, n - 2)
    rng = np.random.default_rng(seed)
    inputs = _inputs(rng, lead=(2,), n=n, d=3, e=2, gate=gate)
    changed = [x.copy() for x in inputs]
    changed[0][:, t + 1:] = rng.standard_normal(changed[0][:, t + 1:].shape)
    changed[1][:, t + 1:] = _unit(rng.standard_normal(changed[1][:, t + 1:].shape))
    changed[2][:, t + 1:] = 10 * rng.standard_normal(changed[2][:, t + 1:].shape)
    changed[3][:, t + 1:] = rng.uniform(0, 2, changed[3][:, t + 1:].shape)
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
    (np.full((2, 3, 5), 2.5), r"beta must lie in \[0, 2\]"),
    (np.full((2, 3, 5), -0.1), r"beta must lie in \[0, 2\]"),
    (np.full((2, 3, 5), np.nan), r"beta holds NaN values|beta must be finite"),
    (np.full((2, 3, 6), 0.5), r"beta must have shape \(\.\.\., n\) = \(2, 3, 5\)"),
    (np.full((2, 3, 5, 1), 0.5), r"beta must have shape \(\.\.\., n\)"),
])
def test_bad_beta_is_named(tree, beta, match):
    q, k, v, _ = _good()
    with pytest.raises(ValueError, match=match):
        tree.delta.delta_rule_attention(*tree.arrays(q, k, v, beta))


def test_beta_up_to_two_is_accepted(tree):
    q, k, v, _ = _good()
    for beta in (0.0, 1.5, 2.0):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # unit keys with β = 2: β‖k‖² = 2 exactly, at the edge, no warning
            out = tree.delta.delta_rule_attention(*tree.arrays(q, k, v, np.full((2, 3, 5), beta)))
        assert np.isfinite(tree.numpy(out)).all()


@pytest.mark.parametrize("log_decay, match", [
    (np.full((2, 3, 5), 0.5), r"log_decay must be <= 0"),
    (np.full((2, 3, 5, 4), 0.5), r"log_decay must be <= 0"),
    (np.full((2, 3, 5), -np.inf), r"log_decay must be finite"),
    (np.full((2, 3, 4), -0.1), r"log_decay must have shape \(\.\.\., n\) = \(2, 3, 5\)"),
    (np.full((2, 3, 5, 3), -0.1), r"or \(\.\.\., n, d\) = \(2, 3, 5, 4\)"),
])
def test_bad_log_decay_is_named(tree, log_decay, match):
    with pytest.raises(ValueError, match=match):
        tree.delta.delta_rule_attention(*tree.arrays(*_good()), log_decay=tree.array(log_decay))


def test_bad_step_arguments_are_named(tree):
    q, k, v, beta = (x[..., 0, :] if x.ndim == 4 else x[..., 0] for x in _good())
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
        tree.delta.delta_rule_step(*tree.arrays(q, k, v, beta + 2), None)
    with pytest.raises(ValueError, match=r"log_decay_t must be <= 0|log_decay must be <= 0"):
        tree.delta.delta_rule_step(*tree.arrays(q, k, v, beta), None, log_decay_t=tree.array(np.full((2, 3), 0.1)))
    with pytest.raises(ValueError, match=r"log_decay_t must be <= 0|log_decay must be <= 0"):
        tree.delta.delta_rule_step(*tree.arrays(q, k, v, beta), None, log_decay_t=tree.array(np.full((2, 3, 4), 0.1)))
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
        warnings.simplefilter("error")  # any warning fails: unit keys with β = 2 are exactly at the edge, 2 ≤ 2
        tree.delta.delta_rule_attention(*tree.arrays(q, _unit(rng.standard_normal(k.shape)), v,
                                                     np.full_like(beta, 2.0)), chunk_size=chunk_size)
    long_keys = 1.5 * k  # β‖k‖² = 1 · 2.25 > 2
    with pytest.warns(RuntimeWarning, match=r"beta \* \|\|k\|\|\^2 up to 2.25 > 2"):
        tree.delta.delta_rule_attention(*tree.arrays(q, long_keys, v, np.ones_like(beta)), chunk_size=chunk_size)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # β = 0.5 brings the same keys back to 1.125 ≤ 2
        tree.delta.delta_rule_attention(*tree.arrays(q, long_keys, v, beta), chunk_size=chunk_size)


def _good_product(n=5, n_householder=2, lead=(2, 3)):
    q, k, v, beta = _good(n * n_householder, lead)
    return q[..., :n, :], k, v, beta


@pytest.mark.parametrize("change, match", [
    ({"k": np.ones((2, 3, 9, 4))}, r"k must have n \* n_householder = 5 \* 2 = 10 positions .* got 9"),
    ({"v": np.ones((2, 3, 11, 2))}, r"v must have n \* n_householder = 5 \* 2 = 10 positions .* got 11"),
    ({"beta": np.full((2, 3, 5), 0.5)}, r"beta must have n \* n_householder = 5 \* 2 = 10 positions .* got 5"),
    ({"q": np.ones((2, 3, 4, 4))}, r"k must have n \* n_householder = 4 \* 2 = 8 positions .* got 10"),
    ({"n_householder": 3}, r"k must have n \* n_householder = 5 \* 3 = 15 positions"),
    ({"n_householder": 0}, r"n_householder must be a positive int"),
    ({"n_householder": 1.5}, r"n_householder must be a positive int"),
    ({"n_householder": True}, r"n_householder must be a positive int"),
    ({"log_decay": np.full((2, 3, 10), -0.1)}, r"log_decay must have shape \(\.\.\., n\) = \(2, 3, 5\)"),
    ({"beta": np.full((2, 3, 10), 2.5)}, r"beta must lie in \[0, 2\]"),
])
def test_bad_delta_product_input_is_named(tree, change, match):
    arrays, change = dict(zip(("q", "k", "v", "beta"), _good_product(), strict=True)), dict(change)  # a copy: the
    options = {"n_householder": change.pop("n_householder", 2)}  # parameter is shared by every tree
    if "log_decay" in change:
        options["log_decay"] = tree.array(change.pop("log_decay"))
    arrays.update(change)
    with pytest.raises(ValueError, match=match):
        tree.delta.delta_product_attention(*tree.arrays(*arrays.values()), **options)


def test_bad_delta_product_step_is_named(tree):
    q, k, v, beta = _good_product(n=1)
    with pytest.raises(ValueError, match=r"k_t must have shape \(\.\.\., n_householder, d\)"):
        tree.delta.delta_product_step(*tree.arrays(q[0, 0, 0], k[0, 0, 0], v[0, 0], beta[0, 0]), None)
    with pytest.raises(ValueError, match=r"v must have n \* n_householder = 1 \* 2 = 2 positions"):
        tree.delta.delta_product_step(*tree.arrays(q[..., 0, :], k, v[..., :1, :], beta), None)


# --- CUDA -----------------------------------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gate", GATES)
def test_cuda_forward_and_backward_match_cpu(rng, dtype, gate):
    arrays = _inputs(rng, lead=(2, 2), n=300, d=16, e=16, low=-0.1, gate=gate)
    q, k, v, beta, log_decay = (None if x is None else torch.as_tensor(x).to(dtype) for x in arrays)
    results = {}
    for device in ("cpu", "cuda"):
        leaves = [x.to(device).requires_grad_() for x in (q, k, v, beta, log_decay) if x is not None]
        out = torch_delta.delta_rule_attention(*leaves[:4], log_decay=leaves[4] if len(leaves) > 4 else None,
                                               chunk_size=64)
        assert out.dtype == dtype
        out.float().sum().backward()
        results[device] = [out.float().cpu()] + [leaf.grad.float().cpu() for leaf in leaves]
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2  # different summation orders; half outputs round
    for cuda, cpu in zip(results["cuda"], results["cpu"], strict=True):
        scale = cpu.abs().max().item()
        torch.testing.assert_close(cuda, cpu, rtol=tolerance, atol=tolerance * scale)
