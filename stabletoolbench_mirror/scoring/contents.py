"""What a score bundle may hold: one validation of its contents, before ``score`` or ``report`` uses any of them.

A bundle's seal (``bundle.json``) is a hash anyone can recompute, not a signature: a correctly sealed bundle
from a stranger is input like any other.  So every file of it that is read is read bounded (:func:`read_json`:
at most :data:`MAX_JSON_BYTES`, nested at most :data:`MAX_DEPTH` deep), and ``run.json``, ``score.json``,
``bundle.json`` and ``verdict.json`` are checked against the models below before anything joins a path
or builds a command line from them:

* every name that becomes a path (a group, the run's label, the reference's label, the evaluator, a
  ``score.json`` group) is a **plain name** (:data:`PLAIN_NAME`: letters, digits, ``_ @ . -``, not
  starting with a dot or a dash): one path part, never ``..`` or a path; an evaluator is one of the
  checkout's ``tooleval/evaluators/`` besides (``checkout.Checkout.evaluator``);
* a file named by the seal is a relative path of such parts (:func:`relative_path`);
* numbers are integers (not ``true``, not ``"3"``) within the ranges upstream's scripts take, a seed
  within ``PYTHONHASHSEED``'s; figures are finite.

:class:`ContentsError` names the file and the field.  Written with pydantic (the models) and ``json`` (the
parse); the depth walk is by hand because ``json`` has no depth bound of its own: it recurses as deep as
the data, then raises ``RecursionError``, which :func:`read_json` turns into the message.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

#: the largest JSON file of a bundle read (run.json, score.json, label and preference files, the seal)
MAX_JSON_BYTES = 64 << 20
#: the deepest nesting of a JSON file read: upstream's own json reads stop near the interpreter's recursion limit (1000),
#: so no file of a run is deeper (a DFS answer tree nests two levels a step); half of it leaves room for the session's own
#: walk over an answer file (``session.drop_null_function_calls``)
MAX_DEPTH = 500
PLAIN_NAME = re.compile(r"[A-Za-z0-9_@][A-Za-z0-9._@-]{0,127}")
"""One path part: a group, a label, an evaluator (what ``session.safe_name`` makes, at most 128 characters)."""
MODEL_NAME = re.compile(r"[A-Za-z0-9_@][A-Za-z0-9._:@+/-]{0,255}")
"""A model's name as an OpenAI-compatible server takes it (``org/model`` allowed, never ``..`` or a leading ``/``)."""
CONTENT_HASH = re.compile(r"sha256:[0-9a-f]{64}")
METHODS = re.compile(r"^(CoT@\d+|DFS(_woFilter)?_w\d+)$")
"""The methods upstream's ``method_converter`` runs: ``CoT@n``, ``DFS_w<n>``, ``DFS_woFilter_w<n>``."""
BACKBONES = ("chatgpt_function", "toolllama_vllm")
PIPELINES = ("qa_pipeline", "qa_pipeline_multithread")
SEED_MAX = 2**32 - 1
"""The largest seed: ``PYTHONHASHSEED`` takes 0 to 4294967295 (a larger one stops every upstream process at its start)."""
MAX_GROUPS = 64
MAX_QUERIES = 1_000_000


Checked = TypeVar("Checked", bound=BaseModel)
"""A model of this module, as :func:`check` returns it."""


class ContentsError(ValueError):
    """A bundle's file holds what no bundle may (the message names the file and the field)."""


# -- a bounded read -------------------------------------------------------------------------------------


