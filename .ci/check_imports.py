#!/usr/bin/env python3
"""Fail when the package's modules import each other in a circle.

Every import counts, at module level or inside a function, except those under
``if TYPE_CHECKING:`` (they never run).  Importing ``pkg.a.b`` also imports the package
``pkg.a`` (its ``__init__``), so that edge counts too: a package's face is part of the graph.
Prints each circle (a strongly connected component of more than one module, or a module that
imports itself) and exits 1, else prints the module and edge counts and exits 0.

The layer order itself (a layer imports only the layers below it) is import-linter's layers contract
(``[importlinter]`` in setup.cfg, ``lint-imports``); a contract forbids edges between layers, and only this
script sees a circle inside one layer or through a package's ``__init__``.

Usage: ``python .ci/check_imports.py [PACKAGE_DIR]`` (default ``stabletoolbench_mirror``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_names(root: Path) -> dict[str, Path]:
    """``dotted name -> file`` for every module of the package at ``root`` (packages by their ``__init__``)."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


def edges_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports (and the packages above each)."""
    is_package = path.name == "__init__.py"
    # the packages above a module are imported before it: importing from a sibling adds no edge to them
    ancestors = {".".join(name.split(".")[:end]) for end in range(1, name.count(".") + 1)}
    explicit: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            explicit.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module or ""
        submodules = {f"{stem}.{alias.name}" for alias in node.names} & modules.keys()  # ``from pkg import module``
        explicit.update(submodules)
        if len(submodules) < len(node.names):  # a name of the package's own face
            explicit.add(stem)
    edges: set[str] = set()
    for target in explicit:
        parts = target.split(".")
        # the module itself and every package above it (``import a.b.c`` runs a/__init__, a/b/__init__)
        for end in range(1, len(parts) + 1):
            candidate = ".".join(parts[:end])
            if candidate in modules and candidate != name and (candidate == target or candidate not in ancestors):
                edges.add(candidate)
    edges.discard(name.split(".")[0])  # the top package's __init__ imports nothing of its own (checked below)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "stabletoolbench_mirror").resolve()
    modules = module_names(root)
    graph = {name: edges_of(name, path, modules) for name, path in modules.items()}
    top = root.name
    if graph.get(top):
        print(f"{top}/__init__.py imports {sorted(graph[top])}: every module imports it, so it must import none of them")
        return 1
    circles = cycles(graph)
    for circle in circles:
        print(f"import circle of {len(circle)} modules: " + " ".join(circle))
        for member in circle:
            inside = sorted(graph[member] & set(circle))
            print(f"  {member} -> {', '.join(inside)}")
    if circles:
        return 1
    print(f"no import circle: {len(graph)} modules, {sum(len(e) for e in graph.values())} imports between them")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
