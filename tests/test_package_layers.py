"""Imports go one way through the packages (see docs/architecture.md), and no cycle joins modules.

Imports under ``if TYPE_CHECKING:`` are left out: they name a type, they run nothing.
"""

from __future__ import annotations

import ast
import functools
import graphlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "prefect_ito"

LAYERS: dict[str, int] = {
    "contract": 0,
    "exceptions": 1,
    "outcomes": 1,
    "backend": 2,
    "settings": 2,
    "simulator": 2,
    "blocks": 3,
    "parameters": 3,
    "request_fields": 3,
    "waiting": 4,
    "reporting": 5,
    "questions": 5,
    "people": 6,
    "supervision": 7,
    "flows": 8,
    "jobs": 8,
    "prefect_ito": 9,
    "worker": 9,
    "cli": 10,
}
"""Each package's (or root module's) row in docs/architecture.md: lower rows import higher."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(inner) for inner in ast.walk(node))
    return hidden


def _imports(path: Path) -> set[str]:
    """Return the prefect_ito modules ``path`` imports when it runs."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hidden = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("prefect_ito"):
                continue
            named = [f"{node.module}.{alias.name}" for alias in node.names]
            submodules = [name for name in named if _is_module(name)]
            # `from package import module` imports the module, not the package's own code.
            found.update(submodules if len(submodules) == len(named) else [node.module])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("prefect_ito"))
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Return what each module imports; parsed once, read by every test here."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        graph[name] = {target for target in _imports(path) if target != name}
    return graph


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else parts[0]]


def test_every_package_has_a_row():
    unknown = {module.split(".")[1] for module in _graph() if module.count(".") >= 1} - set(LAYERS)
    assert not unknown, f"add {sorted(unknown)} to LAYERS and to docs/architecture.md"


@pytest.mark.parametrize("module", sorted(_graph()))
def test_a_module_imports_only_from_its_row_or_above(module: str):
    upwards = sorted(
        target
        for target in _graph()[module]
        if target != "prefect_ito" and _layer(target) > _layer(module)
    )
    assert not upwards, f"{module} imports upwards: {upwards}"


def test_no_import_cycle_joins_modules():
    graph = _graph()
    # A package's own __init__ importing its submodules is not a cycle unless they import back.
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"import cycle: {' -> '.join(error.args[1])}")


def test_the_check_sees_an_import_upwards(tmp_path: Path):
    # The check itself can fail: a low module that imports a high one is caught.
    low = tmp_path / "low.py"
    low.write_text("from prefect_ito.supervision import loop\n", encoding="utf-8")
    assert _imports(low) == {"prefect_ito.supervision.loop"}
    assert _layer("prefect_ito.supervision.loop") > _layer("prefect_ito.backend.desk")


LONG_MODULE_LINES = 400
"""The house rule (docs/architecture.md): a module past this says in its docstring why."""


def test_a_long_module_says_why_it_is_long():
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) <= LONG_MODULE_LINES:
            continue
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if "~400 lines" not in " ".join(docstring.split()):
            unexplained.append(_module_name(path))
    assert not unexplained, f"past {LONG_MODULE_LINES} lines without saying why: {unexplained}"
