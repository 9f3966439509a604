"""Exercise checkers: run a learner's function on seeded cases and say what went wrong.

A check never raises, so "Run All" on an untouched exercise notebook finishes.  It compares
the learner's function with the library on several cases, returns a ``CheckResult``
(``"passed"``, ``"failed"`` or ``"not attempted"``) and prints expected versus got.  When a
wrong answer equals a known *mistake* (the same computation with a classic slip: a missing
normaliser, a future leak, the wrong axis) the hint names that slip.

One module per lesson (``course_lib.checks.lesson01`` …) defines the checks; the tests run
each with the reference (must pass), a stub (must be "not attempted") and every mistake
(must fail with that mistake's hint).
"""

import copy
from dataclasses import dataclass, field

import numpy as np

PASSED, FAILED, NOT_ATTEMPTED = "passed", "failed", "not attempted"


@dataclass
class Mistake:
    """A classic slip: ``fn`` has the exercise's signature and makes that slip."""

    name: str
    fn: object
    hint: str


@dataclass
class CheckResult:
    """The outcome of one exercise check; truthy only when passed."""

    exercise: str
    status: str
    message: str = ""
    mistake: str = None
    details: list = field(default_factory=list)

    def __bool__(self):
        return self.status == PASSED

    def __str__(self):
        mark = {PASSED: "✔", FAILED: "✘", NOT_ATTEMPTED: "…"}[self.status]
        head = f"{mark} Exercise {self.exercise}: {self.status}"
        return head + (f"\n{self.message}" if self.message else "")


def to_numpy(x):
    """A NumPy array from a NumPy array, a torch tensor (any device, any dtype) or a number."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        return (x.double() if x.is_floating_point() else x).numpy()  # bfloat16 has no NumPy dtype
    return np.asarray(x)


def _as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _same(got, expected, atol, rtol):
    got, expected = _as_tuple(got), _as_tuple(expected)
    if len(got) != len(expected):
        return False
    for g, e in zip(got, expected, strict=True):
        g, e = to_numpy(g), to_numpy(e)
        if g.shape != e.shape or not np.allclose(g, e, atol=atol, rtol=rtol, equal_nan=True):
            return False
    return True


def _describe(x):
    x = to_numpy(x)
    if x.ndim == 0:
        return f"{x.item():.6g}"
    flat = x.reshape(-1)
    head = np.array2string(flat[:4], precision=4, separator=", ")
    return f"shape {x.shape}, first values {head}"


def _explain(names, got, expected, atol, rtol):
    got, expected = _as_tuple(got), _as_tuple(expected)
    if len(got) != len(expected):
        return f"  expected {len(expected)} result(s) ({', '.join(names)}), got {len(got)}"
    lines = []
    for name, g, e in zip(names, got, expected, strict=False):
        g, e = to_numpy(g), to_numpy(e)
        if g.shape != e.shape:
            lines.append(f"  {name}: expected shape {e.shape}, got shape {g.shape}")
        elif not np.allclose(g, e, atol=atol, rtol=rtol):
            err = np.nanmax(np.abs(g.astype(float) - e.astype(float))) if g.size else float("nan")
            lines.append(f"  {name}: expected {_describe(e)}\n  {' ' * len(name)}  got      {_describe(g)}"
                         f"  (max |difference| {err:.3g})")
    return "\n".join(lines)


def run_check(exercise, candidate, reference, cases, *, names=("result",), mistakes=(),
              atol=1e-6, rtol=1e-5, verbose=True):
    """Compare ``candidate`` with ``reference`` on every case; never raises.

    Args:
        exercise: the exercise number, e.g. ``"1.1"``.
        candidate: the learner's function.
        reference: the library function it must equal.
        cases: list of ``(description, args, kwargs)``; each call gets its own deep copy.
        names: names of the results (a function may return a tuple of intermediates).
        mistakes: ``Mistake`` list, tried in order when a case fails.
        atol, rtol: tolerances for ``numpy.allclose``.
        verbose: print the result.

    Returns:
        A ``CheckResult``.
    """
    result = None
    for description, args, kwargs in cases:
        expected = reference(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        try:
            got = candidate(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        except NotImplementedError:
            result = CheckResult(exercise, NOT_ATTEMPTED, "  the function still raises NotImplementedError: "
                                 "replace the stub with your code, then run this cell again.")
            break
        except Exception as exc:  # a learner's bug: report it, keep the notebook running
            result = CheckResult(exercise, FAILED, f"  case '{description}' raised "
                                 f"{type(exc).__name__}: {exc}")
            break
        if _same(got, expected, atol, rtol):
            continue
        message = f"  case '{description}' differs from the library:\n" + _explain(names, got, expected, atol, rtol)
        mistake = _match_mistake(mistakes, got, args, kwargs, atol, rtol)
        if mistake is not None:
            message += f"\n  hint: {mistake.hint}"
        result = CheckResult(exercise, FAILED, message, mistake.name if mistake else None)
        break
    if result is None:
        result = CheckResult(exercise, PASSED, f"  {len(cases)} seeded cases agree with the library.")
    if verbose:
        print(result)
    return result


def _match_mistake(mistakes, got, args, kwargs, atol, rtol):
    for mistake in mistakes:
        try:
            wrong = mistake.fn(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        except Exception:  # a mistake model that does not apply to this case
            continue
        if _same(got, wrong, atol, rtol):
            return mistake
    return None


@dataclass
class Exercise:
    """One exercise: its reference, seeded cases and classic mistakes.

    Call it with the learner's function: ``exercise_1_1(my_attention)``.
    """

    number: str
    title: str
    reference: object
    cases: object  # () -> list of (description, args, kwargs)
    mistakes: tuple = ()
    names: tuple = ("result",)
    atol: float = 1e-6
    rtol: float = 1e-5

    def __call__(self, candidate, *, verbose=True):
        return run_check(self.number, candidate, self.reference, self.cases(), names=self.names,
                         mistakes=self.mistakes, atol=self.atol, rtol=self.rtol, verbose=verbose)


def all_exercises():
    """Every ``Exercise`` defined by the lesson modules ``course_lib.checks.lessonNN``."""
    import importlib
    import pkgutil

    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("lesson"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            found.extend(module.EXERCISES)
    return found
