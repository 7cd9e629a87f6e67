"""The house's layout holds: docs/ARCHITECTURE.md's layout table names every module of engine/ (its
kernels/ included) and workbench/ (and nothing that is gone), and no project module imports itself
through a circle of imports.

The table is the map a newcomer reads first, so it may not drift. Import circles are counted through every
import a module makes, a function's lazy ones included (a lazy import only hides a circle), less those
under `if TYPE_CHECKING:`, which never run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "workbench")
DESCRIPTION_COLUMN = 16  # a line indented this far continues the description above it


def project_modules() -> set[str]:
    """Every module file of the packages, as a path relative to the root (migrations are Django's)."""
    return {str(path.relative_to(ROOT)) for package in PACKAGES for path in (ROOT / package).rglob("*.py")
            if path.name != "__init__.py" and "migrations" not in path.parts}


def layout_table() -> str:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## Layout", 1)[1]
    return section.split("```", 2)[1]


def listed_modules(table: str) -> set[str]:
    """The files the table's name column lists, each under the folders its indentation nests it in."""
    folders: list[tuple[int, str]] = []  # (indent, folder path) of the folders open at this line
    listed = set()
    for line in table.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent >= DESCRIPTION_COLUMN:
            continue
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        folders = [(i, f) for i, f in folders if i < indent]
        parent = folders[-1][1] if folders else ""
        for name in re.split(r"[\s,]+", names):
            if name.endswith("/"):
                folders.append((indent, parent + name))
            elif name.endswith(".py") and name != "__init__.py":
                listed.add(parent + name)
    return listed


def test_the_layout_table_lists_every_module_and_no_missing_one() -> None:
    modules, listed = project_modules(), listed_modules(layout_table())
    assert "engine/sequence.py" in listed and "workbench/serving/celery/worker.py" in listed, \
        "liveness: the table's parser finds nested modules"
    assert not modules - listed, f"modules missing from docs/ARCHITECTURE.md's layout: {sorted(modules - listed)}"
    stale = {path for path in listed - modules if path.startswith(PACKAGES)}
    assert not stale, f"the layout table lists modules that do not exist: {sorted(stale)}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, less the bodies of `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)
    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (a `from package import name` counts as the module
    package.name where that is one, else as the package)."""
    files = {_module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
             if "migrations" not in path.parts}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = set()
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in files else node.module)
        graph[module] = {t for t in targets if t in files and t != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))
    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_the_circle_finder_finds_a_circle() -> None:
    """Control: a lazy import closing a circle is caught, so an empty result below means something."""
    graph = import_graph()
    assert "engine.loading.loader" in graph["engine.engine"], "liveness: imports are read"
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_project_module_imports_itself_through_a_circle() -> None:
    assert circles(import_graph()) == []


# What runs the engine (its step, its tensors): outside workbench/serving, the web side imports only the
# engine's values, validators and names (SamplingParams, Tokenizer, the flag registry, leak event kinds).
ENGINE_RUNTIME = ("engine.engine", "engine.decode.runner", "engine.decode.device_loop", "engine.decode.graphs",
                  "engine.scheduler", "engine.model")


def engine_runtime_imports_outside_serving() -> list[str]:
    found = []
    for path in sorted((ROOT / "workbench").rglob("*.py")):
        module = _module_name(path)
        if module.startswith("workbench.serving"):
            continue
        for node in _runtime_imports(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.module == "engine":
                names = [f"engine.{a.name}" for a in node.names]
            found += [f"{module}: {name}" for name in names
                      if name == "engine.Engine" or name.startswith(ENGINE_RUNTIME)]
    return found


def test_the_web_side_reaches_the_running_engine_only_through_serving() -> None:
    assert "workbench.serving.engine_host" in import_graph(), "liveness: serving's modules are read"
    assert engine_runtime_imports_outside_serving() == []


def folder_of(module: str) -> str:
    """A module's floor: its first folder below the package (engine.decode.runner -> engine.decode), or
    the module itself where it sits at the package's root (engine.sampler)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folders.setdefault(folder_of(module), set()).update(folder_of(t) for t in targets)
    for source, targets in folders.items():
        targets.discard(source)
    for target in {t for targets in folders.values() for t in targets}:
        folders.setdefault(target, set())
    return folders


def test_the_folder_graph_sees_a_folder_circle() -> None:
    """Control: two modules of different folders importing each other's folder form a folder circle,
    though no module imports itself."""
    graph = {"engine.model.a": {"engine.decode.b"}, "engine.decode.b": {"engine.decode.c"},
             "engine.decode.c": set(), "engine.decode.d": {"engine.model.e"}, "engine.model.e": set()}
    assert circles(graph) == []
    assert circles(folder_graph(graph)) == [["engine.decode", "engine.model"]]
    assert "engine.kernels" in folder_graph(import_graph())["engine.decode"], "liveness: folders are read"


def test_no_folder_imports_a_folder_that_imports_it() -> None:
    """Inside engine/ and workbench/, imports go one way between floors (a folder, or a module at the
    package's root): a lower floor never reaches up, not even lazily."""
    assert circles(folder_graph(import_graph())) == []
