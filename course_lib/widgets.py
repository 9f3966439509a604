"""ipywidgets panels: sliders for n, k, m, layer and head that redraw a figure.

``panel(draw, n=n_slider(...))`` shows the sliders and the figure ``draw(**values)`` returns,
redrawn when a slider moves (on release, so a slow figure does not queue redraws).
"""

import ipywidgets as widgets
from IPython.display import display


def int_slider(description, value, min, max, step=1):
    """An integer slider that updates on release."""
    return widgets.IntSlider(value=value, min=min, max=max, step=step, description=description,
                             continuous_update=False, style={"description_width": "initial"})


def options_slider(description, options, value=None):
    """A slider over explicit values (e.g. powers of two for n)."""
    return widgets.SelectionSlider(options=list(options), value=value if value is not None else options[0],
                                   description=description, continuous_update=False,
                                   style={"description_width": "initial"})


def panel(draw, **controls):
    """Show ``controls`` and the figure ``draw(**values)``, redrawn on every change.

    Returns the ``ipywidgets.interactive`` object, whose ``.children`` are the controls and the
    output area (tests move a slider by setting ``.value``).
    """
    def show(**values):
        display(draw(**values))

    ui = widgets.interactive(show, **controls)
    display(ui)
    return ui
