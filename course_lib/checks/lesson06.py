"""Checks for the lesson 06 exercises (linear attention).

6.1 and 6.4 have a rule besides their values: 6.1 must never form the ``(n, s)`` kernel and 6.4
must never hold the ``n`` states of the prefix sums.  Their checks measure it: after the seeded
cases pass, the answer runs once more at a size where the forbidden array is large, and the peak
of NumPy's allocations during that call (``tracemalloc``) must stay well below that array's size.
``tracemalloc`` does not see torch's allocator, so while torch is loaded every tensor a torch
operation returns is measured too (a dispatch mode: it sees the products inside ``einsum`` as well).
6.2's rule is about Python work instead: no loop over the chunks and no call into the library's causal
forms, traced by ``course_lib.checks._tracing`` as for exercise 7.1.
"""

import sys
import tracemalloc
from dataclasses import dataclass

import numpy as np

from course_lib.checks import FAILED, CheckResult, Exercise, Mistake, Requirement
from course_lib.checks._tracing import calls_forbidden, loop_grows
from course_lib.numpy import linear

EPS = 1e-6  # the library's default: added to the normaliser (notebook 06)


def _case(seed, lead, n, d, e, scale=1.0):
    rng = np.random.default_rng(seed)
    return tuple(scale * rng.standard_normal((*lead, n, c)) for c in (d, d, e))


def _t(x):
    return np.swapaxes(x, -1, -2)


def _peak_bytes(fn, *args):
    """Peak bytes NumPy allocated while ``fn(*args)`` ran (its inputs, made before, not counted)."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    try:
        with np.errstate(all="ignore"):
            fn(*args)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:
            tracemalloc.stop()


class _TorchTensors:
    """While entered, the largest tensor any torch operation returns: ``largest = (elements, shape)``.

    Elements are counted in the tensor's storage, so a view (``expand``, a slice) of a small tensor is
    small. A no-op while torch is not loaded: a NumPy lesson never imports it.
    """

    def __init__(self):
        self.largest, self._mode = (0, ()), None

    def see(self, tensor):
        try:
            elements = tensor.untyped_storage().nbytes() // tensor.element_size()
        except (RuntimeError, NotImplementedError):  # a tensor without a plain storage (sparse, nested)
            elements = tensor.numel()
        if elements > self.largest[0]:
            self.largest = (elements, tuple(tensor.shape))

    def __enter__(self):
        torch = sys.modules.get("torch")
        if torch is not None:
            self._mode = _dispatch_mode(torch, self)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None


def _dispatch_mode(torch, record):
    """A torch dispatch mode that shows ``record`` every tensor an ATen operation returns."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Sizes(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            # Nothing here is compiled: without this, the mode's first use imports torch._dynamo (about 800
            # modules, seconds, and tens of MiB that tracemalloc would count against the answer).
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(tensor, torch.Tensor):
                    record.see(tensor)
            return out
    return _Sizes()


def _footprint(fn, *args):
    """``(NumPy's peak bytes, (elements, shape) of torch's largest tensor)`` while ``fn(*args)`` ran."""
    loaded = "torch" in sys.modules
    with _TorchTensors() as tensors:
        peak = _peak_bytes(fn, *args)
    if not loaded and "torch" in sys.modules:  # the call imported torch (counted in the peak): again, watched
        with _TorchTensors() as tensors:
            peak = _peak_bytes(fn, *args)
    return peak, tensors.largest


@dataclass
class _RuleExercise(Exercise):
    """An exercise with a rule the values cannot show: ``rule(candidate)`` → None, or (mistake, message, hint)."""

    rule: object = None
    rule_passed: str = ""  # the line a passed check adds: what the size check found

    def __call__(self, candidate, *, verbose=True):
        result = super().__call__(candidate, verbose=False)
        if result and self.rule is not None:
            try:
                broken = self.rule(candidate)
            except Exception as exc:  # the answer passed the small cases but fails at the rule's size
                broken = (None, f"  the size check raised {type(exc).__name__}: {exc}", None)
            if broken is not None:
                name, message, hint = broken
                result = CheckResult(self.number, FAILED, message + (f"\n  hint: {hint}" if hint else ""), name)
            else:
                result.message += f"\n  {self.rule_passed}"
        if verbose:
            print(result)
        return result


# --- Exercise 6.1: padded keys, never the (n, s) kernel --------------------------------------

