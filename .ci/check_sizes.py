#!/usr/bin/env python3
"""Fail when a module of the package is over 500 lines or a function's cyclomatic complexity is over 15.

xenon (run beside this in ``.ci/run``) checks complexity by radon's grades only (C: 11 to 20), so the
limit of 15 a function, and the 500 lines a module, are checked here with radon's own measure.

Usage: ``python .ci/check_sizes.py [PACKAGE_DIR]`` (default ``stabletoolbench_mirror``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from radon.complexity import cc_visit

MAX_LINES = 500
MAX_COMPLEXITY = 15


def problems(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines > MAX_LINES:
            found.append(f"{path}: {lines} lines (at most {MAX_LINES}: split it by idea)")
        for block in cc_visit(text):
            if block.complexity > MAX_COMPLEXITY:
                found.append(f"{path}:{block.lineno} {block.fullname}: complexity {block.complexity} (at most {MAX_COMPLEXITY}: name its steps)")
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "stabletoolbench_mirror")
    found = problems(root)
    print("\n".join(found) if found else f"every module at most {MAX_LINES} lines, every function at most complexity {MAX_COMPLEXITY}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
