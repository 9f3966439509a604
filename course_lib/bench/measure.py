"""How one case is measured: time, peak memory, and isolation in a fresh subprocess.

Every case runs in a fresh Python subprocess (``run_isolated``), so one case's memory, caches
and thread pools never colour the next.  Inside the subprocess (``run_case``):

1. the inputs are created (they are not counted);
2. ``warmup`` untimed calls (first-call costs: thread pools, kernel selection, page faults);
   with a time budget (below), two only when the second took over ``SLOW`` seconds: the
   first-call costs are then within the noise of the call;
3. ``repeats`` timed calls: the median and the minimum wall time are reported.  With a time
   ``budget`` a slow case gets fewer: as many as fit in ``budget`` seconds at the last warm-up
   call's time, never fewer than ``min_repeats`` (the ``repeats`` column says how many ran);
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
the allocator as every program gets it.)  Resolution: the kernel counts resident pages in
per-CPU (per-thread before Linux 6.2) caches that reach the shared counter in batches, and the
high-water mark reads the shared counter, so a peak can be off by ``rss_resolution()`` bytes:
256 KiB on 2 CPUs, 4 MiB on 16, more on bigger machines.  Small Python objects add well under
1 MiB.  Where ``clear_refs`` is unavailable (not Linux), the fallback is
``resource.getrusage``'s lifetime peak, measured on the first call before any warm-up: an
approximation, reported as such in the ``memory_method`` column.
Peak memory, CUDA: ``torch.cuda.reset_peak_memory_stats`` before the call and
``max_memory_allocated - memory_allocated(before)`` after it (bytes held by tensors; the
caching allocator's reserve is not counted).

Forward cases run under ``torch.no_grad()`` (inference, as in Linformer's Table 3);
``forward+backward`` cases back-propagate a fixed output gradient to every input, including
Linformer's E and F (learned parameters).  A case that runs out of memory (a Python
``MemoryError``, torch's ``OutOfMemoryError`` or allocator error, or a subprocess killed by the
kernel's OOM killer) comes back with status ``"oom"`` and the message "out of memory at n = …".
"""

import ctypes
import dataclasses
import gc
import json
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import sys
import time

import torch

from course_lib.bench.variants import DTYPES, VARIANTS, Case, problem, total_flops

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
    except (OSError, KeyError):
        return False


def rss_resolution():
    """Bytes by which a ``VmHWM`` peak can read off on this machine (Linux's batched RSS counters).

    Linux ≥ 6.2 keeps the resident-page count in per-CPU counters that reach the shared total
    in batches of max(32, 2·CPUs) pages; older kernels cache up to 64 page faults per thread.
    The high-water mark is taken from the shared total, so it misses at most one batch per CPU
    (or per thread that touched memory): max(64, 2·CPUs) pages × max(CPUs, torch threads).
    """
    cpus = os.cpu_count() or 1
    return max(64, 2 * cpus) * max(cpus, torch.get_num_threads()) * os.sysconf("SC_PAGE_SIZE")


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


# --- time -------------------------------------------------------------------------------------

