"""Cost per generated token versus its position: the RNN step of linear attention against softmax.

Notebook 07; Katharopoulos et al. 2020, §3.4 and Table 3 (image generation: constant cost per
token for the linear transformer, growing cost for softmax).  Autoregressive generation makes
one token at a time; token t attends to positions 1 … t.  Three ways to compute its attention:

- ``linear_step``: ``linear_attention_step`` on the state (S, Z): O(f·e) work and a constant
  f × (e + 1) state per head, whatever t;
- ``softmax_cache``: the new query against a key/value cache of the t keys and values so far:
  O(t·d) work per token, a cache that grows by 2·d numbers per head and token;
- ``softmax_no_cache``: the causal attention of the whole prefix recomputed, as a model without
  a cache must (each layer needs every position's output of the layer below): O(t²·d) per token.

How it is measured: the three methods advance through the same random q, k, v in step, and at
each measured position (a geometric grid up to n) each method's next step is timed ``repeats``
times, the three interleaved, so noise from a shared machine falls on all alike.  A timed step
never changes what it is timed from: ``linear_attention_step`` returns a new state, and the cache
writes position t into a preallocated buffer.  Steps between measured positions run untimed, so
the state and the cache are those of a real generation.  Everything runs under ``torch.no_grad()``.
One step lasts microseconds, shorter than the time slice a busy machine gives a thread, so the
report and the figure use the fastest of the repeats (``time_min_s``); the CSV keeps the median too.
"""

import math
import statistics

import torch

from course_lib.bench.measure import hardware, timed
from course_lib.bench.output import format_bytes, format_time
from course_lib.bench.variants import DTYPES

METHODS = ("linear_step", "softmax_cache", "softmax_no_cache")
COLUMNS = ["method", "position", "b", "h", "d", "dtype", "device", "repeats", "time_median_s", "time_min_s",
           "state_bytes", "hardware"]


def positions(n, count=12):
    """About ``count`` token positions from 1 to n, evenly spaced on a log scale (1 and n included)."""
    return sorted({max(1, round(n ** (i / (count - 1)))) for i in range(count)} | {n}) if count > 1 else [n]


class Generation:
    """The three methods' states after t tokens of the same random sequence ``(b, h, n, d)``."""

    def __init__(self, n, b=1, h=8, d=64, dtype="float32", device="cpu"):
        gen = torch.Generator().manual_seed(0)
        shape = (b, h, n, d)  # (b, h, n, d)
        self.q, self.k, self.v = (torch.randn(shape, generator=gen).to(device, DTYPES[dtype]) for _ in range(3))
        self.cache_k, self.cache_v = torch.zeros_like(self.k), torch.zeros_like(self.v)  # (b, h, n, d)
        self.state, self.t = None, 0

    def step(self, method):
        """The call that makes token ``t + 1`` with ``method``; it leaves every state as it found it."""
        from course_lib.torch.full import softmax_attention
        from course_lib.torch.linear import linear_attention_step

        t, q, k, v = self.t, self.q, self.k, self.v
        if method == "linear_step":
            return lambda: linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], self.state)

        def cached():
            self.cache_k[..., t, :], self.cache_v[..., t, :] = k[..., t, :], v[..., t, :]
            return softmax_attention(q[..., t:t + 1, :], self.cache_k[..., :t + 1, :], self.cache_v[..., :t + 1, :])
        if method == "softmax_cache":
            return cached  # (b, h, 1, e)
        return lambda: softmax_attention(q[..., :t + 1, :], k[..., :t + 1, :], v[..., :t + 1, :], causal=True)

    def advance(self, until):
        """Make tokens up to position ``until`` (untimed): the linear state and the cache follow."""
        from course_lib.torch.linear import linear_attention_step

        while self.t < until:
            t = self.t
            _, self.state = linear_attention_step(self.q[..., t, :], self.k[..., t, :], self.v[..., t, :], self.state)
            self.cache_k[..., t, :], self.cache_v[..., t, :] = self.k[..., t, :], self.v[..., t, :]
            self.t += 1

    def state_bytes(self, method):
        """Memory carried from token to token: the (S, Z) state, the cache of t + 1 positions, or none."""
        b, h, _, d = self.q.shape
        size = self.q.element_size() if method != "linear_step" else max(self.q.element_size(), 4)  # state ≥ fp32
        per_head = {"linear_step": d * (d + 1), "softmax_cache": 2 * (self.t + 1) * d, "softmax_no_cache": 0}
        return b * h * per_head[method] * size


