"""The ipywidgets controls a live panel shows (``workbench.viz.panel``), with one look.

Expensive controls use ``continuous_update=False`` (see ``slider``): the measurement runs when
the slider is released, not on every pixel of the drag.
"""

from __future__ import annotations


def slider(description: str, min, max, step=None, value=None, *, expensive: bool = True,
           readout_format: str | None = None, width: str = "340px"):
    """IntSlider or FloatSlider (by the type of the bounds); expensive => update on release."""
    import ipywidgets as w

    is_int = all(isinstance(x, int) and not isinstance(x, bool) for x in (min, max, step or 1))
    value = min if value is None else value
    common = dict(description=description, min=min, max=max, value=value,
                  continuous_update=not expensive, style={"description_width": "initial"},
                  layout=w.Layout(width=width))
    if is_int:
        return w.IntSlider(step=step or 1, **common)
    kw = dict(step=step or (max - min) / 100, **common)
    if readout_format:
        kw["readout_format"] = readout_format
    return w.FloatSlider(**kw)


def dropdown(description: str, options, value=None, width: str = "260px"):
    import ipywidgets as w

    options = list(options)
    return w.Dropdown(description=description, options=options,
                      value=options[0] if value is None else value,
                      style={"description_width": "initial"}, layout=w.Layout(width=width))


def checkbox(description: str, value: bool = False):
    import ipywidgets as w

    return w.Checkbox(description=description, value=value, indent=False)


def select_many(description: str, options, value=None, rows: int | None = None):
    """A multiple-choice list (value: a tuple of the chosen options; default all)."""
    import ipywidgets as w

    options = list(options)
    return w.SelectMultiple(description=description, options=options,
                            value=tuple(options if value is None else value),
                            rows=rows or min(8, len(options)), style={"description_width": "initial"})


def text(description: str, value: str = "", width: str = "520px", placeholder: str = ""):
    import ipywidgets as w

    return w.Text(description=description, value=value, continuous_update=False,
                  placeholder=placeholder, style={"description_width": "initial"},
                  layout=w.Layout(width=width))
