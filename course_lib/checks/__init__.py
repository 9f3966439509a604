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
class Requirement:
    """A property beyond equal results, such as a memory budget: ``measure(candidate)`` returns None when it
    holds, else a line saying what was measured; ``example`` breaks it (for the tests), ``hint`` says why."""

    name: str
    measure: object
    hint: str
    example: object


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
    try:  # a string or an object cannot be compared: not the same (run_check reports it first)
        for g, e in zip(got, expected, strict=True):
            g, e = to_numpy(g), to_numpy(e)
            if g.shape != e.shape or not np.allclose(g, e, atol=atol, rtol=rtol, equal_nan=True):
                return False
    except (TypeError, ValueError):
        return False
    return True


def _numeric(x):
    return np.issubdtype(x.dtype, np.number) or x.dtype == bool


def _not_numbers(got, expected):
    """The first result the library gives as numbers that came back as something else (a string), or None."""
    got, expected = _as_tuple(got), _as_tuple(expected)
    for g, e in zip(got, expected, strict=False):
        try:
            g, e = to_numpy(g), to_numpy(e)
        except Exception:  # e.g. a ragged list
            return repr(g)[:40]
        if _numeric(e) and not _numeric(g):
            return repr(g.tolist())[:40]
    return None


def _describe(x):
    x = to_numpy(x)
    if x.ndim == 0:
        return f"{x.item():.6g}"
    head = np.array2string(x.reshape(-1)[:4], precision=4, separator=", ")
    return f"shape {x.shape}, first values {head}"


def _index(flat_index, shape):
    return tuple(int(i) for i in np.unravel_index(flat_index, shape)) if shape else ()


def _nonfinite(got, expected):
    """Where ``got`` is NaN or ±inf but ``expected`` is finite: ``(count NaN, count inf, first index)``."""
    if not (np.issubdtype(got.dtype, np.number) and np.issubdtype(expected.dtype, np.number)):
        return 0, 0, None
    if got.shape != expected.shape:  # a wrong shape is explained by the shape, not compared value by value
        return 0, 0, None
    bad = ~np.isfinite(got) & np.isfinite(expected)
    if not bad.any():
        return 0, 0, None
    n_nan = int(np.count_nonzero(bad & np.isnan(got)))
    first = _index(np.flatnonzero(bad)[0], got.shape)
    return n_nan, int(np.count_nonzero(bad)) - n_nan, first


def _difference(name, g, e, atol, rtol):
    """One result that is not close: what differs, how much and where (never a bare "max |difference| 0")."""
    pad = " " * len(name)
    n_nan, n_inf, first = _nonfinite(g, e)
    if first is not None:
        what = " and ".join(f"{count} {kind}" for count, kind in ((n_nan, "NaN"), (n_inf, "inf")) if count)
        at = f" at index {first}" if first else ""
        return (f"  {name}: {what} value(s) where the library's are finite (the first{at}: "
                f"expected {e[first]:.6g}, got {g[first]})")
    if not (np.issubdtype(g.dtype, np.number) and np.issubdtype(e.dtype, np.number)):
        return f"  {name}: expected {_describe(e)}\n  {pad}  got      {_describe(g)}"
    with np.errstate(invalid="ignore"):
        gap = np.abs(g.astype(float) - e.astype(float))  # NaN where one side is NaN or both are inf
    gap = np.where(np.isnan(gap) & ~(np.isnan(g) & np.isnan(e)), np.inf, gap)  # a NaN the library lacks: inf
    gap = np.nan_to_num(gap, nan=0.0)  # NaN on both sides agrees
    if g.ndim == 0:
        return f"  {name}: expected {e.item():.6g}, got {g.item():.6g} (|difference| {gap.item():.3g})"
    where = _index(int(np.argmax(gap)), g.shape)
    far = int(np.count_nonzero(~np.isclose(g, e, atol=atol, rtol=rtol, equal_nan=True)))
    return (f"  {name} (shape {g.shape}): largest difference at index {where}: expected {e[where]:.6g}, "
            f"got {g[where]:.6g} (|difference| {gap[where]:.3g}); {far} of {g.size} entries differ beyond the "
            "tolerance")


def _unbatched_only(got, expected):
    """True when ``got`` has the shape of one slice of ``expected``: leading (batch, head) dims were dropped."""
    return 0 < got.ndim < expected.ndim and got.shape == expected.shape[expected.ndim - got.ndim:]


def _explain(names, got, expected, atol, rtol):
    got, expected = _as_tuple(got), _as_tuple(expected)
    if len(got) != len(expected):
        return f"  expected {len(expected)} result(s) ({', '.join(names)}), got {len(got)}"
    lines = []
    for name, g, e in zip(names, got, expected, strict=False):
        g, e = to_numpy(g), to_numpy(e)
        if g.shape != e.shape:
            lines.append(f"  {name}: expected shape {e.shape}, got shape {g.shape}")
        elif not np.allclose(g, e, atol=atol, rtol=rtol, equal_nan=True):
            lines.append(_difference(name, g, e, atol, rtol))
    return "\n".join(lines)


