"""What an answer's Python does: its loops and its calls into the library, seen by ``sys.settrace``.

Several exercises ask for a form with no Python loop (over tokens, over chunks) written by the learner,
not taken from the library.  ``traced`` runs an answer once and counts the lines its own code runs (its
function and any helper it defines, in any notebook cell) and the Python calls made from it or from the
library (a C-level ``map`` over a library step still makes one call per item), and lists the forbidden
library functions it reached.  Lines and calls inside NumPy, torch or the standard library are not
counted: they are the same for any size, except where they search (``np.einsum``'s path with
``optimize=True``).  ``loop_grows`` compares two calls; ``calls_forbidden`` names the first library call.
"""

import os
import site
import sys
import sysconfig

_LIBRARY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # course_lib/

# Where Python's own modules and installed packages (NumPy, torch, …) live: their code is not the answer's,
# and its line count may depend on the sizes (np.einsum's path search with optimize=True does).
_INSTALLED = tuple(sorted({os.path.abspath(path) + os.sep for path in (
    *(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")),
    *site.getsitepackages(), site.getusersitepackages())}))

SLACK = 8  # lines and calls a parallel answer may add for the larger input (a branch, a clip)


def _in_library(code):
    return os.path.abspath(code.co_filename).startswith(_LIBRARY + os.sep)


def _installed(code):
    """True for code from the standard library or an installed package other than course_lib."""
    filename = code.co_filename
    if filename.startswith("<frozen"):
        return True
    return not _in_library(code) and os.path.abspath(filename).startswith(_INSTALLED)


def _answers(code):
    """True for the answer's code: its function and any helper, in any notebook cell or file of its own."""
    return not _in_library(code) and not _installed(code)


def _forbidden(code, names):
    """The name of the library function ``code`` is, if it is one of ``names`` or a check's own; else None."""
    if not _in_library(code):
        return None
    if code.co_name in names:
        return code.co_name
    if os.path.basename(os.path.dirname(os.path.abspath(code.co_filename))) == "checks":
        return f"the check's own {code.co_name}"
    return None


def traced(candidate, args, forbidden=frozenset()):
    """One call ``candidate(*args)``, traced: ``(Python work, forbidden library functions it called)``."""
    work, called, own = 0, [], getattr(candidate, "__code__", None)

    def lines(frame, event, arg):
        nonlocal work
        work += event == "line"
        return lines

    def calls(frame, event, arg):
        nonlocal work
        caller = frame.f_back
        work += caller is not None and not _installed(caller.f_code)
        name = None if frame.f_code is own else _forbidden(frame.f_code, forbidden)  # what it calls, not itself
        if name is not None and name not in called:
            called.append(name)
        return lines if _answers(frame.f_code) else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        candidate(*args)
    finally:
        sys.settrace(previous)
    return work, called


def calls_forbidden(candidate, args, forbidden):
    """None when ``candidate(*args)`` calls none of the ``forbidden`` library functions; else a line naming one."""
    _, called = traced(candidate, args, forbidden)
    if not called:
        return None
    return f"your function calls {called[0]} from course_lib."  # the first: the others are inside it


def loop_grows(candidate, small_args, large_args):
    """``(work for small_args, work for large_args)`` when the second is larger by more than ``SLACK``, else None."""
    small, large = traced(candidate, small_args)[0], traced(candidate, large_args)[0]
    return None if large <= small + SLACK else (small, large)
