"""No import circles in the package: every `import` and `from ... import`, at module level or inside a
function, is an edge from the importing module to the module it names; a strongly connected group
of two or more modules is a circle. A function-level import that closes a circle still ties two
modules into one unit that cannot be read, tested or moved apart, so it counts too. Importing a
submodule also runs its package's `__init__`; that implicit edge is not counted (every package with a
lazy import of its own submodule would otherwise be a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "edgex"


def _modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _imported(node: ast.AST, base: str) -> list[str]:
    """Dotted names an import statement may refer to (a module, or a name inside one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            anchor = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
            module = f"{anchor}.{node.module}" if node.module else anchor
        else:
            module = node.module or ""
        return [module] + [f"{module}.{alias.name}" for alias in node.names]
    return []


def import_graph(package: Path) -> dict[str, set[str]]:
    modules = _modules(package)

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        base = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _imported(node, base):
                module = owner(target)
                if module and module != name:
                    graph[name].add(module)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_package_has_no_import_circles():
    graph = import_graph(PACKAGE)
    assert len(graph) > 100  # the walk saw the package, not an empty folder
    assert circles(graph) == []


def test_a_planted_function_level_circle_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..a import g\n    return g\n")
    (package / "c.py").write_text("import pkg.a\n")
    assert circles(import_graph(package)) == [["pkg.a", "pkg.sub.b"]]
    (package / "sub" / "b.py").write_text("def f():\n    return 1\n")
    assert circles(import_graph(package)) == []
