"""environment.yml (conda) and pyproject.toml (pip) must ask for the same packages with
the same version bounds: conda users and pip users get the same course."""

from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).parents[1]


def _pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return project, {r.name.lower(): r for r in reqs}


def _environment():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda, pip = {}, {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for line in dep["pip"]:
                if not line.startswith("-e"):
                    r = Requirement(line)
                    pip[r.name.lower()] = r
        elif dep != "pip":
            r = Requirement(dep.replace(" ", ""))
            conda[r.name.lower()] = r
    return conda, pip


def test_every_dependency_is_in_both_with_the_same_bounds():
    _, wanted = _pyproject()
    conda, pip = _environment()
    listed = {**conda, **pip}
    for name, req in wanted.items():
        assert name in listed, f"environment.yml lacks {name} (pyproject.toml asks for {req})"
        assert listed[name].specifier == req.specifier, (
            f"{name}: environment.yml says {listed[name].specifier}, pyproject.toml {req.specifier}")
        assert str(listed[name].marker) == str(req.marker), f"{name}: platform markers differ"
    extra = set(listed) - set(wanted) - {"python"}
    assert not extra, f"environment.yml has packages pyproject.toml does not: {sorted(extra)}"


def test_torch_and_triton_come_from_pip():
    _, pip = _environment()
    assert {"torch", "triton"} <= set(pip)


def test_python_bound_agrees():
    project, _ = _pyproject()
    conda, _ = _environment()
    assert str(conda["python"].specifier) == project["requires-python"]


@pytest.mark.parametrize("name", ["torch", "triton", "numpy", "matplotlib", "ipywidgets", "tqdm"])
def test_runtime_dependencies_are_declared(name):
    project, _ = _pyproject()
    assert any(Requirement(r).name == name for r in project["dependencies"])
