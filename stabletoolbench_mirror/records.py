"""What the cache stores: a served answer plus where it came from."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from .protocol import encode_answer

Source = Literal["real", "simulated", "imported", "local"]
SOURCES: tuple[str, ...] = ("real", "simulated", "imported", "local")
RECORD_VERSION = 1


@dataclass(frozen=True)
class Record:
    """One cached answer.

    ``body`` is the answer exactly as served (JSON text of ``{"error", "response"}``,
    upstream's compact encoding), so a replay returns the same bytes.  Provenance
    (``source``, ``origin``, ``created_at``) is kept beside it and never served, and so is
    ``meta``: what a simulated answer's generation knew (its rationale, style, model, prompt
    hash, sampling settings, finish reason, token counts, latency).  Only ``body`` is served,
    and only ``namespace``, ``key`` and ``body`` enter a snapshot's content hash.
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
    meta: Mapping[str, Any] | None = field(default=None, compare=False)

    @classmethod
    def from_answer(
        cls, namespace: str, key: str, answer: Any, source: Source, origin: str = "", meta: Mapping[str, Any] | None = None
    ) -> "Record":
        return cls(namespace=namespace, key=key, body=encode_answer(answer), source=source, origin=origin, meta=meta)

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
        if data.get("v") != RECORD_VERSION:
            raise ValueError(f"unsupported record version {data.get('v')!r}")
        return cls(
            namespace=data["namespace"],
            key=data["key"],
            body=data["body"],
            source=data["source"],
            origin=data.get("origin", ""),
            created_at=float(data.get("created_at", 0.0)),
            meta=data["meta"] if isinstance(data.get("meta"), dict) else None,
        )
