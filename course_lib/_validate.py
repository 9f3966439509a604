"""Argument checks shared by the NumPy and PyTorch trees.

They look only at ``.shape`` and at a floating-point flag, so one message serves both
frameworks, and a learner sees the argument name and the expected shape instead of a
traceback from deep inside an einsum.
"""


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
