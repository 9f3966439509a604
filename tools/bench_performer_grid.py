"""Write ``course_lib/data/bench_performer_cpu.csv``, the stored grid that notebook 08 reads.

    .venv/bin/python tools/bench_performer_grid.py [--csv PATH]

Two grids of ``course_lib.bench`` cases, each case in its own subprocess (``bench.run_isolated``),
float32, ``(b, h, d) = (1, 4, 64)``, e = d, m = 256 random features, one thread (on a machine
shared with other work, a two-thread kernel waits at every barrier for a descheduled thread):

* sdpa, performer and causal_sdpa at n = 256 … 16,384;
* exact (``softmax_attention``) and causal_performer at n = 256 … 4,096: exact's weights alone
  need 4 GiB at n = 16,384, and causal_performer's prefix sums keep n × m × e numbers per head.

``--resume`` keeps the rows already in the CSV and measures only the missing cases (the stored
file was written in two such runs).  The same cases with the command line::

    python -m course_lib.bench --variants sdpa performer causal_sdpa --n 256 1024 4096 16384 \\
        --m 256 --h 4 --threads 1 --repeats 3 --warmup 1
    python -m course_lib.bench --variants exact causal_performer --n 256 1024 4096 \\
        --m 256 --h 4 --threads 1 --repeats 3 --warmup 1
"""

import argparse
import sys

from course_lib import bench

SHAPE = dict(b=1, h=4, d=64, dtype="float32", device="cpu", threads=1)
GRIDS = [
    (["sdpa", "performer", "causal_sdpa"], [256, 1024, 4096, 16384], dict(mode="forward", repeats=3, warmup=1)),
    (["exact", "causal_performer"], [256, 1024, 4096], dict(mode="forward", repeats=3, warmup=1)),
]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default="course_lib/data/bench_performer_cpu.csv")
    parser.add_argument("--resume", action="store_true", help="keep the CSV's rows; measure only missing cases")
    args = parser.parse_args(argv)
    rows = bench.read_csv(args.csv) if args.resume else []
    done = {(row["mode"], row["variant"], int(row["n"])) for row in rows}
    for variants, ns, common in GRIDS:
        for case in bench.make_cases(variants, ns, ms=[256], **SHAPE, **common):
            if (case.mode, case.variant, case.n) in done:
                continue
            rows.append(bench.run_isolated(case))
            print(f"{case.mode:>16} {case.variant:>16} n = {case.n:>5}: {bench.output.outcome(rows[-1])}", flush=True)
            bench.write_csv(rows, args.csv)  # after every case, so an interrupted run keeps what it measured
    print(f"wrote {args.csv} ({len(rows)} cases) on {bench.hardware()}")
    return 0 if all(row["status"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
