"""Measure the chunk size of the chunked causal forms: the sweep behind ``DEFAULT_CHUNK_SIZE``.

    .venv/bin/python tools/bench_linear.py --n 1024 4096 16384 --chunks 16 32 64 128 256 --rounds 3

Forward+backward (a fixed random output gradient back-propagated to q, k and v), float32,
``(b, h, d) = (1, 4, 64)``, e = d, one thread, for the two causal kernels that share the
default: ``causal_linear_attention`` (elu+1, f = d = 64 features) and
``performer_attention(causal=True)`` (FAVOR+, f = m = 256 features).

* **time**: at each n every chunk size is timed in this one process, the chunk sizes
  interleaved call by call, ``--repeats`` calls each; the whole sweep runs ``--rounds`` times
  and the minimum over every call is kept: on a machine shared with other work the least
  disturbed call is the best estimate of the undisturbed time.  Time is the process's CPU
  time (one thread, so it excludes waiting for a core) and the wall time is printed beside it;
* **peak memory** (``--memory``): each case once more in a fresh subprocess with
  ``course_lib.bench.peak_memory``, so no case inherits another's allocations;
* the NumPy tree's forward at the same n and chunk sizes (``--numpy``);
* ``--chunks 64 0`` puts the default beside the prefix sums (0: ``chunk_size=None``), the
  comparison lesson 06 draws (the prefix sums' backward stores n states of f × e: at
  n = 16,384, about 17 GB for FAVOR+ with m = 256, so ``--kernels linear`` there on a small machine);
* the two kernel choices of ``course_lib/torch/_causal_linear.py`` (``--kernel-choices``).

The printed table ranks the chunk sizes by the sum over n of each time relative to the best
time at that n, per kernel; ``LINEAR_CHUNK_SIZE`` in ``course_lib/_shared.py`` is the
best of that ranking.  A benchmark, not a test: the figures depend on the machine.
"""

import argparse
import json
import subprocess
import sys
import time

import numpy as np
import torch

from course_lib import bench
from course_lib.numpy import linear as np_linear
from course_lib.torch import linear, performer

SHAPE = dict(b=1, h=4, d=64, m=256)
KERNELS = ("linear", "favor+")


def inputs(n, seed=0):
    """``q, k, v`` (leaves needing gradients), the output gradient ``(b, h, n, d)`` float32, and ω ``(m, d)``."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(SHAPE["b"], SHAPE["h"], n, SHAPE["d"], generator=gen) for _ in range(4))
    omega = performer.random_matrix(SHAPE["m"], SHAPE["d"], gen, dtype=torch.float32)  # (f, d)
    return [x.requires_grad_() for x in (q, k, v)], grad, omega


def attention(kernel, chunk_size, omega):
    """The causal call of ``kernel`` with ``chunk_size`` (0 or None: prefix sums)."""
    chunk_size = chunk_size or None
    if kernel == "linear":
        return lambda q, k, v: linear.causal_linear_attention(q, k, v, chunk_size=chunk_size)
    return lambda q, k, v: performer.performer_attention(q, k, v, omega, causal=True, chunk_size=chunk_size)


def step_call(kernel, chunk_size, n):
    """A no-argument forward+backward call, with ``.clear()`` to drop the gradients it leaves."""
    leaves, grad, omega = inputs(n)
    fn = attention(kernel, chunk_size, omega)

    def clear():
        for leaf in leaves:
            leaf.grad = None

    def call():
        clear()
        fn(*leaves).backward(grad)
    call.clear = clear
    return call


def worker(kernel, chunk_size, n, measures=3):
    """Peak memory of forward+backward in this (fresh) process: the least of ``measures`` calls."""
    torch.set_num_threads(1)
    call = step_call(kernel, chunk_size, n)
    call()  # warm-up: first-touch pages, allocator
    peaks = []
    for _ in range(measures):
        call.clear()  # the last call's gradients would be freed inside the measured call
        peaks.append(bench.peak_memory(call, "cpu")[0])
    return {"peak_bytes": min(peaks)}


def isolated_peak(kernel, chunk_size, n):
    command = [sys.executable, __file__, "--worker", json.dumps([kernel, chunk_size, n])]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"]


def sweep(kernel, n, chunks, repeats, best):
    """Time every chunk size at n, interleaved; keep in ``best[(kernel, n, c)]`` the least (CPU, wall) seconds."""
    calls = {c: step_call(kernel, c, n) for c in chunks}
    for call in calls.values():
        call()  # warm-up
    for _ in range(repeats):
        for c, call in calls.items():
            wall, cpu = time.perf_counter(), time.process_time()
            call()
            seconds = (time.process_time() - cpu, time.perf_counter() - wall)
            old = best.get((kernel, n, c), (float("inf"), float("inf")))
            best[kernel, n, c] = (min(old[0], seconds[0]), min(old[1], seconds[1]))


def numpy_forward(n, chunks, repeats):
    """``{c: least seconds}`` of the NumPy tree's causal forward (float32) at n, interleaved."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((SHAPE["b"], SHAPE["h"], n, SHAPE["d"]), dtype=np.float32) for _ in range(3))
    best = {c: float("inf") for c in chunks}
    for _ in range(repeats):
        for c in chunks:
            start = time.process_time()
            np_linear.causal_linear_attention(q, k, v, chunk_size=c or None)
            best[c] = min(best[c], time.process_time() - start)
    return best


