"""Reading the stored grids: series, crossovers as stable intervals, log-log slopes, on synthetic rows.

The stored CSV is re-measured on a quiet machine at the end, so these tests use rows made up
here (exact numbers known), plus one check that the shipped grid reads and holds what the
lessons compare.
"""

import numpy as np
import pytest

from course_lib.bench import presets, stored

N = [256, 512, 1024, 2048, 4096]


def row(variant, n, seconds, peak=1000, mode="forward", status="ok", **extra):
    return {"variant": variant, "mode": mode, "device": "cpu", "dtype": "float32", "b": 1, "h": 8, "n": n, "d": 64,
            "k": 0, "m": 0, "chunk": 0, "threads": 2, "repeats": 20, "time_min_s": seconds,
            "time_median_s": 1.5 * seconds, "peak_bytes": peak, "status": status, "message": "",
            "hardware": "a CPU, 2 threads, torch x", "note": "", **extra}


# Exact grows like n², linear like n: linear is slower up to n = 512 and faster from 1024 on.
ROWS = ([row("exact", n, 1e-3 * (n / 256) ** 2, peak=4 * 8 * n * n) for n in N]
        + [row("linear", n, 2.5e-3 * n / 256, peak=100 * n) for n in reversed(N)]
        + [row("linear", n, 1.0, mode="forward+backward") for n in N[:2]]
        + [row("exact", 8192, 0, status="oom")])


def test_series_sorted_by_n_with_time_and_memory():
    n, seconds, peak = stored.series(ROWS, "linear")
    assert n.tolist() == N and np.all(np.diff(seconds) > 0)
    assert peak.tolist() == [100 * x for x in N]
    _, median, _ = stored.series(ROWS, "linear", statistic="median")
    np.testing.assert_allclose(median, 1.5 * seconds)
    assert stored.series(ROWS, "linear", "forward+backward")[0].tolist() == N[:2]


def test_series_leaves_out_what_did_not_finish_and_lists_it():
    assert stored.series(ROWS, "exact")[0].tolist() == N  # the oom row at 8192 is not a measurement
    assert stored.not_measured(ROWS) == [("exact", "forward", 8192, "oom", "")]
    assert stored.not_measured(ROWS, variant="linear") == []


def test_series_refuses_ambiguous_and_unknown_requests():
    rows = ROWS + [row("linformer", 512, 1e-3, k=128), row("linformer", 512, 2e-3, k=256)]
    with pytest.raises(ValueError, match="several cases at n = 512 .*differ in k.*k=..."):
        stored.series(rows, "linformer")
    assert stored.series(rows, "linformer", k=256)[1].tolist() == [2e-3]
    with pytest.raises(ValueError, match="no measured case of 'performer'.*exact \\(forward\\)"):
        stored.series(rows, "performer")
    with pytest.raises(ValueError, match="no column 'q'"):
        stored.series(rows, "linear", q=1)
    with pytest.raises(ValueError, match="statistic must be one of"):
        stored.series(rows, "linear", statistic="mean")


def test_crossover_is_the_interval_between_two_measured_n():
    n, exact, linear = stored.common(stored.series(ROWS, "exact"), stored.series(ROWS, "linear"))
    # linear/exact = 2.5·256/n: 2.5 at 256, 1.25 at 512, 0.625 at 1024.
    assert stored.crossover(n, linear, exact) == (512, 1024)
    assert stored.faster_from(n, linear, exact) == 1024
    # The other way round, exact is faster only at the small n: never from some n on.
    assert stored.crossover(n, exact, linear) is None and stored.faster_from(n, exact, linear) is None
    # A margin asks for more than a win: 1.7× faster holds from 2048 (exact/linear = 3.2 there, 1.6 at 1024).
    assert stored.crossover(n, linear, exact, margin=1.7) == (1024, 2048)


