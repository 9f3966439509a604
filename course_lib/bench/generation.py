"""Cost per generated token versus its position: linear attention's recurrent step against a fair softmax cache.

Notebook 07; Katharopoulos et al. 2020, §3.4 and App. C.  Autoregressive generation makes one
token at a time; token t attends to positions 1 … t.  Four ways to compute its attention, one
layer, every head at once (``(b, h, d)`` per token, float32 by default):

- ``linear_step``: ``course_lib.torch.decoding.RecurrentLinearAttention``: the (S, Z) state
  updated in place, O(f·e) work and a constant f × (e + 1) state per head, whatever t.  Its value
  arrives with the ones column appended, as a fused projection emits it (a zero row, bias 1);
- ``linear_step_functional``: ``linear_attention_step``, the teaching form (checks every
  argument, returns a new state): the same arithmetic, more operations;
- ``softmax_cache``: ``course_lib.torch.decoding.KeyValueCache``, the fair baseline: keys and
  values written into a buffer preallocated for the whole sequence, the query attended with
  ``scaled_dot_product_attention``, no validation per call: O(t·d) work per token;
- ``softmax_no_cache``: causal ``scaled_dot_product_attention`` over the whole prefix again, as a
  model without a cache must: O(t²·d) per token (measured up to ``no_cache_max`` positions).

How it is measured: the methods advance through the same random q, k, v, and at each measured
position (a log grid up to n, plus 1,024, 4,096 and 16,384 when ≤ n) each method's next step is
timed ``repeats`` times, the methods interleaved, so noise from a shared machine falls on all
alike; each timed call follows an untimed one of the same method, so it finds its own state in
the caches, as in a generation loop that runs that method alone.  After each call the state is
put back (the recurrent state copied from a snapshot, the cache's length reset), so every timed
call does the work of the same token.  Everything runs
under ``torch.inference_mode()``, with the threads of the caller (the command's ``--threads``).
One step lasts microseconds, shorter than the time slice a busy machine gives a thread, so the
report uses the fastest of the repeats.

CSV columns (``COLUMNS``), one row per method and position:
``method``, ``position`` (t, 1-based: the new token is the t-th), ``b``, ``h``, ``d`` (= e),
``dtype``, ``device``, ``threads``, ``repeats``, ``time_median_s`` and ``time_min_s`` (wall time of
one step), ``cpu_min_s`` (the least thread CPU time of one step: wall time less waiting for a core;
on a quiet machine the two agree), ``ratio_to_linear_step`` (this method's ``time_min_s`` over
``linear_step``'s at the same position), ``state_bytes`` (memory carried from token to token: the
state, or the cache positions in use) and ``hardware``.  ``report`` adds the ratio at 1,024, 4,096
and 16,384 tokens, the interval of positions in which ``linear_step`` becomes and stays the cheaper
(``crossover``), and the paper's App. C.2 batch-1 comparison (``PAPER_C2``) beside it.
"""

import math
import statistics
import time

import torch

from course_lib.bench.measure import hardware, synchronize
from course_lib.bench.output import format_bytes, format_time
from course_lib.bench.variants import DTYPES

METHODS = ("linear_step", "linear_step_functional", "softmax_cache", "softmax_no_cache")
COLUMNS = ["method", "position", "b", "h", "d", "dtype", "device", "threads", "repeats", "time_median_s", "time_min_s",
           "cpu_min_s", "ratio_to_linear_step", "state_bytes", "hardware"]
REPORTED = (1024, 4096, 16384)  # positions always measured (when ≤ n) and quoted by the report
# Katharopoulos et al. 2020, App. C.2, Table 5: seconds to generate one image at batch size 1 on a CPU,
# the whole model (every layer, projections and feed-forward blocks included); "stateful-softmax" is
# their key/value cache.  Tokens per image: 28 × 28 (MNIST), 32 × 32 × 3 (CIFAR-10).
PAPER_C2 = ({"dataset": "MNIST", "tokens": 784, "softmax_s": 72.6, "stateful_softmax_s": 7.4, "linear_s": 5.5},
            {"dataset": "CIFAR-10", "tokens": 3072, "softmax_s": 8651.4, "stateful_softmax_s": 71.9,
             "linear_s": 45.1})


