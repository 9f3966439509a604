"""ipywidgets panels: sliders for n, k, m, layer and head that redraw a figure.

``panel(draw, n=n_slider(...))`` shows the sliders, then the figure ``draw(**values)`` returns as
an ordinary output, redrawn in place when a slider moves (on release, so a slow figure does not
queue redraws).  Because the figure is an ordinary output, a notebook opened without running it
(JupyterLab fresh, GitHub, nbviewer, a slide deck) shows the figure at the sliders' defaults, and
the sliders' text form says what they are set to instead of ``interactive(children=(...``.
"""

import ipywidgets as widgets
from IPython.display import DisplayHandle, display


def int_slider(description, value, min, max, step=1):
    """An integer slider that updates on release."""
    return widgets.IntSlider(value=value, min=min, max=max, step=step, description=description,
                             continuous_update=False, style={"description_width": "initial"})


def options_slider(description, options, value=None):
    """A slider over explicit values (e.g. powers of two for n)."""
    return widgets.SelectionSlider(options=list(options), value=value if value is not None else options[0],
                                   description=description, continuous_update=False,
                                   style={"description_width": "initial"})


class Sliders(widgets.VBox):
    """A panel's sliders.  Where widgets cannot be drawn, their text form names the values shown."""

    def values(self):
        """``{name: value}`` of every slider, as ``draw`` receives them."""
        return {name: control.value for name, control in self.controls.items()}

    def __repr__(self):
        shown = ", ".join(f"{control.description} = {control.value}" for control in self.children)
        return f"Sliders at {shown} (figure below); run the notebook to move them"


def panel(draw, **controls):
    """Show ``controls``, then the figure ``draw(**values)``, redrawn in place on every change.

    Returns the ``Sliders`` box: ``.children`` are the controls (set a control's ``.value`` to
    redraw), ``.figure`` is the display handle of the figure output.
    """
    sliders = Sliders(list(controls.values()))
    sliders.controls = controls
    display(sliders)
    sliders.figure = DisplayHandle()  # one output, replaced in place on each redraw
    sliders.figure.display(draw(**sliders.values()))

    def redraw(_change):
        sliders.figure.update(draw(**sliders.values()))

    for control in controls.values():
        control.observe(redraw, names="value")
    return sliders
