"""Time and peak memory of attention variants versus n, k and m, each case in isolation.

Implements the measurements of notebooks 04 and 09 and the command ``course-bench``
(``python -m course_lib.bench --help``).  Every case runs in a fresh Python subprocess, so
one case's memory, caches and thread pools never colour the next.  Inside the subprocess:

1. the inputs are created (they are not counted);
2. ``warmup`` untimed calls (first-call costs: thread pools, kernel selection, page faults);
3. ``repeats`` timed calls: the median (and the minimum) wall time is reported;
4. a plain square matmul with the same FLOP count is timed, as the machine's reference rate;
5. one last call whose **peak memory** is measured relative to the memory in use just before it.

Why that reference: a square N × N matmul with 2·N³ ≈ the case's FLOPs is the best rate the
BLAS reaches on this machine for that much work, measured in the same process moments later, so
``matmul_fraction`` says how close a variant runs to the hardware.  A skinny product shaped like
the variant's own, e.g. ``(h, n, d)·(h, d, k)`` with d = 64, is itself memory-bound and would
flatter every variant.

Peak memory, CPU (Linux): writing ``5`` to ``/proc/self/clear_refs`` resets the resident-set
high-water mark ``VmHWM`` to the current resident set ``VmRSS``; after the call,
``VmHWM - VmRSS(before)`` is the most memory the call held at once.  Just before the reset,
``malloc_trim(0)`` hands the allocator's free pages back to the system, so buffers cached
from the earlier calls are not resident, and ``mallopt(M_MMAP_THRESHOLD, 64 KiB)`` gives every
larger buffer its own mapping, returned to the system when freed: the resident set then
follows the live tensors instead of the heap's fragmentation.  (Timing runs before this, with
the allocator as every program gets it.)  Resolution: one 4 KiB page, plus the noise of small
Python objects (well under 1 MiB).
Where ``clear_refs`` is unavailable (not Linux), the fallback is ``resource.getrusage``'s
lifetime peak, measured on the first call before any warm-up: an approximation, reported as
such in the ``memory_method`` column.
Peak memory, CUDA: ``torch.cuda.reset_peak_memory_stats`` before the call and
``max_memory_allocated - memory_allocated(before)`` after it (bytes held by tensors; the
caching allocator's reserve is not counted).

Forward cases run under ``torch.no_grad()`` (inference, as in Linformer's Table 3);
``forward+backward`` cases back-propagate a fixed output gradient to every input, including
Linformer's E and F (learned parameters).
"""

import argparse
import csv
import ctypes
import dataclasses
import gc
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import torch

from course_lib.torch import full

MODES = ("forward", "forward+backward")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


@dataclasses.dataclass
class Case:
    """One measurement: a variant at one size, on one device."""

    variant: str
    n: int
    k: int = 0
    m: int = 0
    b: int = 1
    h: int = 8
    d: int = 64
    dtype: str = "float32"
    device: str = "cpu"
    mode: str = "forward"
    repeats: int = 5
    warmup: int = 2
    threads: int = 0  # 0: torch's default


# --- FLOP counts ----------------------------------------------------------------------------
# Convention: only matrix products are counted, 2 FLOPs (a multiply and an add) per term.
# Softmax, scaling and masking are O(n·s) element-wise work and are left out, so the FLOP
# rate below is the rate of *useful* matrix work.  Backward doubles every product (C = A B
# needs dA = dC Bᵀ and dB = Aᵀ dC): forward+backward = 3 × forward.  Recomputation inside a
# fused backward (SDPA re-forms q kᵀ) is not counted: it is the kernel's overhead.

def exact_flops(case):
    """Exact attention: q kᵀ ``(n, d)·(d, s)`` and P v ``(n, s)·(s, e)``, with s = n and e = d.

    Notebook 04, Eq. (4.5).
    FLOPs = 2·b·h·n·s·(d + e) = 4·b·h·n²·d.
    """
    return 2 * case.b * case.h * case.n * case.n * (case.d + case.d)


def linformer_flops(case):
    """Linformer: E k ``(k, s)·(s, d)``, F v ``(k, s)·(s, e)``, q k̄ᵀ ``(n, d)·(d, k)``, P̄ v̄ ``(n, k)·(k, e)``.

    Notebook 04, Eq. (4.5).
    FLOPs = 2·b·h·k·(s·d + s·e + n·d + n·e) = 2·b·h·k·(n + s)·(d + e) = 8·b·h·k·n·d for s = n, e = d.
    """
    return 2 * case.b * case.h * case.k * (case.n + case.n) * (case.d + case.d)


