"""Answers a learner writes for the exercises of lesson 14, other than the reference: each right form passes
(the checks run the learner's prefill and compare what it computes), and each classic slip is named by the
symptom it causes."""

import numpy as np
import pytest
import torch

from course_lib.checks import FAILED, PASSED
from course_lib.checks.lesson14 import exercise_14_1, exercise_14_2, exercise_14_3, layer_inputs
from course_lib.numpy import delta

# --- 14.1: a padded batch whose pads write nothing ------------------------------------------------


def each_sequence_alone(x, key_mask, state, weights):
    """Slice each sequence's real tokens and run it by itself: right for pads on either side."""
    out, states = np.zeros(x.shape[:2] + (state.shape[-1],)), np.empty_like(state)
    for i in range(len(x)):
        q, k, v, beta, log_decay = layer_inputs(x[i, key_mask[i]], weights)
        out[i, key_mask[i]], states[i] = delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay,
                                                                    initial_state=state[i], return_state=True)
    return out, states


def zero_keys_and_decays(x, key_mask, state, weights):
    """A pad's key zero (it writes nothing, its transition is I) and its decay 1: the same as β = 0."""
    q, k, v, beta, log_decay = layer_inputs(x, weights)
    k = np.where(key_mask[..., None], k, 0.0)
    log_decay = np.where(key_mask, log_decay, 0.0)
    return delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, initial_state=state, return_state=True)


def token_loop(x, key_mask, state, weights):
    """One step a token, skipping the pads, the outputs as float32 torch tensors (any array type is read)."""
    q, k, v, beta, log_decay = layer_inputs(x, weights)
    S, out = state.copy(), np.zeros(x.shape[:2] + (state.shape[-1],))
    for t in range(x.shape[1]):
        o, stepped = delta.delta_rule_step(q[:, t], k[:, t], v[:, t], beta[:, t], S, log_decay_t=log_decay[:, t])
        S = np.where(key_mask[:, t, None, None], stepped, S)
        out[:, t] = o
    return torch.from_numpy(out), torch.from_numpy(S)


@pytest.mark.parametrize("answer", [each_sequence_alone, zero_keys_and_decays, token_loop], ids=lambda f: f.__name__)
def test_right_padded_prefills_pass(answer):
    assert exercise_14_1(answer, verbose=False).status == PASSED


def outputs_zeroed_at_pads(x, key_mask, state, weights):  # the pads' outputs hidden, their writes kept
    q, k, v, beta, log_decay = layer_inputs(np.where(key_mask[..., None], x, 0.0), weights)
    out, S = delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, initial_state=state, return_state=True)
    return np.where(key_mask[..., None], out, 0.0), S


def values_zeroed_only(x, key_mask, state, weights):  # v = 0 at pads: no write, but the decay and β k kᵀ stay
    q, k, v, beta, log_decay = layer_inputs(x, weights)
    v = np.where(key_mask[..., None], v, 0.0)
    return delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, initial_state=state, return_state=True)


def keys_zeroed_only(x, key_mask, state, weights):  # no write and no β k kᵀ, but the decay stays
    q, k, v, beta, log_decay = layer_inputs(x, weights)
    k = np.where(key_mask[..., None], k, 0.0)
    return delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, initial_state=state, return_state=True)


@pytest.mark.parametrize("wrong, mistake", [(outputs_zeroed_at_pads, "pads-write-and-forget"),
                                            (keys_zeroed_only, "pads-still-forget")],
                         ids=lambda x: getattr(x, "__name__", x))
def test_partial_fixes_are_named_by_their_symptom(wrong, mistake, capsys):
    result = exercise_14_1(wrong)
    assert result.status == FAILED and result.mistake == mistake
    assert "symptom:" in capsys.readouterr().out


def test_an_unnamed_wrong_prefill_shows_where_the_state_differs(capsys):
    result = exercise_14_1(values_zeroed_only)  # erases (β k kᵀ) and decays at pads: no single named slip
    out = capsys.readouterr().out
    assert result.status == FAILED and "next state" in out and "largest difference" in out


# --- 14.2: a chunk of any length from a state -------------------------------------------------------


def silu(x):
    return x / (1 + np.exp(-x))


def step_by_step(qkv, conv_state, S, conv_weight, beta, log_decay):
    """A token loop: the window slides one input at a time, the library's one-token step."""
    K, d = conv_weight.shape[1], S.shape[0]
    window, outs = conv_state.copy(), []
    for t in range(len(qkv)):
        window = np.concatenate([window, qkv[t:t + 1]])[-K:]  # (K, 3d): the last K inputs, token t last
        y = silu(np.einsum("ck,kc->c", conv_weight, window))
        q, k, v = y[:d] / np.linalg.norm(y[:d]), y[d:2 * d] / np.linalg.norm(y[d:2 * d]), y[2 * d:]
        o, S = delta.delta_rule_step(q, k, v, beta[t], S, log_decay_t=log_decay[t])
        outs.append(o)
        window = window[1:]
    return np.array(outs), window, S


