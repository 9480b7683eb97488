"""The layer contract (docs/architecture.md): imports run one way,

    cli > dashboard > alerts | gateway > ingest | replay > store > core

A module may import only from its own layer's package or from layers below; the packages joined
by ``|`` never import each other. Every ``import`` statement counts, at module level or inside a
function, ``if TYPE_CHECKING`` blocks included (a type-only import is still an arrow).

The check reads the source with :mod:`ast`; import-linter checks the same contract
(``pyproject.toml`` ``[tool.importlinter]``, run by tests/test_static_checks.py) through the
``prefixscope/<folder>`` links.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Package -> folder, as in pyproject.toml's [tool.setuptools.package-dir].
FOLDERS = {
    "prefixscope.cli": "prefixscope/cli",
    "prefixscope.core": "prefixscope/core",
    "prefixscope.dashboard": "dashboard",
    "prefixscope.alerts": "alerts",
    "prefixscope.gateway": "gateway",
    "prefixscope.ingest": "ingest",
    "prefixscope.replay": "replay",
    "prefixscope.store": "store",
}

#: Top to bottom; a tuple is one layer of independent packages.
LAYERS: list[tuple[str, ...]] = [
    ("prefixscope.cli",),
    ("prefixscope.dashboard",),
    ("prefixscope.alerts", "prefixscope.gateway"),
    ("prefixscope.ingest", "prefixscope.replay"),
    ("prefixscope.store",),
    ("prefixscope.core",),
]


def _package_of(module: str) -> str | None:
    for pkg in FOLDERS:
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    return None


def _layer_index(pkg: str) -> int:
    for i, layer in enumerate(LAYERS):
        if pkg in layer:
            return i
    raise KeyError(pkg)


def _imports(source: str, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import in ``source`` (relative imports resolved)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: -node.level]
                base = ".".join(parts + ([base] if base else []))
            out.append((node.lineno, base))
            # `from prefixscope import store` imports the package prefixscope.store
            out.extend((node.lineno, f"{base}.{a.name}") for a in node.names)
    return out


def back_arrows(modules: dict[str, str]) -> list[str]:
    """Every import statement of ``modules`` (module name -> source) that breaks the contract,
    once per statement, worded ``importer:line imports module (a layer above/beside pkg)``."""
    problems = []
    for module, source in sorted(modules.items()):
        own = _package_of(module)
        if own is None:
            continue
        seen = set()
        for line, imported in _imports(source, module):
            other = _package_of(imported)
            if other is None or other == own or (line, other) in seen:
                continue
            seen.add((line, other))
            mine, theirs = _layer_index(own), _layer_index(other)
            if theirs < mine:
                problems.append(f"{module}:{line} imports {imported} (a layer above {own})")
            elif theirs == mine:
                problems.append(f"{module}:{line} imports {imported} (beside {own} in one layer)")
    return problems


def product_modules() -> dict[str, str]:
    """Module name -> source of every product module in the mapped folders (a package's own
    module is named ``pkg.__init__``)."""
    modules = {}
    for pkg, folder in FOLDERS.items():
        base = ROOT / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            # a package keeps its ``__init__`` part, so that relative imports resolve from it
            modules[".".join([pkg, *rel.parts])] = path.read_text(encoding="utf-8")
    return modules


def test_the_product_has_no_back_arrow():
    modules = product_modules()
    assert len(modules) > 100, "the walker found too few modules: is FOLDERS out of date?"
    assert back_arrows(modules) == []


def test_core_imports_nothing_of_the_product_but_core():
    for module, source in product_modules().items():
        if _package_of(module) != "prefixscope.core":
            continue
        for line, imported in _imports(source, module):
            if imported.startswith("prefixscope.") and not imported.startswith(
                    ("prefixscope.core", "prefixscope.data")):
                pytest.fail(f"{module}:{line} imports {imported}")


@pytest.mark.parametrize("importer, statement, why", [
    ("prefixscope.store.db", "from prefixscope.ingest import usage", "a layer above"),
    ("prefixscope.core.errors", "import prefixscope.store.db", "a layer above"),
    ("prefixscope.alerts.render", "from prefixscope.dashboard.data import query", "a layer above"),
    ("prefixscope.ingest.runs", "def f():\n    from prefixscope.replay.runner import x", "beside"),
    ("prefixscope.replay.sim", "from prefixscope import ingest", "beside"),
    ("prefixscope.store.queries.scopes", "from ...replay import identity", "a layer above"),
])
def test_a_back_arrow_fails_the_contract(importer, statement, why):
    modules = product_modules()
    modules[importer] = modules.get(importer, "") + "\n" + statement + "\n"
    problems = back_arrows(modules)
    assert len(problems) == 1 and problems[0].startswith(importer + ":") and why in problems[0]


def test_a_downward_import_passes():
    modules = {"prefixscope.cli.x": "from prefixscope.dashboard import data\nimport prefixscope.core",
               "prefixscope.dashboard.y": "from prefixscope.alerts.render import html",
               "prefixscope.ingest.z": "from prefixscope.store import db"}
    assert back_arrows(modules) == []
