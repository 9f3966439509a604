"""The command line: ``python -m course_lib.bench`` (installed as ``course-bench``).

Parses the grid (or takes a named one, ``--preset``, from ``presets.py``), runs each case in its
own subprocess with a progress line per case on stderr, writes the CSV after every case, then
the HTML report, and prints the text report.  ``--generation`` runs the cost-per-token benchmark
instead (``generation.py``).
"""

import argparse
import pathlib
import sys
import time

import torch

from course_lib.bench import generation, output, presets
from course_lib.bench.measure import hardware, run_isolated, worker
from course_lib.bench.variants import DTYPES, MODES, VARIANTS, make_cases

# Grid options a preset fixes, with their defaults when no preset is named.
GRID_DEFAULTS = dict(variants=["exact", "sdpa", "linformer", "linear", "performer"], n=[512, 1024, 2048, 4096],
                     k=[128, 256], m=[256], chunk=0, b=1, h=8, d=64, dtype="float32", device="cpu", mode="forward",
                     threads=0)

EPILOG = """\
variants:
{variants}

output:
  CSV, one row per case: the case (variant, mode, device, dtype, b, h, n, d, k, m, chunk, threads,
  repeats, warmup), median and minimum time (s), peak memory (bytes) and how it was measured,
  FLOPs, GFLOP/s, the rate of a square matmul with the same FLOPs and the fraction of it reached,
  status (ok / oom / timeout / error), a one-line message when not ok, the hardware, the machine's
  1-minute load average when the case began (load_1min), the case's wall time (case_s) and --note.
  repeats and warmup are the calls made (fewer under --budget). Written after every case.
  HTML (plotly.js embedded, opens offline): time and peak memory versus n, one line per variant.
  Exit code 0 when every case was measured, 1 when one was not, 2 for a request that cannot run.

errors, one line each:
  k > n        "k = 512 > n = 256: Linformer projects n positions down to k ≤ n" (a grid skips it)
  memory       "out of memory at n = 65536": status oom (torch/Python out-of-memory errors, or a
               subprocess killed by the kernel's OOM killer)

generation (--generation): time per generated token versus its position t, for linear attention's
  RNN step (the lean in-place step and the teaching step), softmax with a preallocated key/value
  cache and SDPA (the fair baseline) and softmax recomputing the whole prefix; n = the largest --n;
  writes its own CSV (method, position, time median and minimum, CPU time, ratio to the linear step,
  state bytes, threads, hardware) and HTML.

presets (--preset NAME): every stored timing grid of the course is one command; a preset fixes the
  variants, sizes, modes and the setting; --repeats, --warmup, --budget, --min-repeats, --threads,
  --csv and --note may still be given, e.g. for a quicker provisional run on a shared machine, where
  one thread is less disturbed than two. The stored grids use torch's default threads.
{presets}

examples:
  python -m course_lib.bench --preset grid            # the shared grid of lessons 06, 08, 09 (≈ 40 min quiet)
  python -m course_lib.bench --preset linformer       # lesson 04's grid
  python -m course_lib.bench --variants exact sdpa linformer linear performer --n 1024 4096
  python -m course_lib.bench --variants causal_sdpa causal_linear causal_linear_prefix \\
      --mode forward+backward --n 1024 4096 16384
  python -m course_lib.bench --device cuda --dtype float16 --n 4096 16384 65536
  python -m course_lib.bench --generation --n 4096
"""