NONFINITE_HINT = ("your result has NaN or inf where the library's is finite: exp overflows above about 709.8 in "
                  "float64 (88.7 in float32) — subtract each row's maximum before exp — or a sum you divide by is 0.")
BATCHED_HINT = ("your function works without leading dimensions but not with them: write it for (..., n, d) — "
                "transpose the last two axes (np.swapaxes(x, -1, -2) or x.transpose(-1, -2), not x.T), sum over "
                "axis=-1, and use '...' in einsum strings.")


def _ndim(args):
    """The largest number of dimensions among the array arguments of a case (0 when there are none)."""
    arrays = [to_numpy(a) for a in args if hasattr(a, "shape") and hasattr(a, "ndim")]
    return max((a.ndim for a in arrays), default=0)


def _generic_hint(got, expected, args, passed_ndim):
    """A hint for a failure that no modelled mistake explains: non-finite values, or a batched case only."""
    got, expected = _as_tuple(got), _as_tuple(expected)
    pairs = [(to_numpy(g), to_numpy(e)) for g, e in zip(got, expected, strict=False)]
    if any(_nonfinite(g, e)[2] is not None for g, e in pairs):
        return NONFINITE_HINT
    if passed_ndim and _ndim(args) > passed_ndim or any(_unbatched_only(g, e) for g, e in pairs):
        return BATCHED_HINT
    return None


def run_check(exercise, candidate, reference, cases, *, names=("result",), mistakes=(), requirements=(),
              atol=1e-6, rtol=1e-5, verbose=True):
    """Compare ``candidate`` with ``reference`` on every case; never raises.

    Args:
        exercise: the exercise number, e.g. ``"1.1"``.
        candidate: the learner's function.
        reference: the library function it must equal.
        cases: list of ``(description, args, kwargs)``; each call gets its own deep copy.
        names: names of the results (a function may return a tuple of intermediates).
        mistakes: ``Mistake`` list, tried in order when a case fails.
        requirements: ``Requirement`` list, measured once every case agrees.
        atol, rtol: tolerances for ``numpy.allclose``.
        verbose: print the result.

    Returns:
        A ``CheckResult``.
    """
    result, passed_ndim = None, 0
    for description, args, kwargs in cases:
        expected = reference(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        try:
            with np.errstate(all="ignore"):  # overflow is reported below, not as a warning mid-check
                got = candidate(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        except NotImplementedError:
            result = CheckResult(exercise, NOT_ATTEMPTED, "  the function still raises NotImplementedError: "
                                 "replace the stub with your code, then run this cell again.")
            break
        except Exception as exc:  # a learner's bug: report it, keep the notebook running
            message = f"  case '{description}' raised {type(exc).__name__}: {exc}"
            if passed_ndim and _ndim(args) > passed_ndim:
                message += f"\n  hint: {BATCHED_HINT}"
            result = CheckResult(exercise, FAILED, message)
            break
        wrong_type = _not_numbers(got, expected)
        if wrong_type is not None:
            result = CheckResult(exercise, FAILED, f"  case '{description}' returned {wrong_type}: the function "
                                 "must return numbers (True/False or a float), not strings.")
            break
        if _same(got, expected, atol, rtol):
            passed_ndim = max(passed_ndim, _ndim(args))
            continue
        message = f"  case '{description}' differs from the library:\n" + _explain(names, got, expected, atol, rtol)
        mistake = _match_mistake(mistakes, got, args, kwargs, atol, rtol)
        hint = mistake.hint if mistake is not None else _generic_hint(got, expected, args, passed_ndim)
        if hint is not None:
            message += f"\n  hint: {hint}"
        result = CheckResult(exercise, FAILED, message, mistake.name if mistake else None)
        break
    if result is None:
        result = _unmet(exercise, candidate, requirements)
    if result is None:
        result = CheckResult(exercise, PASSED, f"  {len(cases)} seeded cases agree with the library.")
    if verbose:
        print(result)
    return result


def _unmet(exercise, candidate, requirements):
    """A failed ``CheckResult`` for the first requirement ``candidate`` breaks, or None."""
    for requirement in requirements:
        try:
            with np.errstate(all="ignore"):
                measured = requirement.measure(candidate)
        except Exception as exc:  # e.g. MemoryError on the larger input: the requirement is not met
            measured = f"the measurement raised {type(exc).__name__}: {exc}"
        if measured is not None:
            return CheckResult(exercise, FAILED, f"  every case agrees with the library, but {measured}\n"
                               f"  hint: {requirement.hint}", requirement.name)
    return None


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
    requirements: tuple = ()

    def __call__(self, candidate, *, verbose=True):
        return run_check(self.number, candidate, self.reference, self.cases(), names=self.names,
                         mistakes=self.mistakes, requirements=self.requirements, atol=self.atol, rtol=self.rtol,
                         verbose=verbose)


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