def total_flops(case):
    """FLOPs of ``case`` (forward, or forward+backward = 3 × forward)."""
    forward = VARIANTS[case.variant].flops(case)
    return forward * (3 if case.mode == "forward+backward" else 1)


def matmul_size(flops, multiple=32, largest=4096):
    """Side N of a square matmul with about ``flops`` FLOPs (2·N³), rounded to a multiple of 32."""
    side = round((flops / 2) ** (1 / 3) / multiple) * multiple
    return int(min(max(side, multiple), largest))


# --- the variants: name → how to build the call and how much work it is ----------------------

@dataclasses.dataclass
class Variant:
    """``build(case, tensors)`` returns ``(fn, leaves)``: a call, and the inputs that get gradients."""

    build: object
    flops: object
    sizes: tuple = ()  # which of k, m the variant depends on


def _build_exact(case, t):
    return (lambda: full.softmax_attention(t["q"], t["k"], t["v"])), [t["q"], t["k"], t["v"]]


def _build_sdpa(case, t):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return (lambda: sdpa(t["q"], t["k"], t["v"])), [t["q"], t["k"], t["v"]]


def _build_linformer(case, t):
    from course_lib.torch.linformer import linformer_attention

    # One E and one F for every head and batch row: layerwise sharing, as in Linformer's Table 3.
    shape = (case.k, case.n)  # (k, s)
    t["E"] = torch.randn(shape, generator=t["gen"]).div_(math.sqrt(case.k)).to(t["q"])
    t["F"] = torch.randn(shape, generator=t["gen"]).div_(math.sqrt(case.k)).to(t["q"])
    leaves = [t["q"], t["k"], t["v"], t["E"], t["F"]]
    return (lambda: linformer_attention(t["q"], t["k"], t["v"], t["E"], t["F"])), leaves


def _build_linformer_reference(case, t):
    from course_lib.torch.full import softmax_attention
    from course_lib.torch.linformer import project_sequence

    fn, leaves = _build_linformer(case, t)
    E, F = t["E"], t["F"]
    # The same Linformer (Eq. 4.4), its softmax over the k projected keys written out step by step.
    return (lambda: softmax_attention(t["q"], project_sequence(E, t["k"]), project_sequence(F, t["v"]))), leaves


# exact: course_lib.torch.full.softmax_attention, which forms the (b, h, n, s) weights;
# sdpa: PyTorch's fused kernel (flash-style on CPU and CUDA: no n × s matrix is stored);
# linformer: course_lib.torch.linformer.linformer_attention (projections, then the fused kernel over
#   the k projected keys), E and F shared by every head;
# linformer_reference: the same projections, then the step-by-step softmax_attention.
VARIANTS = {
    "exact": Variant(_build_exact, exact_flops),
    "sdpa": Variant(_build_sdpa, exact_flops),
    "linformer": Variant(_build_linformer, linformer_flops, sizes=("k",)),
    "linformer_reference": Variant(_build_linformer_reference, linformer_flops, sizes=("k",)),
}


# --- peak memory ----------------------------------------------------------------------------

