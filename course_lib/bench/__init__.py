"""Time and peak memory of attention variants versus n, k and m, each case in isolation.

Implements the measurements of notebooks 04, 06, 07, 08 and 09 and the command ``course-bench``
(``python -m course_lib.bench --help``).  One concern per file:

- ``variants.py``: the variants (how each is called), their FLOP counts, ``Case`` and the grid;
- ``measure.py``: how one case is measured: time, peak memory, one subprocess per case;
- ``presets.py``: the named grids, each stored grid one command (``--preset grid``, ``--preset linformer``);
- ``stored.py``: the stored grids read back: ``load``, ``series``, ``crossover`` (an interval),
  ``loglog_slope``;
- ``generation.py``: cost per generated token versus position (RNN step, softmax with and
  without a key/value cache);
- ``output.py``: what a run leaves behind: the CSV, the text report and the self-contained plotly
  HTML report;
- ``cli.py`` and ``__main__.py``: the command line.

Every name below can be imported from ``course_lib.bench`` itself.
"""

from course_lib.bench import presets, stored
from course_lib.bench.cli import main, parse_args
from course_lib.bench.measure import (
    clear_refs_available,
    failed_row,
    hardware,
    is_out_of_memory,
    matmul_rate,
    matmul_size,
    peak_memory,
    rss_resolution,
    run_case,
    run_isolated,
)
from course_lib.bench.output import (
    COLUMNS,
    format_bytes,
    format_time,
    read_csv,
    report,
    savings,
    write_csv,
)
from course_lib.bench.variants import (
    DTYPES,
    MODES,
    VARIANTS,
    Case,
    Variant,
    chunked_flops,
    exact_flops,
    linear_flops,
    linformer_flops,
    make_cases,
    performer_flops,
    problem,
    total_flops,
)

__all__ = [
    "COLUMNS", "DTYPES", "MODES", "VARIANTS", "Case", "Variant", "chunked_flops", "clear_refs_available",
    "exact_flops", "failed_row", "format_bytes", "format_time", "hardware", "is_out_of_memory", "linear_flops",
    "linformer_flops", "main", "make_cases", "matmul_rate", "matmul_size", "parse_args", "peak_memory",
    "performer_flops", "presets", "problem", "read_csv", "report", "rss_resolution", "run_case", "run_isolated",
    "savings", "stored", "total_flops", "write_csv",
]