def _padded(seed, lead, n, s, d, e, real, fill=1e3, fill_v=None):
    """q, k, v and a key mask with ``real`` real keys per row (fewer in later rows); padding holds ``fill``
    (the values' padding ``fill_v`` if given)."""
    q, k, v = _case(seed, lead, n, d, e)[0], *_case(seed + 1, lead, s, d, e)[1:]
    lengths = np.maximum(1, real - np.arange(int(np.prod(lead, dtype=int)))).reshape(lead)  # (...)
    key_mask = np.arange(s) < lengths[..., None]  # (..., s): True where the key is a real token
    k = np.where(key_mask[..., None], k, fill)  # padding: anything, even NaN
    v = np.where(key_mask[..., None], v, fill if fill_v is None else fill_v)
    return q, k, v, key_mask


def _masked(*, mask_state=True, mask_sum=True, by="where", mask_queries=False, invert=False):
    """Exercise 6.1's function, made with one slip (the defaults: none)."""
    def attention(q, k, v, key_mask):
        keep = ~key_mask if invert else key_mask
        phi_q, phi_k = linear.elu_feature_map(q), linear.elu_feature_map(k)  # (..., n, f), (..., s, f)
        if mask_queries:
            phi_q = np.where(keep[..., None], phi_q, 0.0)
        elif by == "multiply":
            phi_k, v = phi_k * keep[..., None], v * keep[..., None]  # 0 · NaN is NaN
        else:
            state_k = np.where(keep[..., None], phi_k, 0.0) if mask_state else phi_k
            v = np.where(keep[..., None], v, 0.0) if mask_state else v
            phi_k_sum = np.where(keep[..., None], phi_k, 0.0) if mask_sum else phi_k
            kv_state = _t(state_k) @ v  # (..., f, e)
            normaliser = np.einsum("...nf,...f->...n", phi_q, phi_k_sum.sum(axis=-2))  # (..., n)
            return kv_state, normaliser, phi_q @ kv_state / (normaliser[..., None] + EPS)
        kv_state = _t(phi_k) @ v
        normaliser = np.einsum("...nf,...f->...n", phi_q, phi_k.sum(axis=-2))
        return kv_state, normaliser, phi_q @ kv_state / (normaliser[..., None] + EPS)
    return attention


def _masked_reference(q, k, v, key_mask):
    kv_state, normaliser, _ = _masked()(q, k, v, key_mask)
    return kv_state, normaliser, linear.linear_attention(q, k, v, key_mask=key_mask)


def _masked_kernel(q, k, v, key_mask):
    """The right values the forbidden way: the masked (n, s) kernel of Eq. (6.1)."""
    phi_q, phi_k = linear.elu_feature_map(q), np.where(key_mask[..., None], linear.elu_feature_map(k), 0.0)
    v = np.where(key_mask[..., None], v, 0.0)
    kernel = phi_q @ _t(phi_k)  # (..., n, s)
    normaliser = kernel.sum(axis=-1)  # (..., n)
    return _t(phi_k) @ v, normaliser, kernel @ v / (normaliser[..., None] + EPS)


MISTAKES_6_1 = (
    Mistake("normaliser-counts-padding", _masked(mask_sum=False),
            "the state skips the padded keys but the normaliser still counts them: z = Σ_j phi(k_j) runs over the "
            "real keys only, like S, or the weights of the real keys sum to less than 1."),
    Mistake("state-counts-padding", _masked(mask_state=False),
            "the normaliser skips the padded keys but the state S = Σ_j phi(k_j) v_jᵀ still adds theirs: take the "
            "padded keys out of both sums."),
    Mistake("mask-by-multiplying", _masked(by="multiply"),
            "phi(k) · mask keeps the padding's NaN or inf: 0 · NaN is NaN. Padding may hold anything, so select "
            "with np.where(key_mask[..., None], phi_k, 0.0) (and the same for v)."),
    Mistake("mask-inverted", _masked(invert=True),
            "key_mask is True where the key is a real token (the library's convention): keep those, drop the "
            "False ones."),
    Mistake("queries-masked", _masked(mask_queries=True),
            "the mask removes keys, not queries: every query still gets an output, computed from the real keys "
            "only; zero the padded keys' features (and values) before the sums over the keys."),
    Mistake("forms-the-kernel", _masked_kernel,
            "the values are right, but the answer forms the (n, s) kernel phi(Q) phi(K)ᵀ — the one thing "
            "Eq. (6.3) avoids. Drop the padded keys from S = phi(K)ᵀ v (f × e) and z = Σ_j phi(k_j), then "
            "phi(Q) S: nothing of size n × s."),
)