def positions(n, count=12):
    """About ``count`` token positions from 1 to n, evenly spaced on a log scale (1 and n included)."""
    return sorted({max(1, round(n ** (i / (count - 1)))) for i in range(count)} | {n}) if count > 1 else [n]


class Generation:
    """Every method's state after t tokens of the same random sequence ``(b, h, n, d)``."""

    def __init__(self, n, b=1, h=8, d=64, dtype="float32", device="cpu"):
        from course_lib.torch.decoding import KeyValueCache, RecurrentLinearAttention

        gen = torch.Generator().manual_seed(0)
        self.qkv = torch.randn(3, b, h, n, d, generator=gen).to(device, DTYPES[dtype])  # (3, b, h, n, d)
        ones = torch.ones(b, h, n, 1, dtype=self.qkv.dtype, device=device)
        self.values_with_ones = torch.cat([self.qkv[2], ones], dim=-1)  # (b, h, n, d + 1), as a fused projection
        self.rnn = RecurrentLinearAttention((b, h), d, d, dtype=self.qkv.dtype, device=device)
        self.cache = KeyValueCache((b, h), n, d, d, dtype=self.qkv.dtype, device=device)
        self.t = 0

    @property
    def q(self):
        return self.qkv[0]

    @property
    def k(self):
        return self.qkv[1]

    @property
    def v(self):
        return self.qkv[2]

    def step(self, method):
        """The call that makes token ``t + 1`` with ``method`` (it may change the state: see ``restore``)."""
        from course_lib.torch.linear import linear_attention_step

        t, qkv = self.t, self.qkv
        if method == "linear_step":
            return lambda: self.rnn.step(qkv[:2, ..., t, :], self.values_with_ones[..., t, :])  # (b, h, e)
        if method == "linear_step_functional":
            state = self.rnn.functional_state()  # views of the state after t tokens; never changed by the call
            return lambda: linear_attention_step(qkv[0, ..., t, :], qkv[1, ..., t, :], qkv[2, ..., t, :], state)
        if method == "softmax_cache":
            return lambda: self.cache.step(qkv[0, ..., t, :], qkv[1, ..., t, :], qkv[2, ..., t, :])  # (b, h, e)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return lambda: sdpa(qkv[0, ..., :t + 1, :], qkv[1, ..., :t + 1, :], qkv[2, ..., :t + 1, :], is_causal=True)

    def advance(self, until):
        """Make tokens up to position ``until`` (untimed): the recurrent state steps, the cache is filled."""
        while self.t < until:
            self.rnn.step(self.qkv[:2, ..., self.t, :], self.values_with_ones[..., self.t, :])
            self.t += 1
        self.cache.keys[..., :until, :] = self.k[..., :until, :]
        self.cache.values[..., :until, :] = self.v[..., :until, :]
        self.cache.position = until

    def snapshot(self):
        """What ``restore`` puts back: the recurrent state after t tokens."""
        return self.rnn.state.clone(), self.rnn.position

    def restore(self, saved):
        """Undo a timed step: the recurrent state as it was, the cache back to t positions."""
        self.rnn.state.copy_(saved[0])
        self.rnn.position = saved[1]
        self.cache.position = self.t

    def state_bytes(self, method):
        """Memory carried from token to token: the (S, Z) state, the cache's t + 1 positions, or none."""
        b, h, _, d = self.q.shape
        size = self.q.element_size() if method.startswith("softmax") else max(self.q.element_size(), 4)  # ≥ fp32
        per_head = {"softmax_cache": 2 * (self.t + 1) * d, "softmax_no_cache": 0}.get(method, d * (d + 1))
        return b * h * per_head * size