def test_crossover_is_stable_in_a_noisy_non_monotone_grid():
    n = np.array([256, 512, 1024, 2048, 4096, 8192])
    b = np.ones(6)
    # a wins at 512 by noise, loses at 1024 and 2048 (a disturbed case), wins from 4096 on.
    a = np.array([1.2, 0.9, 1.1, 1.3, 0.5, 0.3])
    assert stored.crossover(n, a, b) == (2048, 4096)
    assert stored.faster_from(n, a, b) == 4096
    # A loss at the largest n: no stable crossover, whatever happened before.
    a_last_lost = np.array([1.2, 0.5, 0.4, 0.3, 0.2, 1.01])
    assert stored.crossover(n, a_last_lost, b) is None and stored.faster_from(n, a_last_lost, b) is None
    # Faster at every n: no crossover inside the grid, and faster_from says "from the first n".
    assert stored.crossover(n, b / 2, b) is None and stored.faster_from(n, b / 2, b) == 256
    # A tie is not a win.
    assert stored.crossover(n, np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.9]), b) == (4096, 8192)


def test_describe_crossover_says_interval_or_why_none():
    n = np.array([256, 512, 1024, 2048])
    b = np.ones(4)
    text = stored.describe_crossover(n, np.array([2, 2, 0.5, 0.5]), b, ("linear", "SDPA"))
    assert text == "linear becomes and stays faster than SDPA between n = 512 and n = 1,024 (measured n = 256 … 2,048)"
    assert "at every measured n" in stored.describe_crossover(n, b / 2, b)
    assert "not faster than b by more than 3× at the largest measured n (2,048" in stored.describe_crossover(
        n, b / 2, b, margin=3)


def test_crossover_checks_its_arguments():
    with pytest.raises(ValueError, match="one value per n"):
        stored.crossover([256, 512], [1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="increase strictly"):
        stored.crossover([512, 256], [1.0, 1.0], [2.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        stored.crossover([256, 512], [0.0, 1.0], [2.0, 2.0])


def test_loglog_slope_recovers_known_powers():
    n = np.array(N, dtype=float)
    assert stored.loglog_slope(n, 3e-9 * n**2) == pytest.approx(2.0)
    # A fixed cost bends the curve at small n: the slope over the large n only is the growth.
    with_overhead = 1e-3 + 1e-6 * n
    whole, large = stored.loglog_slope(n, with_overhead), stored.loglog_slope(n, with_overhead, n_min=2048)
    assert whole < 0.6 < large < 1  # 1 ms + 1 µs·n: the fixed cost still weighs a third at n = 2048
    assert large == pytest.approx(np.log2((1e-3 + 4096e-6) / (1e-3 + 2048e-6)))
    assert stored.loglog_slope(n, n**1.5, n_max=1024) == pytest.approx(1.5)
    np.testing.assert_allclose(stored.local_slopes(n, n**2), 2.0)
    with pytest.raises(ValueError, match="at least two lengths"):
        stored.loglog_slope(n, n, n_min=4096)


def test_measured_on_names_the_machine_and_the_note():
    rows = [row("exact", 256, 1e-3), row("exact", 512, 1.0, repeats=5)]
    line = stored.measured_on(rows)
    assert line.startswith("a CPU, 2 threads, torch x; b = 1, h = 8, d = e = 64, float32; 20 timed calls a case "
                           "(5 at least for slow ones)")
    assert not stored.provisional(rows)
    rows[0]["note"] = "provisional: shared machine"
    assert stored.provisional(rows) and stored.measured_on(rows).endswith("; provisional: shared machine")


def test_load_names_the_stored_grids_when_one_is_missing():
    with pytest.raises(FileNotFoundError, match="no stored grid named 'nope'.*grid_cpu.*linformer_cpu"):
        stored.load("nope")


def test_shipped_grid_holds_every_variant_the_lessons_compare():
    rows = stored.load()
    wanted = {variant for part in presets.GRID.parts for variant in part.variants}
    for mode in ("forward", "forward+backward"):
        measured = {r["variant"] for r in rows if r["mode"] == mode and r["status"] == "ok"}
        expected = {v for part in presets.GRID.parts if part.mode == mode for v in part.variants}
        assert expected <= wanted and expected <= measured, (mode, expected - measured)
    n, seconds, _ = stored.series(rows, "sdpa")
    assert n[0] == 32 and np.all(seconds > 0)
    low, high = stored.SLOPE_RANGE  # lessons 06 and 09 fit every slope over these lengths
    assert low in n and high in n and low < high
    assert {r["h"] for r in rows} == {8} and {r["d"] for r in rows} == {64}