def parse_args(argv=None):
    """The options of the command (``--help`` prints them)."""
    variants = "\n".join(f"  {name:<22} {variant.about}" for name, variant in VARIANTS.items())
    parser = argparse.ArgumentParser(
        prog="course-bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG.format(variants=variants, presets=presets.describe()),
        description="Time and peak memory of attention variants versus n, k and m, each case in its own\n"
        "subprocess; writes a CSV and a self-contained plotly HTML report.")
    parser.add_argument("--preset", choices=list(presets.PRESETS), help="a named grid (listed below); its CSV "
                        "goes to course_lib/data/ unless --csv says otherwise")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), metavar="VARIANT",
                        help="attention variants (listed below; default: exact sdpa linformer linear performer)")
    parser.add_argument("--n", nargs="+", type=int, help="sequence lengths (default: 512 1024 2048 4096)")
    parser.add_argument("--k", nargs="+", type=int, help="Linformer projected lengths (default: 128 256)")
    parser.add_argument("--m", nargs="+", type=int, help="Performer random features (default: 256)")
    parser.add_argument("--chunk", type=int, help="positions per chunk of the chunked causal forms "
                        "(default 0: the library's DEFAULT_CHUNK_SIZE)")
    parser.add_argument("--b", type=int, help="batch size (default: 1)")
    parser.add_argument("--h", type=int, help="heads (default: 8)")
    parser.add_argument("--d", type=int, help="head dim, d = e (default: 64)")
    parser.add_argument("--dtype", choices=list(DTYPES), help="default: float32")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default: cpu")
    parser.add_argument("--mode", choices=MODES, help="forward (default): under no_grad (inference); "
                        "forward+backward: gradients into every input")
    parser.add_argument("--repeats", type=int, help="timed calls per case (the median and minimum are reported; "
                        "default 5, a preset's own)")
    parser.add_argument("--warmup", type=int, help="untimed calls before measuring (default 2, a preset's own)")
    parser.add_argument("--budget", type=float, help="seconds of timed calls per case: a slower case gets fewer "
                        "calls, at least --min-repeats, and two warm-up calls at most if a call takes over a second "
                        "(default 0: no budget, or a preset's own)")
    parser.add_argument("--min-repeats", type=int, help="fewest timed calls under --budget (default 5)")
    parser.add_argument("--threads", type=int, help="torch threads (default 0: torch's default)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per case")
    parser.add_argument("--note", default="", help="a note stored in every row's note column (e.g. "
                        "'provisional: shared machine')")
    parser.add_argument("--resume", action="store_true", help="keep the cases the CSV already holds (status ok) "
                        "and measure only the others")
    parser.add_argument("--csv", default=None, help="output CSV (default: bench-results/bench.csv, a preset's "
                        "file in course_lib/data/, or bench-results/generation.csv with --generation)")
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
    preset = presets.PRESETS.get(args.preset)
    if preset:
        fixed = [f"--{name}" for name in GRID_DEFAULTS if name != "threads" and getattr(args, name) is not None]
        if fixed or args.generation:
            parser.error(f"--preset {args.preset} fixes the grid; leave out {' '.join(fixed or ['--generation'])}")
        args.csv = args.csv or str(presets.data_file(preset))
        args.plot = None if args.no_plot else (args.plot or f"bench-results/{args.preset}.html")
        args.budget = preset.budget if args.budget is None else args.budget
        args.min_repeats = args.min_repeats or preset.min_repeats
        return args
    for name, default in GRID_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    args.repeats, args.warmup = args.repeats or 5, 2 if args.warmup is None else args.warmup
    args.budget, args.min_repeats = args.budget or 0.0, args.min_repeats or 5
    args.csv = args.csv or f"bench-results/{'generation' if args.generation else 'bench'}.csv"
    args.plot = None if args.no_plot else (args.plot or str(pathlib.Path(args.csv).with_suffix(".html")))
    return args


def _say(args, text):
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


def _cases(args, skipped):
    if args.preset:
        return presets.cases(presets.PRESETS[args.preset], repeats=args.repeats, warmup=args.warmup,
                             threads=args.threads, skipped=skipped)
    common = dict(b=args.b, h=args.h, d=args.d, dtype=args.dtype, device=args.device, mode=args.mode,
                  repeats=args.repeats, warmup=args.warmup, threads=args.threads, chunk=args.chunk)
    return make_cases(args.variants, args.n, args.k, args.m, skipped=skipped, **common)


def _kept(args):
    """``--resume``: the measured rows already in the CSV, by case."""
    if not (args.resume and pathlib.Path(args.csv).exists()):
        return {}
    return {presets.key(row): row for row in output.read_csv(args.csv) if row.get("status") == "ok"}


def _run_grid(args):
    skipped = []
    cases = _cases(args, skipped)
    for case, reason in skipped:
        _say(args, f"skipped {output.label(vars(case))}: {reason}")
    if not cases:
        print("course-bench: nothing to measure: " + (skipped[0][1] if skipped else "no cases"), file=sys.stderr)
        return None
    line = hardware(cases[0].device)
    modes = ", ".join(dict.fromkeys(case.mode for case in cases))
    _say(args, f"{line}; {len(cases)} cases, {modes}, {cases[0].dtype}, {cases[0].device}")
    kept, rows, start = _kept(args), [], time.perf_counter()
    for i, case in enumerate(cases, start=1):
        if presets.key(case) in kept:
            rows.append(kept[presets.key(case)])
            continue
        began = time.perf_counter()
        row = run_isolated(case, args.timeout, budget=args.budget, min_repeats=args.min_repeats)
        rows.append({**row, "case_s": round(time.perf_counter() - began, 2), "note": args.note})
        _say(args, f"[{i}/{len(cases)}] {output.label(rows[-1])} … {output.outcome(rows[-1])} "
                   f"({rows[-1]['case_s']:.1f} s)")
        # After every case, so a run cut short keeps what it measured (and --resume goes on from there).
        output.write_csv(rows + [kept[presets.key(c)] for c in cases[i:] if presets.key(c) in kept], args.csv)
    _say(args, f"{len(rows)} cases in {(time.perf_counter() - start) / 60:.1f} min")
    title = f"{modes}, {cases[0].dtype}, {cases[0].device}: time and peak memory versus n<br><sup>{line}</sup>"
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
