"""Where the simulator's system prompt comes from: built in, a text file, or StableToolBench's own.

``simulator.system_prompt_file`` may name

* a plain text file: its text is sent verbatim;
* StableToolBench's ``server/system_prompts.py``: the file is read as a Python syntax tree
  (:func:`ast.parse`) and the string constant the style was trained on is taken from it:
  ``SFT_SYSTEM`` for ``mirrorapi-sft`` and ``mirrorapi-cache``, ``COT_SYSTEM`` for
  ``mirrorapi-cot``.  The file is never imported or run: only a top-level assignment of a
  string literal counts;
* the folder of a StableToolBench checkout: ``server/system_prompts.py`` in it (or
  ``system_prompts.py`` directly in it).

Without a file the built-in prompts of :mod:`.prompts` are used; they are this project's own
text, which the MirrorAPI models were not trained on (the server warns about it at start).
"""

from __future__ import annotations

import ast
import hashlib
import os
import stat
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from stabletoolbench_mirror.responders.simulator import prompts

#: the constant of upstream's ``system_prompts.py`` each MirrorAPI style was trained on
UPSTREAM_CONSTANTS = {"mirrorapi-sft": "SFT_SYSTEM", "mirrorapi-cache": "SFT_SYSTEM", "mirrorapi-cot": "COT_SYSTEM"}
#: where a StableToolBench checkout keeps the prompts, relative to its root
CHECKOUT_PATHS = ("server/system_prompts.py", "system_prompts.py")
MAX_PROMPT_FILE_BYTES = 4 * 1024 * 1024
BUILT_IN = "built-in"


class PromptFileError(ValueError):
    """A ``system_prompt_file`` that cannot be used (the message says why and what was looked for)."""


@dataclass(frozen=True)
class SystemPrompt:
    """A system prompt's text and where it came from."""

    text: str
    source: str
    """``built-in``, a file path, or ``<path>:SFT_SYSTEM`` for a constant of a ``system_prompts.py``."""

    @cached_property  # in every simulated record's metadata: hashed once, not per miss
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8", "surrogatepass")).hexdigest()

    def describe(self) -> dict[str, str]:
        return {"source": self.source, "sha256": self.sha256}


def built_in_prompt(style: str) -> SystemPrompt:
    return SystemPrompt(prompts.DEFAULT_SYSTEM_PROMPTS[style], BUILT_IN)


def resolve_system_prompt(style: str, path: str | None) -> SystemPrompt:
    """The system prompt of ``style``: the built-in one, or the one ``path`` holds for it."""
    if style not in prompts.STYLES:
        raise PromptFileError(f"unknown simulator style {style!r}")
    if not path:
        return built_in_prompt(style)
    file = Path(path)
    if file.is_dir():
        found = next((file / rel for rel in CHECKOUT_PATHS if (file / rel).is_file()), None)
        if found is None:
            looked = ", ".join(str(file / rel) for rel in CHECKOUT_PATHS)
            raise PromptFileError(f"{file} is a folder without StableToolBench's system_prompts.py (looked for {looked})")
        file = found
    raw = _read(file)
    if file.suffix != ".py":
        try:
            return SystemPrompt(raw.decode("utf-8"), str(file))
        except UnicodeDecodeError as exc:
            raise PromptFileError(f"{file}: not UTF-8 text: {exc}") from None
    constant = UPSTREAM_CONSTANTS.get(style)
    if constant is None:
        raise PromptFileError(
            f"{file}: a system_prompts.py holds MirrorAPI's prompts (SFT_SYSTEM, COT_SYSTEM); "
            f"style {style!r} needs a plain text file"
        )
    return SystemPrompt(string_constant(raw, constant, str(file)), f"{file}:{constant}")


def _read(file: Path) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_PROMPT_FILE_BYTES` (a device such as ``/dev/zero``
    or a FIFO is refused before it is read, and the read stops at the bound whatever the size said)."""
    too_big = f"more than a prompt file may have ({MAX_PROMPT_FILE_BYTES:,} bytes): name a text file or StableToolBench's system_prompts.py"
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the check below refuses it
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise PromptFileError(f"{file} is not a regular file: name a text file or StableToolBench's system_prompts.py")
            if info.st_size > MAX_PROMPT_FILE_BYTES:
                raise PromptFileError(f"{file}: {info.st_size:,} bytes, {too_big}")
            data = fh.read(MAX_PROMPT_FILE_BYTES + 1)
    except OSError as exc:
        raise PromptFileError(f"cannot read {file}: {exc}") from None
    if len(data) > MAX_PROMPT_FILE_BYTES:
        raise PromptFileError(f"{file}: {too_big}")
    return data


def string_constant(source: bytes | str, name: str, label: str = "<source>") -> str:
    """The string assigned to ``name`` at the top level of Python ``source``, found without running it.

    The last top-level ``NAME = "..."`` (or ``NAME: str = "..."``) whose value is a string
    literal wins, as it would at import; anything else (a call, an f-string, a name) is not a
    constant and is an error.
    """
    try:
        tree = ast.parse(source, filename=label)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise PromptFileError(f"{label}: not Python source: {exc}") from None
    found: str | None = None
    seen_other = False
    for node in tree.body:
        targets: list[ast.expr]
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            found, seen_other = value.value, False
        else:
            seen_other = True
    if seen_other:
        raise PromptFileError(f"{label}: {name} is not assigned a plain string literal (the file is never run, so it must be one)")
    if found is None:
        raise PromptFileError(f"{label}: no top-level string constant {name}")
    return found
