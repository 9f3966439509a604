"""Plotly figure builders shared by the lessons: one look, rounded data, no state.

Data are rounded to 6 significant digits before they go into a figure, so a stored figure
does not depend on the last bit of a BLAS sum and nbval can compare it.  Lesson-specific
builders live below the shared ones, one section per lesson.
"""

import numpy as np
import plotly.graph_objects as go

TEMPLATE = "plotly_white"
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def rounded(x, digits=6):
    """``x`` as a float array rounded to ``digits`` significant digits (NaN and inf kept)."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(np.isfinite(x) & (x != 0), 10.0 ** (digits - 1 - np.floor(np.log10(np.abs(x)))), 1.0)
    return np.round(x * scale) / scale


# The legend stands right of the plot, top-aligned: never over the title, the subplot titles or the
# x-axis title, however many entries it has (plotly widens the right margin to hold it).
LEGEND = dict(orientation="v", x=1.02, xanchor="left", y=1.0, yanchor="top")
TOP_MARGIN, SUBTITLE_ROOM = 60, 30  # px: the title's line, then one more line for subplot titles


def top_margin(fig, title):
    """The top margin ``fig`` needs: a line for ``title``, one more when subplot titles sit above the plots."""
    subtitles = any(a.yref and a.yref.startswith("paper") and a.y is not None and a.y >= 1
                    for a in fig.layout.annotations)
    return TOP_MARGIN + (SUBTITLE_ROOM if title and subtitles else 0)


def style(fig, *, title=None, x_title=None, y_title=None, log_x=False, log_y=False, height=420):
    """Apply the course layout to ``fig`` and return it: legend at the right, room above for the titles."""
    fig.update_layout(template=TEMPLATE, title=title, height=height,
                      margin=dict(l=60, r=20, t=top_margin(fig, title), b=50), legend=LEGEND)
    # Only what was asked for: axes a caller already set (log scales, titles) stay as they are.
    for update, axis_title, log in ((fig.update_xaxes, x_title, log_x), (fig.update_yaxes, y_title, log_y)):
        if axis_title is not None:
            update(title=axis_title)
        if log:
            update(type="log")
    return fig


def lines(x, series, *, mode="lines+markers", dash=None, **layout):
    """One trace per ``name: y`` in ``series`` against the shared ``x``.

    ``dash`` maps a series name to a plotly dash style (e.g. a bound drawn ``"dash"``).
    """
    fig = go.Figure()
    for i, (name, y) in enumerate(series.items()):
        line = dict(color=COLORS[i % len(COLORS)], dash=(dash or {}).get(name))
        fig.add_trace(go.Scatter(x=rounded(x), y=rounded(y), name=name, mode=mode, line=line))
    return style(fig, **layout)


def heatmap(matrix, *, colorscale="Viridis", zmin=None, zmax=None, x_title="key position j",
            y_title="query position i", **layout):
    """A matrix as a heatmap with row 0 at the top (how attention maps are read), axes always titled.

    The default axis titles read an attention map (rows: queries, columns: keys); name others'.
    """
    if not (x_title and y_title):
        raise ValueError(f"heatmap needs both axis titles, got x_title={x_title!r}, y_title={y_title!r}")
    fig = go.Figure(go.Heatmap(z=rounded(matrix), colorscale=colorscale, zmin=zmin, zmax=zmax))
    fig.update_yaxes(autorange="reversed")
    layout.setdefault("height", 420)
    return style(fig, x_title=x_title, y_title=y_title, **layout)


BASELINE_COLORS = {"output 0": "#7f7f7f", "uniform": "#bcbd22"}  # gray and olive: apart from COLORS
BASELINE_DASHES = ("dot", "dashdot", "longdashdot")  # the first, second, third line of the same answer


def add_baselines(fig, x, baselines, *, row=None, col=None, showlegend=True):
    """The trivial answers as horizontal lines across ``x``, one per ``name: value``; returns ``fig``.

    An approximation's error means something only next to what knows nothing: an output of zero
    (relative error 1) and uniform attention (every query gets the mean of V).  Lines whose name
    starts with "output 0" are gray, "uniform …" olive; a second line of the same kind (another
    value column, the worst row instead of the median) is dash-dotted.
    """
    x = np.asarray(x, dtype=float)
    seen = {}
    for name, value in baselines.items():
        kind = next((k for k in BASELINE_COLORS if name.startswith(k)), None)
        count = seen[kind] = seen.get(kind, -1) + 1
        line = dict(color=BASELINE_COLORS.get(kind, "#7f7f7f"), dash=BASELINE_DASHES[count % len(BASELINE_DASHES)],
                    width=2)
        fig.add_trace(go.Scatter(x=rounded([x.min(), x.max()]), y=rounded([value, value]), mode="lines", name=name,
                                 line=line, showlegend=showlegend), row=row, col=col)
    return fig


# --- Lesson 02 ---

def spectrum_curves(curves, *, k_mark=None, title="Normalised cumulative singular values of P", height=440,
                    dash=None):
    """Normalised cumulative spectra c_k (Eq. 2.2) against k = 1 … r, one line per ``name: c``.

    ``k_mark`` draws a dotted vertical line (e.g. at k = 128, the Linformer figure's mark).
    """
    x = np.arange(1, len(next(iter(curves.values()))) + 1)
    fig = lines(x, curves, mode="lines", dash=dash, title=title, x_title="k (largest singular values kept)",
                y_title="c_k", height=height)
    if k_mark is not None:
        fig.add_vline(x=k_mark, line_dash="dot", line_color="gray", annotation_text=f"k = {k_mark}")
    fig.update_yaxes(range=[0, 1.02])
    return fig


def layer_head_heatmap(values, *, title=None, zmin=None, zmax=None, colorscale="Viridis", height=360):
    """A ``(layers, heads)`` table as a heatmap, each cell labelled with its value; layer 1 on top."""
    values = rounded(values)
    layers, heads = values.shape
    fig = go.Figure(go.Heatmap(z=values, x=[str(h + 1) for h in range(heads)], y=[str(i + 1) for i in range(layers)],
                               text=np.round(values, 2), texttemplate="%{text:.2f}", colorscale=colorscale,
                               zmin=zmin, zmax=zmax))
    fig.update_yaxes(autorange="reversed")
    fig = style(fig, title=title, x_title="head", y_title="layer", height=height)
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


def low_rank_view(P, approx, *, k, title=None, height=380):
    """Two heatmaps side by side: P and its best rank-k copy P_k (Eq. 2.5), on one colour scale."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("P", f"best rank-{k} copy P_k"), horizontal_spacing=0.08)
    zmax = float(np.max(P))
    for col, matrix in ((1, P), (2, approx)):
        fig.add_trace(go.Heatmap(z=rounded(matrix), colorscale="Viridis", zmin=0, zmax=zmax, showscale=col == 2),
                      row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig = style(fig, title=title, height=height)
    fig.update_xaxes(title="key position j")
    fig.update_yaxes(title="query position i", col=1)
    return fig


def spectrum_and_error(sigma, cumulative, errors, *, k, title=None, height=380):
    """One head's spectrum: σᵢ/σ₁ and c_k (left), the relative rank-k error (right), k marked on both."""
    from plotly.subplots import make_subplots

    ks = np.arange(1, len(sigma) + 1)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("spectrum", "relative error of the best rank-k copy"))
    traces = ((1, "σ_k / σ_1", np.asarray(sigma) / sigma[0]), (1, "c_k", cumulative),
              (2, "‖P − P_k‖_F / ‖P‖_F", errors))
    for i, (col, name, y) in enumerate(traces):
        fig.add_trace(go.Scatter(x=ks, y=rounded(y), name=name, mode="lines", line=dict(color=COLORS[i])),
                      row=1, col=col)
    for col in (1, 2):
        fig.add_vline(x=k, line_dash="dot", line_color="gray", row=1, col=col)
    fig = style(fig, title=title, height=height)
    fig.update_xaxes(title="k")
    fig.update_yaxes(title="share (σ_k / σ_1 and c_k)", col=1)
    fig.update_yaxes(title="relative error", col=2)
    return fig


# --- Lesson 04 ---

def bench_figure(rows, *, title="Time and peak memory versus n", height=440):
    """Benchmark rows (``course_lib.bench``) as two log-log panels: median time and peak memory versus n.

    One trace per variant, and per k for variants that have one; failed cases are left out.
    """
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("forward time (s)", "peak memory (MiB)"))
    groups = {}
    for row in rows:
        if row.get("status") == "ok":
            label = row["variant"] + (f", k = {row['k']}" if row.get("k") else "")
            groups.setdefault(label, []).append(row)
    for i, (label, group) in enumerate(sorted(groups.items())):
        group = sorted(group, key=lambda r: r["n"])
        n = [r["n"] for r in group]
        for col, y in ((1, [r["time_median_s"] for r in group]), (2, [r["peak_bytes"] / 2**20 for r in group])):
            fig.add_trace(go.Scatter(x=n, y=rounded(y, 3), name=label, legendgroup=label, showlegend=col == 1,
                                     mode="lines+markers", line=dict(color=COLORS[i % len(COLORS)])),
                          row=1, col=col)
    style(fig, title=title, height=height)
    fig.update_xaxes(title="n", type="log")
    fig.update_yaxes(type="log")
    return fig