def synchronize(device):
    """Wait for queued CUDA work, so a wall-clock interval covers the computation itself."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device, repeats):
    """Wall times of ``repeats`` calls of ``fn`` (seconds), each bracketed by device synchronisation."""
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def matmul_size(flops, multiple=32, largest=4096):
    """Side N of a square matmul with about ``flops`` FLOPs (2·N³), rounded to a multiple of 32."""
    side = round((flops / 2) ** (1 / 3) / multiple) * multiple
    return int(min(max(side, multiple), largest))


def matmul_rate(flops, dtype, device, repeats):
    """``(N, GFLOP/s)`` of a square N×N matmul with about ``flops`` FLOPs, timed like the variants."""
    side = matmul_size(flops)
    a, b = (torch.randn(side, side, device=device, dtype=dtype) for _ in range(2))
    timed(lambda: a @ b, device, 2)
    seconds = statistics.median(timed(lambda: a @ b, device, repeats))
    return side, 2 * side**3 / seconds / 1e9


# --- one case, in this process -----------------------------------------------------------------

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


SLOW = 1.0  # seconds: a call this long is warmed up twice at most (its first-call costs are within its noise)


def warm_up(step, device, calls, slow=None):
    """Up to ``calls`` untimed calls; ``(calls made, last call's seconds)``.

    With ``slow``, the warm-up ends after a call that took over ``slow`` seconds, but never at the
    first call: first calls carry one-off costs (up to a second here), so the second call is the
    one that predicts the timed ones.
    """
    seconds = []
    for _ in range(calls):
        seconds += timed(step, device, 1)
        if slow is not None and len(seconds) > 1 and seconds[-1] > slow:
            break
    return len(seconds), (seconds[-1] if seconds else None)


def repeats_within(budget, seconds, repeats, min_repeats):
    """Timed calls for a case whose call takes ``seconds``: ``repeats``, or fewer if they exceed ``budget`` s."""
    if not budget or not seconds:
        return repeats
    return max(min(repeats, min_repeats), min(repeats, int(budget / seconds)))


def run_case(case, budget=0.0, min_repeats=5):
    """Measure ``case`` in this process; return one result row (a dict). Raises ``ValueError`` if impossible.

    ``budget``: seconds of timed calls at most (0: always ``case.repeats``), but never fewer than
    ``min_repeats`` calls.
    """
    reason = problem(case)
    if reason:
        raise ValueError(reason)
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
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    warmup, last = warm_up(step, device, case.warmup, slow=SLOW if budget else None)
    repeats = repeats_within(budget, last, case.repeats, min_repeats)
    times = timed(step, device, repeats)
    flops = total_flops(case)
    median = statistics.median(times)
    # Under a budget the reference matmul (up to 0.5 s a call at N = 4096) is timed min_repeats times.
    side, reference = matmul_rate(flops, dtype, device, min(repeats, min_repeats) if budget else repeats)
    if not first:
        for leaf in leaves:
            leaf.grad = None  # last step's gradients would be freed inside the measured call
        peak, method = peak_memory(step, device)
    return {**dataclasses.asdict(case), "threads": torch.get_num_threads(), "repeats": repeats, "warmup": warmup,
            "load_1min": load, "time_median_s": median,
            "time_min_s": min(times), "peak_bytes": peak, "memory_method": method, "flops": flops,
            "gflops": flops / median / 1e9, "matmul_n": side, "matmul_gflops": reference,
            "matmul_fraction": flops / median / 1e9 / reference, "status": "ok", "message": ""}


def is_out_of_memory(exc):
    """True for Python's MemoryError, torch's OutOfMemoryError and the CPU allocator's "can't allocate memory"."""
    text = str(exc)
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or (isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)))


def failed_row(case, status, message):
    """The row of a case that has no measurement: ``status`` is "oom", "timeout" or "error"."""
    return {**dataclasses.asdict(case), "status": status, "message": message}


def worker(case_json):
    """The subprocess side: measure one JSON case; its row (or why it failed) on one ``RESULT`` line.

    The JSON holds the ``Case``'s fields and optionally ``budget`` and ``min_repeats`` (``run_case``).
    """
    fields = json.loads(case_json)
    method = {name: fields.pop(name) for name in ("budget", "min_repeats") if name in fields}
    case = Case(**fields)
    try:
        row = run_case(case, **method)
    except Exception as exc:  # one line back to the driver, never a traceback in the report
        if is_out_of_memory(exc):
            row = failed_row(case, "oom", f"out of memory at n = {case.n}")
        else:
            row = failed_row(case, "error", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
        gc.collect()
    print("RESULT " + json.dumps({**row, "hardware": hardware(case.device)}), flush=True)


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


# --- isolation: one subprocess per case --------------------------------------------------------

def run_isolated(case, timeout=600, budget=0.0, min_repeats=5):
    """Run ``case`` in a fresh Python subprocess; return its row (``status`` and ``message`` say if it failed).

    ``budget`` and ``min_repeats``: how many timed calls a slow case gets (``run_case``).
    """
    reason = problem(case)
    if reason:
        return failed_row(case, "error", reason)
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    if case.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(case.threads)
    fields = {**dataclasses.asdict(case), **({"budget": budget, "min_repeats": min_repeats} if budget else {})}
    command = [sys.executable, "-m", "course_lib.bench", "--worker", json.dumps(fields)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return failed_row(case, "timeout", f"timed out after {timeout} s at n = {case.n}")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    if done.returncode == -signal.SIGKILL:  # the kernel's OOM killer sends SIGKILL
        return failed_row(case, "oom", f"out of memory at n = {case.n} (the process was killed)")
    reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return failed_row(case, "error", reason)
