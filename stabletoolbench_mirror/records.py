"""What the cache stores: a served answer plus where it came from."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from .protocol import encode_answer

Source = Literal["real", "simulated", "imported", "local", "frozen"]
"""``real`` and ``simulated`` answers were recorded here, ``imported`` ones copied into the store
by ``cache import``, ``local`` ones made by a local tool; ``frozen`` marks an answer read from a frozen cache tree (never stored)."""
SOURCES: tuple[str, ...] = ("real", "simulated", "imported", "local", "frozen")
RECORD_VERSION = 2
"""Version 2 names the API ``api``; version 1 (still read) named it ``namespace``."""


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

    @classmethod
    def from_answer(
        cls, api: str, key: str, answer: Any, source: Source, origin: str = "", meta: Mapping[str, Any] | None = None
    ) -> "Record":
        return cls(api=api, key=key, body=encode_answer(answer), source=source, origin=origin, meta=meta)

    @property
    def answer(self) -> Any:
        return json.loads(self.body)

    def to_json(self) -> str:
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
        return json.dumps(
            data,
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> "Record":
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
        )
