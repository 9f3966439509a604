"""Execute notebooks in place, top to bottom in one fresh kernel, and store the outputs.

    python tools/execute.py notebooks/01_attention_recap.ipynb [more.ipynb ...]

Prints each notebook's wall time.  Run it after editing a lesson or a solution, then commit
the executed notebook: nbval compares the stored outputs on every ``make test``.
"""

import argparse
import pathlib
import sys
import time

import nbformat
from nbclient import NotebookClient

# Per-cell limit: a whole lesson must run in 90 s, so no cell needs more.  It also bounds a
# sporadic stall seen here with nbclient 0.11 + pyzmq 27: after a cell that creates widgets, the
# execute reply sometimes goes unnoticed until the poll times out, and only then is it read
# (the cell's outputs are complete and correct; only the wait is lost).  nbval, which make test
# uses, polls with blocking sockets and has not shown it.
CELL_TIMEOUT_S = 90


def execute(path, timeout=CELL_TIMEOUT_S):
    """Run ``path`` in place; return the wall time in seconds."""
    path = pathlib.Path(path)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    nbformat.write(nb, path)
    return seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT_S, help="seconds per cell")
    args = parser.parse_args(argv)
    for path in args.paths:
        print(f"{execute(path, args.timeout):7.1f} s  {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