KERNEL_PROBE = 2048  # n = s of the size check: an (n, s) float64 kernel takes 32 MiB, the answer about 1 MiB


def _no_kernel(candidate):
    """Exercise 6.1's rule: at n = s = 2048 the call may not allocate a quarter of an (n, s) kernel."""
    q, k, v, key_mask = _padded(60, (), KERNEL_PROBE, KERNEL_PROBE, 8, 8, KERNEL_PROBE - 100)
    kernel_elements = KERNEL_PROBE * KERNEL_PROBE
    kernel_bytes = kernel_elements * 8
    peak, (elements, shape) = _footprint(candidate, q, k, v, key_mask)
    if elements >= kernel_elements / 4:  # torch: the kernel in any dtype, float16 included
        return ("forms-the-kernel", f"  at n = s = {KERNEL_PROBE} (d = e = 8) the call made a torch tensor of shape "
                f"{shape} ({elements:,} elements); the (n, s) kernel has {kernel_elements:,}, Eq. (6.3)'s largest "
                "array (n, e) or (n, f) about 16,000.", MISTAKES_6_1[-1].hint)
    if peak < kernel_bytes / 4:
        return None
    return ("forms-the-kernel", f"  at n = s = {KERNEL_PROBE} (d = e = 8) the call allocated {peak / 2**20:.0f} MiB; "
            f"the (n, s) kernel alone is {kernel_bytes / 2**20:.0f} MiB, Eq. (6.3) needs about 1 MiB.",
            MISTAKES_6_1[-1].hint)


def _cases_6_1():
    return [
        ("n = s = 6, d = e = 4, the last 2 keys padded", _padded(61, (), 6, 6, 4, 4, 4), {}),
        ("n = 5 queries, s = 8 keys (3 padded), d = 4, e = 3", _padded(62, (), 5, 8, 4, 3, 5), {}),
        ("batched (b, h) = (2, 3), n = s = 10, a different number of real keys per row, padded keys NaN",
         _padded(63, (2, 3), 10, 10, 4, 4, 9, fill=np.nan, fill_v=1e3), {}),
        ("no padding (every key real), n = s = 7", _padded(64, (), 7, 7, 3, 3, 7), {}),
    ]


exercise_6_1 = _RuleExercise("6.1", "linear attention over padded keys, without the (n, s) kernel",
                             _masked_reference, _cases_6_1, MISTAKES_6_1, names=("kv_state", "normaliser", "output"),
                             rule=_no_kernel,
                             rule_passed=f"At n = s = {KERNEL_PROBE} it allocated far less than an (n, s) kernel.")


# --- Exercise 6.2: every chunk at once, its length set by a memory budget ---------------------
# The chunkwise form holds, beyond q, k, v and the output, one f × e state per chunk (n / c of them) and one
# masked c × c kernel per chunk (n · c numbers): itemsize · n · (f e / c + c) bytes.  The budget admits an
# interval of c around √(f e); the largest c in it (the fewest, largest matrix products) solves a quadratic.

def _chunk_size(n, f, e, itemsize, budget_bytes, *, per_byte=True, root=+1, kernels="all", rounding=np.floor,
                clip=True):
    """The largest c ≤ n with itemsize · n · (f e / c + c) ≤ budget; the keywords make one slip each."""
    beta = budget_bytes / ((itemsize if per_byte else 1) * n)  # c² − β c + f e ≤ 0 (all kernels)
    if kernels == "none":  # memory n f e / c only: it falls as c grows, every c ≥ n f e / β fits
        c = np.inf
    elif kernels == "one":  # one c × c kernel: n f e / c + c² ≤ β n, solved by search
        fits = [c for c in range(1, n + 1) if f * e / c + c * c / n <= beta]
        c = max(fits) if fits else 0
    else:
        disc = beta * beta - 4 * f * e
        if disc < 0:
            raise ValueError("no chunk length fits the budget")
        c = rounding((beta + root * np.sqrt(disc)) / 2)
    return int(min(c, n)) if clip else int(c)


def _chunks(x, chunk_size, drop_last=False):
    """``(..., n, w)`` → ``(..., g, c, w)``: g = ⌈n / c⌉ chunks, the last zero-padded (drop_last: ⌊n / c⌋)."""
    n = x.shape[-2]
    g = n // chunk_size if drop_last else -(-n // chunk_size)
    x = x[..., :g * chunk_size, :] if drop_last else np.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, g * chunk_size - n),
                                                                                      (0, 0)])
    return x.reshape(*x.shape[:-2], g, chunk_size, x.shape[-1])


