"""Where sessions are kept: one JSON document per session, expiring after an idle time.

Beside the records: a diskcache folder (``<store.path>/sessions``, opened on first use) or
the same Redis (``<prefix>:session:<id>`` strings).  See :mod:`stabletoolbench_mirror.sessions`.
"""

from __future__ import annotations

import abc
import json
import os
import sqlite3
import threading
from typing import Any, Callable, Iterator

from .base import StoreError

#: the version of a session document
DOC_VERSION = 1


class SessionStore(abc.ABC):
    """Session documents by id, each expiring ``ttl_s`` after its last write."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = float(ttl_s)

    @abc.abstractmethod
    def load(self, session_id: str) -> dict[str, Any] | None:
        """The document, or ``None`` when there is none (or it expired)."""

    @abc.abstractmethod
    def create(self, doc: dict[str, Any]) -> bool:
        """Store ``doc`` unless its id is taken; whether it was stored."""

    @abc.abstractmethod
    def replace(self, doc: dict[str, Any]) -> bool:
        """Overwrite the document of ``doc['id']`` only if it still exists; whether it did."""

    @abc.abstractmethod
    def delete(self, session_id: str) -> bool:
        """Forget a session; whether there was one."""

    @abc.abstractmethod
    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Every live document, in no particular order."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """About how many documents there are (expired ones may still count)."""

    def close(self) -> None:  # noqa: B027 - optional: a backend that holds nothing keeps this
        """Release the backend's resources."""

    @staticmethod
    def encode(doc: dict[str, Any]) -> str:
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))

    @staticmethod
    def decode(text: str | bytes) -> dict[str, Any] | None:
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        if not isinstance(doc, dict) or doc.get("v") != DOC_VERSION:
            return None
        return doc


class DiskcacheSessionStore(SessionStore):
    """Documents in a diskcache folder (``<store.path>/sessions``), with diskcache's own expiry."""

    def __init__(self, path: str | os.PathLike[str], ttl_s: float) -> None:
        super().__init__(ttl_s)
        import diskcache

        self.path = os.fspath(path)
        self._diskcache = diskcache
        self._opened: Any = None
        self._open_lock = threading.Lock()

    @property
    def _cache(self) -> Any:
        # opened on first use: a server whose clients never use sessions creates nothing
        if self._opened is None:
            with self._open_lock:
                if self._opened is None:
                    try:
                        os.makedirs(self.path, exist_ok=True)
                        # expired documents are culled by later writes; nothing is evicted for size
                        self._opened = self._diskcache.Cache(self.path, eviction_policy="none", size_limit=2**62, timeout=60)
                    except (OSError, sqlite3.Error) as exc:
                        raise StoreError(f"cannot open the session store at {self.path}: {exc}") from exc
        return self._opened

    def _do(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"session store {what} failed: {exc}") from exc

    def load(self, session_id: str) -> dict[str, Any] | None:
        raw = self._do("read", lambda: self._cache.get(session_id))
        return None if raw is None else self.decode(raw)

    def create(self, doc: dict[str, Any]) -> bool:
        text = self.encode(doc)
        return bool(self._do("write", lambda: self._cache.add(doc["id"], text, expire=self.ttl_s)))

    def replace(self, doc: dict[str, Any]) -> bool:
        text = self.encode(doc)

        def write() -> bool:
            with self._cache.transact():
                if doc["id"] not in self._cache:
                    return False
                self._cache.set(doc["id"], text, expire=self.ttl_s)
                return True

        return bool(self._do("write", write))

    def delete(self, session_id: str) -> bool:
        return bool(self._do("write", lambda: self._cache.delete(session_id)))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for key in self._do("read", lambda: list(self._cache.iterkeys())):
            raw = self._do("read", lambda key=key: self._cache.get(key))
            doc = None if raw is None else self.decode(raw)
            if doc is not None:
                yield doc

    def __len__(self) -> int:
        return int(self._do("read", lambda: len(self._cache)))

    def close(self) -> None:
        if self._opened is not None:
            self._opened.close()


class RedisSessionStore(SessionStore):
    """Documents as Redis strings ``<prefix>:session:<id>`` with an expiry, shared by every host."""

    def __init__(self, url: str, ttl_s: float, *, prefix: str = "stm", timeout_s: float = 2.0) -> None:
        super().__init__(ttl_s)
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from ..secrets import public_url

        self.url = public_url(url)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._prefix = f"{prefix}:session:"
        try:
            self._client = redis.Redis.from_url(
                url,
                decode_responses=True,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 1),
            )
        except (ValueError, redis.RedisError) as exc:
            raise StoreError(f"invalid redis URL {self.url}: {exc}") from exc

    def _do(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._errors as exc:
            raise StoreError(f"redis session store at {self.url}: {what} failed: {type(exc).__name__}: {exc}") from exc

    def _key(self, session_id: str) -> str:
        return self._prefix + session_id

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl_s * 1000))

    def load(self, session_id: str) -> dict[str, Any] | None:
        raw = self._do("read", lambda: self._client.get(self._key(session_id)))
        return None if raw is None else self.decode(raw)

    def create(self, doc: dict[str, Any]) -> bool:
        text = self.encode(doc)
        return bool(self._do("write", lambda: self._client.set(self._key(doc["id"]), text, nx=True, px=self._ttl_ms)))

    def replace(self, doc: dict[str, Any]) -> bool:
        text = self.encode(doc)
        return bool(self._do("write", lambda: self._client.set(self._key(doc["id"]), text, xx=True, px=self._ttl_ms)))

    def delete(self, session_id: str) -> bool:
        return int(self._do("write", lambda: self._client.delete(self._key(session_id)))) > 0

    def _keys(self) -> list[str]:
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in self._prefix) + "*"
        return self._do("read", lambda: list(self._client.scan_iter(match=pattern, count=500)))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        keys = self._keys()
        for start in range(0, len(keys), 100):
            batch = keys[start : start + 100]
            for raw in self._do("read", lambda batch=batch: self._client.mget(batch)):
                doc = None if raw is None else self.decode(raw)
                if doc is not None:
                    yield doc

    def __len__(self) -> int:
        return len(self._keys())

    def close(self) -> None:
        try:
            self._client.close()
        except self._errors:  # pragma: no cover - closing never matters
            pass
