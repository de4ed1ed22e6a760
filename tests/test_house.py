"""The shape of the package: its layers in order, no import cycle, the probe layer off explain, the core
pure, small modules.

Imports are read from the source (inside functions too, where a cycle hides from every tool that only
reads module-level imports); a package's ``__init__`` re-exporting its modules is not an edge of a cycle.
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autobatch"
MAX_MODULE_LINES = 800


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(package: Path) -> dict[str, Path]:
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


MODULES = modules_of(PACKAGE)


def imported(name: str, path: Path, modules: dict[str, Path] = MODULES) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level > 1:
                base = base[: len(base) - (node.level - 1)]
            module = (
                (".".join(base) + (f".{node.module}" if node.module else ""))
                if node.level
                else node.module or ""
            )
            targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        found.update(t for t in targets if t in modules and t != name)
    return found


GRAPH = {name: imported(name, path) for name, path in MODULES.items()}


def layers(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, int]:
    """Each top-level name of the package -> its layer's rank (0 is the bottom), from pyproject.toml."""
    order = tomllib.loads(pyproject.read_text())["tool"]["autobatch"]["layers"]["order"]
    return {unit: rank for rank, names in enumerate(order) for unit in names}


def unit(module: str) -> str:
    """The top-level package or module of the package that ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(package: Path) -> list[str]:
    """Every import in ``package`` that runs up a layer, and every top-level name with no layer."""
    modules = modules_of(package)
    rank = layers()
    problems = sorted({f"{unit(m)} has no layer in pyproject.toml" for m in modules if unit(m) not in rank})
    for name, path in modules.items():
        for dep in sorted(imported(name, path, modules)):
            if unit(dep) in rank and unit(name) in rank and rank[unit(dep)] > rank[unit(name)]:
                problems.append(f"{name} imports {dep}: {unit(dep)} is a layer above {unit(name)}")
    return problems


def test_no_import_runs_up_a_layer() -> None:
    assert upward_imports(PACKAGE) == []


def test_an_import_up_a_layer_is_caught(tmp_path: Path) -> None:
    """The check fails on a copy of the package where the core imports the run layer."""
    copy = tmp_path / "autobatch"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "core" / "reaches_up.py").write_text("from autobatch.run.session import Session\n")
    assert upward_imports(copy) == [
        "autobatch.core.reaches_up imports autobatch.run.session: run is a layer above core"
    ]


def test_at_most_eight_modules_at_the_top() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top


def test_no_import_cycle() -> None:
    edges = {n: {d for d in deps if MODULES[d].name != "__init__.py"} for n, deps in GRAPH.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep) :] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name)


def test_the_probe_layer_knows_nothing_of_explain() -> None:
    for name, deps in GRAPH.items():
        if name.startswith("autobatch.probe"):
            assert not [d for d in deps if d.startswith("autobatch.explain")], name


@pytest.mark.parametrize("layer", ["autobatch.core", "autobatch.settings"])
def test_pure_layers_import_no_edge(layer: str) -> None:
    """The core (search, plan, reuse) and the settings import nothing that does I/O or needs torch."""
    allowed = ("autobatch.core", "autobatch.errors", "autobatch.settings")
    for name, deps in GRAPH.items():
        if name.startswith(layer):
            assert all(d.startswith(allowed) or d == "autobatch" for d in deps), (name, deps)


def test_modules_stay_cohesive() -> None:
    """A module up to 800 lines (a cohesive module reads better than fragments); a function is judged by its
    complexity and parameters (ruff), not its length."""
    problems = []
    for name, path in MODULES.items():
        lines = path.read_text().count("\n") + 1
        if lines > MAX_MODULE_LINES:
            problems.append(f"{name}: {lines} lines")
    assert not problems, problems