def _chunked(*, inclusive=False, diagonal=0, masked=True, within_normaliser=True, drop_last=False, **budget):
    """Exercise 6.2's function; the keywords make one slip each (the defaults: none); ``budget``: ``_chunk_size``'s."""
    def attention(q, k, v, budget_bytes):
        n = q.shape[-2]
        c = _chunk_size(n, q.shape[-1], v.shape[-1], q.dtype.itemsize, budget_bytes, **budget)
        a, b = _chunks(linear.elu_feature_map(q), c, drop_last), _chunks(linear.elu_feature_map(k), c, drop_last)
        w = _chunks(v, c, drop_last)  # (..., g, c, e)
        per_chunk = _t(b) @ w  # (..., g, f, e): Σ_j phi(k_j) v_jᵀ within each chunk
        keys = b.sum(axis=-2)  # (..., g, f)
        states, key_states = np.cumsum(per_chunk, axis=-3), np.cumsum(keys, axis=-2)  # up to and including g
        if not inclusive:
            states, key_states = states - per_chunk, key_states - keys  # the chunks before g only
        scores = a @ _t(b)  # (..., g, c, c)
        if masked:
            scores = np.tril(scores, diagonal)
        normaliser = np.einsum("...gif,...gf->...gi", a, key_states)  # (..., g, c)
        if within_normaliser:
            normaliser = normaliser + scores.sum(axis=-1)
        output = (a @ states + scores @ w) / (normaliser[..., None] + EPS)  # (..., g, c, e)
        length = n if not drop_last else output.shape[-3] * c
        return c, states, output.reshape(*output.shape[:-3], -1, output.shape[-1])[..., :length, :]
    return attention


def _chunked_reference(q, k, v, budget_bytes):
    c, states, _ = _chunked()(q, k, v, budget_bytes)
    return c, states, linear.causal_linear_attention(q, k, v, chunk_size=None)  # the output: prefix sums


MISTAKES_6_2 = (
    Mistake("numbers-not-bytes", _chunked(per_byte=False),
            "the budget is in bytes and each number takes q.dtype.itemsize of them (8 in float64, 4 in float32): "
            "n · (f e / c + c) numbers take itemsize times as many bytes. Your chunks overrun the budget."),
    Mistake("smallest-chunk-that-fits", _chunked(root=-1, rounding=np.ceil),
            "the budget admits every c between the two roots of c² − β c + f e = 0 (β = budget / (itemsize · n)); "
            "you took the smallest. Take the largest: the fewest, largest matrix products for the same memory."),
    Mistake("kernels-not-counted", _chunked(kernels="none"),
            "the c × c kernels are memory too: with every chunk at once they take n · c numbers, which grows with "
            "c, while the n / c states shrink. Count both, itemsize · n · (f e / c + c) bytes, and the budget caps "
            "c from above."),
    Mistake("one-kernel-counted", _chunked(kernels="one"),
            "with every chunk at once, all n / c masked kernels exist together: n · c numbers, not one c × c "
            "kernel's c²."),
    Mistake("rounded-up", _chunked(rounding=np.ceil),
            "c is a whole number of positions at most the larger root: round it down (np.floor); rounded up, the "
            "chunks overrun the budget."),
    Mistake("chunk-longer-than-the-sequence", _chunked(clip=False),
            "a chunk never holds more than the n positions there are: a budget that admits c > n gives c = n "
            "(one chunk)."),
    Mistake("inclusive-states", _chunked(inclusive=True),
            "the carried state must hold the chunks *before* chunk g only (the first chunk's is zero): a cumulative "
            "sum over the chunk summaries includes chunk g itself, so subtract it (np.cumsum(...) − per_chunk), or "
            "each position counts its chunk twice and sees the rest of it (Eq. 6.6)."),
    Mistake("unmasked-chunk", _chunked(masked=False),
            "inside its chunk, position i may only see j ≤ i: mask the c × c kernels with np.tril before using them "
            "(Eq. 6.6). Unmasked, every position reads the rest of its chunk — the future."),
    Mistake("strict-mask", _chunked(diagonal=-1),
            "np.tril(..., -1) drops the diagonal: position i attends to itself (j ≤ i), so keep k = 0."),
    Mistake("normaliser-across-only", _chunked(within_normaliser=False),
            "the normaliser has the same two parts as the numerator: phi(q_i)·z_<g from the earlier chunks plus "
            "the row sums of the masked c × c kernel (Eq. 6.6 with v = 1)."),
    Mistake("last-chunk-dropped", _chunked(drop_last=True),
            "n // c chunks drop the last, shorter chunk when c does not divide n: use ⌈n / c⌉ chunks and pad the "
            "last with zero rows (zeros add nothing to a sum), then cut the outputs back to n positions."),
)


