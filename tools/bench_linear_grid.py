"""Write ``course_lib/data/bench_linear_cpu.csv``, the stored grid that notebook 06 reads.

    .venv/bin/python tools/bench_linear_grid.py [--modes forward forward+backward] [--csv PATH]

(The stored file was made by several runs at the same time (``--modes``, ``--n`` and ``--variants``
pick a part of the grids), each into its own file, their rows then joined.  On the shared 2-core
machine one forward+backward call of the prefix sums took 103 s already at n = 8,192, so the prefix
sums were left out at n = 16,384: ``--variants linear causal_sdpa causal_linear_chunked --n 16384``.)

Two grids of ``course_lib.bench`` cases, each case in its own subprocess (``bench.run_isolated``),
float32, ``(b, h, d) = (1, 4, 64)``, e = d, one thread, written to one CSV.  One thread: on a
machine shared with other work, a two-thread kernel waits at every barrier for a descheduled
thread, and its times measure the neighbours more than the kernel.

* **forward** (inference), n = 64 … 8,192: exact (``softmax_attention``), sdpa, linear, causal_sdpa
  and causal_linear_chunked: where linear attention overtakes exact attention and SDPA;
* **forward+backward**, n = 1,024 … 16,384: linear, causal_sdpa, causal_linear (prefix sums through
  autograd of ``cumsum``) and causal_linear_chunked: peak memory and time of the causal forms.

The same grids with the command line, one mode per run::

    python -m course_lib.bench --variants exact sdpa linear causal_sdpa causal_linear_chunked \\
        --n 64 128 256 512 1024 2048 4096 8192 --h 4 --threads 1 --repeats 5 --warmup 1
    python -m course_lib.bench --variants linear causal_sdpa causal_linear causal_linear_chunked \\
        --mode forward+backward --n 1024 2048 4096 8192 16384 --h 4 --threads 1 --repeats 3 --warmup 1
"""

import argparse
import sys

from course_lib import bench

SHAPE = dict(b=1, h=4, d=64, dtype="float32", device="cpu", threads=1)
GRIDS = [
    (["exact", "sdpa", "linear", "causal_sdpa", "causal_linear_chunked"], [64, 128, 256, 512, 1024, 2048, 4096, 8192],
     dict(mode="forward", repeats=5, warmup=1)),
    (["linear", "causal_sdpa", "causal_linear", "causal_linear_chunked"], [1024, 2048, 4096, 8192, 16384],
     dict(mode="forward+backward", repeats=3, warmup=1)),
]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", choices=bench.MODES, default=list(bench.MODES))
    parser.add_argument("--n", nargs="+", type=int, help="only these lengths of the grids (default: all)")
    parser.add_argument("--variants", nargs="+", help="only these variants of the grids (default: all)")
    parser.add_argument("--csv", default="course_lib/data/bench_linear_cpu.csv")
    args = parser.parse_args(argv)
    rows = []
    for variants, ns, common in GRIDS:
        if common["mode"] not in args.modes:
            continue
        variants = [v for v in variants if args.variants is None or v in args.variants]
        ns = [n for n in ns if args.n is None or n in args.n]
        for case in bench.make_cases(variants, ns, **SHAPE, **common):
            rows.append(bench.run_isolated(case))
            print(f"{case.mode:>16} {case.variant:>22} n = {case.n:>5}: {bench.output.outcome(rows[-1])}", flush=True)
            bench.write_csv(rows, args.csv)  # after every case, so an interrupted run keeps what it measured
    print(f"wrote {args.csv} ({len(rows)} cases) on {bench.hardware()}")
    return 0 if all(row["status"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
