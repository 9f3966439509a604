"""nbval compares plotly figures at the precision a reader reads them, and nothing finer.

A stored figure is a plotly JSON document.  nbval alone compares it bit for bit, so a figure
built from a BLAS sum fails on a CPU that sums in another order.  This plugin compares each
figure in two parts instead:

- everything a reader reads as text — trace types and names, axis titles and types, layout,
  annotations, category labels — must be equal, exactly;
- every number must agree within ``RTOL`` of its own size (three significant digits: finer
  than the eye resolves on a plot), plus ``FLOOR`` times the largest magnitude in the same
  array (float32 carries about seven significant digits, so a value under a millionth of
  its array's largest is rounding noise of the sums that made it, not data).

A claim that needs more precision than a figure shows belongs in an ``assert`` in the lesson.
Every other output (printed text, tables) is left to nbval as it is: exact after the sanitiser.
The plugin is loaded by the repository's ``conftest.py`` (and by ``-p tools.nbval_figures``).
"""

import base64

import numpy as np

FIGURE = "application/vnd.plotly.v1+json"
RTOL = 1e-3  # relative: a reader reads three significant digits off a figure
FLOOR = 1e-6  # relative to the array's largest value: the noise floor of a float32 sum


def _typed_array(value):
    """Decode plotly's typed-array encoding ``{"dtype": "f8", "bdata": "…", "shape": "2, 3"}``."""
    array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
    if value.get("shape"):
        array = array.reshape([int(s) for s in str(value["shape"]).split(",")])
    return array.astype(float)


def _is_typed_array(value):
    return isinstance(value, dict) and "bdata" in value and "dtype" in value


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numeric(value):
    """``value`` as a float array when it is numeric data (a typed array, a number, a list of numbers)."""
    if _is_typed_array(value):
        return _typed_array(value)
    if _is_number(value):
        return np.array(float(value))
    if isinstance(value, list) and value and all(_is_number(v) or v is None for v in value):
        return np.array([np.nan if v is None else float(v) for v in value])
    return None


def numbers_differ(ref, test, rtol=RTOL, floor=FLOOR):
    """A one-line reason when the arrays differ by more than the figure's precision, else None."""
    if ref.shape != test.shape:
        return f"shape {ref.shape} became {test.shape}"
    same_kind = (np.isnan(ref) == np.isnan(test)) & (np.isinf(ref) == np.isinf(test))
    if not same_kind.all() or (np.isinf(ref) & (ref != test)).any():
        return "NaN or infinite entries differ"
    finite = np.isfinite(ref)
    if not finite.any():
        return None
    scale = np.abs(ref[finite]).max()
    gap = np.abs(ref[finite] - test[finite])
    allowed = rtol * np.abs(ref[finite]) + floor * scale
    if (gap > allowed).any():
        worst = int(np.argmax(gap - allowed))
        return (f"{int((gap > allowed).sum())} of {gap.size} values moved by more than {rtol:g} relative "
                f"(worst: {ref[finite][worst]:.6g} became {test[finite][worst]:.6g})")
    return None


def figure_differences(ref, test, path="figure"):
    """Every place where figure ``test`` differs from ``ref`` beyond the precision above."""
    ref_numbers, test_numbers = _numeric(ref), _numeric(test)
    if ref_numbers is not None and test_numbers is not None:
        reason = numbers_differ(ref_numbers, test_numbers)
        return [f"{path}: {reason}"] if reason else []
    if isinstance(ref, dict) and isinstance(test, dict):
        if ref.keys() != test.keys():
            return [f"{path}: keys {sorted(ref.keys() ^ test.keys())} differ"]
        return [d for key in ref for d in figure_differences(ref[key], test[key], _child(path, key, ref))]
    if isinstance(ref, list) and isinstance(test, list):
        if len(ref) != len(test):
            return [f"{path}: {len(ref)} entries became {len(test)}"]
        pairs = enumerate(zip(ref, test, strict=True))
        return [d for i, (r, t) in pairs for d in figure_differences(r, t, f"{path}[{i}]")]
    return [] if ref == test else [f"{path}: {ref!r} became {test!r}"]


def _child(path, key, parent):
    """Name a trace by its name in messages: ``figure.data[0 'exact'].y``."""
    name = parent.get("name") if isinstance(parent, dict) else None
    return f"{path}{' ' + repr(name) if name and key != 'name' else ''}.{key}"


def _without_figures(outputs):
    """Copies of ``outputs`` with the plotly figures taken out (compared separately)."""
    stripped = []
    for output in outputs:
        if FIGURE in output.get("data", {}):
            output = type(output)(output)  # a NotebookNode stays one: nbval reads attributes
            output["data"] = type(output["data"])({k: v for k, v in output["data"].items() if k != FIGURE})
        stripped.append(output)
    return stripped


def _figures(outputs):
    return [o["data"][FIGURE] for o in outputs if FIGURE in o.get("data", {})]


def pytest_configure(config):
    """Wrap nbval's output comparison (when nbval is installed) with the figure comparison."""
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:
        return
    original = IPyNbCell.compare_outputs
    if getattr(original, "compares_figures", False):
        return

    def compare_outputs(self, test, ref, skip_compare=None):
        same = original(self, _without_figures(test), _without_figures(ref), skip_compare)  # resets the traceback
        ref_figures, test_figures = _figures(ref), _figures(test)
        if len(ref_figures) != len(test_figures):
            problems = [f"{len(ref_figures)} stored plotly figure(s), {len(test_figures)} produced"]
        else:
            problems = [p for r, t in zip(ref_figures, test_figures, strict=True) for p in figure_differences(r, t)]
        for problem in problems[:10]:
            self.comparison_traceback.append(f"plotly figure mismatch: {problem}")
        return same and not problems

    compare_outputs.compares_figures = True
    IPyNbCell.compare_outputs = compare_outputs