def error_versus_k(ks, series, *, title="Linformer's error versus k", y_title="relative error", **layout):
    """Approximation error (one line per projection family) against the projected length k, log y."""
    return lines(ks, series, title=title, x_title="k", y_title=y_title, log_y=True, **layout)


def context_maps(maps, *, title=None, zmax=None, height=340, digits=3):
    """Side-by-side heatmaps of n × s context-mapping matrices (``title: matrix``), one colour scale.

    Rounded to ``digits`` significant digits: these figures sit in widget outputs and stay small.
    """
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=len(maps), subplot_titles=list(maps), horizontal_spacing=0.04)
    zmax = zmax if zmax is not None else float(max(np.max(m) for m in maps.values()))
    for col, matrix in enumerate(maps.values(), start=1):
        fig.add_trace(go.Heatmap(z=rounded(matrix, digits), zmin=0.0, zmax=zmax, colorscale="Viridis",
                                 showscale=col == len(maps)), row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    fig = style(fig, title=title, height=height)
    fig.update_xaxes(title="key position j")
    fig.update_yaxes(title="query position i", col=1)
    return fig


# --- Lesson 05 ---

def sharing_counts(counts, *, title="Distinct projection matrices per sharing mode", height=360):
    """Bars of ``{sharing mode: number of distinct E/F matrices}`` on a log axis, each labelled."""
    names, values = list(counts), [counts[name] for name in counts]
    fig = go.Figure(go.Bar(x=names, y=values, text=[str(v) for v in values], textposition="outside",
                           marker_color=[COLORS[i % len(COLORS)] for i in range(len(names))]))
    return style(fig, title=title, x_title="sharing", y_title="matrices (log scale)", log_y=True, height=height)


def loss_curves(histories, *, title="Training loss", log_y=True, **layout):
    """One line per ``name: (steps, losses)``; losses on a log axis by default."""
    fig = go.Figure()
    for i, (name, (steps, losses)) in enumerate(histories.items()):
        fig.add_trace(go.Scatter(x=list(steps), y=rounded(losses), name=name, mode="lines",
                                 line=dict(color=COLORS[i % len(COLORS)])))
    return style(fig, title=title, x_title="step", y_title="cross-entropy", log_y=log_y, **layout)


def accuracy_grid(rows, *, title="Held-out accuracy: Linformer at each (n, k) and exact attention", height=380):
    """Accuracy against n, one line per k (``rows``: dicts with n, k (None for exact), accuracy)."""
    groups = {}
    for row in rows:
        groups.setdefault("exact" if row["k"] is None else f"k = {row['k']}", []).append(row)
    fig = go.Figure()
    for i, (label, group) in enumerate(sorted(groups.items(), key=lambda item: (item[0] != "exact", item[0]))):
        group = sorted(group, key=lambda r: r["n"])
        fig.add_trace(go.Scatter(x=[r["n"] for r in group], y=rounded([r["accuracy"] for r in group]), name=label,
                                 mode="lines+markers", line=dict(color=COLORS[i % len(COLORS)],
                                                                 dash="dash" if label == "exact" else None)))
    fig = style(fig, title=title, x_title="n", y_title="accuracy per token", log_x=True, height=height)
    fig.update_xaxes(tickvals=sorted({r["n"] for r in rows}))
    return fig


# --- Lesson 03 ---

def _vertical(fig, x, y_low, y_high, name, color, dash):
    """A vertical line at ``x`` drawn as a trace (named in the legend; safe on log axes)."""
    fig.add_trace(go.Scatter(x=rounded([x, x]), y=rounded([y_low, y_high]), mode="lines", name=name,
                             line=dict(color=color, dash=dash)))


def distortion_histogram(distortion, *, bound=None, bins=40, title="Distortion of every pairwise distance",
                         height=380):
    """Bars counting the pairwise distortions |ratio − 1|, with the worst pair and the JL bound ε as lines.

    The counts are binned here (``bins`` bars), so the figure stays small however many pairs.
    """
    distortion = np.asarray(distortion, dtype=float)
    has_bound = bound is not None and np.isfinite(bound)
    top = max(distortion.max(), bound if has_bound else 0.0) * 1.05
    counts, edges = np.histogram(distortion, bins=bins, range=(0.0, top))
    fig = go.Figure(go.Bar(x=rounded((edges[:-1] + edges[1:]) / 2), y=counts.tolist(), width=float(edges[1] - edges[0]),
                           marker_color=COLORS[0], name="pairs"))
    _vertical(fig, distortion.max(), 0, counts.max(), f"worst pair {distortion.max():.3f}", COLORS[1], None)
    if has_bound:
        _vertical(fig, bound, 0, counts.max(), f"JL bound ε = {bound:.3f}", COLORS[2], "dash")
    return style(fig, title=title, x_title="|‖R(x_i − x_j)‖² / ‖x_i − x_j‖² − 1|", y_title="pairs", height=height)


def measured_vs_bound(x, measured, bounds, *, marker=None, marker_label=None, **layout):
    """Measured curves (solid) against bounds (dashed) on shared ``x``; NaN leaves a bound undrawn.

    ``marker`` adds a dotted vertical line (e.g. at k = n) named ``marker_label`` in the legend.
    """
    fig = lines(x, {**measured, **bounds}, dash={name: "dash" for name in bounds}, **layout)
    if marker is not None:
        values = np.concatenate([np.asarray(y, dtype=float).ravel() for y in (*measured.values(), *bounds.values())])
        values = values[np.isfinite(values)]
        _vertical(fig, marker, values.min(), values.max(), marker_label, "gray", "dot")
    return fig


# --- Lesson 06 ---

def feature_maps(x, maps, *, title="Feature maps and their slopes", height=380):
    """Two panels against ``x``: phi(x) and phi'(x), one line per ``name: (values, slopes)``."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("phi(x)", "phi'(x), the gradient that flows back"))
    for i, (name, (values, slopes)) in enumerate(maps.items()):
        for col, y in ((1, values), (2, slopes)):
            fig.add_trace(go.Scatter(x=rounded(x), y=rounded(y), name=name, legendgroup=name, showlegend=col == 1,
                                     mode="lines", line=dict(color=COLORS[i % len(COLORS)])), row=1, col=col)
    style(fig, title=title, height=height)
    fig.update_xaxes(title="x (one entry of q or k)")
    return fig


def cost_bars(times, *, title="Forward time", height=340):
    """Bars of ``{variant: seconds}`` (a live measurement), each labelled in ms."""
    names = list(times)
    ms = [1e3 * times[name] for name in names]
    fig = go.Figure(go.Bar(x=names, y=rounded(ms, 3), text=[f"{t:.3g} ms" for t in ms], textposition="outside",
                           marker_color=[COLORS[i % len(COLORS)] for i in range(len(names))]))
    return style(fig, title=title, x_title="kernel", y_title="forward time (ms, minimum of repeats)", height=height)


def memory_per_token(rows, *, title="Peak memory per token, forward+backward", height=400):
    """Peak memory divided by n (KiB per token) versus n, one line per variant, from benchmark rows."""
    groups = {}
    for row in rows:
        if row.get("status") == "ok":
            groups.setdefault(row["variant"], []).append(row)
    fig = go.Figure()
    for i, (name, group) in enumerate(sorted(groups.items())):
        group = sorted(group, key=lambda r: r["n"])
        per_token = [r["peak_bytes"] / r["n"] / 1024 for r in group]  # KiB per token
        fig.add_trace(go.Scatter(x=[r["n"] for r in group], y=rounded(per_token, 3), name=name, mode="lines+markers",
                                 line=dict(color=COLORS[i % len(COLORS)])))
    return style(fig, title=title, x_title="n (log scale)", y_title="KiB per token (log scale)", log_x=True, log_y=True,
                 height=height)


# --- Lesson 07 ---

def generation_at(rows, position, *, title=None, height=360):
    """Two bar panels for one position t: time per token and the state carried, one bar per method."""
    from plotly.subplots import make_subplots

    at = {r["method"]: r for r in rows if r["position"] == position}
    names = [name for name in ("linear_step", "softmax_cache", "softmax_no_cache") if name in at]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per token (µs, minimum of repeats)",
                                                        "state carried to the next token (KiB)"))
    colors = [COLORS[i % len(COLORS)] for i in range(len(names))]
    micro = [1e6 * at[name]["time_min_s"] for name in names]
    kib = [at[name]["state_bytes"] / 1024 for name in names]
    fig.add_trace(go.Bar(x=names, y=rounded(micro, 3), marker_color=colors, showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=rounded(kib, 3), marker_color=colors, showlegend=False), row=1, col=2)
    style(fig, title=title or f"Making token {position}", height=height)
    fig.update_yaxes(type="log", title="µs (log scale)", row=1, col=1)
    fig.update_yaxes(title="KiB", row=1, col=2)
    fig.update_xaxes(title="method")
    return fig


# --- Lesson 08 ---

def running_means(draws, means, bands, exact, *, title="Mean of the estimates over draws of ω", height=400):
    """Running means of estimators (``name: values``) against the number of draws, with bands and the exact value."""
    fig = go.Figure()
    for i, name in enumerate(means):
        color = COLORS[i % len(COLORS)]
        low, high = means[name] - bands[name], means[name] + bands[name]
        fig.add_trace(go.Scatter(x=np.concatenate([draws, draws[::-1]]), y=rounded(np.concatenate([high, low[::-1]])),
                                 fill="toself", fillcolor=color, opacity=0.2, line=dict(width=0),
                                 name=f"{name}: 95% band", hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=draws, y=rounded(means[name]), name=f"{name}: running mean", mode="lines",
                                 line=dict(color=color)))
    fig.add_hline(y=float(exact), line_dash="dash", line_color="black", annotation_text="exact exp(xᵀy)")
    return style(fig, title=title, x_title="draws of ω", y_title="estimate of exp(xᵀy)", log_x=True, height=height)


# --- Lesson 09 ---

def bench_minimum_figure(rows, *, title="Forward time (minimum of repeats) and peak memory versus n", height=440):
    """Benchmark rows as two log-log panels, minimum time and peak memory versus n, one trace per variant."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("forward time, minimum (s)", "peak memory (MiB)"))
    variants = sorted({r["variant"] for r in rows if r["status"] == "ok"})
    for i, variant in enumerate(variants):
        group = sorted((r for r in rows if r["variant"] == variant and r["status"] == "ok"), key=lambda r: r["n"])
        n = [r["n"] for r in group]
        for col, y in ((1, [r["time_min_s"] for r in group]), (2, [r["peak_bytes"] / 2**20 for r in group])):
            fig.add_trace(go.Scatter(x=n, y=rounded(y, 3), name=variant, legendgroup=variant, showlegend=col == 1,
                                     mode="lines+markers", line=dict(color=COLORS[i % len(COLORS)])), row=1, col=col)
    style(fig, title=title, height=height)
    fig.update_xaxes(title="n", type="log")
    fig.update_yaxes(type="log")
    return fig


def pareto_figure(rows, *, floor=1e-6, title="Error versus cost on one MiniLM layer", height=440):
    """Relative error (clipped at ``floor``) against minimum time, one trace per variant, settings as labels."""
    fig = go.Figure()
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    for i, variant in enumerate(variants):
        group = [r for r in rows if r["variant"] == variant]
        fig.add_trace(go.Scatter(x=rounded([r["time_s"] * 1e3 for r in group], 2),
                                 y=rounded([max(r["error"], floor) for r in group], 3),
                                 text=[r["setting"] if r["setting"] != "–" else "" for r in group],
                                 textposition=["top center", "bottom center"] * len(group),  # labels alternate
                                 mode="markers+text+lines", name=variant,
                                 marker=dict(size=9, color=COLORS[i % len(COLORS)])))
    style(fig, title=title, x_title="forward time, minimum (ms)", y_title="relative error (clipped at 1e-6)",
          log_x=True, log_y=True, height=height)
    return fig.update_yaxes(exponentformat="power")
