"""Argument checks shared by the NumPy and PyTorch trees.

They look only at ``.shape`` and at a floating-point flag, so one message serves both
frameworks, and a learner sees the argument name and the expected shape instead of a
traceback from deep inside an einsum.  Constants both trees need live in ``course_lib/_shared.py``.
"""

import math
import numbers


def _broadcastable(a, b):
    """True when two shape tuples broadcast against each other."""
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b), strict=False))


def check_float(name, x, is_float):
    """Raise TypeError unless ``x`` holds floating-point numbers."""
    if not is_float:
        raise TypeError(
            f"{name} must hold floating-point numbers (float16/32/64), got dtype {x.dtype}; "
            f"convert it first, e.g. {name}.astype(float) or {name}.float()."
        )


def check_qkv(q, k, v=None):
    """Check ``q (..., n, d)``, ``k (..., s, d)`` and ``v (..., s, e)`` agree."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x is not None and len(x.shape) < 2:
            raise ValueError(f"{name} must have shape (..., positions, dim), got {tuple(x.shape)}.")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share the head dim d: q is (..., n, d) = {tuple(q.shape)}, "
            f"k is (..., s, d) = {tuple(k.shape)}."
        )
    if not _broadcastable(q.shape[:-2], k.shape[:-2]):
        raise ValueError(
            f"q and k leading (batch/head) dims do not broadcast: q {tuple(q.shape)}, k {tuple(k.shape)}."
        )
    if v is None:
        return
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of key positions s: k is (..., s, d) = "
            f"{tuple(k.shape)}, v is (..., s, e) = {tuple(v.shape)}."
        )
    if not _broadcastable(k.shape[:-2], v.shape[:-2]):
        raise ValueError(
            f"k and v leading (batch/head) dims do not broadcast: k {tuple(k.shape)}, v {tuple(v.shape)}."
        )


def check_key_mask(key_mask, k, is_bool):
    """Check a boolean ``key_mask (..., s)`` against ``k (..., s, d)``."""
    if key_mask is None:
        return
    if not is_bool:
        raise TypeError(
            f"key_mask must be boolean (True where the key is a real token), got dtype {key_mask.dtype}."
        )
    s = k.shape[-2]
    if len(key_mask.shape) < 1 or key_mask.shape[-1] != s:
        raise ValueError(
            f"key_mask must have shape (..., s) with s = {s} key positions (k is {tuple(k.shape)}), "
            f"got {tuple(key_mask.shape)}."
        )
    if not _broadcastable(key_mask.shape[:-1], k.shape[:-2]):
        raise ValueError(
            f"key_mask leading dims {tuple(key_mask.shape[:-1])} do not broadcast with the keys' "
            f"{tuple(k.shape[:-2])}; for k of shape (b, h, s, d) pass a mask of shape (b, 1, s)."
        )


def check_heads(d_model, n_heads):
    """Check that ``n_heads`` divides the model width."""
    if n_heads < 1 or d_model % n_heads:
        raise ValueError(
            f"n_heads must be a positive divisor of the model width: d_model = {d_model}, n_heads = {n_heads}."
        )


def check_projection(name, proj, k, is_float):
    """Check a Linformer projection ``proj (..., k, n)`` against keys ``k (..., s, d)``: n ≥ s ≥ 1."""
    check_float(name, proj, is_float)
    s = k.shape[-2]
    if len(proj.shape) < 2:
        raise ValueError(f"{name} must have shape (..., k, n) (projected length k, maximum length n), "
                         f"got {tuple(proj.shape)}.")
    rows, cols = proj.shape[-2:]
    if rows > cols:
        raise ValueError(f"{name} has k = {rows} rows, more than its n = {cols} columns: Linformer projects "
                         f"n positions down to k <= n. Did you pass {name} transposed, as (n, k)?")
    if cols < s:
        raise ValueError(f"{name} must have shape (..., k, n) with n >= s = {s} key positions (the keys "
                         f"have shape {tuple(k.shape)}), got {tuple(proj.shape)}: the input is longer than "
                         "the maximum length.")
    if not _broadcastable(proj.shape[:-2], k.shape[:-2]):
        raise ValueError(f"{name} leading dims {tuple(proj.shape[:-2])} do not broadcast with the keys' "
                         f"{tuple(k.shape[:-2])}; use (k, n) for one projection, (h, k, n) for one per head.")


def check_chunk_size(chunk_size, is_int=None):
    """``chunk_size`` is None (the token loop or prefix sums) or a positive int (NumPy's integers too).

    ``is_int`` overrides the test ``isinstance(chunk_size, numbers.Integral)``; a bool is never a size.
    """
    is_int = isinstance(chunk_size, numbers.Integral) if is_int is None else is_int
    if chunk_size is not None and (isinstance(chunk_size, bool) or not is_int):
        raise TypeError(f"chunk_size must be None (the token loop) or a positive int, got {chunk_size!r}.")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int (positions per chunk), got {chunk_size}.")


def check_recurrence(q, k, v):
    """``q (..., n, d)``, ``k (..., n, d)``, ``v (..., n, e)``: one query, key and value per token."""
    check_qkv(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"a recurrence needs one query per key (n = s): q is {tuple(q.shape)}, k is {tuple(k.shape)}.")


def per_channel(log_decay, k, name="log_decay"):
    """True for a decay per channel ``(..., n, d)``, False for one per head ``(..., n)``; else ValueError.

    The rank tells them apart (a decay per channel has the rank of ``k``), so a decay per head of a
    ``(b, h, n, d)`` input is ``(b, h, n)``, never ``(h, n)``.
    """
    n, d, rank = k.shape[-2], k.shape[-1], len(k.shape)
    shape = tuple(log_decay.shape)
    if len(shape) == rank - 1 and shape[-1:] == (n,) and _broadcastable(shape[:-1], k.shape[:-2]):
        return False
    if len(shape) == rank and shape[-2:] == (n, d) and _broadcastable(shape[:-2], k.shape[:-2]):
        return True
    raise ValueError(f"{name} must have shape (..., n) = {(*k.shape[:-2], n)} (one decay per head and token) or "
                     f"(..., n, d) = {tuple(k.shape)} (one per channel), with k's leading dims; got {shape}.")


def check_finite(name, lowest, highest):
    """Refuse NaN and ±inf in an input, given its min and max (NaN when any value is NaN).

    Through the recurrent state one NaN or inf spoils every later output, far from its cause.
    """
    if lowest != lowest or highest != highest:
        raise ValueError(f"{name} holds NaN values: through the state one NaN spoils every later output; find where "
                         "it came from (0 / 0, inf - inf, 0 * inf).")
    if math.isinf(lowest) or math.isinf(highest):
        raise ValueError(f"{name} must be finite, got values in [{lowest:.3g}, {highest:.3g}]: through the state one "
                         "inf spoils every later output; find the overflow that made it.")


def check_log_decay(name, largest, finite):
    """A log decay is finite and ≤ 0 (a decay a = e^{log a} in (0, 1]).  ``largest`` is its max: NaN if any is."""
    if largest != largest:  # a max is NaN when any value is
        raise ValueError(f"{name} holds NaN values: a NaN decay makes the state, and every later output, NaN; "
                         "find where it came from (log of a negative number, 0 * inf, an overflow in the gate).")
    if not finite and largest <= 0:
        raise ValueError(f"{name} must be finite: a decay of exactly 0 (log = -inf) makes the masked differences "
                         "-inf - (-inf) = NaN; use a large negative value such as -30 instead.")
    if largest > 0:
        raise ValueError(f"{name} must be <= 0 (a decay a = exp({name}) in (0, 1]), got values up to {largest:.3g}: "
                         "a positive log decay makes the state grow without bound. Pass log(a), e.g. logsigmoid(x).")


def check_beta(beta, k, lowest, highest, name="beta"):
    """``beta (..., n)`` with one writing strength per token, in [0, 2] (above 1: a negative eigenvalue)."""
    n = k.shape[-2]
    if len(beta.shape) != len(k.shape) - 1 or beta.shape[-1:] != (n,) or not _broadcastable(beta.shape[:-1],
                                                                                           k.shape[:-2]):
        raise ValueError(f"{name} must have shape (..., n) = {(*k.shape[:-2], n)}, one strength per token (k is "
                         f"{tuple(k.shape)}); got {tuple(beta.shape)}.")
    if lowest != lowest or highest != highest:  # a min or max is NaN when any value is
        raise ValueError(f"{name} holds NaN values: a NaN step size makes the state, and every later output, NaN.")
    if not (lowest >= 0 and highest <= 2):
        raise ValueError(f"{name} must lie in [0, 2] (the delta rule's step size; above 1 the update I - beta k k^T "
                         f"has a negative eigenvalue), got values in [{lowest:.3g}, {highest:.3g}]; squash it with "
                         "a sigmoid, or 2 * sigmoid for negative eigenvalues.")


def key_norm_warning(largest_product):
    """The text of the warning for keys with β‖k‖² > 2: the update's eigenvalue 1 − β‖k‖² leaves [−1, 1]."""
    return (f"keys with beta * ||k||^2 up to {largest_product:.3g} > 2: the delta update I - beta k k^T then has an "
            "eigenvalue 1 - beta ||k||^2 below -1 and the state can grow without bound; L2-normalise the keys.")


def check_state(name, state, lead, d, e):
    """An ``initial_state`` or step state ``(..., d, e)``: keys × values."""
    if state is None:
        return
    shape = tuple(state.shape)
    if len(shape) < 2 or shape[-2:] != (d, e) or not _broadcastable(shape[:-2], lead):
        raise ValueError(f"{name} must have shape (..., d, e) = {(*lead, d, e)} (keys x values, as returned with "
                         f"return_state=True), got {shape}.")


def check_n_householder(n_householder):
    """DeltaProduct's steps a token: a positive int (a NumPy integer too)."""
    if isinstance(n_householder, bool) or not isinstance(n_householder, numbers.Integral) or n_householder < 1:
        raise ValueError(f"n_householder must be a positive int (delta-rule steps per token), got {n_householder!r}.")


def check_householder(n_householder, q, k, v, beta):
    """DeltaProduct: ``q (..., n, d)``, ``k (..., n·n_h, d)``, ``v (..., n·n_h, e)``, ``beta (..., n·n_h)``."""
    check_n_householder(n_householder)
    for name, x, rank in (("q", q, 2), ("k", k, 2), ("v", v, 2), ("beta", beta, 1)):
        if len(x.shape) < rank:
            raise ValueError(f"{name} must have a positions axis, got shape {tuple(x.shape)}.")
    n = q.shape[-2]
    for name, x, axis in (("k", k, -2), ("v", v, -2), ("beta", beta, -1)):
        if x.shape[axis] != n * n_householder:
            raise ValueError(f"{name} must have n * n_householder = {n} * {n_householder} = {n * n_householder} "
                             f"positions (one per Householder step, token-major; q has n = {n}), got "
                             f"{x.shape[axis]} ({name} is {tuple(x.shape)}).")
