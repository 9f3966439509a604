"""Measure the acceptance figures of ``course_lib.torch.linear`` (notebook 06's chunked causal form).

    .venv/bin/python tools/bench_linear.py [--n 16384] [--chunks 32 64 128 256] [--repeats 5]

Forward+backward (a fixed random output gradient back-propagated to q, k and v), float32,
``(b, h, n, d) = (1, 4, n, 64)``, e = d:

* **time**: every case is timed in this one process, the cases interleaved repeat by repeat
  (so a busy neighbour on a shared machine slows them alike); the minimum is reported;
* **peak memory**: each case once more in a fresh subprocess with ``course_lib.bench.peak_memory``
  (VmHWM after ``clear_refs`` on Linux), so no case inherits another's allocations; one thread
  (see ``worker``); it counts everything the call allocates, the gradients of q, k, v included;
* the per-token cost of ``linear_attention_step`` at positions 16 and 4,096 (one thread,
  interleaved, the minimum over many batches of calls).

A benchmark, not a test: the figures depend on the machine; the script prints them and the ratios.
"""

import argparse
import json
import subprocess
import sys
import time

import torch

from course_lib import bench
from course_lib.torch import linear

SHAPE = dict(b=1, h=4, d=64)


def inputs(n, seed=0):
    """``q, k, v`` (leaves needing gradients) and the output gradient, ``(b, h, n, d)`` float32."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(SHAPE["b"], SHAPE["h"], n, SHAPE["d"], generator=gen) for _ in range(4))
    return [x.requires_grad_() for x in (q, k, v)], grad


def attention(case):
    """The attention call of a case name: ``linear``, ``sdpa_causal``, ``prefix``, ``chunked_<c>``."""
    if case == "linear":
        return linear.linear_attention
    if case == "sdpa_causal":
        return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    if case == "prefix":
        return lambda q, k, v: linear.causal_linear_attention(q, k, v, chunk_size=None)
    chunk_size = int(case.removeprefix("chunked_"))
    return lambda q, k, v: linear.causal_linear_attention(q, k, v, chunk_size=chunk_size)


def step_call(case, n):
    """A no-argument forward+backward call of ``case`` at length n, and a call that drops its gradients."""
    fn = attention(case)
    leaves, grad = inputs(n)

    def clear():
        for leaf in leaves:
            leaf.grad = None

    def call():
        clear()
        fn(*leaves).backward(grad)
    call.clear = clear
    return call


def worker(case, n, measures=5):
    """Peak memory of forward+backward, in this (fresh) process: ``{"peak_bytes": ...}``.

    One thread, and the least of a few measured calls: the tensors an algorithm holds do not
    depend on the thread count, but a threaded BLAS's scratch buffers do; and from call to call
    the resident set at the peak varies by one or two (b, h, n, d) tensors.
    """
    torch.set_num_threads(1)
    call = step_call(case, n)
    call()  # warm-up: thread pool, first-touch pages
    peaks = []
    for _ in range(measures):
        call.clear()  # the last call's gradients would be freed inside the measured call
        peaks.append(bench.peak_memory(call, "cpu"))
    return {"case": case, "n": n, "peak_bytes": min(p for p, _ in peaks), "method": peaks[0][1]}


def isolated_peak(case, n):
    command = [sys.executable, __file__, "--worker", json.dumps([case, n])]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"]


def interleaved_times(cases, n, repeats):
    """``{case: min seconds}`` of forward+backward, cases interleaved within each repeat."""
    calls = {case: step_call(case, n) for case in cases}
    times = {case: [] for case in cases}
    for call in calls.values():
        call()  # warm-up
    for _ in range(repeats):
        for case, call in calls.items():
            start = time.perf_counter()
            call()
            times[case].append(time.perf_counter() - start)
    return {case: min(values) for case, values in times.items()}


def step_times(positions=(16, 4096), calls=100, repeats=50):
    """``{position: seconds per token}`` of ``linear_attention_step`` with a state built over ``position`` tokens.

    One thread: a step is a handful of (h, f, e) = (4, 64, 64) operations, too small to share, and
    on a busy machine a second thread only adds waiting.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _step_times(positions, calls, repeats)
    finally:
        torch.set_num_threads(threads)


