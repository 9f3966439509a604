"""Checks for the lesson 14 exercises (hybrid models and the state cache).

14.1 and 14.2 run the learner's prefill on seeded batches and compare what it returns with the library's
recurrence, so any right form passes (masking the gates, masking the keys and the decay, slicing each
sequence; a chunked call or a token loop); 14.3 is arithmetic on the decode roofline.
"""

import dataclasses

import numpy as np

from course_lib.checks import Exercise, Mistake, run_check, to_numpy
from course_lib.numpy import delta


def _rng(seed):
    return np.random.default_rng(seed)


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _silu(x):
    return x / (1.0 + np.exp(-x))


# --- Exercise 14.1: find the bug in a prefill that lets padding write to the state --------------
# A gated delta-rule layer whose inputs come from x through projections with biases, so a pad whose x
# is zero still has a key, a value, a β and a decay.  The learner's prefill of a padded batch must give
# each sequence the state (and the outputs at its real tokens) it gets alone.

def make_weights(rng, d_model=8, d=4):
    """The layer of Exercise 14.1: projections with biases, ``{"Wq", "Wk", "Wv", "wb", "wa"}`` and their biases."""
    weights = {name: rng.standard_normal(shape) / np.sqrt(d_model)
               for name, shape in (("Wq", (d_model, d)), ("Wk", (d_model, d)), ("Wv", (d_model, d)),
                                   ("wb", (d_model,)), ("wa", (d_model,)))}
    weights |= {"bq": rng.standard_normal(d), "bk": rng.standard_normal(d), "bv": rng.standard_normal(d),
                "bb": 0.5, "ba": -1.0}
    return weights


def layer_inputs(x, weights):
    """``(q, k, v, beta, log_decay)`` of the layer: ``x (..., n, d_model)`` → ``(..., n, d)`` thrice and ``(..., n)``
    twice; unit q and k, β = sigmoid(·) in (0, 1), log a = −softplus(·) ≤ 0 (notebook 11's Gated DeltaNet)."""
    q = _unit(x @ weights["Wq"] + weights["bq"])
    k = _unit(x @ weights["Wk"] + weights["bk"])
    v = x @ weights["Wv"] + weights["bv"]
    beta = 1.0 / (1.0 + np.exp(-(x @ weights["wb"] + weights["bb"])))
    log_decay = -np.logaddexp(0.0, x @ weights["wa"] + weights["ba"])
    return q, k, v, beta, log_decay


def padded_prefill_with_the_bug(x, key_mask, state, weights):
    """The prefill of Exercise 14.1 as given: the pads' x zeroed, every position run."""
    q, k, v, beta, log_decay = layer_inputs(np.where(key_mask[..., None], x, 0.0), weights)
    return delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, initial_state=state, return_state=True)


def _masked_prefill_reference(x, key_mask, state, weights):
    """A pad neither writes (β = 0) nor forgets (log a = 0): each sequence gets what it gets alone."""
    q, k, v, beta, log_decay = layer_inputs(x, weights)
    beta, log_decay = np.where(key_mask, beta, 0.0), np.where(key_mask, log_decay, 0.0)
    return delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, initial_state=state, return_state=True)


def _pads_masked(*, write=True, forget=True, zero_x=True, zero_keys=False, initial=True):
    """A prefill that masks the pads' writes (by β = 0, or by a zero key) and/or decays (True: still does it)."""

    def prefill(x, key_mask, state, weights):
        q, k, v, beta, log_decay = layer_inputs(np.where(key_mask[..., None], x, 0.0) if zero_x else x, weights)
        if not write and zero_keys:
            k = np.where(key_mask[..., None], k, 0.0)
        elif not write:
            beta = np.where(key_mask, beta, 0.0)
        if not forget:
            log_decay = np.where(key_mask, log_decay, 0.0)
        start = state if initial else np.zeros_like(state)
        return delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, initial_state=start, return_state=True)
    return prefill


def _mask_inverted(x, key_mask, state, weights):
    """β = 0 and log a = 0 where the mask is True: the real tokens are silenced, the pads run."""
    return _masked_prefill_reference(x, ~key_mask, state, weights)


def _decay_dropped_everywhere(x, key_mask, state, weights):
    """β masked at pads, but log a = 0 at every token: the real tokens lose their decay too."""
    q, k, v, beta, _ = layer_inputs(x, weights)
    beta = np.where(key_mask, beta, 0.0)
    return delta.delta_rule_attention(q, k, v, beta, log_decay=np.zeros_like(beta), initial_state=state,
                                      return_state=True)


