"""What the cache stores: a served answer plus where it came from."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from stabletoolbench_mirror.core.protocol import encode_answer

Source = Literal["real", "simulated", "imported", "local", "frozen", "model", "mcp"]
"""``real`` and ``simulated`` answers were recorded here, ``imported`` ones copied into the store
by ``cache import``, ``local`` ones made by a local tool; ``model`` records are recorded model calls
(chat completions of an agent or a judge, :mod:`.model_calls`); ``mcp`` ones a live MCP server's answers
and listings (``responders.mcp_live``); ``frozen`` marks an answer read from a frozen cache tree (never stored)."""
RECORD_VERSION = 2
"""Version 2 names the API ``api``; version 1 (still read) named it ``namespace``."""

RecordOutcome = Literal["answer", "failure"]
"""``answer``: a usable answer.  ``failure``: the body served when a miss ended without one
(unparsable simulator output, every responder failing, an answer the validity rules reject)."""
ANSWER: RecordOutcome = "answer"
FAILURE: RecordOutcome = "failure"


@dataclass(frozen=True)
class Record:
    """One cached answer.

    ``body`` is the answer exactly as served (JSON text of ``{"error", "response"}``,
    upstream's compact encoding), so a replay returns the same bytes.  Provenance
    (``source``, ``origin``, ``created_at``) is kept beside it and never served, and so is
    ``meta``: what a simulated answer's generation knew (its rationale, style, model, prompt
    hash, sampling settings, finish reason, token counts, latency).  Only ``body`` is served,
    and only ``api``, ``key`` and ``body`` enter a snapshot's content hash.
    """

    api: str
    """``<category>/<tool>_for_<category>/<api>``: the upstream cache file without ``.json``."""
    key: str
    """The upstream key, ``str(parsed_input)``."""
    body: str
    source: Source
    origin: str = ""
    """The model name, the endpoint, or the file an entry was imported from (never a secret)."""
    created_at: float = field(default_factory=time.time)
    meta: Mapping[str, Any] | None = field(default=None, compare=False)
    outcome: RecordOutcome = ANSWER
    reason: str = ""
    """For a failure record: why no usable answer was found (a rule or error, never the answer's text)."""
    tried: tuple[str, ...] = ()
    """For a failure record: the responders asked, as ``source:origin``, in order."""
    replaced: Mapping[str, Any] | None = field(default=None, compare=False)
    """For an answer that replaced a failure record (``record`` mode, ``record.retry_failures``): that
    failure's provenance (``body``, ``source``, ``origin``, ``created_at``, ``reason``, ``tried``)."""

    @property
    def is_failure(self) -> bool:
        return self.outcome == FAILURE

    @classmethod
    def failure(
        cls, api: str, key: str, answer: Any, source: Source, origin: str, *, reason: str, tried: tuple[str, ...] = ()
    ) -> Record:
        """A failure record: ``answer`` is exactly what the client was served."""
        return cls(
            api=api, key=key, body=encode_answer(answer), source=source, origin=origin,
            outcome=FAILURE, reason=reason[:500], tried=tuple(tried),
        )

    def provenance(self) -> dict[str, Any]:
        """What an answer that replaces this (failure) record keeps of it."""
        return {
            "body": self.body, "source": self.source, "origin": self.origin, "created_at": self.created_at,
            "reason": self.reason, "tried": list(self.tried),
        }

    @classmethod
    def from_answer(
        cls, api: str, key: str, answer: Any, source: Source, origin: str = "", meta: Mapping[str, Any] | None = None
    ) -> Record:
        return cls(api=api, key=key, body=encode_answer(answer), source=source, origin=origin, meta=meta)

    @property
    def answer(self) -> Any:
        return json.loads(self.body)

    def to_json(self) -> str:
        cached = self.__dict__.get("_json")
        if cached is not None:
            return cached
        data: dict[str, Any] = {
            "v": RECORD_VERSION,
            "api": self.api,
            "key": self.key,
            "body": self.body,
            "source": self.source,
            "origin": self.origin,
            "created_at": self.created_at,
        }
        if self.meta:
            data["meta"] = dict(self.meta)
        # optional provenance: written only when set, so an answer's JSON stays as it was
        if self.outcome != ANSWER:
            data.update(outcome=self.outcome, reason=self.reason, tried=list(self.tried))
        if self.replaced is not None:
            data["replaced"] = dict(self.replaced)
        return json.dumps(
            data,
            ensure_ascii=False,
            separators=(",", ":"),
        )

    def keep_json(self) -> Record:
        """Encode the record now and keep the text with it (pickled along), so ``to_json`` is free later.

        ``cache import`` reads files in worker processes: they encode, the one writing process only writes.
        """
        object.__setattr__(self, "_json", self.to_json())
        return self

    @classmethod
    def from_json(cls, text: str | bytes) -> Record:
        data = json.loads(text)
        version = data.get("v")
        if version not in (1, RECORD_VERSION):
            raise ValueError(f"unsupported record version {version!r}")
        return cls(
            api=data["api" if version == RECORD_VERSION else "namespace"],
            key=data["key"],
            body=data["body"],
            source=data["source"],
            origin=data.get("origin", ""),
            created_at=float(data.get("created_at", 0.0)),
            meta=data["meta"] if isinstance(data.get("meta"), dict) else None,
            outcome=FAILURE if data.get("outcome") == FAILURE else ANSWER,
            reason=str(data.get("reason", "")),
            tried=tuple(str(t) for t in data.get("tried") or ()),
            replaced=data["replaced"] if isinstance(data.get("replaced"), dict) else None,
        )


def origin_key(record: Record) -> str:
    """The origin a record is counted under: ``<source>:<origin>``, an import's cut to its folder."""
    group = record.origin.split("/", 1)[0] if record.source == "imported" else record.origin
    return f"{record.source}:{group}"