def ranking(best, kernel, ns, chunks):
    """Chunk sizes by Σ_n time(c, n) / min_c time(c, n), best first."""
    score = {c: sum(best[kernel, n, c][0] / min(best[kernel, n, x][0] for x in chunks) for n in ns) for c in chunks}
    return sorted(chunks, key=score.get), score


def kernel_choices(n, chunk_size=64):
    """``cumsum`` over chunks against ``_prefix_over_chunks``'s triangular products; ``bmm`` with e = 64 against 65."""
    from course_lib.torch._causal_linear import _prefix_over_chunks

    def least(fn, repeats=7):
        fn()
        return min(_seconds(fn) for _ in range(repeats))

    length, g, d = SHAPE["b"] * SHAPE["h"], n // chunk_size, SHAPE["d"]
    states = torch.randn(length * g, d, d)  # (L·g, f, e)
    scores = torch.randn(length * g, chunk_size, chunk_size)  # (L·g, c, c)
    values = {e: torch.randn(length * g, chunk_size, e) for e in (d, d + 1)}  # (L·g, c, e)
    return {"cumsum over chunks": least(lambda: states.reshape(length, g, -1).cumsum(dim=1)),
            "triangular products": least(lambda: _prefix_over_chunks(states, length)),
            f"bmm, e = {d}": least(lambda: torch.bmm(scores, values[d])),
            f"bmm, e = {d + 1}": least(lambda: torch.bmm(scores, values[d + 1]))}


def _seconds(fn):
    start = time.process_time()
    fn()
    return time.process_time() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--chunks", type=int, nargs="+", default=[16, 32, 64, 128, 256],
                        help="chunk sizes; 0 for the prefix sums (chunk_size=None)")
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per chunk size and round")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the whole sweep")
    parser.add_argument("--memory", action="store_true", help="also the peak memory of each case (subprocesses)")
    parser.add_argument("--numpy", action="store_true", help="also the NumPy tree's forward")
    parser.add_argument("--kernel-choices", action="store_true", help="also _causal_linear.py's two choices")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.worker:
        print(json.dumps(worker(*json.loads(args.worker))), flush=True)
        return 0
    print(f"hardware: {bench.hardware()}; forward+backward float32, b={SHAPE['b']} h={SHAPE['h']} d=e={SHAPE['d']} "
          f"m={SHAPE['m']}; least of {args.rounds} × {args.repeats} calls", flush=True)
    best = {}
    for round_ in range(args.rounds):
        for n in args.n:
            for kernel in args.kernels:
                sweep(kernel, n, args.chunks, args.repeats, best)
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    for kernel in args.kernels:
        order, score = ranking(best, kernel, args.n, args.chunks)
        print(f"\n{kernel}: CPU time (wall) per chunk size; score = Σ_n time / best time at that n (lower is better)")
        for c in args.chunks:
            cells = "  ".join(f"n={n}: {bench.format_time(best[kernel, n, c][0]):>8} "
                              f"({bench.format_time(best[kernel, n, c][1])})" for n in args.n)
            memory = ""
            if args.memory:
                memory = "  peak " + ", ".join(bench.format_bytes(isolated_peak(kernel, c, n)) for n in args.n)
            print(f"  c={c:>4}: {cells}  score {score[c]:.3f}{memory}")
        print(f"  best chunk size for {kernel}: {order[0]} (then {', '.join(map(str, order[1:]))})")
    if args.numpy:
        for n in args.n:
            times = numpy_forward(n, args.chunks, args.rounds * args.repeats)
            print(f"numpy forward n={n}: " + ", ".join(f"c={c} {bench.format_time(t)}" for c, t in times.items()))
    if args.kernel_choices:
        for name, seconds in kernel_choices(max(args.n)).items():
            print(f"{name:>20}: {bench.format_time(seconds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