def _right_padding_assumed(x, key_mask, state, weights):
    """Each sequence cut at its length from the start: right for right padding only."""
    outs, states = np.zeros(x.shape[:2] + (state.shape[-1],)), np.empty_like(state)
    for i, length in enumerate(key_mask.sum(1)):
        q, k, v, beta, log_decay = layer_inputs(x[i, :length], weights)
        out, states[i] = delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, initial_state=state[i],
                                                    return_state=True)
        outs[i, :length] = out
    return outs, states


WRITE_AND_FORGET = ("symptom: each padded sequence's state differs from the one it gets alone (with no pads, the "
                    "batch agrees). Zeroing a pad's x leaves the biases: the pad still has a key, a value, β > 0 and a "
                    "decay below 1, so it writes into S and shrinks it. Mask what reaches the recurrence, not x.")
STILL_FORGET = ("symptom: a padded sequence's state is its right state shrunk — by e^{Σ log a} over its pads. The pads "
                "write nothing now, but their decay a < 1 still multiplies S: a pad needs log a = 0 (a = 1) as well.")
STILL_WRITE = ("symptom: a padded sequence's state holds extra writes: the pads' decay is off (a = 1), but β > 0 and "
               "the bias's key still write β k vᵀ. A pad needs β = 0 (or a zero key) as well.")
MISTAKES_14_1 = (  # each slip with the pads' x zeroed or left as it is: the same symptom
    Mistake("pads-write-and-forget", padded_prefill_with_the_bug, WRITE_AND_FORGET),
    Mistake("pads-write-and-forget", _pads_masked(zero_x=False), WRITE_AND_FORGET),
    Mistake("pads-still-forget", _pads_masked(write=False), STILL_FORGET),
    Mistake("pads-still-forget", _pads_masked(write=False, zero_x=False), STILL_FORGET),
    Mistake("pads-still-forget", _pads_masked(write=False, zero_keys=True, zero_x=False), STILL_FORGET),
    Mistake("pads-still-forget", _pads_masked(write=False, zero_keys=True), STILL_FORGET),
    Mistake("pads-still-write", _pads_masked(forget=False), STILL_WRITE),
    Mistake("pads-still-write", _pads_masked(forget=False, zero_x=False), STILL_WRITE),
    Mistake("state-restarted", _pads_masked(write=False, forget=False, initial=False),
            "symptom: every sequence is wrong, padded or not: a prefill continues from the cache's state "
            "(initial_state=state), it does not start from zeros."),
    Mistake("mask-inverted", _mask_inverted,
            "symptom: every sequence is wrong, the unpadded ones too: key_mask is True at real tokens, so β = 0 and "
            "log a = 0 go where key_mask is False."),
    Mistake("decay-dropped-everywhere", _decay_dropped_everywhere,
            "symptom: every sequence is wrong, the unpadded ones too: log a = 0 belongs at the pads only; real "
            "tokens keep their decay."),
    Mistake("right-padding-assumed", _right_padding_assumed,
            "symptom: right-padded batches agree, left-padded ones do not: cutting each sequence at its length "
            "keeps its first tokens, which are pads when the padding is on the left. Use key_mask itself."),
)


def _padded_case(seed, lengths, n, side, d_model=8, d=4):
    rng = _rng(seed)
    b = len(lengths)
    x = rng.standard_normal((b, n, d_model))
    position = np.arange(n)
    if side == "right":
        key_mask = position[None, :] < np.array(lengths)[:, None]
    else:
        key_mask = position[None, :] >= n - np.array(lengths)[:, None]
    state = rng.standard_normal((b, d, d))  # a prefill continuing a cache
    return x, key_mask, state, make_weights(rng, d_model, d)


def _cases_14_1():
    # the first case ends with a real token (left padding): a non-finite output there is the learner's own
    return [("left-padded batch, lengths 9, 6, 3, from a state", _padded_case(141, (9, 6, 3), 9, "left"), {}),
            ("right-padded batch, lengths 9, 5, 2, from a state", _padded_case(142, (9, 5, 2), 9, "right"), {}),
            ("right-padded, lengths 13, 12, one pad", _padded_case(143, (13, 12), 13, "right"), {}),
            ("no pads at all", _padded_case(144, (7, 7), 7, "right"), {})]


def _at_real_tokens(prefill):
    """What a prefill returns where it is defined: outputs at real tokens (pads' outputs set to 0), the state."""

    def computed(x, key_mask, state, weights):
        out, next_state = prefill(x, key_mask, state, weights)
        out = np.asarray(out, np.float64)
        if out.shape[:2] == key_mask.shape:
            out = np.where(key_mask[..., None], out, 0.0)  # a pad's output is never read
        return out, next_state
    return computed


