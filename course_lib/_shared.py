"""Constants and framework-free helpers that both trees need.

STYLE: the torch tree never imports the NumPy tree, so what ``course_lib.numpy.<module>`` and
``course_lib.torch.<module>`` must agree on lives here, in plain Python (no NumPy, no torch),
and each tree re-exports it under its usual name.
"""

import numbers

# --- linear attention (notebook 06) -------------------------------------------------------------
# The chunk size of every causal call that does not name one (both trees, linear attention and
# causal FAVOR+), measured by
#     .venv/bin/python tools/bench_linear.py --n 1024 4096 16384 --chunks 16 32 64 128 256 --rounds 3 --memory --numpy
# (torch forward+backward, b = 1, h = 4, d = 64, elu+1 and FAVOR+ with m = 256, one thread, least CPU time
# of 9 calls).  c = 64 was the fastest at every n for both: at n = 16,384, elu+1 279 ms against 338 ms
# (c = 128) and 354 ms (c = 32), FAVOR+ 1.36 s against 1.41 s and 2.21 s; its peak memory is within
# 25 % of the least (c = 128).  The NumPy forward is as fast with 64 as with 128 (268 ms at n = 16,384).
# Measured on a shared 2-core AMD EPYC: provisional.  chunk_size=None selects the prefix sums of notebook 06.
LINEAR_CHUNK_SIZE = 64


def check_causal(q, k, chunk_size):
    """Causal attention needs n = s, and ``chunk_size`` is None (prefix sums) or a positive int."""
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal attention needs as many queries as keys (n = s), got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}.")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral)):
        raise TypeError(f"chunk_size must be None (prefix sums) or a positive int, got {chunk_size!r}.")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int (positions per chunk), got {chunk_size}.")


# --- recurrences (notebooks 11-13) ---------------------------------------------------------------
# Positions per chunk of every gated_linear_attention and delta-rule call that does not name one (both
# trees).  Chosen by the lesson-12 grid, ``python -m course_lib.bench --preset recurrent`` (b = 1, h = 4,
# d = e = 64, float32, forward+backward of the PyTorch form, one thread): see the comment on
# course_lib.bench.presets.RECURRENT for the measured times.  chunk_size=None is the token loop.
RECURRENT_CHUNK_SIZE = 32

# Positions per sub-chunk of gated_linear_attention with a decay per channel (Yang et al. 2024, §4).  Work
# per position and channel grows as c' (the c' × c' decays inside a sub-chunk) plus c / c' (keys rescaled
# for each later sub-chunk): least near c' = √c.  Measured with the PyTorch form, forward+backward, b = 1,
# h = 4, n = 4096, d = e = 64, float32, one thread, least of 9 calls, as a multiple of the same call with a
# decay per head: at c = 32, c' = 4: 2.34, 8: 2.13, 16: 2.36, 32 (no sub-chunks): 3.17; at c = 64, c' = 4:
# 2.55, 8: 2.23, 16: 2.55.  On a shared 2-core Intel Xeon: provisional.
SUB_CHUNK_SIZE = 8


# --- FAVOR+ (notebook 08) -----------------------------------------------------------------------
FEATURES = ("positive", "hyperbolic", "trig")
SCALINGS = ("chi", "sqrt_d")
# Causal key features are at most e^HEADROOM (see the NumPy tree's _key_shift): sums of 1e9 such
# keys times values of 1e12 stay below float32's maximum e^88, while a key exponent may sit 87 + 40
# below the bound before its feature leaves float32's normal range (typical keys sit ~50 below it
# at d = 64, ~90 at d = 128).
HEADROOM = 40.0


def check_sizes(**sizes):
    """Each keyword must be a positive whole number (``m=``, ``d=``, ``n_layers=`` …)."""
    for name, value in sizes.items():
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")


# --- Linformer (notebooks 04 and 05) ------------------------------------------------------------
SHARING_MODES = ("none", "headwise", "key-value", "layerwise")


def count_projection_matrices(n_layers, n_heads, sharing):
    """How many distinct k × n projection matrices a model has. Notebook 05, Eq. (5.3); Wang et al. 2020, §4.

    ``"none"``: an E and an F per head per layer (2·L·h); ``"headwise"``: one E and one F per
    layer, shared by its heads (2·L); ``"key-value"``: one matrix per layer, E = F (L);
    ``"layerwise"``: one matrix for the whole model (1).
    """
    check_sizes(n_layers=n_layers, n_heads=n_heads)
    counts = {"none": 2 * n_layers * n_heads, "headwise": 2 * n_layers, "key-value": n_layers, "layerwise": 1}
    if sharing not in counts:
        raise ValueError(f"sharing must be one of {', '.join(map(repr, SHARING_MODES))}; got {sharing!r}.")
    return counts[sharing]


def pooling_blocks(k, s):
    """The k consecutive blocks of positions that mean pooling averages: ``[(start, stop), …]``.

    Sizes as ``numpy.array_split``: the first ``s % k`` blocks hold one position more, so k need
    not divide s.
    """
    for name, value, low in (("k", k, 1), ("s", s, k)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ValueError(f"{name} must be an integer >= {low} (1 <= k <= s positions), got {value!r}.")
    size, extra = divmod(s, k)
    stops = [(i + 1) * size + min(i + 1, extra) for i in range(k)]
    return list(zip([0, *stops[:-1]], stops, strict=True))