def with_np_convolve(qkv, conv_state, S, conv_weight, beta, log_decay):
    """Each channel by np.convolve ('valid', the filter reversed as convolution does), the token loop of the
    library (chunk_size=None) for the recurrence."""
    n, K, d = len(qkv), conv_weight.shape[1], S.shape[0]
    window = np.vstack([conv_state, qkv])
    y = silu(np.stack([np.convolve(window[:, c], conv_weight[c, ::-1], mode="valid") for c in range(3 * d)], -1))
    assert y.shape == (n, 3 * d)
    q = y[:, :d] / np.linalg.norm(y[:, :d], axis=1, keepdims=True)
    k = y[:, d:2 * d] / np.linalg.norm(y[:, d:2 * d], axis=1, keepdims=True)
    out, S = delta.delta_rule_attention(q, k, y[:, 2 * d:], beta, log_decay=log_decay, initial_state=S,
                                        return_state=True, chunk_size=None)
    return out, window[len(window) - (K - 1):], S


@pytest.mark.parametrize("answer", [step_by_step, with_np_convolve], ids=lambda f: f.__name__)
def test_right_chunk_prefills_pass(answer):
    assert exercise_14_2(answer, verbose=False).status == PASSED


def chunk_padded_to_eight(qkv, conv_state, S, conv_weight, beta, log_decay):
    """Pads the chunk with zero inputs, β = 0 and log a = 0 to 8 tokens: S survives, the conv state does not."""
    pad = -len(qkv) % 8
    qkv_p = np.vstack([qkv, np.zeros((pad, qkv.shape[1]))])
    out, conv, S = step_by_step(qkv_p, conv_state, S, conv_weight, np.pad(beta, (0, pad)), np.pad(log_decay, (0, pad)))
    return out[:len(qkv)], conv, S


def conv_state_last_rows(qkv, conv_state, S, conv_weight, beta, log_decay):
    """The next conv state as qkv[-3:]: too short (or wrong) when the chunk is shorter than K − 1."""
    out, _, S = step_by_step(qkv, conv_state, S, conv_weight, beta, log_decay)
    return out, qkv[-(conv_weight.shape[1] - 1):], S


def test_padding_the_chunk_is_named(capsys):
    result = exercise_14_2(chunk_padded_to_eight)
    assert result.mistake == "conv-state-of-the-padding" and "*real* inputs" in capsys.readouterr().out


def test_a_conv_state_of_the_wrong_shape_says_so(capsys):
    result = exercise_14_2(conv_state_last_rows)  # n = 1: one row where K − 1 = 3 are needed
    out = capsys.readouterr().out
    assert result.status == FAILED and "next conv state: expected shape (3, 9), got shape (1, 9)" in out


# --- 14.3: the decode roofline --------------------------------------------------------------------------


def as_integers_and_array(pattern, position, *, d_model, n_heads, conv_size, n_params, bytes_per_number,
                          bandwidth_gbs, window=None):
    """Integers for the bytes, a NumPy array for the triple: any numeric form is read."""
    d = d_model // n_heads
    cache = growth = 0
    for layer in pattern:
        if layer == "D":
            cache += (n_heads * d * d + 3 * d_model * (conv_size - 1)) * bytes_per_number
        else:
            tokens = position if layer == "S" or window is None else min(window, position)
            cache += 2 * tokens * d_model * bytes_per_number
            full = layer == "W" and window is not None and position >= window
            growth += 0 if full else 2 * d_model * bytes_per_number
    return np.array([cache, growth, (cache + n_params * bytes_per_number) / bandwidth_gbs / 1e9])


def test_other_right_forms_pass():
    assert exercise_14_3(as_integers_and_array, verbose=False).status == PASSED


def whole_model_state_squared(pattern, position, **kwargs):  # a learner's d_model² for every recurrent layer
    cache, growth, seconds = as_integers_and_array(pattern, position, **kwargs)
    d_model, n_heads, b = kwargs["d_model"], kwargs["n_heads"], kwargs["bytes_per_number"]
    extra = pattern.count("D") * (d_model * d_model - n_heads * (d_model // n_heads) ** 2) * b
    return cache + extra, growth, seconds + extra / kwargs["bandwidth_gbs"] / 1e9


def test_the_state_of_one_head_per_model_is_named(capsys):
    result = exercise_14_3(whole_model_state_squared)
    assert result.mistake == "state-d-model-squared" and "d_model² / h" in capsys.readouterr().out