@dataclasses.dataclass
class _Read(Exercise):
    """An exercise whose answers are first read by ``read`` (the reference's, the learner's and each mistake's)."""

    read: object = None

    def __call__(self, candidate, *, verbose=True):
        mistakes = tuple(Mistake(m.name, self.read(m.fn), m.hint) for m in self.mistakes)
        return run_check(self.number, self.read(candidate), self.read(self.reference), self.cases(), names=self.names,
                         mistakes=mistakes, atol=self.atol, rtol=self.rtol, verbose=verbose)


exercise_14_1 = _Read("14.1", "find the bug in a prefill that lets padding write to the state",
                      _masked_prefill_reference, _cases_14_1, MISTAKES_14_1,
                      names=("outputs at real tokens", "next state"), atol=1e-6, rtol=1e-5, read=_at_real_tokens)


# --- Exercise 14.2: the prefill of a partial chunk from a state ------------------------------------
# One recurrent layer's MixerState: the short convolution's last K − 1 raw inputs and S.  A prompt's last
# chunk (and a speculative draft) has any length n ≥ 1, shorter than a chunk and even than K − 1.

def _prefill_chunk_reference(qkv, conv_state, S, conv_weight, beta, log_decay):
    """``(out (n, d), next conv state (K − 1, 3d), next S (d, d))`` of one chunk of any length from a state."""
    n, K, d = qkv.shape[0], conv_weight.shape[1], S.shape[0]
    window = np.concatenate([conv_state, qkv])  # (K − 1 + n, 3d): the inputs before the chunk, then its own
    y = _silu(sum(conv_weight[:, j] * window[j:j + n] for j in range(K)))  # (n, 3d)
    q, k, v = _unit(y[:, :d]), _unit(y[:, d:2 * d]), y[:, 2 * d:]
    out, S = delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, initial_state=S, return_state=True)
    return out, window[-(K - 1):], S


def _chunk_slip(*, conv_from_zeros=False, conv_state="window", from_zero_state=False, flipped=False,
                activation=_silu, unit_q=True, unit_v=False):
    def prefill(qkv, conv_state_in, S, conv_weight, beta, log_decay):
        n, K, d = qkv.shape[0], conv_weight.shape[1], S.shape[0]
        before = np.zeros_like(conv_state_in) if conv_from_zeros else conv_state_in
        window = np.concatenate([before, qkv])
        weight = conv_weight[:, ::-1] if flipped else conv_weight
        y = activation(sum(weight[:, j] * window[j:j + n] for j in range(K)))
        q, k, v = y[:, :d], _unit(y[:, d:2 * d]), y[:, 2 * d:]
        q, v = _unit(q) if unit_q else q, _unit(v) if unit_v else v
        start = np.zeros_like(S) if from_zero_state else S
        out, S_next = delta.delta_rule_attention(q, k, v, beta, log_decay=log_decay, initial_state=start,
                                                 return_state=True)
        if conv_state == "window":
            kept = np.concatenate([conv_state_in, qkv])[-(K - 1):]
        elif conv_state == "chunk":  # the chunk's last K − 1 inputs, zeros in front when it is shorter
            kept = np.concatenate([np.zeros_like(conv_state_in), qkv])[-(K - 1):]
        elif conv_state == "K rows":  # one input too many
            kept = np.concatenate([conv_state_in, qkv])[-K:]
        elif conv_state == "padded":  # the chunk zero-padded to a whole chunk of 8 first
            kept = np.concatenate([conv_state_in, qkv, np.zeros((-n % 8, qkv.shape[1]))])[-(K - 1):]
        else:  # "convolved": the convolution's outputs instead of its inputs
            kept = np.concatenate([np.zeros_like(conv_state_in), y])[-(K - 1):]
        return out, kept, S_next
    return prefill