def _time(fn, device):
    """(wall, thread CPU) seconds of one call."""
    synchronize(device)
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    synchronize(device)
    return time.perf_counter() - wall, time.thread_time() - cpu


def run(n, *, b=1, h=8, d=64, dtype="float32", device="cpu", repeats=5, warmup=2, count=12, no_cache_max=4096,
        progress=None):
    """Rows (``COLUMNS``) for every method at every measured position up to n."""
    tokens = Generation(n, b=b, h=h, d=d, dtype=dtype, device=device)
    grid = sorted(set(positions(n, count)) | {p for p in REPORTED if p <= n})
    rows, line, threads = [], hardware(device), torch.get_num_threads()
    with torch.inference_mode():
        for i, position in enumerate(grid, start=1):
            tokens.advance(position - 1)  # token `position` is made next
            methods = [m for m in METHODS if m != "softmax_no_cache" or position <= no_cache_max]
            calls, saved = {m: tokens.step(m) for m in methods}, tokens.snapshot()
            times = {m: [] for m in methods}
            for repeat in range(warmup + repeats):
                for method in methods:
                    calls[method]()  # untimed: its data back in the caches the other methods just used
                    tokens.restore(saved)
                    seconds = _time(calls[method], device)
                    tokens.restore(saved)
                    if repeat >= warmup:
                        times[method].append(seconds)
            for method in methods:
                walls = [w for w, _ in times[method]]
                rows.append({"method": method, "position": position, "b": b, "h": h, "d": d, "dtype": dtype,
                             "device": device, "threads": threads, "repeats": repeats,
                             "time_median_s": statistics.median(walls), "time_min_s": min(walls),
                             "cpu_min_s": min(c for _, c in times[method]),
                             "state_bytes": tokens.state_bytes(method), "hardware": line})
            linear = rows[-len(methods)]["time_min_s"]  # linear_step comes first
            for row in rows[-len(methods):]:
                row["ratio_to_linear_step"] = row["time_min_s"] / linear
            if progress:
                done = ", ".join(f"{r['method']} {format_time(r['time_min_s'])}" for r in rows[-len(methods):])
                print(f"[{i}/{len(grid)}] position {position}: {done}", file=progress, flush=True)
    return rows


def _series(rows, method, column="time_min_s"):
    """``{position: column}`` of one method."""
    return {r["position"]: r[column] for r in rows if r["method"] == method}


def ratios(rows, method="softmax_cache", column="time_min_s"):
    """``{position: time of method / time of linear_step}`` at every position both were measured."""
    linear, other = _series(rows, "linear_step", column), _series(rows, method, column)
    return {p: other[p] / linear[p] for p in sorted(linear) if p in other}


def crossover(rows, method="softmax_cache"):
    """The positions ``(low, high)`` between which ``linear_step`` becomes, and then stays, cheaper than ``method``.

    ``high`` is the first measured position from which every later one has linear_step cheaper;
    ``low`` the measured position before it (0 when linear_step is cheaper from the first token).
    None when linear_step is not cheaper at the last measured position.
    """
    by_position = ratios(rows, method)
    grid = sorted(by_position)
    if not grid or by_position[grid[-1]] <= 1:
        return None
    high = grid[-1]
    for position in reversed(grid):
        if by_position[position] <= 1:
            break
        high = position
    index = grid.index(high)
    return (grid[index - 1] if index else 0), high


def total_time(rows, method, until=None):
    """Seconds to generate every token up to ``until`` (trapezoid rule over the measured positions).

    ``until`` defaults to the largest position that every method in ``rows`` reached, so the totals
    of different methods cover the same tokens.
    """
    if until is None:
        until = min(max(r["position"] for r in rows if r["method"] == m) for m in {r["method"] for r in rows})
    group = sorted((r for r in rows if r["method"] == method and r["position"] <= until), key=lambda r: r["position"])
    pairs = zip(group, group[1:], strict=False)
    return group[0]["time_min_s"] + sum((b["position"] - a["position"]) * math.fsum(
        (a["time_min_s"], b["time_min_s"])) / 2 for a, b in pairs)