def _cases_6_2():
    return [  # budgets in bytes; the larger root of c² − β c + f e, β = budget / (itemsize · n), in brackets
        ("n = 80, d = e = 4, 5600 bytes (c = 6 [6.15]: the last chunk is short)", (*_case(81, (), 80, 4, 4), 5600),
         {}),
        ("n = 12, d = e = 2, 450 bytes (c = 3 [3.57])", (*_case(82, (), 12, 2, 2), 450), {}),
        ("n = 6, d = e = 3, 1 MB (one chunk: c = n)", (*_case(83, (), 6, 3, 3), 10**6), {}),
        ("n = 7, d = e = 1, 121 bytes (c = 1 [1.49]: every chunk one position)", (*_case(84, (), 7, 1, 1), 121), {}),
        ("batched (b, h) = (2, 3), n = 16, d = e = 4, 1076 bytes (c = 5 [5.49])",
         (*_case(85, (2, 3), 16, 4, 4), 1076), {}),
        ("float32, n = 20, d = e = 3, 690 bytes (c = 7 [7.41]: 4 bytes a number)",
         (*(x.astype(np.float32) for x in _case(86, (), 20, 3, 3)), 690), {}),
    ]


# What Exercise 6.2 asks the learner to write: the library's causal forms and the check's own reference.
_FORBIDDEN_6_2 = frozenset({"causal_linear_attention", "causal_linear_attention_from_features",
                            "causal_linear_attention_reference", "chunked_causal_sums"})
ONE_CHUNK, MANY_CHUNKS = 10**7, 1400  # n = 64, d = e = 1: c = 64 (one chunk) and c = 2 (32 chunks)


def _no_library_call_6_2(candidate):
    return calls_forbidden(candidate, (*_case(87, (), 16, 2, 2), 10**6), _FORBIDDEN_6_2)


def _no_chunk_loop(candidate):
    """None when one chunk and 32 chunks of the same sequence cost the same Python work: no loop over chunks."""
    q, k, v = _case(88, (), 64, 1, 1)
    grows = loop_grows(candidate, (q, k, v, ONE_CHUNK), (q, k, v, MANY_CHUNKS))
    if grows is None:
        return None
    return (f"for 32 chunks of 2 positions your function ran {grows[1]} lines and calls of Python code (its own, "
            f"its helpers' in any cell), for one chunk of 64 {grows[0]}: it loops over the chunks (or searches "
            "for c one candidate at a time).")


def _chunk_loop(q, k, v, budget_bytes):
    """The right values with a Python loop over the chunks (lesson 06's loop); no helper of this module."""
    n, f, e = q.shape[-2], q.shape[-1], v.shape[-1]
    beta = budget_bytes / (q.dtype.itemsize * n)
    c = int(min(np.floor((beta + np.sqrt(beta * beta - 4 * f * e)) / 2), n))
    phi_q, phi_k = linear.elu_feature_map(q), linear.elu_feature_map(k)
    S, z = np.zeros((*q.shape[:-2], f, e)), np.zeros((*q.shape[:-2], f))
    states, out = [], []
    for start in range(0, n, c):
        a, b, w = phi_q[..., start:start + c, :], phi_k[..., start:start + c, :], v[..., start:start + c, :]
        states.append(S)
        scores = np.tril(a @ np.swapaxes(b, -1, -2))  # (..., c, c)
        out.append((a @ S + scores @ w) / (np.einsum("...if,...f->...i", a, z) + scores.sum(-1) + EPS)[..., None])
        S, z = S + np.swapaxes(b, -1, -2) @ w, z + b.sum(axis=-2)
    return c, np.stack(states, axis=-3), np.concatenate(out, axis=-2)


def _chunked_by_library(q, k, v, budget_bytes):
    c, states, _ = _chunked()(q, k, v, budget_bytes)
    return c, states, linear.causal_linear_attention(q, k, v, chunk_size=c)


REQUIREMENTS_6_2 = (
    Requirement("calls-the-library", _no_library_call_6_2,
                "the values are right, but the outputs come from the library's causal linear attention (or the "
                "check's reference), the computation this exercise asks you to write: build them from "
                "elu_feature_map and NumPy.",
                _chunked_by_library),
    Requirement("loops-over-chunks", _no_chunk_loop,
                "the values are right, but Python work grows with the number of chunks: a loop over them (lesson "
                "06's), in your function or a helper. Do every chunk at once: reshape to (..., g, c, w), the masked "
                "c × c kernels of all chunks in one product, the states before each chunk by one cumulative sum "
                "over the chunk summaries; and c from the budget in closed form, not by trying candidates.",
                _chunk_loop),
)

