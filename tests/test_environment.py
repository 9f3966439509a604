"""The set-up files agree: pyproject, environment.yml, constraints.txt and the Makefile."""

import re
import tomllib

from packaging.requirements import Requirement

from tests.conftest import ROOT


def _name(requirement):
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _environment_pip_lines():
    text = (ROOT / "environment.yml").read_text()
    block = text.split("- pip:", 1)[1]
    return [line.strip()[2:].strip().strip("\"") for line in block.splitlines() if line.strip().startswith("- ")]


def _constraints():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_environment_yml_names_the_same_direct_dependencies_as_pyproject():
    project = _pyproject()
    direct = {_name(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    lines = _environment_pip_lines()
    assert "-c constraints.txt" in lines, "environment.yml must install through constraints.txt"
    named = {_name(line) for line in lines if not line.startswith("-")}
    assert named == direct, f"only in pyproject: {direct - named}; only in environment.yml: {named - direct}"
    assert re.search(r"^\s*- python=3\.11\s*$", (ROOT / "environment.yml").read_text(), re.M)


def test_constraints_pin_every_direct_dependency_and_torch_2_13():
    project = _pyproject()
    pins = _constraints()
    for requirement in project["dependencies"] + project["optional-dependencies"]["dev"]:
        req = Requirement(requirement)
        name = _name(requirement)
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} violates {req}"
    assert pins["torch"] == "2.13.0"


def test_pyproject_keeps_torch_and_numpy_loose_for_colab():
    deps = {_name(r): Requirement(r) for r in _pyproject()["dependencies"]}
    for name in ("torch", "numpy"):
        assert str(deps[name].specifier).startswith(">="), f"{name} must have a lower bound only"
    assert str(deps["torch"].specifier) == ">=2.2"


def test_every_pip_install_in_the_makefile_uses_the_constraints():
    installs = [line for line in (ROOT / "Makefile").read_text().splitlines()
                if re.search(r"(pip|\$\(PIP\)) install", line) and ".constraints-venv" not in line]
    assert installs and all("-c constraints.txt" in line for line in installs), installs


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
