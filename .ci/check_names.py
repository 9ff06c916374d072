#!/usr/bin/env python3
"""Fail when two classes of the package share a name (one word per idea: CONTRIBUTING.md, Words).

The names that are shared today are listed in :data:`KNOWN` with where; issue 50 (Architecture V) renames them.
A name shared anywhere else, or by more modules than listed, fails, so no new pair comes in; a listed name no
longer shared fails too, so the list only shrinks.

Usage: ``python .ci/check_names.py [PACKAGE_DIR]`` (default ``stabletoolbench_mirror``).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

#: class names shared today -> how many modules define them
KNOWN = {
    "Environment": 2, "MirrorError": 2, "ModelServer": 2, "ModelServers": 2, "Reply": 3, "Session": 2,
    "SessionError": 2, "Stats": 2, "Target": 2, "Transport": 2,
}


def class_names(root: Path) -> dict[str, list[str]]:
    """Each class name defined at the top of a module (or in a class, or a function) -> the modules defining it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name in sorted({node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}):
            found[name].append(str(path))
    return found


def problems(root: Path) -> list[str]:
    out = []
    for name, modules in sorted(class_names(root).items()):
        if len(modules) > KNOWN.get(name, 1):
            out.append(f"class {name} is defined in {len(modules)} modules ({', '.join(modules)}): give each idea its own name")
    for name, count in sorted(KNOWN.items()):
        if len(class_names(root).get(name, [])) < count:
            out.append(f"class {name} is no longer shared by {count} modules: lower or remove it in .ci/check_names.py's KNOWN")
    return out


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "stabletoolbench_mirror")
    found = problems(root)
    for line in found:
        print(line)
    if not found:
        print(f"no class name shared by two modules beyond the {len(KNOWN)} listed (issue 50 renames them)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
