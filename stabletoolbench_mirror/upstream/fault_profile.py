"""A tree's fault profile (``faults profile TREE``, :mod:`stabletoolbench_mirror.commands.faults_profile`): the real mix
of failures in an upstream ``tool_response_cache`` tree, as a ``faults:`` block.

Every answer of the tree (for instance StableToolBench's published cache) is sorted by what the client would make of
it: one of StableToolBench's six error answers (its ``error`` text exactly, see
:mod:`stabletoolbench_mirror.core.fault_kinds`), an ``empty`` answer (no error and an empty response), another error
text (counted, but no fault kind stands for it) or a clean answer.  :meth:`Profile.config` gives the ``faults:``
settings of that mix: ``rate`` the share of error and empty answers among all, ``kinds`` the share of each among them.
Files are read one at a time; nothing is written.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from stabletoolbench_mirror.core.fault_kinds import KIND_OF_ERROR, KINDS
from stabletoolbench_mirror.upstream.layout import iter_cache_files, iter_cache_spans, read_cache_text

#: digits the shares are printed with
DIGITS = 4


@dataclass
class Profile:
    """What one tree's answers are, by fault kind."""

    answers: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    other_errors: Counter[str] = field(default_factory=Counter)
    """Error texts no fault kind stands for (e.g. the relay's ``Blocked error...``), by text."""
    files: int = 0
    unreadable: list[str] = field(default_factory=list)

    def add(self, answer: Any) -> None:
        self.answers += 1
        kind = kind_of_answer(answer)
        if kind is not None:
            self.kinds[kind] += 1
        elif isinstance(answer, dict) and isinstance(answer.get("error"), str) and answer["error"]:
            self.other_errors[answer["error"][:80]] += 1

    @property
    def faulted(self) -> int:
        return sum(self.kinds.values())

    def config(self, seed: int = 0) -> dict[str, Any]:
        """The ``faults:`` settings of this mix (``rate`` 0 and every kind when there is none)."""
        if not self.faulted:
            return {"seed": seed, "rate": 0.0}
        rate = round(self.faulted / self.answers, DIGITS) or 10.0**-DIGITS
        kinds = {kind: round(self.kinds[kind] / self.faulted, DIGITS) for kind in KINDS if self.kinds[kind]}
        return {"seed": seed, "rate": rate, "kinds": {k: v or 10.0**-DIGITS for k, v in kinds.items()}}

    def as_json(self, tree: str, seed: int = 0) -> dict[str, Any]:
        """``faults profile --json``: what was counted, and the ``faults:`` settings it gives."""
        return {
            "tree": tree, "files": self.files, "answers": self.answers, "faulted": self.faulted,
            "kinds": {kind: self.kinds[kind] for kind in KINDS if self.kinds[kind]},
            "other_errors": sum(self.other_errors.values()), "unreadable": list(self.unreadable), "faults": self.config(seed),
        }

    def render(self, tree: str, seed: int = 0) -> str:
        """The YAML block, with comments saying what was counted."""
        cfg = self.config(seed)
        lines = [
            f"# faults profile of {tree}",
            f"# {self.answers:,} answers in {self.files:,} files: {self.faulted:,} error or empty answers"
            + (f" ({self.faulted / self.answers:.2%})" if self.answers else ""),
        ]
        for kind in KINDS:
            if self.kinds[kind]:
                lines.append(f"#   {kind}: {self.kinds[kind]:,}")
        if self.other_errors:
            lines.append(f"# {sum(self.other_errors.values()):,} other error answers, no fault kind stands for them (not in the rate):")
            lines += [f"#   {n:,}  {text!r}" for text, n in self.other_errors.most_common(10)]
        if self.unreadable:
            lines.append(f"# {len(self.unreadable)} files could not be read and were skipped")
        lines += ["faults:", f"  seed: {cfg['seed']}", f"  rate: {cfg['rate']}"]
        if "kinds" in cfg:
            lines.append("  kinds:")
            lines += [f"    {kind}: {share}" for kind, share in cfg["kinds"].items()]
        return "\n".join(lines)


def kind_of_answer(answer: Any) -> str | None:
    """The fault kind an answer is an instance of, or ``None`` (clean, or an error no kind stands for)."""
    if not isinstance(answer, dict):
        return None
    error = answer.get("error", "")
    if isinstance(error, str) and error in KIND_OF_ERROR:
        return KIND_OF_ERROR[error]
    if error in ("", None) and answer.get("response") in (None, "", {}, []):
        return "empty"
    return None


def profile_tree(root: str, *, progress: bool = False, allow_symlinks: bool = False) -> Profile:
    """Count the answers of the tree at ``root`` by fault kind (each file parsed once, one at a time)."""
    from stabletoolbench_mirror.core.progress import progress_bar

    profile = Profile()
    files = list(iter_cache_files(root, allow_symlinks=allow_symlinks))
    for _api, path in progress_bar(files, desc="faults profile", unit="file", disable=not progress):
        try:
            spans = list(iter_cache_spans(read_cache_text(path), path, bodies=False))
        except (OSError, ValueError, RecursionError, MemoryError):
            profile.unreadable.append(str(path))
            continue
        profile.files += 1
        for _key, answer, _body, _start, _end in spans:
            profile.add(answer)
    return profile
