"""What a benchmark run leaves behind: the CSV, the text report and a self-contained plotly HTML page.

The CSV has one row per case with the columns ``COLUMNS`` (``read_csv`` reads it back, numbers
as numbers); a failed case keeps its sizes, ``status`` ("oom", "timeout", "error") and a
one-line ``message``.  ``repeats`` and ``warmup`` are the calls actually made; ``load_1min`` is
the machine's 1-minute load average when the case began (on a quiet machine about the number of
threads: the previous case's own), ``case_s`` the wall time of the case's whole process, and
``note`` what the command's ``--note`` said about the run (e.g. that it is provisional).

The HTML embeds plotly.js (``include_plotlyjs=True``), so it opens with no network: time and
peak memory versus n, log-log, one line per variant (and per k or m, and per mode).
"""

import csv
import pathlib

COLUMNS = ["variant", "mode", "device", "dtype", "b", "h", "n", "d", "k", "m", "chunk", "threads", "repeats",
           "warmup", "time_median_s", "time_min_s", "peak_bytes", "memory_method", "flops", "gflops", "matmul_n",
           "matmul_gflops", "matmul_fraction", "status", "message", "hardware", "load_1min", "case_s", "note"]


def write_csv(rows, path, columns=COLUMNS):
    """Write the rows with ``columns`` (missing values left empty); create the folder if needed."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
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


def label(row, n=True):
    """``"linformer n=4096 k=128"``: the variant and the sizes that matter to it (``n=False``: no n)."""
    sizes = [f"n={row['n']}"] * n + [f"{size}={row[size]}" for size in ("k", "m", "chunk") if row.get(size)]
    return " ".join([row["variant"], *sizes])


def outcome(row):
    """``"14.9 ms, 42.1 MiB"`` for a measured case; its one-line message otherwise."""
    if row.get("status") != "ok":
        return row.get("message") or row.get("status", "")
    return f"{format_time(row['time_median_s'])}, {format_bytes(row['peak_bytes'])}"


# Each variant is compared with exact attention of the same causality: the step-by-step kernel and the fused one.
BASELINES = {False: ("exact", "sdpa"), True: ("causal_exact", "causal_sdpa")}


def ratios(rows, baseline):
    """``{label: (time saved ×, memory saved ×)}`` of every measured row over ``baseline`` at the same n."""
    ok = [r for r in rows if r.get("status") == "ok"]
    base = {r["n"]: r for r in ok if r["variant"] == baseline}
    return {label(r): (base[r["n"]]["time_median_s"] / r["time_median_s"],
                       base[r["n"]]["peak_bytes"] / max(r["peak_bytes"], 1))
            for r in ok if r["n"] in base and r["variant"] != baseline}


def report(rows):
    """Lines for the terminal: each case, then every variant's savings over exact attention and SDPA.

    Rows of several modes (a preset) are reported mode by mode.
    """
    modes = list(dict.fromkeys(r.get("mode", "forward") for r in rows))
    if len(modes) > 1:
        return [line for mode in modes
                for line in [f"{mode}:", *_report([r for r in rows if r.get("mode", "forward") == mode])]]
    return _report(rows)


def _report(rows):
    lines = [f"{'variant':>21} {'n':>6} {'k':>5} {'m':>5} {'time':>9} {'peak memory':>11} {'GFLOP/s':>8} "
             f"{'matmul':>7} {'fraction':>8}"]
    for r in rows:
        head = f"{r['variant']:>21} {r['n']:>6} {r['k']:>5} {r['m']:>5}"
        if r.get("status") != "ok":
            lines.append(f"{head}  {r['status']}: {r.get('message', '')}")
            continue
        lines.append(f"{head} {format_time(r['time_median_s']):>9} {format_bytes(r['peak_bytes']):>11} "
                     f"{r['gflops']:8.1f} {r['matmul_gflops']:7.1f} {r['matmul_fraction']:8.0%}")
    for causal, (exact, fused) in BASELINES.items():
        versus = {name: ratios(rows, name) for name in (exact, fused)}
        names = [label(r) for r in rows if r.get("status") == "ok" and r["variant"].startswith("causal_") == causal
                 and r["variant"] not in (exact, fused) and any(label(r) in v for v in versus.values())]
        if names:
            lines.append(f"saved × over {exact} and {fused} at the same n:")
            lines.append(f"  {'':<36}" + "".join(f"{base + ' time':>14}{'memory':>9}  " for base in versus).rstrip())
            lines += [f"  {name:<36}" + "".join(f"{v[name][0]:>13.1f}×{v[name][1]:>8.1f}×  " if name in v
                                                else f"{'-':>14}{'-':>9}  " for v in versus.values()).rstrip()
                      for name in names]
    return lines


def figure(rows, title="Time and peak memory versus n"):
    """Two log-log panels, time and peak memory versus n, one line per variant (and per k, m, chunk)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from course_lib.viz import COLORS, rounded, style

    fig = make_subplots(rows=1, cols=2, subplot_titles=("median time (s)", "peak memory (MiB)"))
    groups = {}
    for row in rows:
        if row.get("status") == "ok":  # forward+backward rows beside forward ones (a preset) are named so
            mode = "" if row.get("mode", "forward") == "forward" else f" ({row['mode']})"
            groups.setdefault(label(row, n=False) + mode, []).append(row)
    for i, (name, group) in enumerate(sorted(groups.items())):
        group = sorted(group, key=lambda r: r["n"])
        for col, y in ((1, [r["time_median_s"] for r in group]), (2, [r["peak_bytes"] / 2**20 for r in group])):
            fig.add_trace(go.Scatter(x=[r["n"] for r in group], y=rounded(y, 4), name=name, legendgroup=name,
                                     showlegend=col == 1, mode="lines+markers",
                                     line=dict(color=COLORS[i % len(COLORS)])), row=1, col=col)
    failed = [f"{label(r)}: {r.get('message') or r['status']}" for r in rows if r.get("status") != "ok"]
    if failed:
        title += "<br><sup>not measured: " + "; ".join(failed[:4]) + ("; …" if len(failed) > 4 else "") + "</sup>"
    style(fig, title=title, height=520)
    fig.update_xaxes(title="n", type="log")
    fig.update_yaxes(type="log")
    return fig


def write_html(fig, path):
    """Write ``fig`` as one HTML file with plotly.js inside: it opens offline."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