MISTAKES_14_2 = (
    Mistake("state-ignored", _chunk_slip(from_zero_state=True),
            "the outputs and S start from the zero state: a prefill from a cache passes S on — "
            "delta_rule_attention(..., initial_state=S, return_state=True)."),
    Mistake("convolution-restarted", _chunk_slip(conv_from_zeros=True),
            "the first K − 1 outputs are wrong: the short convolution of token t reads the K − 1 inputs before it, "
            "which for the chunk's first tokens are in conv_state, not zeros. Convolve [conv_state; qkv]."),
    Mistake("conv-state-from-the-chunk-alone", _chunk_slip(conv_state="chunk"),
            "the next conv state is wrong when the chunk is shorter than K − 1 tokens: it must hold the last "
            "K − 1 inputs seen, some of which are still the old conv_state's. Take the last K − 1 rows of "
            "[conv_state; qkv]."),
    Mistake("conv-state-of-the-padding", _chunk_slip(conv_state="padded"),
            "the next conv state holds zeros: a chunk padded to a whole chunk leaves the padding as its last "
            "inputs. Keep the last K − 1 *real* inputs (or do not pad: the library's chunked form takes any n)."),
    Mistake("conv-state-convolved", _chunk_slip(conv_state="convolved"),
            "the next conv state must hold the raw inputs qkv (what the next token's convolution multiplies), "
            "not the convolution's outputs."),
    Mistake("conv-state-keeps-K-inputs", _chunk_slip(conv_state="K rows"),
            "the next conv state has K rows: the next token's convolution reads the K − 1 inputs before it (and "
            "its own), so the state keeps the last K − 1 rows of [conv_state; qkv]."),
    Mistake("no-activation", _chunk_slip(activation=lambda y: y),
            "the convolution's output goes through SiLU before q, k and v are read from it: y = silu(conv)."),
    Mistake("query-not-normalised", _chunk_slip(unit_q=False),
            "q is L2-normalised like k (the library's mixers normalise both after the convolution)."),
    Mistake("value-normalised", _chunk_slip(unit_v=True),
            "only q and k are L2-normalised; v is used as the convolution gives it."),
    Mistake("filter-reversed", _chunk_slip(flipped=True),
            "the filter runs the other way: y_t = Σ_j w[:, j] · window[t + j], so w[:, K − 1] multiplies token t "
            "itself and w[:, 0] the oldest input."),
)


def _chunk_case(seed, n, K=4, d=3):
    rng = _rng(seed)
    qkv = rng.standard_normal((n, 3 * d))
    conv_state = rng.standard_normal((K - 1, 3 * d))
    S = 0.5 * rng.standard_normal((d, d))
    conv_weight = rng.standard_normal((3 * d, K)) / np.sqrt(K)
    return qkv, conv_state, S, conv_weight, rng.uniform(0.1, 0.9, n), -rng.uniform(0.01, 0.3, n)


def _cases_14_2():
    return [(f"a chunk of {n} token{'s' if n > 1 else ''} from a state, K = 4", _chunk_case(140 + n, n), {})
            for n in (5, 1, 2, 13)]


exercise_14_2 = Exercise("14.2", "the prefill of a partial chunk from a state", _prefill_chunk_reference,
                         _cases_14_2, MISTAKES_14_2, names=("outputs", "next conv state", "next S"),
                         atol=1e-6, rtol=1e-5)


# --- Exercise 14.3: a hybrid's cache bytes and its decode time from the bandwidth ----------------
# Decoding one token reads every weight and everything cached once: time ≈ bytes read / bandwidth.

def _decode_cost(pattern, position, *, d_model, n_heads, conv_size, n_params, bytes_per_number, bandwidth_gbs,
                 window=None, keys_and_values=2, state=None, conv=True, grows=False, ignore_window=False, weights=True,
                 bandwidth_unit=1e9, scale=1.0, conv_channels=3, extra_tokens=0, window_kept=0, window_stops=True,
                 params_cached=False):
    """The decode roofline of one sequence at ``position`` tokens, with one slip (the defaults: none)."""
    head = d_model // n_heads
    per_state = n_heads * head * head if state is None else state(d_model, n_heads)
    window = None if ignore_window else window
    position += extra_tokens
    numbers = growth = 0
    for letter in pattern:
        if letter == "D" and not grows:  # S and the convolution's last K − 1 inputs of q, k and v: no growth
            numbers += per_state + conv * (conv_size - 1) * conv_channels * d_model
            continue
        windowed = letter == "W" and window is not None
        numbers += keys_and_values * (min(position, window + window_kept) if windowed else position) * d_model
        growth += keys_and_values * d_model * (not windowed or not window_stops or position < window)  # a full one: 0
    numbers += params_cached * n_params
    cache = numbers * bytes_per_number
    read = cache + weights * n_params * bytes_per_number  # every weight and every cached number, once a token
    return float(cache), float(growth * bytes_per_number), scale * read / (bandwidth_gbs * bandwidth_unit)


def _decode_reference(pattern, position, *, d_model, n_heads, conv_size, n_params, bytes_per_number, bandwidth_gbs,
                      window=None):
    """``(cache bytes, cache bytes added per token, seconds per token)`` at ``position`` tokens."""
    return _decode_cost(pattern, position, d_model=d_model, n_heads=n_heads, conv_size=conv_size, n_params=n_params,
                        bytes_per_number=bytes_per_number, bandwidth_gbs=bandwidth_gbs, window=window)