def _proc_status(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    raise KeyError(field)


def clear_refs_available():
    """True when the resident-set high-water mark can be reset (Linux ``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        _proc_status("VmHWM")
        return True
    except OSError:
        return False
    except KeyError:
        return False


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def _release_free_memory():
    """Return free heap pages to the system and map every buffer of 64 KiB or more on its own (glibc)."""
    gc.collect()
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
        libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)
    except (OSError, AttributeError):  # not glibc: freed pages may stay resident, peaks read low
        pass


def peak_memory(fn, device):
    """``(bytes, method)``: the most memory ``fn()`` held at once above what was in use before it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before, "cuda max_memory_allocated"
    if clear_refs_available():
        _release_free_memory()
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # VmHWM := VmRSS
        before = _proc_status("VmRSS")
        fn()
        return _proc_status("VmHWM") - before, "VmHWM after clear_refs"
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, kB on Linux
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    fn()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    return max(after - before, 0), "getrusage lifetime peak (approximate)"


# --- one case, inside its own subprocess ----------------------------------------------------

def _synchronize(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device, repeats):
    times = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        fn()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def _step(case, fn, leaves, grad_out):
    """The measured call: forward without autograd, or forward + backward into every leaf."""
    if case.mode == "forward":
        def call():
            with torch.no_grad():
                fn()
        return call

    def call():
        for leaf in leaves:
            leaf.grad = None
        fn().backward(grad_out)
    return call


def matmul_rate(flops, dtype, device, repeats):
    """``(N, GFLOP/s)`` of a square N×N matmul with about ``flops`` FLOPs, timed like the variants."""
    side = matmul_size(flops)
    a, b = (torch.randn(side, side, device=device, dtype=dtype) for _ in range(2))
    _timed(lambda: a @ b, device, 2)
    seconds = statistics.median(_timed(lambda: a @ b, device, repeats))
    return side, 2 * side**3 / seconds / 1e9


def run_case(case):
    """Measure ``case`` in this process; return one result row (a dict)."""
    if case.threads:
        torch.set_num_threads(case.threads)
    dtype, device = DTYPES[case.dtype], case.device
    gen = torch.Generator().manual_seed(0)
    grad = case.mode == "forward+backward"
    shape = (case.b, case.h, case.n, case.d)  # (b, h, n, d)
    t = {name: torch.randn(shape, generator=gen).to(device, dtype) for name in ("q", "k", "v")}
    t["gen"] = gen
    fn, leaves = VARIANTS[case.variant].build(case, t)
    for leaf in leaves:
        leaf.requires_grad_(grad)
    grad_out = torch.randn(shape, generator=gen).to(device, dtype) if grad else None
    step = _step(case, fn, leaves, grad_out)
    first = not (clear_refs_available() or device.startswith("cuda"))
    if first:  # lifetime-peak fallback: measure before the warm-up raises the peak
        peak, method = peak_memory(step, device)
    _timed(step, device, case.warmup)
    times = _timed(step, device, case.repeats)
    flops = total_flops(case)
    median = statistics.median(times)
    side, reference = matmul_rate(flops, dtype, device, case.repeats)
    if not first:
        for leaf in leaves:
            leaf.grad = None  # last step's gradients would be freed inside the measured call
        peak, method = peak_memory(step, device)
    return {**dataclasses.asdict(case), "threads": torch.get_num_threads(), "time_median_s": median,
            "time_min_s": min(times), "peak_bytes": peak, "memory_method": method, "flops": flops,
            "gflops": flops / median / 1e9, "matmul_n": side, "matmul_gflops": reference,
            "matmul_fraction": flops / median / 1e9 / reference, "status": "ok"}


def hardware(device="cpu"):
    """One line naming the machine: CPU model, threads, torch version and GPU when CUDA."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    line = f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    if device.startswith("cuda") and torch.cuda.is_available():
        line += f", GPU {torch.cuda.get_device_name()}"
    return line


# --- the driver: one subprocess per case ----------------------------------------------------

def run_isolated(case, timeout=600):
    """Run ``case`` in a fresh Python subprocess; return its row (``status`` says if it failed)."""
    root = pathlib.Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    if case.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(case.threads)
    command = [sys.executable, "-m", "course_lib.bench", "--worker", json.dumps(dataclasses.asdict(case))]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**dataclasses.asdict(case), "status": f"timed out after {timeout} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    if done.returncode < 0:
        reason = f"killed by signal {-done.returncode} (out of memory?)"
    return {**dataclasses.asdict(case), "status": f"failed: {reason}"}


def make_cases(variants, ns, ks=(), ms=(), **common):
    """Every case of the grid; a variant that ignores k (or m) is measured once per n; k >= n is skipped."""
    cases = []
    for n in ns:
        for name in variants:
            sizes = VARIANTS[name].sizes
            for k in (ks if "k" in sizes else [0]):
                for m in (ms if "m" in sizes else [0]):
                    if k < n:  # k >= n projects nothing away
                        cases.append(Case(name, n, k=k, m=m, **common))
    return cases


COLUMNS = ["variant", "mode", "device", "dtype", "b", "h", "n", "d", "k", "m", "threads", "repeats", "warmup",
           "time_median_s", "time_min_s", "peak_bytes", "memory_method", "flops", "gflops", "matmul_n",
           "matmul_gflops", "matmul_fraction", "status", "hardware"]


def write_csv(rows, path):
    """Write the rows with the columns ``COLUMNS`` (missing values left empty)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path):
    """The rows of a benchmark CSV, numbers converted back to int/float."""
    def number(value):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
        return value
    with open(path, newline="") as src:
        return [{key: number(value) for key, value in row.items()} for row in csv.DictReader(src)]