exercise_6_2 = Exercise("6.2", "every chunk at once, its length set by a memory budget", _chunked_reference,
                        _cases_6_2, MISTAKES_6_2, names=("chunk_size", "states_before", "output"),
                        requirements=REQUIREMENTS_6_2)


# --- Exercise 6.3: what cancellation does to the output: the worst case of a small weight error -------
# Weights that are off by a relative ε each (random features estimate them, float rounds them) move output i by
# δo_i = Σ_j δ_ij (v_j − o_i) / z_i to first order, so at worst by ε Σ_j |w_ij| |v_j − o_i| / |z_i|, entry by entry:
# a weighted average's condition number.  It is at most ε max_j |v_j − o_i| / ρ_i, ρ_i = |z_i| / Σ_j |w_ij| the
# cancellation ratio: weights that cancel amplify every error in them.

def _sensitivity(*, map_keys=True, abs_after_sum=False, inverted=False, dead=1.0, normaliser_moves=True,
                 absolute=True, through_ratio=False):
    """Exercise 6.3's function; the keywords make one slip each (the defaults: none)."""
    def report(q, k, v, feature_map, eps):
        weights = feature_map(q) @ _t(feature_map(k) if map_keys else k)  # (..., n, s): small sizes only
        normaliser = weights.sum(axis=-1)  # (..., n): z_i
        size = np.abs(normaliser) if abs_after_sum else np.abs(weights).sum(axis=-1)  # Σ_j |w_ij|
        live = size > 0  # a row without weights (relu zeroes a query): nothing cancels, nothing moves
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = size / np.abs(normaliser) if inverted else np.abs(normaliser) / size
            ratio = np.where(live, ratio, dead) if dead is not None else ratio
            output = np.where(live[..., None], weights @ v / normaliser[..., None], 0.0)  # (..., n, e)
            spread = v[..., None, :, :] - output[..., :, None, :] if normaliser_moves else v[..., None, :, :]
            if through_ratio:  # the bound through ρ: larger than the worst case unless all |v_j − o_i| are equal
                moved = eps * np.abs(spread).max(axis=-2) / ratio[..., None]
            elif absolute:
                moved = eps * np.einsum("...ns,...nse->...ne", np.abs(weights), np.abs(spread))
                moved = moved / np.abs(normaliser)[..., None]
            else:
                moved = eps * np.abs(np.einsum("...ns,...nse->...ne", weights, spread)) / np.abs(normaliser)[..., None]
            moved = np.where(live[..., None], moved, 0.0)
        return ratio, moved
    return report


MISTAKES_6_3 = (
    Mistake("keys-not-mapped", _sensitivity(map_keys=False),
            "the weights used the raw keys: w_ij = phi(q_i)·phi(k_j), with the feature map applied to the keys too."),
    Mistake("abs-after-the-sum", _sensitivity(abs_after_sum=True),
            "every ratio is 1: the denominator took the absolute value after summing, |Σ_j w_ij|. It is "
            "Σ_j |w_ij|, the absolute values summed, which is larger than |z_i| exactly when the terms cancel."),
    Mistake("inverted-ratio", _sensitivity(inverted=True),
            "that is the amplification Σ_j |w_ij| / |z_i| (1 or more): the cancellation ratio is its inverse, "
            "|z_i| / Σ_j |w_ij|, between 0 and 1."),
    Mistake("ratio-0-for-rows-without-weights", _sensitivity(dead=0.0),
            "a row whose weights are all zero (relu zeroes a query whose entries are all negative) gets ratio 1, "
            "not 0: it has no terms that cancel. Use np.where(size > 0, ratio, 1.0)."),
    Mistake("nan-for-rows-without-weights", _sensitivity(dead=None),
            "a row whose weights are all zero (relu zeroes a query whose entries are all negative) gives 0 / 0: "
            "nothing cancels there, so its ratio is 1, and with no weight to be wrong its output cannot move (0)."),
    Mistake("normaliser-held-fixed", _sensitivity(normaliser_moves=False),
            "the normaliser is a sum of the same weights, so it moves with them: to first order "
            "δo_i = Σ_j δ_ij (v_j − o_i) / z_i, not Σ_j δ_ij v_j / z_i. Measure each value from the output, "
            "v_j − o_i."),
    Mistake("errors-that-cancel", _sensitivity(absolute=False),
            "every entry is 0: Σ_j w_ij (v_j − o_i) is 0 by the definition of o_i. The worst case picks the sign of "
            "each error δ_ij against you: sum the absolute values, ε Σ_j |w_ij| |v_j − o_i| / |z_i|."),
    Mistake("bound-through-the-ratio", _sensitivity(through_ratio=True),
            "ε max_j |v_j − o_i| / ρ_i bounds the move, but it is not the worst case: the worst error weighs each "
            "|v_je − o_ie| by its own |w_ij|, ε Σ_j |w_ij| |v_je − o_ie| / |z_i|, entry by entry."),
)


