"""Shared fixtures: one test body runs on the NumPy tree, PyTorch on CPU, and CUDA when present.

``tree`` yields a small adapter with the module pair and array conversion, so a test writes
``tree.full.softmax_attention(*tree.arrays(q, k, v))`` once for every backend.  The CUDA
variant is always collected and skipped with a visible reason when no GPU is present.
"""

import importlib
import pathlib
from dataclasses import dataclass

import numpy as np
import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device on this machine: GPU variant not run")


@dataclass
class Tree:
    """A backend: ``numpy``, ``torch`` on CPU or ``torch`` on CUDA."""

    name: str
    device: str = None

    def module(self, name):
        package = "numpy" if self.name == "numpy" else "torch"
        return importlib.import_module(f"course_lib.{package}.{name}")

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self.module(name)

    def array(self, x):
        """A NumPy array → this backend's array (float64 stays float64)."""
        if self.name == "numpy":
            return np.asarray(x)
        return torch.as_tensor(np.asarray(x), device=self.device)

    def arrays(self, *xs):
        return tuple(self.array(x) for x in xs)

    def numpy(self, x):
        if self.name == "numpy":
            return np.asarray(x)
        return x.detach().cpu().numpy()


TREES = [
    pytest.param(Tree("numpy"), id="numpy"),
    pytest.param(Tree("torch", "cpu"), id="torch-cpu"),
    pytest.param(Tree("torch", "cuda"), id="torch-cuda", marks=requires_cuda),
]


@pytest.fixture(params=TREES)
def tree(request):
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def make_qkv(rng, lead=(2, 3), n=7, s=7, d=5, e=4):
    """Random float64 ``q (*lead, n, d)``, ``k (*lead, s, d)``, ``v (*lead, s, e)``."""
    return (rng.standard_normal((*lead, n, d)), rng.standard_normal((*lead, s, d)),
            rng.standard_normal((*lead, s, e)))


def padding_mask(lengths, s):
    """Boolean ``(b, s)``: True for the first ``lengths[i]`` positions of row i."""
    return np.arange(s)[None, :] < np.asarray(lengths)[:, None]