def _times(ratio):
    return f"{ratio:.3g}×" if ratio < 1000 else f"{ratio:,.0f}×"


def report(rows):
    """Lines for the terminal: times per token, the ratios at 1k/4k/16k, the crossover, and the paper's App. C.2."""
    by = {(r["method"], r["position"]): r for r in rows}
    first, last = min(r["position"] for r in rows), max(r["position"] for r in rows)
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    lines = [f"{'method':>22} {'token ' + str(first):>12} {'token ' + str(last):>12} {'state at ' + str(last):>14}"]
    for method in methods:
        a, z = by[method, first], by.get((method, last))
        lines.append(f"{method:>22} {format_time(a['time_min_s']):>12} "
                     + (f"{format_time(z['time_min_s']):>12} {format_bytes(z['state_bytes']):>14}" if z
                        else f"{'not measured':>12}"))
    fair, cpu = ratios(rows), ratios(rows, column="cpu_min_s")
    quoted = [p for p in REPORTED if p in fair] or [last]
    lines.append("softmax_cache / linear_step, fastest call of each (thread CPU time in brackets): "
                 + ", ".join(f"token {p}: {_times(fair[p])} ({_times(cpu[p])})" for p in quoted))
    if 16 in _series(rows, "linear_step") and 4096 in _series(rows, "linear_step"):
        flat = by["linear_step", 4096]["time_min_s"] / by["linear_step", 16]["time_min_s"]
        lines.append(f"linear_step is flat in position: time at token 4096 / token 16 = {flat:.2f}")
    crossing = crossover(rows)
    lines.append("linear_step is cheaper than softmax_cache " + (
        f"at no measured position up to token {last}" if crossing is None else
        f"from the first token on (up to token {last})" if crossing[0] == 0 else
        f"from a token between {crossing[0]} and {crossing[1]} on (measured positions; up to token {last})"))
    for paper in PAPER_C2:
        if paper["tokens"] <= last:
            ours = total_time(rows, "softmax_cache", paper["tokens"]) / total_time(rows, "linear_step", paper["tokens"])
            lines.append(f"Katharopoulos et al. 2020, App. C.2 (batch 1, CPU, the whole model): {paper['dataset']}, "
                         f"{paper['tokens']} tokens: stateful-softmax / linear = {paper['stateful_softmax_s']} s / "
                         f"{paper['linear_s']} s = {paper['stateful_softmax_s'] / paper['linear_s']:.1f}×; here, "
                         f"one attention layer alone over the same {paper['tokens']} tokens: {_times(ours)}")
    totals = ", ".join(f"{method} {format_time(total_time(rows, method))}" for method in methods)
    lines.append(f"all tokens up to {min(last, _shared_last(rows))} (estimated from the measured positions): {totals}")
    return lines


def _shared_last(rows):
    return min(max(r["position"] for r in rows if r["method"] == m) for m in {r["method"] for r in rows})


def figure(rows, title="Cost per generated token versus its position"):
    """Time per token versus position, log-log, one line per method."""
    import plotly.graph_objects as go

    from course_lib.viz import COLORS, rounded, style

    fig = go.Figure()
    for i, method in enumerate(METHODS):
        group = sorted((r for r in rows if r["method"] == method), key=lambda r: r["position"])
        if group:
            fig.add_trace(go.Scatter(x=[r["position"] for r in group], y=rounded([r["time_min_s"] for r in group], 4),
                                     name=method, mode="lines+markers", line=dict(color=COLORS[i % len(COLORS)])))
    return style(fig, title=title, x_title="position t of the new token", y_title="time per token (s)",
                 log_x=True, log_y=True, height=480)
