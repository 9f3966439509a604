"""Measure FAVOR+ against exact attention at the sizes notebook 08 quotes (not a test).

Two measurements, each in a fresh subprocess (so one's memory and thread pools never colour
the other), fp32, on the CPU unless ``--device cuda``:

1. ``forward``: b = 1, h = 8, d = 64, n = 16,384, m = 256.  FAVOR+ forward (no grad) against
   PyTorch's fused ``scaled_dot_product_attention``, timed interleaved (SDPA, FAVOR+, SDPA, ...)
   and reported as the minimum over repeats (the least disturbed run on a shared machine), as
   wall and as CPU time; and the mean absolute error of FAVOR+ against the exact output (SDPA
   in float64, a block of queries at a time).
2. ``causal``: h = 4, d = 64, n = 4,096, m = 256, causal FAVOR+ forward+backward as called by
   default (the chunked form, ``DEFAULT_CHUNK_SIZE``; memory linear in n): minimum time, and the
   peak memory the call held above what was in use before it (``course_lib.bench.peak_memory``).

Inputs are standard normal (so qᵀk/√d has unit variance), ω is block-orthogonal with χ norms.
Usage: ``python tools/bench_performer.py [--threads 2] [--repeats 5] [--device cpu] [--cases ...]``.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from course_lib.bench import peak_memory
from course_lib.torch.linear import DEFAULT_CHUNK_SIZE
from course_lib.torch.performer import performer_attention, random_matrix


def _inputs(b, h, n, d, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=generator).to(device) for _ in range(3))
    omega = random_matrix(256, d, generator, dtype=torch.float32).to(device)
    return q, k, v, omega


def _timed(fn, device):
    """``(wall seconds, CPU seconds of this process)`` of one call.

    On a shared machine the wall time includes waiting for a core; with one thread the CPU time
    does not, so it is the better estimate of the time on an idle machine.
    """
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def _exact(q, k, v, rows=1024):
    """Exact softmax attention in float64, a block of query rows at a time (memory rows × n)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    k64, v64 = k.double(), v.double()
    return torch.cat([sdpa(q[..., i:i + rows, :].double(), k64, v64) for i in range(0, q.shape[-2], rows)], dim=-2)


def forward_case(device, repeats):
    q, k, v, omega = _inputs(1, 8, 16_384, 64, device)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls = {"sdpa": lambda: sdpa(q, k, v), "favor+": lambda: performer_attention(q, k, v, omega)}
    times = {name: [] for name in calls}
    with torch.no_grad():
        for fn in calls.values():  # warm-up: thread pools, page faults
            fn()
        for _ in range(repeats):
            for name, fn in calls.items():
                times[name].append(_timed(fn, device))
        errors = {}
        for scale in (1.0, 0.5):  # 0.5: logits qᵀk/√d of standard deviation 1/4, where m = 256 suffices
            exact = _exact(scale * q, scale * k, v)
            favor = performer_attention(scale * q, scale * k, v, omega).double()
            errors[scale] = ((favor - exact).abs().mean().item(), exact.abs().mean().item())
    wall = {name: min(w for w, _ in t) for name, t in times.items()}
    cpu = {name: min(c for _, c in t) for name, t in times.items()}
    return {"case": "forward n=16384 h=8 d=64 m=256 fp32", "threads": torch.get_num_threads(),
            "sdpa_wall_s": wall["sdpa"], "favor_wall_s": wall["favor+"], "speedup_wall": wall["sdpa"] / wall["favor+"],
            "sdpa_cpu_s": cpu["sdpa"], "favor_cpu_s": cpu["favor+"], "speedup_cpu": cpu["sdpa"] / cpu["favor+"],
            "mean_abs_error": errors[1.0][0], "mean_abs_exact": errors[1.0][1],
            "mean_abs_error_qk_halved": errors[0.5][0], "mean_abs_exact_qk_halved": errors[0.5][1]}


def causal_case(device, repeats):
    q, k, v, omega = _inputs(1, 4, 4_096, 64, device)
    leaves = [x.requires_grad_() for x in (q, k, v)]
    grad = torch.randn_like(v)

    def step():
        out = performer_attention(*leaves, omega, causal=True)  # the default call: chunked
        out.backward(grad)
        for x in leaves:
            x.grad = None

    step()
    times = [_timed(step, device) for _ in range(repeats)]
    peak, method = peak_memory(step, device)
    return {"case": f"causal forward+backward n=4096 h=4 d=64 m=256 fp32 chunk_size={DEFAULT_CHUNK_SIZE}",
            "threads": torch.get_num_threads(), "wall_s": min(w for w, _ in times), "cpu_s": min(c for _, c in times),
            "peak_mb": peak / 2**20, "memory_method": method}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", nargs="+", choices=["forward", "causal"], default=["forward", "causal"])
    parser.add_argument("--worker", choices=["forward", "causal"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        torch.set_num_threads(args.threads)
        case = forward_case if args.worker == "forward" else causal_case
        print("RESULT " + json.dumps(case(args.device, args.repeats)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    for worker in args.cases:
        command = [sys.executable, __file__, "--worker", worker, "--threads", str(args.threads),
                   "--repeats", str(args.repeats), "--device", args.device]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        rows = [line[len("RESULT "):] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        print(json.dumps(json.loads(rows[-1]), indent=1) if rows else done.stderr)


if __name__ == "__main__":
    main()