def savings(rows, baseline="exact", variant="linformer"):
    """Table 3-style ratios: ``{(n, k): (time saved ×, memory saved ×)}`` of ``variant`` over ``baseline``."""
    ok = [r for r in rows if r.get("status") == "ok"]
    base = {r["n"]: r for r in ok if r["variant"] == baseline}
    return {(r["n"], r["k"]): (base[r["n"]]["time_median_s"] / r["time_median_s"],
                               base[r["n"]]["peak_bytes"] / max(r["peak_bytes"], 1))
            for r in ok if r["variant"] == variant and r["n"] in base}


def format_time(seconds):
    """``12.3 ms`` / ``4.56 s`` / ``789 µs``: the form the notebooks' sanitiser masks."""
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def format_bytes(count):
    """``1.50 GiB`` / ``12.0 MiB`` / ``4.0 KiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} B"


def report(rows):
    """Lines for the terminal: each case, then the savings of the Linformer variants over exact attention and SDPA."""
    lines = [f"{'variant':>14} {'n':>6} {'k':>5} {'time':>9} {'peak memory':>11} {'GFLOP/s':>8} "
             f"{'matmul':>7} {'fraction':>8}"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"{r['variant']:>14} {r['n']:>6} {r['k']:>5}  {r['status']}")
            continue
        lines.append(f"{r['variant']:>14} {r['n']:>6} {r['k']:>5} {format_time(r['time_median_s']):>9} "
                     f"{format_bytes(r['peak_bytes']):>11} {r['gflops']:8.1f} {r['matmul_gflops']:7.1f} "
                     f"{r['matmul_fraction']:8.0%}")
    for variant in ("linformer", "linformer_reference"):
        for baseline in ("exact", "sdpa"):
            table = savings(rows, baseline, variant)
            if table:
                lines.append(f"{variant} savings over {baseline} (time ×, memory ×):")
                lines += [f"  n = {n:>6}, k = {k:>5}: {t:6.1f}× {m:7.1f}×" for (n, k), (t, m) in sorted(table.items())]
    return lines


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="course-bench", description="Time and peak memory of attention variants versus n, k and m; "
        "each case runs in its own subprocess. Writes a CSV (and optionally a self-contained plotly HTML).")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                        help="exact: the course's softmax_attention; sdpa: PyTorch's fused kernel; linformer: the "
                        "course's linformer_attention; linformer_reference: its projections + the step-by-step "
                        "softmax_attention")
    parser.add_argument("--n", nargs="+", type=int, default=[512, 1024, 2048, 4096], help="sequence lengths")
    parser.add_argument("--k", nargs="+", type=int, default=[128, 256], help="Linformer projected lengths")
    parser.add_argument("--m", nargs="+", type=int, default=[256], help="Performer's m, for variants with one")
    parser.add_argument("--b", type=int, default=1, help="batch size")
    parser.add_argument("--h", type=int, default=8, help="heads")
    parser.add_argument("--d", type=int, default=64, help="head dim (d = e)")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--mode", default="forward", choices=MODES)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per case (the median is reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls before measuring")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per case")
    parser.add_argument("--csv", default="bench-results/bench.csv", help="output CSV path")
    parser.add_argument("--plot", default=None, help="also write a self-contained plotly HTML here")
    parser.add_argument("--quiet", action="store_true", help="print only the output paths")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one JSON case, print its row
    return parser.parse_args(argv)


def main(argv=None):
    """The ``course-bench`` command."""
    args = parse_args(argv)
    if args.worker:
        row = run_case(Case(**json.loads(args.worker)))
        print("RESULT " + json.dumps({**row, "hardware": hardware(row["device"])}), flush=True)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("course-bench: --device cuda, but torch sees no CUDA device.", file=sys.stderr)
        return 2
    common = dict(b=args.b, h=args.h, d=args.d, dtype=args.dtype, device=args.device, mode=args.mode,
                  repeats=args.repeats, warmup=args.warmup, threads=args.threads)
    cases = make_cases(args.variants, args.n, args.k, args.m, **common)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.quiet:
        print(f"hardware: {hardware(args.device)}; {len(cases)} cases, {args.mode}, {args.dtype}", flush=True)
    rows = []
    for case in cases:
        rows.append(run_isolated(case, args.timeout))
        if not args.quiet:
            print(report(rows[-1:])[1], flush=True)
    write_csv(rows, args.csv)
    if not args.quiet:
        print("\n".join(report(rows)[len(rows) + 1:]))
    print(f"wrote {args.csv}")
    if args.plot:
        from course_lib import viz

        viz.bench_figure(rows).write_html(args.plot, include_plotlyjs=True, full_html=True)
        print(f"wrote {args.plot}")
    return 0 if all(r.get("status") == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