def depth(value: Any) -> int:
    """How deep ``value`` nests (a scalar 0, ``[]`` 1), walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def read_json(path: Path, *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON in ``path``; :class:`ContentsError` for a file that cannot be read, is over ``max_bytes``,
    is not JSON, or nests deeper than :data:`MAX_DEPTH` (:class:`FileNotFoundError` passes)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ContentsError(f"{path}: cannot be read ({exc})") from None
    if len(data) > max_bytes:
        raise ContentsError(f"{path}: over {max_bytes >> 20} MiB: no file of a score bundle is that large")
    try:
        value = json.loads(data)
    except RecursionError:
        raise ContentsError(f"{path}: nested deeper than {MAX_DEPTH} levels: not a file a score run writes") from None
    except ValueError as exc:
        raise ContentsError(f"{path}: not JSON ({exc})") from None
    if depth(value) > MAX_DEPTH:
        raise ContentsError(f"{path}: nested deeper than {MAX_DEPTH} levels: not a file a score run writes")
    return value


# -- names --------------------------------------------------------------------------------------------


def plain_name(value: str) -> str:
    if not PLAIN_NAME.fullmatch(value):
        raise ValueError(f"{value[:200]!r} is not a plain name (letters, digits, _ @ . -, at most 128, not starting with . or -: "
                         "it names files inside the bundle)")
    return value


def model_name(value: str) -> str:
    if not MODEL_NAME.fullmatch(value) or ".." in value.split("/") or "//" in value:
        raise ValueError(f"{value[:200]!r} is not a model name (letters, digits, _ @ . : + - and /-separated parts, never a path)")
    return value


def relative_path(value: str) -> str:
    """A file of the bundle named by its seal: ``/``-separated parts, none empty, ``.`` or ``..``, no ``\\`` or NUL."""
    parts = value.split("/")
    if len(value) > 1024 or any(p in ("", ".", "..") for p in parts) or "\\" in value or "\0" in value or PurePosixPath(value).is_absolute():
        raise ValueError(f"{value[:200]!r} is not a path inside the bundle")
    return value


def _method(value: str) -> str:
    if not METHODS.match(value):
        raise ValueError(f"{value[:200]!r}: upstream runs CoT@<n>, DFS_w<n> or DFS_woFilter_w<n>")
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("a finite number expected")
    return value


Name = Annotated[StrictStr, AfterValidator(plain_name)]
Model = Annotated[StrictStr, AfterValidator(model_name)]
Hash = Annotated[StrictStr, Field(pattern=CONTENT_HASH.pattern)]
Figure = Annotated[float, Field(strict=False), AfterValidator(_finite)]
Count = Annotated[StrictInt, Field(ge=0, le=MAX_QUERIES)]


class _Checked(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


# -- run.json ------------------------------------------------------------------------------------------


class Reference(_Checked):
    label: Name
    content_hash: Hash | None = None


class RunCheckout(_Checked):
    commit: Annotated[StrictStr, Field(max_length=64, pattern=r"^[0-9a-f]*$")] | None = None
    dirty: StrictBool | None = None


def _labelled(value: Any) -> Any:
    return {"label": value} if isinstance(value, str) else value


class RunFile(_Checked):
    """``run.json`` (see :mod:`.bundle`): the fields a replay, a re-score or a report reads, each checked.

    ``label`` and ``groups`` are needed; the rest may be absent (a report shows what there is; a replay
    needs every field of ``session.RunSpec``)."""

    label: Name
    groups: Annotated[list[Name], Field(max_length=MAX_GROUPS)]
    method: Annotated[StrictStr, AfterValidator(_method)] | None = None
    backbone: Literal[BACKBONES] | None = None  # type: ignore[valid-type]
    agent_model: Model | None = None
    judge_model: Model | None = None
    evaluator: Name | None = None
    evaluate_times: Annotated[StrictInt, Field(ge=1, le=100)] | None = None
    limit: Annotated[StrictInt, Field(ge=1, le=MAX_QUERIES)] | None = None
    pipeline: Literal[PIPELINES] | None = None  # type: ignore[valid-type]
    threads: Annotated[StrictInt, Field(ge=1, le=256)] | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=SEED_MAX)] | None = None
    max_observation_length: Annotated[StrictInt, Field(ge=1, le=10**7)] | None = None
    reference: Annotated[Reference, BeforeValidator(_labelled)] | None = None
    """``{"label", "content_hash"}`` in a bundle; the label alone in ``session.RunSpec.as_json``."""
    query_ids: Annotated[list[Annotated[StrictStr, Field(max_length=64)]], Field(max_length=MAX_QUERIES)] | None = None
    stabletoolbench: RunCheckout | None = None
    environment: dict[str, Any] | None = None
    commands: list[dict[str, Any]] | None = None

    @property
    def reference_label(self) -> str | None:
        return None if self.reference is None else self.reference.label


# -- score.json ----------------------------------------------------------------------------------------


class ScorePassRate(_Checked):
    solve_rate: Figure
    std: Figure
    per_evaluation: Annotated[list[Figure], Field(max_length=100)] = Field(default_factory=list)
    queries: Count


class WinRate(_Checked):
    win: Figure
    tie: Figure
    lose: Figure
    queries: Count | None = None


class Labels(_Checked):
    evaluations: dict[Annotated[StrictStr, Field(max_length=8)], Annotated[StrictStr, Field(max_length=64)]]
    solved: StrictBool | None = None


class ScoreFile(_Checked):
    """``score.json`` (see :mod:`.bundle`)."""

    pass_rate: dict[Name, ScorePassRate]
    pass_rate_average: Figure | None = None
    win_rate: dict[Name, WinRate] = Field(default_factory=dict)
    win_rate_average: Figure | None = None
    labels: dict[Name, dict[Annotated[StrictStr, Field(max_length=64)], Labels]] = Field(default_factory=dict)


# -- bundle.json and verdict.json ------------------------------------------------------------------------


class Seal(_Checked):
    """``bundle.json``: the files and their digests (its format is checked by ``bundle.read_manifest``)."""

    content_hash: Hash
    files: dict[Annotated[StrictStr, AfterValidator(relative_path)], Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]]
    sealed_at: Annotated[StrictStr, Field(max_length=64)] | None = None
    mirror_version: Annotated[StrictStr, Field(max_length=64)] | None = None


class VerdictFile(_Checked):
    """``verdict.json``, in the bundle a replay or re-score wrote with ``--out``: which bundle it ran again and what it found."""

    kind: Literal["replay", "rescore"]
    replayed: Hash
    """The content hash of the bundle run again."""
    identical: StrictBool
    """Every file compared was identical, and the bundle's ``score.json`` is what its label files give."""
    differ: Annotated[list[Annotated[StrictStr, AfterValidator(relative_path)]], Field(max_length=100_000)] = Field(default_factory=list)
    score_differences: Annotated[list[Annotated[StrictStr, Field(max_length=2000)]], Field(max_length=10_000)] = Field(default_factory=list)


# -- checking -------------------------------------------------------------------------------------------


def _message(where: str, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors()[:5]:
        field = ".".join(str(p) for p in error["loc"]) or "(the whole file)"
        held = "" if error["type"] == "value_error" else f" (it holds {repr(error.get('input'))[:80]})"
        lines.append(f"{where}: {field}: {error['msg'].removeprefix('Value error, ')}{held}")
    return "\n".join(lines)


def check(model: type[Checked], data: Any, where: str) -> Checked:
    """``data`` (what ``where`` holds) as ``model``: :class:`ContentsError` naming each field that is wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ContentsError(_message(where, exc)) from None