def run(n, *, b=1, h=8, d=64, dtype="float32", device="cpu", repeats=5, warmup=2, count=12, progress=None):
    """Rows ``{method, position, time_median_s, …}`` for every method at every measured position."""
    tokens = Generation(n, b=b, h=h, d=d, dtype=dtype, device=device)
    rows, grid, line = [], positions(n, count), hardware(device)
    with torch.no_grad():
        for i, position in enumerate(grid, start=1):
            tokens.advance(position - 1)  # token `position` is made next
            done = []
            for method in METHODS:
                step = tokens.step(method)
                timed(step, device, warmup)
                times = timed(step, device, repeats)
                rows.append({"method": method, "position": position, "b": b, "h": h, "d": d, "dtype": dtype,
                             "device": device, "repeats": repeats, "time_median_s": statistics.median(times),
                             "time_min_s": min(times), "state_bytes": tokens.state_bytes(method), "hardware": line})
                done.append(f"{method} {format_time(rows[-1]['time_min_s'])}")
            if progress:
                print(f"[{i}/{len(grid)}] position {position}: " + ", ".join(done), file=progress, flush=True)
    return rows


def report(rows):
    """Lines for the terminal: time per token and state at the first and last position, and the ratios at the last."""
    by = {(r["method"], r["position"]): r for r in rows}
    first, last = min(r["position"] for r in rows), max(r["position"] for r in rows)
    lines = [f"{'method':>17} {'token ' + str(first):>12} {'token ' + str(last):>12} {'state at ' + str(last):>14}"]
    for method in METHODS:
        a, z = by[method, first], by[method, last]
        lines.append(f"{method:>17} {format_time(a['time_min_s']):>12} {format_time(z['time_min_s']):>12} "
                     f"{format_bytes(z['state_bytes']):>14}")
    linear = by["linear_step", last]["time_min_s"]
    for method in METHODS[1:]:
        ratio = by[method, last]["time_min_s"] / linear
        lines.append(f"at token {last}, {method} takes {ratio:.3g}× the time of linear_step" if ratio < 1000
                     else f"at token {last}, {method} takes {ratio:,.0f}× the time of linear_step")
    totals = ", ".join(f"{method} {format_time(total_time(rows, method))}" for method in METHODS)
    lines.append(f"all {last} tokens (estimated from the measured positions): {totals}")
    return lines


def figure(rows, title="Cost per generated token versus its position"):
    """Time per token versus position, log-log, one line per method."""
    import plotly.graph_objects as go

    from course_lib.viz import COLORS, rounded, style

    fig = go.Figure()
    for i, method in enumerate(METHODS):
        group = sorted((r for r in rows if r["method"] == method), key=lambda r: r["position"])
        fig.add_trace(go.Scatter(x=[r["position"] for r in group], y=rounded([r["time_min_s"] for r in group], 4),
                                 name=method, mode="lines+markers", line=dict(color=COLORS[i % len(COLORS)])))
    return style(fig, title=title, x_title="position t of the new token", y_title="time per token (s)",
                 log_x=True, log_y=True, height=480)


def total_time(rows, method):
    """Seconds to generate every token up to the last measured position (trapezoid rule over the log grid)."""
    group = sorted((r for r in rows if r["method"] == method), key=lambda r: r["position"])
    pairs = zip(group, group[1:], strict=False)
    return group[0]["time_min_s"] + sum((b["position"] - a["position"]) * math.fsum(
        (a["time_min_s"], b["time_min_s"])) / 2 for a, b in pairs)
