"""What ``check --apibank DIALOGUES`` computes (the command is :mod:`stabletoolbench_mirror.commands.check`): API-Bank's
dialogues replayed and each call scored with the API's own check.

Each dialogue (a ``.jsonl`` file of turns; API turns carry ``api_name``, ``param_dict`` and the
expected ``result``) runs in a session of its own (``POST /sessions`` with the task
``apibank:<file name>``, so its ids and tokens are the same every run), its API calls in order,
against a running server (:class:`HttpSessions`) or the layer in-process (:class:`LayerSessions`).  Each answer
is scored with the API class's own ``check_api_call_correctness(answer, expected)`` (the class loaded from
``apibank.path``, or from the API-Bank folder above ``DIALOGUES``), as API-Bank's evaluator does
(a check that raises counts as incorrect); **identical** counts answers equal to the recorded
result.  :class:`ApiBankReport` holds the counts per API.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stabletoolbench_mirror.apibank import load_suites
from stabletoolbench_mirror.apibank.environment import Environment
from stabletoolbench_mirror.apibank.loader import Suite, folder_of, load_suite
from stabletoolbench_mirror.apibank.tools import CATEGORY, TOOL_NAMES, state_key
from stabletoolbench_mirror.client import Client, MirrorError, session_path
from stabletoolbench_mirror.config import Settings
from stabletoolbench_mirror.core.outcomes import Outcome


class SessionTarget(Protocol):
    def start(self, task: str) -> str: ...

    def send(self, session_id: str, payload: dict[str, Any]) -> tuple[int, str]: ...

    def state(self, session_id: str) -> Any: ...

    def close(self) -> None: ...


class HttpSessions:
    """A running server: ``POST /sessions``, ``POST /virtual`` with ``X-STM-Session``, ``GET /sessions/{id}``."""

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 120.0) -> None:
        try:
            self.client = Client(url, token=token, timeout=timeout_s)
        except MirrorError:
            raise ValueError(f"--url must be http://HOST:PORT or https://HOST:PORT (got {url!r})") from None

    def _request(self, method: str, path: str, body: Any = None, session: str | None = None) -> tuple[int, str]:
        try:
            if session is None:
                reply = self.client.request(method, path, body)
            else:
                reply = self.client.call(body, session=session)
        except MirrorError as exc:
            raise ValueError(f"cannot reach the server: {exc.reason}") from None
        return reply.status, reply.body

    def start(self, task: str) -> str:
        status, text = self._request("POST", "/sessions", {"task": task})
        if status != 201:
            raise ValueError(f"POST /sessions answered HTTP {status}: {text[:300]}")
        return str(json.loads(text)["id"])

    def send(self, session_id: str, payload: dict[str, Any]) -> tuple[int, str]:
        return self._request("POST", "/virtual", payload, session_id)

    def state(self, session_id: str) -> Any:
        status, text = self._request("GET", session_path(session_id))
        return json.loads(text).get("state", {}) if status == 200 else {}

    def close(self) -> None:
        self.client.close()


class LayerSessions:
    """The layer in this process (built from the settings)."""

    def __init__(self, settings: Settings) -> None:
        from stabletoolbench_mirror.factory import build_layer

        self.layer = build_layer(settings, responders=[] if settings.mode == "replay" else None)

    def start(self, task: str) -> str:
        assert self.layer.sessions is not None
        return self.layer.sessions.create(task)["id"]

    def send(self, session_id: str, payload: dict[str, Any]) -> tuple[int, str]:
        prepared = self.layer.prepare(payload)
        outcome = prepared if isinstance(prepared, Outcome) else self.layer.handle_call(prepared, session_id)
        return outcome.status, outcome.body

    def state(self, session_id: str) -> Any:
        assert self.layer.sessions is not None
        return self.layer.sessions.get(session_id).get("state", {})

    def close(self) -> None:
        self.layer.close()


@dataclass
class ApiCounts:
    total: int = 0
    correct: int = 0
    identical: int = 0


@dataclass
class ApiBankReport:
    by_api: dict[str, ApiCounts] = field(default_factory=lambda: defaultdict(ApiCounts))
    dialogues: int = 0
    problems: list[str] = field(default_factory=list)
    largest_state_bytes: int = 0
    largest_state_dialogue: str = ""
    digest: Any = field(default_factory=hashlib.sha256)

    def totals(self) -> ApiCounts:
        out = ApiCounts()
        for counts in self.by_api.values():
            out.total += counts.total
            out.correct += counts.correct
            out.identical += counts.identical
        return out

    def to_json(self) -> dict[str, Any]:
        t = self.totals()
        return {
            "correct": t.correct,
            "total": t.total,
            "identical": t.identical,
            "dialogues": self.dialogues,
            "by_api": {name: vars(c) for name, c in sorted(self.by_api.items())},
            "answers_sha256": self.digest.hexdigest(),
            "largest_state_bytes": self.largest_state_bytes,
            "largest_state_dialogue": self.largest_state_dialogue,
            "problems": self.problems,
        }

    def lines(self, *, max_problems: int = 30) -> list[str]:
        t = self.totals()
        out = [f"{'API':<26} {'correct':>8} {'identical':>9} {'total':>6}"]
        for name, c in sorted(self.by_api.items()):
            out.append(f"{name:<26} {c.correct:>8} {c.identical:>9} {c.total:>6}")
        out.append(f"{'all':<26} {t.correct:>8} {t.identical:>9} {t.total:>6}  ({self.dialogues} dialogues)")
        out.append(f"largest session state: {self.largest_state_bytes} bytes ({self.largest_state_dialogue or '-'})")
        out.append(f"answers sha256: {self.digest.hexdigest()}")
        out.extend(f"  {p}" for p in self.problems[:max_problems])
        if len(self.problems) > max_problems:
            out.append(f"  ... and {len(self.problems) - max_problems} more")
        return out


def dialogue_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ValueError(f"--apibank: {path} does not exist")
    files = sorted(path.glob("*.jsonl"))
    if not files:
        raise ValueError(f"--apibank: {path} holds no .jsonl dialogues")
    return files


def api_turns(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                turn = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{n}: not JSON: {exc}") from None
            if isinstance(turn, dict) and turn.get("role") == "API":
                yield turn


def suite_for(settings: Settings, dialogues: Path) -> Suite:
    """The API folder the checks come from: ``apibank.path``, else the API-Bank folder above the dialogues."""
    if settings.apibank is not None:
        return load_suites(settings)[0]
    for parent in [dialogues, *dialogues.resolve().parents]:
        if (parent / "apis").is_dir() and (parent / "init_database").is_dir():
            return load_suite(folder_of(str(parent)), "apis", TOOL_NAMES["apis"])
    raise ValueError(f"--apibank: no apibank.path in the settings and no API-Bank folder (apis/, init_database/) above {dialogues}")


def _score(suite: Suite, checker: Environment, name: str, answer: Any, expected: Any) -> tuple[bool, str]:
    api = suite.apis.get(name)
    if api is None or api.cls is None:
        return False, f"{name}: no check here ({api.remote if api else 'no such API'})"
    try:
        return bool(checker.instance(name).check_api_call_correctness(answer, expected)), ""
    except Exception as exc:  # noqa: BLE001 - API-Bank's evaluator counts a check that fails as incorrect
        return False, f"{name}: its check raised {type(exc).__name__}: {exc}"[:300]


def replay_dialogue(target: SessionTarget, suite: Suite, path: Path, report: ApiBankReport) -> None:
    session = target.start(f"apibank:{path.name}")
    checker = Environment(suite, "check")
    report.dialogues += 1
    for turn in api_turns(path):
        name = str(turn.get("api_name"))
        expected = turn.get("result")
        payload = {
            "category": CATEGORY,
            "tool_name": suite.tool_name,
            "api_name": name,
            "tool_input": json.dumps(turn.get("param_dict") or {}, ensure_ascii=False),
            "strip": "",
            "toolbench_key": "",
        }
        status, body = target.send(session, payload)
        report.digest.update(body.encode("utf-8", "surrogatepass") + b"\n")
        counts = report.by_api[name]
        counts.total += 1
        try:
            answer = json.loads(json.loads(body)["response"]) if status == 200 else None
        except (ValueError, KeyError, TypeError):
            answer = None
        if not isinstance(answer, dict):
            report.problems.append(f"{path.name}: {name}: HTTP {status}, not an API-Bank answer: {body[:200]}")
            continue
        correct, why = _score(suite, checker, name, answer, expected)
        counts.correct += correct
        counts.identical += answer == expected
        if why:
            report.problems.append(f"{path.name}: {why}")
    kept = json.dumps(target.state(session).get(state_key(suite), {}), ensure_ascii=False).encode("utf-8", "surrogatepass")
    if len(kept) > report.largest_state_bytes:
        report.largest_state_bytes, report.largest_state_dialogue = len(kept), path.name