def _step_times(positions, calls, repeats):
    gen = torch.Generator().manual_seed(0)
    b, h, d = SHAPE["b"], SHAPE["h"], SHAPE["d"]
    tokens = torch.randn(3, max(positions) + 1, b, h, d, generator=gen)  # q, k, v for every position
    states = {}
    with torch.no_grad():
        state = None
        for t in range(max(positions)):
            if t in positions:
                states[t] = state
            _, state = linear.linear_attention_step(tokens[0, t], tokens[1, t], tokens[2, t], state)
        states[max(positions)] = state
    best = {p: float("inf") for p in positions}
    with torch.no_grad():
        for _ in range(repeats):
            for p in positions:
                q, k, v = tokens[:, p]
                start = time.perf_counter()
                for _ in range(calls):
                    linear.linear_attention_step(q, k, v, states[p])
                best[p] = min(best[p], (time.perf_counter() - start) / calls)
    return best


def best_time(fn, repeats=7):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def kernel_choices(n, chunk_size=64):
    """The two measurements behind ``course_lib/torch/_causal_linear.py``'s choices, at length n.

    ``cumsum`` along the chunk axis of the ``(L, g, f·e)`` states against the triangular products
    of ``_prefix_over_chunks``; ``bmm`` of the chunk blocks with 64 value columns against 65 (a
    ones column appended to v for the normaliser).
    """
    from course_lib.torch._causal_linear import _prefix_over_chunks

    length, g, d = SHAPE["b"] * SHAPE["h"], n // chunk_size, SHAPE["d"]
    states = torch.randn(length * g, d, d)  # (L·g, f, e)
    scores = torch.randn(length * g, chunk_size, chunk_size)  # (L·g, c, c)
    values = {e: torch.randn(length * g, chunk_size, e) for e in (d, d + 1)}  # (L·g, c, e)
    return {"cumsum over chunks": best_time(lambda: states.reshape(length, g, -1).cumsum(dim=1)),
            "triangular products": best_time(lambda: _prefix_over_chunks(states, length)),
            f"bmm, e = {d}": best_time(lambda: torch.bmm(scores, values[d])),
            f"bmm, e = {d + 1}": best_time(lambda: torch.bmm(scores, values[d + 1]))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16384)
    parser.add_argument("--chunks", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sdpa-repeats", type=int, default=2, help="causal SDPA is slow at large n")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*json.loads(args.worker))), flush=True)
        return 0
    print(f"hardware: {bench.hardware()}; fwd+bwd float32, b={SHAPE['b']} h={SHAPE['h']} d=e={SHAPE['d']} "
          f"n={args.n}", flush=True)
    cases = ["linear"] + [f"chunked_{c}" for c in args.chunks]
    times = interleaved_times(cases, args.n, args.repeats)
    times.update(interleaved_times(["sdpa_causal"], args.n, args.sdpa_repeats))
    peaks = {case: isolated_peak(case, args.n) for case in times}
    for case in times:
        print(f"{case:>14}: {bench.format_time(times[case]):>9}  peak {bench.format_bytes(peaks[case]):>9}  "
              f"time/linear {times[case] / times['linear']:5.2f}  memory/linear {peaks[case] / peaks['linear']:5.2f}  "
              f"sdpa/this {times['sdpa_causal'] / times[case]:6.1f}")
    for name, seconds in kernel_choices(args.n).items():
        print(f"{name:>20}: {bench.format_time(seconds)}")
    per_token = step_times()
    first, last = sorted(per_token)
    print(f"linear_attention_step per token: position {first}: {bench.format_time(per_token[first])}, "
          f"position {last}: {bench.format_time(per_token[last])}, ratio {per_token[last] / per_token[first]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
