"""The stored timing grids, read back: series against n, crossovers as intervals, log-log slopes.

Lessons 06, 08 and 09 read one grid, ``course_lib/data/bench_grid_cpu.csv``, written by
``python -m course_lib.bench --preset grid`` (``presets.py``).  They print every number from it
through these functions, so a grid measured again changes their numbers and not their code.

A crossover is an *interval* between two measured lengths, never a point: the grid says that
variant a is slower (or not faster by the margin) at ``n_low`` and faster from ``n_high`` on, at
every larger measured n; the true crossover lies somewhere in between.  A noisy grid in which
the order flips back and forth gives the interval after the last flip.
"""

import numpy as np

from course_lib.bench.output import read_csv

STATISTICS = {"min": "time_min_s", "median": "time_median_s"}

# The lengths over which lessons 06 and 09 fit every log-log slope of the grid (``loglog_slope(n, values,
# *SLOPE_RANGE)``): from 2,048, where a call's fixed costs no longer count, to 8,192, below the 16,384 at
# which every (h, n, d) float32 array reaches 32 MiB and glibc serves it with fresh pages at every call.
SLOPE_RANGE = (2048, 8192)


def load(name="grid_cpu"):
    """The rows of the stored grid ``course_lib/data/bench_{name}.csv``: a list of dicts, numbers as numbers.

    ``load()`` is the shared grid of lessons 06, 08 and 09; ``load("linformer_cpu")`` lesson 04's.
    """
    from course_lib import data_path

    try:
        path = data_path(f"bench_{name}.csv")
    except FileNotFoundError:
        from importlib.resources import files

        known = sorted(p.name[len("bench_"):-len(".csv")] for p in (files("course_lib") / "data").iterdir()
                       if p.name.startswith("bench_") and p.name.endswith(".csv"))
        raise FileNotFoundError(f"no stored grid named {name!r} (course_lib/data/bench_{name}.csv); "
                                f"stored: {', '.join(known)}") from None
    return read_csv(path)


