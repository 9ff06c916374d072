"""A snapshot's content hash (see :mod:`stabletoolbench_mirror.snapshots.snapshot` for what it covers).

Kept apart from the ``snapshot`` command so that the frozen caches' archive check
(:mod:`.archives`) computes it without the command's imports.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from stabletoolbench_mirror.core.protocol import encode_answer

HASH_METHOD = (
    "sha256 over UTF-8 lines json.dumps([api, key, answer_json], ensure_ascii=False, "
    "separators=(',', ':')) + '\\n', sorted by (api, key); answer_json is the served compact encoding"
)


def served_line(api: str, key: str, body: str) -> bytes:
    """The canonical line of one entry (see the module docstring), from the answer's served encoding."""
    text = json.dumps([api, key, body], ensure_ascii=False, separators=(",", ":"))
    return (text + "\n").encode("utf-8", "surrogatepass")


#: hex digits kept of each API's own hash (``api_hashes``): enough to tell a changed file, and short
API_HASH_HEX = 32


class ContentHash:
    """The content hash, fed one API at a time in api order (memory: one API's entries).

    ``apis`` holds each API's own ``"<entries>:<hash>"`` (the manifest's ``api_hashes``): the first
    :data:`API_HASH_HEX` hex digits of SHA-256 over that API's lines alone, so a verification that
    fails can name the files that changed.
    """

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._last: str | None = None
        self.apis: dict[str, str] = {}

    def add_api(self, api: str, entries: Iterable[tuple[str, Any]]) -> None:
        self.add_api_bodies(api, ((key, encode_answer(answer)) for key, answer in entries))

    def add_api_bodies(self, api: str, entries: Iterable[tuple[str, str]]) -> None:
        """:meth:`add_api` with each answer in its served encoding (records' bodies: no decoding)."""
        if self._last is not None and api <= self._last:
            raise ValueError(f"APIs must come in api order: {api!r} after {self._last!r}")
        self._last = api
        own = hashlib.sha256()
        n = 0
        for key, body in sorted(entries, key=lambda e: e[0]):
            line = served_line(api, key, body)
            self._digest.update(line)
            own.update(line)
            n += 1
        self.apis[api] = f"{n}:{own.hexdigest()[:API_HASH_HEX]}"

    def hexdigest(self) -> str:
        return "sha256:" + self._digest.hexdigest()


