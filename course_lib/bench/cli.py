"""The command line: ``python -m course_lib.bench`` (installed as ``course-bench``).

Parses the grid, runs each case in its own subprocess with a progress line per case on stderr,
then writes the CSV and the HTML report and prints the text report.  ``--generation`` runs the
cost-per-token benchmark instead (``generation.py``).
"""

import argparse
import pathlib
import sys

import torch

from course_lib.bench import generation, output
from course_lib.bench.measure import hardware, run_isolated, worker
from course_lib.bench.variants import DTYPES, MODES, VARIANTS, make_cases

EPILOG = """\
variants:
{variants}

output:
  CSV, one row per case: the case (variant, mode, device, dtype, b, h, n, d, k, m, chunk, threads,
  repeats, warmup), median and minimum time (s), peak memory (bytes) and how it was measured,
  FLOPs, GFLOP/s, the rate of a square matmul with the same FLOPs and the fraction of it reached,
  status (ok / oom / timeout / error), a one-line message when not ok, and the hardware.
  HTML (plotly.js embedded, opens offline): time and peak memory versus n, one line per variant.
  Exit code 0 when every case was measured, 1 when one was not, 2 for a request that cannot run.

errors, one line each:
  k > n        "k = 512 > n = 256: Linformer projects n positions down to k ≤ n" (a grid skips it)
  memory       "out of memory at n = 65536": status oom (torch/Python out-of-memory errors, or a
               subprocess killed by the kernel's OOM killer)

generation (--generation): time per generated token versus its position t, for linear attention's
  RNN step, softmax with a key/value cache and softmax recomputing the whole prefix; n = the
  largest --n; writes its own CSV (method, position, time, state bytes) and HTML.

examples:
  python -m course_lib.bench --variants exact sdpa linformer linear performer --n 1024 4096
  python -m course_lib.bench --variants causal_sdpa causal_linear causal_linear_chunked \\
      --mode forward+backward --n 1024 4096 16384
  python -m course_lib.bench --device cuda --dtype float16 --n 4096 16384 65536
  python -m course_lib.bench --generation --n 4096
"""


def parse_args(argv=None):
    """The options of the command (``--help`` prints them)."""
    variants = "\n".join(f"  {name:<22} {variant.about}" for name, variant in VARIANTS.items())
    parser = argparse.ArgumentParser(
        prog="course-bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG.format(variants=variants),
        description="Time and peak memory of attention variants versus n, k and m, each case in its own\n"
        "subprocess; writes a CSV and a self-contained plotly HTML report.")
    parser.add_argument("--variants", nargs="+", default=["exact", "sdpa", "linformer", "linear", "performer"],
                        choices=list(VARIANTS), metavar="VARIANT", help="attention variants (listed below)")
    parser.add_argument("--n", nargs="+", type=int, default=[512, 1024, 2048, 4096], help="sequence lengths")
    parser.add_argument("--k", nargs="+", type=int, default=[128, 256], help="Linformer projected lengths")
    parser.add_argument("--m", nargs="+", type=int, default=[256], help="Performer random features")
    parser.add_argument("--chunk", type=int, default=0, help="positions per chunk of causal_linear_chunked "
                        "(0: the library's DEFAULT_CHUNK_SIZE)")
    parser.add_argument("--b", type=int, default=1, help="batch size")
    parser.add_argument("--h", type=int, default=8, help="heads")
    parser.add_argument("--d", type=int, default=64, help="head dim (d = e)")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--mode", default="forward", choices=MODES,
                        help="forward: under no_grad (inference); forward+backward: gradients into every input")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per case (the median is reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls before measuring")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per case")
    parser.add_argument("--csv", default=None, help="output CSV (default: bench-results/bench.csv, or "
                        "bench-results/generation.csv with --generation)")
    parser.add_argument("--plot", "--html", dest="plot", default=None,
                        help="output HTML report (default: the CSV's path with .html)")
    parser.add_argument("--no-plot", action="store_true", help="write no HTML report")
    parser.add_argument("--generation", action="store_true", help="time per generated token versus position "
                        "(linear RNN step, softmax with and without a key/value cache) instead of the grid")
    parser.add_argument("--positions", type=int, default=12, help="--generation: measured positions, log-spaced "
                        "from 1 to n")
    parser.add_argument("--quiet", action="store_true", help="no progress lines and no report; only the paths")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one JSON case, print its row
    args = parser.parse_args(argv)
    args.csv = args.csv or f"bench-results/{'generation' if args.generation else 'bench'}.csv"
    args.plot = None if args.no_plot else (args.plot or str(pathlib.Path(args.csv).with_suffix(".html")))
    return args


def _say(args, text):
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


def _run_grid(args):
    common = dict(b=args.b, h=args.h, d=args.d, dtype=args.dtype, device=args.device, mode=args.mode,
                  repeats=args.repeats, warmup=args.warmup, threads=args.threads, chunk=args.chunk)
    skipped = []
    cases = make_cases(args.variants, args.n, args.k, args.m, skipped=skipped, **common)
    for case, reason in skipped:
        _say(args, f"skipped {output.label(vars(case))}: {reason}")
    if not cases:
        print("course-bench: nothing to measure: " + (skipped[0][1] if skipped else "no cases"), file=sys.stderr)
        return None
    line = hardware(args.device)
    _say(args, f"{line}; {len(cases)} cases, {args.mode}, {args.dtype}, {args.device}")
    rows = []
    for i, case in enumerate(cases, start=1):
        rows.append(run_isolated(case, args.timeout))
        _say(args, f"[{i}/{len(cases)}] {output.label(rows[-1])} … {output.outcome(rows[-1])}")
    title = f"{args.mode}, {args.dtype}, {args.device}: time and peak memory versus n<br><sup>{line}</sup>"
    return rows, output.COLUMNS, [f"measured on: {line}", *output.report(rows)], lambda: output.figure(rows, title)


def _run_generation(args):
    n = max(args.n)
    _say(args, f"{hardware(args.device)}; generation up to n = {n}, {args.dtype}, {args.device}")
    rows = generation.run(n, b=args.b, h=args.h, d=args.d, dtype=args.dtype, device=args.device,
                          repeats=args.repeats, warmup=args.warmup, count=args.positions,
                          progress=None if args.quiet else sys.stderr)
    line = rows[0]["hardware"]
    title = f"Cost per generated token, {args.dtype}, {args.device}<br><sup>{line}</sup>"
    return rows, generation.COLUMNS, [f"measured on: {line}", *generation.report(rows)], \
        lambda: generation.figure(rows, title)


def main(argv=None):
    """The ``course-bench`` command: 0 when every case was measured, 1 when one was not, 2 when nothing could run."""
    args = parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("course-bench: --device cuda, but torch sees no CUDA device.", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    result = _run_generation(args) if args.generation else _run_grid(args)
    if result is None:
        return 2
    rows, columns, lines, make_figure = result
    output.write_csv(rows, args.csv, columns)
    if not args.quiet:
        print("\n".join(lines))
    print(f"wrote {args.csv}")
    if args.plot:
        output.write_html(make_figure(), args.plot)
        print(f"wrote {args.plot}")
    return 0 if all(r.get("status", "ok") == "ok" for r in rows) else 1