def series(rows, variant, mode="forward", *, statistic="min", **filters):
    """``(n, seconds, peak_bytes)``: one variant's measured cases as NumPy arrays sorted by n.

    Args:
        rows: rows of a grid (``load()``).
        variant: e.g. ``"linear"``, ``"causal_sdpa"``.
        mode: ``"forward"`` or ``"forward+backward"``.
        statistic: ``"min"`` (the least disturbed call; the default) or ``"median"`` time.
        **filters: other columns that must match, e.g. ``k=128``, ``m=256``, ``h=8``.

    Only cases measured (status ok) are returned: one that ran out of memory or time is left
    out (``not_measured`` lists them).  Several rows at one n (two k, say) are an error that
    names the column to filter on.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(map(repr, STATISTICS))}; got {statistic!r}")
    columns = set(rows[0]) if rows else set()
    unknown = sorted(set(filters) - columns)
    if unknown:
        raise ValueError(f"no column {', '.join(map(repr, unknown))} to filter on; columns: {', '.join(columns)}")
    chosen = [r for r in rows if r["variant"] == variant and r["mode"] == mode and r["status"] == "ok"
              and all(r[name] == value for name, value in filters.items())]
    if not chosen:
        there = sorted({(r["variant"], r["mode"]) for r in rows if r["status"] == "ok"})
        raise ValueError(f"no measured case of {variant!r}, mode {mode!r}" + (f" with {filters}" if filters else "")
                         + "; the grid holds: " + ", ".join(f"{v} ({m})" for v, m in there))
    chosen.sort(key=lambda r: r["n"])
    n = np.array([r["n"] for r in chosen])
    repeated = sorted({int(x) for x in n[1:][np.diff(n) == 0]})
    if repeated:
        differ = [c for c in ("k", "m", "chunk", "b", "h", "d", "dtype", "device", "threads")
                  if len({r[c] for r in chosen if r["n"] == repeated[0]}) > 1]
        raise ValueError(f"{variant!r} has several cases at n = {repeated[0]} (they differ in "
                         f"{', '.join(differ) or 'nothing: a duplicated row'}): pass e.g. "
                         f"{differ[0] if differ else 'k'}=... to pick one")
    seconds = np.array([r[STATISTICS[statistic]] for r in chosen], dtype=float)
    peak = np.array([r["peak_bytes"] for r in chosen], dtype=np.int64)
    return n, seconds, peak


def not_measured(rows, variant=None, mode=None):
    """``[(variant, mode, n, status, message)]`` of the cases that did not finish (out of memory, time)."""
    return [(r["variant"], r["mode"], r["n"], r["status"], r.get("message", "")) for r in rows
            if r["status"] != "ok" and variant in (None, r["variant"]) and mode in (None, r["mode"])]


def common(series_a, series_b):
    """``(n, seconds_a, seconds_b)`` at the lengths both series measured (exact stops before SDPA, say)."""
    (n_a, seconds_a, _), (n_b, seconds_b, _) = series_a, series_b
    n, in_a, in_b = np.intersect1d(n_a, n_b, return_indices=True)
    return n, seconds_a[in_a], seconds_b[in_b]


def _check(n, *values):
    n = np.asarray(n)
    values = [np.asarray(v, dtype=float) for v in values]
    if n.ndim != 1 or len(n) == 0:
        raise ValueError(f"n must be a non-empty 1-d array of lengths; got shape {n.shape}")
    for v in values:
        if v.shape != n.shape:
            raise ValueError(f"each series must have one value per n: n has shape {n.shape}, a series {v.shape}")
        if not np.all(v > 0):
            raise ValueError("times must be positive (and finite) to compare on a log scale")
    if np.any(np.diff(n) <= 0):
        raise ValueError(f"n must increase strictly (sort a series by n first); got {n.tolist()}")
    return n, values


def faster_from(n, seconds_a, seconds_b, *, margin=1.0):
    """The smallest measured n from which a is faster than b at every larger measured n; None if not at the last.

    ``margin``: a counts as faster where ``seconds_b > margin · seconds_a`` (``margin=1.5``: at
    least 1.5 × faster), so a claim keeps its meaning when the grid is measured again.
    """
    n, (a, b) = _check(n, seconds_a, seconds_b)
    faster = b > margin * a
    if not faster[-1]:
        return None
    slower = np.flatnonzero(~faster)
    return int(n[slower[-1] + 1]) if len(slower) else int(n[0])


def crossover(n, seconds_a, seconds_b, *, margin=1.0):
    """``(n_low, n_high)``: the interval in which variant a becomes, and stays, faster than b.

    a is not faster (by ``margin``) at ``n_low``, and faster at ``n_high`` and at every larger
    measured n.  None when there is no crossover in the grid: a is faster at every measured n
    (``faster_from`` returns ``n[0]`` then), or not faster at the largest.

    Args:
        n: measured lengths, increasing ``(p,)``; seconds_a, seconds_b: times at those n ``(p,)``.
        margin: a counts as faster where ``seconds_b > margin · seconds_a``.
    """
    start = faster_from(n, seconds_a, seconds_b, margin=margin)
    n = np.asarray(n)
    if start is None or start == n[0]:
        return None
    i = int(np.flatnonzero(n == start)[0])
    return int(n[i - 1]), int(n[i])


def describe_crossover(n, seconds_a, seconds_b, names=("a", "b"), *, margin=1.0):
    """One sentence: where a becomes and stays faster than b (an interval), or why there is no crossover."""
    a, b = names
    span = f"n = {n[0]:,} … {n[-1]:,}"
    start = faster_from(n, seconds_a, seconds_b, margin=margin)
    by = "" if margin == 1 else f" by more than {margin:g}×"
    if start is None:
        return f"{a} is not faster than {b}{by} at the largest measured n ({n[-1]:,}; measured {span})"
    if start == n[0]:
        return f"{a} is faster than {b}{by} at every measured n ({span})"
    low, high = crossover(n, seconds_a, seconds_b, margin=margin)
    return f"{a} becomes and stays faster than {b}{by} between n = {low:,} and n = {high:,} (measured {span})"


def loglog_slope(n, values, n_min=None, n_max=None):
    """The least-squares slope of log(values) against log(n), over ``n_min ≤ n ≤ n_max``.

    Time ∝ n^slope: about 2 for exact attention at large n, about 1 for linear attention once its
    fixed costs are amortised.  ``values`` may be seconds or peak bytes.
    """
    n, (values,) = _check(n, values)
    keep = (n >= (n_min or n[0])) & (n <= (n_max or n[-1]))
    if keep.sum() < 2:
        raise ValueError(f"a slope needs at least two lengths in [{n_min}, {n_max}]; the series has "
                         f"{n[keep].tolist()} there")
    return float(np.polyfit(np.log(n[keep]), np.log(values[keep]), 1)[0])


def local_slopes(n, values):
    """``(p - 1,)`` slopes of log(values) against log(n) between neighbouring lengths: where the growth sets in."""
    n, (values,) = _check(n, values)
    return np.diff(np.log(values)) / np.diff(np.log(n))


def measured_on(rows):
    """One line on how the grid was measured: hardware, threads, setting, timed calls, and its note if any."""
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        raise ValueError("the grid has no measured case")
    first = ok[0]
    repeats = sorted({r["repeats"] for r in ok})
    calls = f"{repeats[-1]} timed calls a case" + (f" ({repeats[0]} at least for slow ones)" if len(repeats) > 1
                                                   else "")
    sizes = f"b = {first['b']}, h = {first['h']}, d = e = {first['d']}, {first['dtype']}"
    notes = sorted({str(r.get("note") or "") for r in ok} - {""})
    return f"{first['hardware']}; {sizes}; {calls}" + "".join(f"; {note}" for note in notes)


def provisional(rows):
    """True when any row's note marks the grid as provisional (measured on a shared, disturbed machine)."""
    return any(str(r.get("note") or "").startswith("provisional") for r in rows)
