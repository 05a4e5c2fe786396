"""environment.yml and environment-cpu.yml (conda) and pyproject.toml (pip) must ask for the same
packages with the same version bounds: conda users, with or without a GPU, and pip users get
the same course. And the distribution is publishable: a name free on PyPI, an SPDX license."""

from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).parents[2]


def _pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return project, {r.name.lower(): r for r in reqs}


ENVIRONMENTS = ["environment.yml", "environment-cpu.yml"]
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def _environment(name="environment.yml"):
    env = yaml.safe_load((ROOT / name).read_text())
    conda, pip = {}, {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for line in dep["pip"]:
                if not line.startswith("-"):           # -e ., --extra-index-url …: options, not packages
                    r = Requirement(line)
                    pip[r.name.lower()] = r
        elif dep != "pip":
            r = Requirement(dep.replace(" ", ""))
            conda[r.name.lower()] = r
    return conda, pip


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_every_dependency_is_in_both_with_the_same_bounds(name):
    _, wanted = _pyproject()
    conda, pip = _environment(name)
    listed = {**conda, **pip}
    for name, req in wanted.items():
        assert name in listed, f"environment.yml lacks {name} (pyproject.toml asks for {req})"
        assert listed[name].specifier == req.specifier, (
            f"{name}: environment.yml says {listed[name].specifier}, pyproject.toml {req.specifier}")
        assert str(listed[name].marker) == str(req.marker), f"{name}: platform markers differ"
    extra = set(listed) - set(wanted) - {"python"}
    assert not extra, f"{name} has packages pyproject.toml does not: {sorted(extra)}"


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_torch_and_triton_come_from_pip(name):
    _, pip = _environment(name)
    assert {"torch", "triton"} <= set(pip)


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_python_bound_agrees(name):
    project, _ = _pyproject()
    conda, _ = _environment(name)
    assert str(conda["python"].specifier) == project["requires-python"]


def test_the_cpu_environment_is_the_gpu_one_plus_the_cpu_index():
    """Same name, channels and packages; its pip section adds PyTorch's CPU index (so pip takes
    the +cpu torch wheel), which environment.yml does not have and mentions."""
    gpu, cpu = (yaml.safe_load((ROOT / name).read_text()) for name in ENVIRONMENTS)
    pip_gpu, pip_cpu = ([d for d in env["dependencies"] if isinstance(d, dict)][0]["pip"] for env in (gpu, cpu))
    assert pip_cpu == [CPU_INDEX] + pip_gpu
    assert cpu.keys() == gpu.keys() and all(cpu[k] == gpu[k] for k in gpu if k != "dependencies")
    assert [d for d in cpu["dependencies"] if not isinstance(d, dict)] == \
        [d for d in gpu["dependencies"] if not isinstance(d, dict)]
    assert "environment-cpu.yml" in (ROOT / "environment.yml").read_text(), "the GPU file points CPU users to it"


def test_the_distribution_is_publishable():
    """"flashlab" on PyPI is an unrelated project: the distribution has its own name (the import
    name stays flashlab); an SPDX license string with its file (no setuptools deprecation)."""
    project, wanted = _pyproject()
    assert project["name"] == "flashlab-course"
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert "transformers" in [Requirement(r).name for r in project["optional-dependencies"]["hf"]]
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "launch/tuned/*.json" in build["tool"]["setuptools"]["package-data"]["flashlab"]
    assert Requirement(build["build-system"]["requires"][0]).specifier.contains("77")


@pytest.mark.parametrize("name", ["torch", "triton", "numpy", "matplotlib", "ipywidgets", "tqdm"])
def test_runtime_dependencies_are_declared(name):
    project, _ = _pyproject()
    assert any(Requirement(r).name == name for r in project["dependencies"])
