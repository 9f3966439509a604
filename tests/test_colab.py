"""Colab readiness: every notebook opens from its own badge and installs the course on Colab only.

The install cell is run here as Colab would run it, with a stand-in ``google.colab`` module
and ``subprocess.run`` recorded instead of called: the pip command must be exactly the one
that installs this repository at the configured ref, under a constraints file that pins the
torch and numpy already installed (so pip can never replace Colab's builds of them).
"""

import re
import subprocess
import sys
import tomllib
import types
from importlib.metadata import version

import nbformat
import pytest

from tests.conftest import ROOT
from tools import nbhead

NOTEBOOKS = list(nbhead.notebooks())
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["course"]
REPOSITORY, REF = CONFIG["repository"].rstrip("/"), CONFIG["ref"]
GITHUB_REPO = REPOSITORY.removeprefix("https://github.com/")


def run_install_cell(monkeypatch, tmp_path, *, colab):
    """Execute the install cell's source; return the recorded subprocess calls and the keep file."""
    keep = tmp_path / "keep.txt"
    source = nbhead.install_source()
    assert source.count(nbhead.KEEP_FILE) >= 2, "the cell writes and passes one constraints file"
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: calls.append((args, kwargs)))
    if colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(source.replace(nbhead.KEEP_FILE, str(keep)), "<colab-install>", "exec"), {"__name__": "__main__"})
    return calls, keep


def test_on_colab_the_cell_installs_this_repository_keeping_torch_and_numpy(monkeypatch, tmp_path):
    calls, keep = run_install_cell(monkeypatch, tmp_path, colab=True)
    requirement = f"efficient-attention-course @ git+{REPOSITORY}@{REF}"
    assert calls == [(([sys.executable, "-m", "pip", "install", "--quiet", "-c", str(keep), requirement],),
                      {"check": True})]
    assert keep.read_text().splitlines() == [f"torch=={version('torch')}", f"numpy=={version('numpy')}"]


def test_the_colab_check_is_the_one_course_lib_uses(monkeypatch):
    from course_lib.notebook import in_colab

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert in_colab() and 'if "google.colab" in sys.modules:' in nbhead.install_source()


def test_outside_colab_the_cell_does_nothing(monkeypatch, tmp_path):
    calls, keep = run_install_cell(monkeypatch, tmp_path, colab=False)
    assert calls == [] and not keep.exists()


def test_there_are_notebooks_to_check():
    assert any(p.parent.name == "notebooks" for p in NOTEBOOKS), "no notebook found in notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.relative_to(ROOT).as_posix() for p in NOTEBOOKS])
def test_notebook_starts_with_its_badge_and_the_install_cell(path):
    relpath = path.relative_to(ROOT).as_posix()
    nb = nbformat.read(path, as_version=4)
    assert nbhead.head_is_current(nb, relpath), f"stale head: run `python tools/nbhead.py {relpath}`"
    badge = nb.cells[0].source
    assert f"colab.research.google.com/github/{GITHUB_REPO}/blob/{REF}/{relpath})" in badge


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.relative_to(ROOT).as_posix() for p in NOTEBOOKS])
def test_notebook_names_no_other_repository(path):
    text = "\n".join(cell.source for cell in nbformat.read(path, as_version=4).cells)
    for owner_repo in re.findall(r"colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)", text):
        assert owner_repo == GITHUB_REPO
    for url in re.findall(r"git\+(https://[^\s\"'@)]+)", text):
        assert url == REPOSITORY


def test_badge_and_install_follow_the_configured_repository(monkeypatch):
    assert nbhead.course_config() == (REPOSITORY, REF)
    monkeypatch.setattr(nbhead, "course_config", lambda: ("https://github.com/someone/fork", "abc123"))
    assert "colab.research.google.com/github/someone/fork/blob/abc123/notebooks/00_x.ipynb" in (
        nbhead.badge_markdown("notebooks/00_x.ipynb"))
    assert "git+https://github.com/someone/fork@abc123" in nbhead.install_requirement()
    source = nbhead.install_source()
    assert "someone/fork" in source and "abc123" in source and GITHUB_REPO not in source
