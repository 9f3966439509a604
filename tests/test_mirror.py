"""The two trees mirror each other: same modules, same public functions, same signatures."""

import importlib
import inspect
import pkgutil

import pytest

import course_lib.numpy
import course_lib.torch

# Modules the specification defines for NumPy only (analysis tools, no PyTorch port needed).
NUMPY_ONLY = {"lowrank", "jl"}


def _modules(package):
    return {info.name for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_")}


def _public_functions(module):
    return {name: obj for name, obj in vars(module).items()
            if inspect.isfunction(obj) and not name.startswith("_") and obj.__module__ == module.__name__}


def _shape_of(signature):
    """Parameter names, kinds and plain defaults (a callable default may differ per tree)."""
    return [(p.name, p.kind, p.default if not callable(p.default) else "<callable>")
            for p in signature.parameters.values()]


def test_every_numpy_module_has_a_torch_twin_unless_numpy_only():
    missing = _modules(course_lib.numpy) - _modules(course_lib.torch) - NUMPY_ONLY
    assert not missing, f"NumPy modules without a course_lib.torch twin: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(_modules(course_lib.numpy) & _modules(course_lib.torch)))
def test_same_functions_with_the_same_signatures(name):
    numpy_module = importlib.import_module(f"course_lib.numpy.{name}")
    torch_module = importlib.import_module(f"course_lib.torch.{name}")
    numpy_functions = _public_functions(numpy_module)
    assert numpy_functions, f"course_lib.numpy.{name} defines no public function"
    # torch may define a function or re-export a framework-free one from the NumPy tree
    torch_functions = {f: getattr(torch_module, f) for f in numpy_functions
                       if inspect.isfunction(getattr(torch_module, f, None))}
    missing = set(numpy_functions) - set(torch_functions)
    assert not missing, f"course_lib.torch.{name} lacks {sorted(missing)}"
    for fname, fn in numpy_functions.items():
        numpy_sig = _shape_of(inspect.signature(fn))
        torch_sig = _shape_of(inspect.signature(torch_functions[fname]))
        # torch may add trailing optional keywords (device=...), never change the shared ones
        assert torch_sig[: len(numpy_sig)] == numpy_sig, f"{name}.{fname}: {numpy_sig} vs {torch_sig}"
        extra = torch_sig[len(numpy_sig):]
        assert all(default is not inspect.Parameter.empty for _, _, default in extra), (
            f"{name}.{fname}: torch adds required parameters {extra}")


def test_numpy_tree_never_imports_torch():
    for name in _modules(course_lib.numpy):
        source = inspect.getsource(importlib.import_module(f"course_lib.numpy.{name}"))
        assert "import torch" not in source, f"course_lib/numpy/{name}.py imports torch"


def test_torch_tree_never_imports_numpy_tree():
    # STYLE: what both trees need lives in course_lib/_validate.py or course_lib/_shared.py
    for name in _modules(course_lib.torch):
        source = inspect.getsource(importlib.import_module(f"course_lib.torch.{name}"))
        imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
        assert not [line for line in imports if "course_lib.numpy" in line or "course_lib import numpy" in line], (
            f"course_lib/torch/{name}.py imports the NumPy tree")