def _trig_map(seed, d, m=32):
    """Random Fourier features [cos ωᵀx, sin ωᵀx] / √m: signed, an unbiased estimate of exp(−‖x − y‖²/2)."""
    omega = np.random.default_rng(seed).standard_normal((m, d))

    def trig(x):
        projections = x @ omega.T  # (..., n, m)
        return np.concatenate([np.cos(projections), np.sin(projections)], axis=-1) / np.sqrt(m)
    return trig


def _cases_6_3():
    identity = lambda x: x  # noqa: E731 (the broken map under study)
    rng = np.random.default_rng(69)
    relu_q, relu_k = rng.standard_normal((2, 64, 2))  # d = 2: about a quarter of the queries all negative
    return [
        ("identity map, n = s = 32, d = 4, e = 3, ε = 1e-3", (*_case(67, (), 32, 4, 3), identity, 1e-3), {}),
        ("elu + 1, batched (2, 3), n = s = 12, d = 3, e = 2, ε = 0.01",
         (*_case(68, (2, 3), 12, 3, 2), linear.elu_feature_map, 0.01), {}),
        ("random Fourier (trig) features, n = s = 24, d = 4, m = 32, e = 3, ε = 1e-3",
         (*_case(70, (), 24, 4, 3), _trig_map(71, 4), 1e-3), {}),
        ("relu, n = s = 64, d = 2, e = 2 (some queries all negative), ε = 0.01",
         (relu_q, relu_k, rng.standard_normal((64, 2)), linear.relu_feature_map, 0.01), {}),
    ]


exercise_6_3 = Exercise("6.3", "what cancellation does to the output", _sensitivity(), _cases_6_3, MISTAKES_6_3,
                        names=("cancellation", "sensitivity"))


# --- Exercise 6.4: the gradients of Eq. (6.5) with one running state -------------------------

def _reverse_cumsum(x, axis):
    return np.flip(np.cumsum(np.flip(x, axis=axis), axis=axis), axis=axis)


def _backward(*, old_state=False, suffix="inclusive", grad_v_features="k"):
    """Exercise 6.4's function written with all n states; the keywords make one slip each (defaults: none)."""
    def backward(phi_q, phi_k, v, grad):
        outer = phi_k[..., :, :, None] * v[..., :, None, :]  # (..., n, f, e)
        states = np.cumsum(outer, axis=-3)  # S_i
        if old_state:
            states = states - outer  # S_{i-1}: token i not yet in
        reads = phi_q[..., :, :, None] * grad[..., :, None, :]  # (..., n, f, e): phi(q_i) G_iᵀ
        future = {"inclusive": _reverse_cumsum(reads, -3),  # Σ_{i ≥ j}
                  "exclusive": _reverse_cumsum(reads, -3) - reads,  # Σ_{i > j}
                  "prefix": np.cumsum(reads, axis=-3)}[suffix]  # Σ_{i ≤ j}: the wrong direction in time
        features = phi_k if grad_v_features == "k" else phi_q
        return (np.einsum("...nfe,...ne->...nf", states, grad), np.einsum("...nfe,...ne->...nf", future, v),
                np.einsum("...nfe,...nf->...ne", future, features))
    return backward


