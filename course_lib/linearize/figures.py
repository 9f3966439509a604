"""The figures of notebook 10, built from ``course_lib.viz``'s look: rounded data, titled axes, legend at the right."""

import numpy as np
from plotly.subplots import make_subplots

from course_lib import viz

go = viz.go


def by_layer(values, baselines, *, title, y_title, height=400):
    """One line per variant of a per-layer measure (``name: (layers,)``), trivial levels dotted."""
    layers = np.arange(1, len(next(iter(values.values()))) + 1)
    fig = viz.lines(layers, values, title=title, x_title="layer", y_title=y_title, height=height)
    viz.add_baselines(fig, layers, baselines)
    return fig.update_xaxes(dtick=1)


def weights_against_scores(scores, rows, *, title, height=400):
    """One query's weights (``name: (s,)``) against its scores qᵀk/√d, log y: softmax's is a straight line."""
    order = np.argsort(scores)
    fig = go.Figure()
    for i, (name, weights) in enumerate(rows.items()):
        fig.add_trace(go.Scatter(x=viz.rounded(scores[order], 4), y=viz.rounded(np.maximum(weights[order], 1e-8), 4),
                                 mode="markers", name=name, marker=dict(size=5, color=viz.COLORS[i])))
    viz.style(fig, title=title, x_title="score q·k / √d of each key", y_title="weight (log scale, floor 1e-8)",
              log_y=True, height=height)
    return fig.update_yaxes(exponentformat="power")


def results_bars(rows, exact_retrieval, *, title, height=520, score="retrieval"):
    """Held-out cosine and a retrieval score for every row of the results table, each control as a marker.

    ``score``: ``"retrieval"`` (top-1 share, control ``retrieval_control``) or ``"mrr"`` (mean
    reciprocal rank, control ``mrr_control``); ``exact_retrieval`` is the exact model's value of it.
    """
    if score not in ("retrieval", "mrr"):
        raise ValueError(f"score must be 'retrieval' or 'mrr', got {score!r}.")
    label = {"retrieval": "retrieval top-1", "mrr": "mean reciprocal rank"}[score]
    names = [r["name"] for r in rows]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=("embedding cosine to the exact model", label))
    fig.add_trace(go.Bar(x=viz.rounded([r["cosine"] for r in rows], 3), y=names, orientation="h", name="cosine",
                         marker_color=viz.COLORS[0]), row=1, col=1)
    fig.add_trace(go.Scatter(x=viz.rounded([r["control"] for r in rows], 3), y=names, mode="markers",
                             name="control: other passages", marker=dict(symbol="line-ns-open", size=14,
                                                                         color="black")), row=1, col=1)
    fig.add_trace(go.Bar(x=viz.rounded([r[score] for r in rows], 3), y=names, orientation="h",
                         name=label, marker_color=viz.COLORS[2]), row=1, col=2)
    if all(f"{score}_control" in r for r in rows):  # the exact model under a random error of each row's size
        fig.add_trace(go.Scatter(x=viz.rounded([r[f"{score}_control"] for r in rows], 3), y=names, mode="markers",
                                 name="control: exact, random error", marker=dict(symbol="line-ns-open", size=14,
                                                                                   color="black")), row=1, col=2)
    fig.add_vline(x=float(viz.rounded(exact_retrieval, 3)), line_dash="dot", line_color="black", row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    fig = viz.style(fig, title=title, height=height)
    fig.update_xaxes(range=[0, 1.02])
    return fig


def cost_panels(rows, *, title, height=420):
    """Time and peak memory of one layer against n (``name: [(n, seconds, bytes), ...]``), log-log."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("forward time (ms)", "peak memory (MiB)"))
    for i, (name, points) in enumerate(rows.items()):
        n, seconds, peak = (np.array(x, dtype=float) for x in zip(*points, strict=True))
        for col, y in ((1, seconds * 1e3), (2, np.maximum(peak, 1) / 2**20)):
            fig.add_trace(go.Scatter(x=n, y=viz.rounded(y, 2), name=name, legendgroup=name, showlegend=col == 1,
                                     mode="lines+markers", line=dict(color=viz.COLORS[i])), row=1, col=col)
    fig = viz.style(fig, title=title, height=height)
    fig.update_xaxes(title="n (tokens)", type="log")
    return fig.update_yaxes(type="log")