def _decode_slip(**slip):
    def answer(pattern, position, **kwargs):
        return _decode_cost(pattern, position, **kwargs, **slip)
    return answer


MISTAKES_14_3 = (
    Mistake("keys-only", _decode_slip(keys_and_values=1),
            "a softmax layer caches a key and a value per token: 2 · d_model numbers a token and layer."),
    Mistake("state-d-model-squared", _decode_slip(state=lambda d_model, n_heads: d_model * d_model),
            "a recurrent layer keeps one d × d matrix per head, d = d_model / h: h · d² = d_model² / h numbers, "
            "not d_model²."),
    Mistake("conv-state-forgotten", _decode_slip(conv=False),
            "a recurrent layer's cache also holds its short convolution's last K − 1 inputs of q, k and v: "
            "(K − 1) · 3 · d_model numbers beside S."),
    Mistake("recurrent-layers-grow", _decode_slip(grows=True),
            "a recurrent layer's state does not grow with the position: only softmax layers add to the cache per "
            "token."),
    Mistake("window-grows", _decode_slip(ignore_window=True),
            "a sliding-window layer keeps its last w keys and values: min(position, w) tokens, and it stops "
            "growing at w."),
    Mistake("conv-state-of-x-only", _decode_slip(conv_channels=1),
            "the short convolution runs over q, k and v side by side: its last K − 1 inputs are 3 · d_model numbers "
            "each, not d_model."),
    Mistake("one-token-too-many", _decode_slip(extra_tokens=1),
            "at `position` tokens the cache holds `position` keys and values per softmax layer (the tokens seen so "
            "far), not position + 1."),
    Mistake("window-keeps-w-minus-1", _decode_slip(window_kept=-1),
            "a window of w keys holds w keys and values (a query sees its own and the w − 1 before it, and its own "
            "must be cached for the next w − 1 queries)."),
    Mistake("window-never-full", _decode_slip(window_stops=False),
            "the cache is right but the growth is not: once a window layer holds w tokens, each new token replaces "
            "the oldest, and the cache no longer grows."),
    Mistake("weights-in-the-cache", _decode_slip(params_cached=True),
            "the cache is what grows or changes per sequence: keys, values, S and the convolution's inputs. The "
            "weights are read every token but are not part of a sequence's cache."),
    Mistake("weights-not-read", _decode_slip(weights=False),
            "each decoded token reads every weight once too: bytes read = n_params · bytes a number + the cache."),
    Mistake("gibibytes", _decode_slip(bandwidth_unit=2 ** 30),
            "GB/s here means 10⁹ bytes a second (the bandwidth was measured that way), not 2³⁰."),
    Mistake("microseconds", _decode_slip(scale=1e6),
            "return seconds per token; the number you gave is 10⁶ times larger: microseconds."),
    Mistake("bits", _decode_slip(scale=8.0),
            "bytes, not bits: bandwidth in GB/s already counts bytes, so do not multiply by 8."),
)


def _cases_14_3():
    shared = dict(d_model=384, n_heads=6, conv_size=4, n_params=2_500_000, bandwidth_gbs=12.5)
    return [("DDDS at 2,000 tokens, float32", ("DDDS", 2000), dict(shared, bytes_per_number=4)),
            ("SSSS at 2,000 tokens, float32", ("SSSS", 2000), dict(shared, bytes_per_number=4)),
            ("DSDSDS at 30,000 tokens, bfloat16", ("DSDSDS", 30_000), dict(shared, bytes_per_number=2)),
            ("DDDW, window 512, at 10,000 tokens", ("DDDW", 10_000), dict(shared, bytes_per_number=4, window=512)),
            ("DDDD at 100 tokens, 8 heads of 48", ("DDDD", 100), dict(shared, bytes_per_number=4, n_heads=8))]


def _three_numbers(answer):
    """An answer read as its three numbers, whether a tuple, a list or an array (or a tensor) of three."""

    def computed(*args, **kwargs):
        result = answer(*args, **kwargs)
        if isinstance(result, tuple | list):
            return tuple(result)
        flat = to_numpy(result).reshape(-1)
        return tuple(flat) if flat.size == 3 else result
    return computed


exercise_14_3 = _Read("14.3", "a hybrid's cache bytes and its decode time from the bandwidth", _decode_reference,
                      _cases_14_3, MISTAKES_14_3, names=("cache bytes", "cache bytes added per token",
                                                         "seconds per token"), atol=0, rtol=1e-6,
                      read=_three_numbers)

EXERCISES = [exercise_14_1, exercise_14_2, exercise_14_3]
