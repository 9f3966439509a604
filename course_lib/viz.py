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
    fig.update_xaxes(title=x_title, type="log" if log_x else None)
    fig.update_yaxes(title=y_title, type="log" if log_y else None)
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
