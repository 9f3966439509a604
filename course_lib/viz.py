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


def style(fig, *, title=None, x_title=None, y_title=None, log_x=False, log_y=False, height=420):
    """Apply the course layout to ``fig`` and return it."""
    fig.update_layout(template=TEMPLATE, title=title, height=height, margin=dict(l=60, r=20, t=60, b=50),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0))
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


def heatmap(matrix, *, colorscale="Viridis", zmin=None, zmax=None, **layout):
    """A matrix as a heatmap with row 0 at the top (how attention maps are read)."""
    fig = go.Figure(go.Heatmap(z=rounded(matrix), colorscale=colorscale, zmin=zmin, zmax=zmax))
    fig.update_yaxes(autorange="reversed")
    layout.setdefault("height", 420)
    return style(fig, **layout)


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
    return style(fig, title=title, height=height)


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
