"""Efficient Attention, from the Ground Up: the course library.

Every attention variant exists twice, with the same module and function names:

    course_lib.numpy.<module>   the NumPy reference (float64-friendly, never imports torch)
    course_lib.torch.<module>   the PyTorch port (batched, autograd, any device and dtype)

Modules: ``full`` (exact softmax attention; notebook 01).  Later lessons add ``lowrank``,
``jl``, ``linformer``, ``linear`` and ``performer`` to both trees.

Dimension key, used in every shape comment, docstring and einsum string:

    letter  meaning                          paper
    b       batch                            -
    h       heads                            h
    n       query positions                  n
    s       key/value positions              n
    d       query/key head dim               d_k
    e       value head dim                   d_v
    k       Linformer projected length       k
    f       feature-map size (Performer m)   m, C

Functions take ``(..., n, d)`` so they work unbatched first and as ``(b, h, n, d)`` later.
This module imports no framework.
"""

__version__ = "0.1.0"

DIMENSION_KEY = {
    "b": ("batch", "-"),
    "h": ("heads", "h"),
    "n": ("query positions", "n"),
    "s": ("key/value positions", "n"),
    "d": ("query/key head dim", "d_k"),
    "e": ("value head dim", "d_v"),
    "k": ("Linformer projected length", "k"),
    "f": ("feature-map size (Performer's m)", "m, C"),
}


def data_path(name):
    """Path of a data file shipped inside the package (``course_lib/data/``).

    The data are precomputed results that take longer than a lesson may run; each file names
    the ``tools/`` script that regenerates it.  Shipping them as package data makes them
    available wherever the course is installed, Colab included.
    """
    from importlib.resources import files

    path = files("course_lib") / "data" / name
    if not path.is_file():
        raise FileNotFoundError(f"no course data file named {name!r} in course_lib/data/")
    return path