def _backward_reference(phi_q, phi_k, v, grad):
    """Eq. (6.5) as the paper's scan: one running f × e sum forward in time, one backward."""
    grad_phi_q, grad_phi_k, grad_v = np.zeros_like(phi_q), np.zeros_like(phi_k), np.zeros_like(v)
    state = np.zeros((*phi_k.shape[:-2], phi_k.shape[-1], v.shape[-1]))  # (..., f, e): S_i
    for i in range(phi_q.shape[-2]):
        state += phi_k[..., i, :, None] * v[..., i, None, :]
        grad_phi_q[..., i, :] = np.einsum("...fe,...e->...f", state, grad[..., i, :])
    future = np.zeros_like(state)  # (..., f, e): Σ_{i ≥ j} phi(q_i) G_iᵀ
    for j in reversed(range(phi_q.shape[-2])):
        future += phi_q[..., j, :, None] * grad[..., j, None, :]
        grad_phi_k[..., j, :] = np.einsum("...fe,...e->...f", future, v[..., j, :])
        grad_v[..., j, :] = np.einsum("...fe,...f->...e", future, phi_k[..., j, :])
    return grad_phi_q, grad_phi_k, grad_v


MISTAKES_6_4 = (
    Mistake("old-state", _backward(old_state=True),
            "∂L/∂phi(q_i) reads S_i, which holds token i itself (j ≤ i): add phi(k_i) v_iᵀ to the running state "
            "before you read it, as the forward does."),
    Mistake("suffix-exclusive", _backward(suffix="exclusive"),
            "the sum for ∂L/∂phi(k_j) and ∂L/∂v_j runs over i ≥ j: query j itself read key j, so add "
            "phi(q_j) G_jᵀ to the backward running sum before you use it at position j."),
    Mistake("wrong-direction", _backward(suffix="prefix"),
            "key j is read by the queries at and after it (i ≥ j): that running sum runs backward in time, from "
            "the last position down to j (Eq. 6.5), not forward like the one for ∂L/∂phi(q)."),
    Mistake("grad-v-with-query-features", _backward(grad_v_features="q"),
            "∂L/∂v_j = (Σ_{i ≥ j} phi(q_i) G_iᵀ)ᵀ phi(k_j): the key features of position j, not its query features."),
    Mistake("keeps-all-states", _backward(),
            "the values are right, but the answer holds an (n, f, e) array — all n states or all suffix sums, "
            "the memory Eq. (6.5) exists to avoid. Keep one f × e running sum: loop forward for ∂L/∂phi(q), "
            "then backward from the last position for ∂L/∂phi(k) and ∂L/∂v."),
)


def _backward_case(seed, lead, n, f, e):
    rng = np.random.default_rng(seed)
    phi_q, phi_k = (linear.elu_feature_map(rng.standard_normal((*lead, n, f))) for _ in range(2))
    return phi_q, phi_k, rng.standard_normal((*lead, n, e)), rng.standard_normal((*lead, n, e))


def _cases_6_4():
    return [
        ("n = 6, f = e = 3", _backward_case(91, (), 6, 3, 3), {}),
        ("n = 9, f = 4, e = 2", _backward_case(92, (), 9, 4, 2), {}),
        ("n = 1 (one position)", _backward_case(93, (), 1, 3, 3), {}),
        ("batched (b, h) = (2, 3), n = 8, f = e = 4", _backward_case(94, (2, 3), 8, 4, 4), {}),
    ]


STATES_PROBE = (1024, 64, 64)  # n, f, e of the size check: the n states take 32 MiB in float64


def _one_running_state(candidate):
    """Exercise 6.4's rule: at n = 1024, f = e = 64 the call may not allocate a quarter of the n states."""
    n, f, e = STATES_PROBE
    states_bytes = n * f * e * 8
    peak, (elements, shape) = _footprint(candidate, *_backward_case(90, (), n, f, e))
    if elements >= n * f * e / 4:
        return ("keeps-all-states", f"  at n = {n}, f = e = {f} the call made a torch tensor of shape {shape} "
                f"({elements:,} elements); the n states have {n * f * e:,}, the gradients {3 * n * f:,}.",
                MISTAKES_6_4[-1].hint)
    if peak < states_bytes / 4:
        return None
    return ("keeps-all-states", f"  at n = {n}, f = e = {f} the call allocated {peak / 2**20:.0f} MiB; the n states "
            f"alone are {states_bytes / 2**20:.0f} MiB, the gradients themselves {3 * n * f * 8 / 2**20:.1f} MiB.",
            MISTAKES_6_4[-1].hint)


exercise_6_4 = _RuleExercise("6.4", "the backward of Eq. (6.5) with one running state", _backward_reference,
                             _cases_6_4, MISTAKES_6_4, names=("grad_phi_q", "grad_phi_k", "grad_v"),
                             rule=_one_running_state,
                             rule_passed=f"At n = {STATES_PROBE[0]}, f = e = {STATES_PROBE[1]} it allocated far "
                                         "less than the n states.")

EXERCISES = [exercise_6_1, exercise_6_2, exercise_6_3, exercise_6_4]
