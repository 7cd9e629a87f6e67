"""The code stays readable in one sitting: the Engine (engine/engine.py) and the Celery transport's web
side (CeleryTransport) under 200 lines each, and no product function of engine/ or workbench/ over 50.

The one exception: GPU kernel bodies (`@triton.jit`), which Triton compiles as one function, so a
kernel cannot call a helper the way host code does. Django's generated migrations are not ours to
shape. A function counts from its `def` line to its last line, its docstring and comments included.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "workbench")
CLASS_LIMIT = 200  # lines, the class statement to its last line
FUNCTION_LIMIT = 50
BIG_CLASSES = {"engine/engine.py": "Engine", "workbench/serving/celery/transport.py": "CeleryTransport"}


def lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]


def class_lines(path: str, name: str) -> int:
    tree = ast.parse((ROOT / path).read_text())
    [found] = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == name]
    return lines(found)


def gpu_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(ast.unparse(decorator) == "triton.jit" for decorator in node.decorator_list)


def long_functions(source: str, where: str) -> tuple[list[str], list[str]]:
    """The functions of `source` over the limit, and the GPU kernels left out as the exception."""
    found: list[str] = []
    kernels: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if gpu_kernel(node):
                kernels.append(f"{where}:{node.name}")
            elif lines(node) > FUNCTION_LIMIT:
                found.append(f"{where}:{node.lineno} {node.name} ({lines(node)} lines)")
    return found, kernels


def product_files() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
                  if "migrations" not in path.parts)


def test_the_engine_and_the_celery_transport_stay_under_their_limit() -> None:
    sizes = {name: class_lines(path, name) for path, name in BIG_CLASSES.items()}
    assert all(size > 50 for size in sizes.values()), f"liveness: the classes are found whole: {sizes}"
    over = {name: size for name, size in sizes.items() if size >= CLASS_LIMIT}
    assert not over, f"over {CLASS_LIMIT - 1} lines (split what they delegate into modules of their own): {over}"


def function(name: str, length: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(length - 1))
    return f"{indent}def {name}():\n{body}"


def test_the_checker_finds_a_long_function_and_spares_only_a_kernel() -> None:
    """Control: a function one line over the limit is found, a method too, and a triton.jit kernel
    longer still is left out, so an empty result below means something."""
    over = FUNCTION_LIMIT + 1
    source = (function("long", over) + "class C:\n" + function("method", over, "    ")
              + "@triton.jit\n" + function("kernel", 2 * over) + function("short", FUNCTION_LIMIT))
    found, kernels = long_functions(source, "sample")
    assert found == [f"sample:1 long ({over} lines)", f"sample:{over + 2} method ({over} lines)"], found
    assert kernels == ["sample:kernel"]


def test_no_product_function_is_over_fifty_lines() -> None:
    files = product_files()
    assert len(files) > 100, "liveness: the packages are read"
    found = [entry for path in files for entry in long_functions(path.read_text(), str(path.relative_to(ROOT)))[0]]
    assert found == [], f"functions over {FUNCTION_LIMIT} lines: {found}"
