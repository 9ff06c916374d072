"""A StableToolBench checkout, found and checked: its scripts, queries, test ids, tools folder, evaluators, commit.

``score --stabletoolbench DIR`` runs upstream's own scripts from the user's checkout (never a copy of them).
Everything here reads file listings, small JSON and YAML files and ``git``'s answer; nothing of upstream's
is imported.  A path one level off (the ``toolbench`` folder, or the folder holding the checkout) gets an
error naming the path to use.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.upstream.nearby import nearby

SCRIPTS = {
    "qa_pipeline": "toolbench/inference/qa_pipeline.py",
    "qa_pipeline_multithread": "toolbench/inference/qa_pipeline_multithread.py",
    "convert": "toolbench/tooleval/convert_to_answer_format.py",
    "eval_pass_rate": "toolbench/tooleval/eval_pass_rate.py",
    "eval_preference": "toolbench/tooleval/eval_preference.py",
}
"""Upstream's scripts ``score`` runs, relative to the checkout's root."""
QUERIES = "solvable_queries/test_instruction"
"""The groups' queries (``<group>.json``), as upstream's inference script reads them."""
TEST_IDS = "solvable_queries/test_query_ids"
"""The query ids each group's evaluation reads (``--test_ids``)."""
EVALUATORS = "toolbench/tooleval/evaluators"
TOOLS_FOLDERS = ("toolenv/tools", "server/tools")
"""Where a checkout keeps the tool docs: upstream's inference script's ``--tool_root_dir``, then the server's folder."""
_MARK = SCRIPTS["qa_pipeline"]


class CheckoutError(ValueError):
    """The path is not a usable StableToolBench checkout (the message names the fix)."""


@dataclass(frozen=True)
class Checkout:
    root: Path
    tools: Path
    """The tools folder ``qa_pipeline --tool_root_dir`` reads."""
    commit: str | None
    """``git rev-parse HEAD``; ``None`` when the folder is not a git checkout."""
    dirty: bool | None
    """Whether tracked files differ from the commit (``None`` without git)."""

    def script(self, name: str) -> Path:
        return self.root / SCRIPTS[name]

    def queries(self, group: str) -> Path:
        return self.root / QUERIES / f"{group}.json"

    def test_ids(self, group: str) -> Path:
        return self.root / TEST_IDS / f"{group}.json"

    def groups(self) -> list[str]:
        """The groups with a queries file, sorted."""
        folder = self.root / QUERIES
        return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []

    def check_groups(self, groups: list[str]) -> None:
        """:class:`CheckoutError` naming the groups that have no queries (or no test ids) file, and those that do."""
        known = self.groups()
        unknown = [g for g in groups if g not in known]
        if unknown:
            raise CheckoutError(f"no group {', '.join(unknown)} in {self.root / QUERIES}: the groups are {', '.join(known) or '(none)'}")
        missing = [g for g in groups if not self.test_ids(g).is_file()]
        if missing:
            raise CheckoutError(f"no test ids for {', '.join(missing)} in {self.root / TEST_IDS} (the evaluation's --test_ids)")

    def evaluators(self) -> list[str]:
        """The evaluators' names (the folders of ``tooleval/evaluators/`` with a ``config.yaml``), sorted."""
        return sorted(p.parent.name for p in (self.root / EVALUATORS).glob("*/config.yaml"))

    def evaluator(self, name: str) -> Path:
        """An evaluator's folder (its ``config.yaml``): ``name`` must be one of :meth:`evaluators`, never a path;
        :class:`CheckoutError` listing them when it is not."""
        known = self.evaluators()
        if name not in known:
            raise CheckoutError(f"no evaluator {name[:200]!r} in {self.root / EVALUATORS}: the evaluators are {', '.join(known) or '(none)'}")
        return self.root / EVALUATORS / name

    def judge_model(self, evaluator: str) -> str:
        """The model an evaluator asks (its ``config.yaml``'s ``completions_kwargs.model``)."""
        import yaml

        path = self.evaluator(evaluator) / "config.yaml"
        try:
            config: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
            return str(config["completions_kwargs"]["model"])
        except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError) as exc:
            raise CheckoutError(f"{path}: no completions_kwargs.model ({exc}); name the judge with --judge-model") from None

    def read_queries(self, group: str) -> list[dict[str, Any]]:
        return _json_list(self.queries(group))

    def read_test_ids(self, group: str) -> dict[str, Any]:
        data = _json(self.test_ids(group))
        if not isinstance(data, dict):
            raise CheckoutError(f"{self.test_ids(group)}: a JSON object of query ids expected")
        return data


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckoutError(f"{path}: cannot be read ({exc})") from None


def _json_list(path: Path) -> list[dict[str, Any]]:
    data = _json(path)
    if not isinstance(data, list) or not all(isinstance(q, dict) for q in data):
        raise CheckoutError(f"{path}: a JSON list of queries expected")
    return data


def _is_checkout(path: Path) -> bool:
    return (path / _MARK).is_file()


def find_checkout(path: str | os.PathLike[str], tools: str | os.PathLike[str] | None = None) -> Checkout:
    """The checkout at ``path``, its tools folder (``tools``, else the first of :data:`TOOLS_FOLDERS` there).

    :class:`CheckoutError` when ``path`` is not one (naming a checkout just above or below it), when a
    script ``score`` runs is missing, or when there is no tools folder.
    """
    root = Path(path).expanduser().resolve()
    if not root.exists():
        raise CheckoutError(f"--stabletoolbench {root}: no such folder (a clone of https://github.com/THUNLP-MT/StableToolBench)")
    if not _is_checkout(root):
        near = nearby(root, lambda folder, _budget: _is_checkout(Path(folder)), prefer="StableToolBench")
        hint = f"; {near[1]} is one: use --stabletoolbench {near[1]}" if near is not None else ""
        raise CheckoutError(f"--stabletoolbench {root}: not a StableToolBench checkout (no {_MARK}){hint}")
    missing = [rel for rel in SCRIPTS.values() if not (root / rel).is_file()]
    if missing:
        raise CheckoutError(f"--stabletoolbench {root}: {', '.join(missing)} missing: an incomplete checkout")
    return Checkout(root, _tools_folder(root, tools), *_git_state(root))


def _tools_folder(root: Path, tools: str | os.PathLike[str] | None) -> Path:
    if tools is not None:
        folder = Path(tools).expanduser().resolve()
        if not folder.is_dir():
            raise CheckoutError(f"--tools {folder}: no such folder (the tool docs, <Category>/<tool>.json)")
        return folder
    for rel in TOOLS_FOLDERS:
        if (root / rel).is_dir():
            return root / rel
    where = " or ".join(str(root / rel) for rel in TOOLS_FOLDERS)
    raise CheckoutError(f"no tools folder at {where}: download the tools (StableToolBench's README) or name the folder with --tools")


def _git_state(root: Path) -> tuple[str | None, bool | None]:
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        if head.returncode != 0:
            return None, None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    return head.stdout.strip() or None, bool(status.stdout.strip()) if status.returncode == 0 else None
