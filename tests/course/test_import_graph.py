"""Imports inside flashlab go one way: from the top (command line, benchmarks, trainer) down to
the bottom (the reference code, the kernels), never back up, and each folder imports only the
folders its layer may use (`ALLOWED`). The graph is read from the source
with `ast` (every import statement, those inside functions too, since a lazy import is still
a dependency), so a cycle fails here before it fails, or hides, at import time."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "flashlab"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The package's modules that ``tree`` (module ``name``) imports. ``from X import y``
    imports X, and X.y too when that is a module; relative imports are resolved against
    ``name``."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{stem}.{alias.name}" for alias in node.names] + [stem]
        else:
            continue
        for target in targets:
            while target and target not in modules:     # flashlab.reference.tiled.tiled_attention → …tiled
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module → the package's modules it imports, for every module under ``root``. A module's
    edge to its own parent package (``from . import x`` in flashlab.bench.y) is left out:
    Python imports the parent first anyway, and the parent's own imports are its edges."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        edges = imported_modules(ast.parse(path.read_text()), name, path.name == "__init__.py", set(paths))
        graph[name] = {e for e in edges if not name.startswith(e + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, …, a], or None: depth-first search, a back edge is a cycle."""
    state, stack = {}, []                       # state: 1 = on the current path, 2 = finished

    def visit(node):
        state[node], _ = 1, stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node], _ = 2, stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_flashlab_imports_have_no_cycle():
    graph = import_graph()
    assert "flashlab.launch.timing" in graph and "flashlab.bench.attention" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " → ".join(cycle)


# What each folder may import (besides itself). Read from the bottom: the course's reference code,
# then the Triton kernels (nothing but each other), how they are launched and tuned, the public
# API, and on top the trainer, the benchmarks and the command line. The lessons' teaching code may
# use the API but nothing above it; nothing but the command line imports the benchmarks.
ALLOWED = {
    "reference": set(),
    "kernels": set(),
    "launch": {"reference", "kernels"},
    "api": {"reference", "kernels", "launch"},
    "integrations": {"reference", "launch", "api"},
    "lessons": {"reference", "kernels", "launch", "api"},
    "train": {"reference", "launch", "api"},
    "bench": {"reference", "kernels", "launch", "api", "lessons", "train"},
    "cli": {"reference", "kernels", "launch", "api", "lessons", "train", "bench"},
    "__init__": {"reference", "launch", "api", "lessons"},
    "__main__": {"cli"},
    "flash_attn_interface": {"api"},      # FlashAttention's import path, re-exporting flashlab.api's
}


def folder(module: str) -> str:
    """flashlab.kernels.dense → kernels; flashlab → __init__; flashlab.cli → cli."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def forbidden_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every edge that crosses the layers the wrong way, as 'a → b (folder may not import folder)'."""
    bad = []
    for module, edges in sorted(graph.items()):
        here = folder(module)
        for target in sorted(edges):
            there = folder(target)
            if there != here and there not in ALLOWED.get(here, set()):
                bad.append(f"{module} → {target} ({here}/ may not import {there}/)")
    return bad


def test_every_module_lives_in_a_folder_with_rules():
    graph = import_graph()
    assert {folder(m) for m in graph} <= set(ALLOWED), "a folder with no rules in ALLOWED"
    assert "flashlab.kernels.dense" in graph and "flashlab.bench.attention" in graph


def test_imports_follow_the_layers():
    bad = forbidden_imports(import_graph())
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_the_layer_check_fails_on_a_forbidden_import(tmp_path):
    """The rule is live: a kernel module importing the launcher, or the lessons the trainer, is caught."""
    files = {"__init__.py": "", "kernels/__init__.py": "", "kernels/dense.py": "from flashlab.launch import small\n",
             "launch/__init__.py": "", "launch/small.py": "from flashlab.kernels import dense\n",
             "lessons/__init__.py": "", "lessons/widgets.py": "from flashlab.train import model\n",
             "train/__init__.py": "", "train/model.py": "import torch\n"}
    bad = forbidden_imports(import_graph(write_package(tmp_path / "flashlab", files)))
    assert "flashlab.kernels.dense → flashlab.launch.small (kernels/ may not import launch/)" in bad
    assert "flashlab.lessons.widgets → flashlab.train.model (lessons/ may not import train/)" in bad
    assert not any(line.startswith("flashlab.launch.small") for line in bad), "launch/ may import kernels/"


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("files, cycle", [
    ({"__init__.py": "", "a.py": "from .b import f\n", "b.py": "def f():\n    from .a import g\n"},
     ["pkg.a", "pkg.b", "pkg.a"]),                                  # lazy import inside a function
    ({"__init__.py": "", "a.py": "from . import b\n", "b.py": "import pkg.c\n", "c.py": "from pkg.a import x\n"},
     ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]),                         # absolute and `from . import module`
    ({"__init__.py": "", "sub/__init__.py": "", "sub/x.py": "from ..y import f\n", "y.py": "from .sub.x import g\n"},
     ["pkg.sub.x", "pkg.y", "pkg.sub.x"]),                          # two levels up from a subpackage
    ({"__init__.py": "from .a import f\n", "a.py": "from .b import g\n", "b.py": "import os\n"}, None),
])
def test_the_cycle_finder_sees_every_kind_of_import(tmp_path, files, cycle):
    graph = import_graph(write_package(tmp_path / "pkg", files))
    assert find_cycle(graph) == cycle
