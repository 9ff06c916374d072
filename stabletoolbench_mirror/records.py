"""What the cache stores: a served answer plus where it came from."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from .protocol import encode_answer

Source = Literal["real", "simulated", "imported"]
SOURCES: tuple[str, ...] = ("real", "simulated", "imported")
RECORD_VERSION = 1

RecordOutcome = Literal["answer", "failure"]
"""``answer``: a usable answer.  ``failure``: the body served when a miss ended without one
(unparsable simulator output, every responder failing, an answer the validity rules reject)."""
ANSWER, FAILURE = "answer", "failure"


@dataclass(frozen=True)
class Record:
    """One cached answer.

    ``body`` is the answer exactly as served (JSON text of ``{"error", "response"}``,
    upstream's compact encoding), so a replay returns the same bytes.  Provenance
    (``source``, ``origin``, ``created_at``) is kept beside it and never served.
    """

    namespace: str
    """``<category>/<tool>_for_<category>/<api>``: the upstream cache file without ``.json``."""
    key: str
    """The upstream key, ``str(parsed_input)``."""
    body: str
    source: Source
    origin: str = ""
    """The model name, the endpoint, or the file an entry was imported from (never a secret)."""
    created_at: float = field(default_factory=time.time)
    outcome: RecordOutcome = ANSWER
    reason: str = ""
    """For a failure record: why no usable answer was found (a rule or error, never the answer's text)."""
    tried: tuple[str, ...] = ()
    """For a failure record: the responders asked, as ``source:origin``, in order."""
    replaced: dict[str, Any] | None = None
    """For an answer that replaced a failure record (record mode, ``record.retry_failures``): that
    failure's provenance (``body``, ``source``, ``origin``, ``created_at``, ``reason``, ``tried``)."""

    @property
    def is_failure(self) -> bool:
        return self.outcome == FAILURE

    @classmethod
    def failure(
        cls, namespace: str, key: str, answer: Any, source: Source, origin: str, *, reason: str, tried: tuple[str, ...] = ()
    ) -> "Record":
        """A failure record: ``answer`` is exactly what the client was served."""
        return cls(
            namespace=namespace, key=key, body=encode_answer(answer), source=source, origin=origin,
            outcome=FAILURE, reason=reason[:500], tried=tuple(tried),
        )

    def provenance(self) -> dict[str, Any]:
        """What a replacing answer keeps of this (failure) record."""
        return {
            "body": self.body, "source": self.source, "origin": self.origin, "created_at": self.created_at,
            "reason": self.reason, "tried": list(self.tried),
        }

    @classmethod
    def from_answer(cls, namespace: str, key: str, answer: Any, source: Source, origin: str = "") -> "Record":
        return cls(namespace=namespace, key=key, body=encode_answer(answer), source=source, origin=origin)

    @property
    def answer(self) -> Any:
        return json.loads(self.body)

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "v": RECORD_VERSION,
            "namespace": self.namespace,
            "key": self.key,
            "body": self.body,
            "source": self.source,
            "origin": self.origin,
            "created_at": self.created_at,
        }
        # optional provenance: written only when set, so an answer's JSON stays as it was
        if self.outcome != ANSWER:
            data.update(outcome=self.outcome, reason=self.reason, tried=list(self.tried))
        if self.replaced is not None:
            data["replaced"] = self.replaced
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> "Record":
        data = json.loads(text)
        if data.get("v") != RECORD_VERSION:
            raise ValueError(f"unsupported record version {data.get('v')!r}")
        return cls(
            namespace=data["namespace"],
            key=data["key"],
            body=data["body"],
            source=data["source"],
            origin=data.get("origin", ""),
            created_at=float(data.get("created_at", 0.0)),
            outcome=FAILURE if data.get("outcome") == FAILURE else ANSWER,
            reason=str(data.get("reason", "")),
            tried=tuple(str(t) for t in data.get("tried") or ()),
            replaced=data["replaced"] if isinstance(data.get("replaced"), dict) else None,
        )
