"""Where sessions are kept: a small head per session and its calls one entry each, expiring after an idle time.

A session's *head* holds everything but its calls (task, history hash, local-tool state, the
number and size of its calls); each call is a separate entry, written once.  A call appends one
entry and rewrites the head only: the calls before it are never rewritten, so a call costs the
same however long the session is.  A head exists only for a session created (``POST /sessions``,
or a client's own id with ``sessions.allow_client_ids``): that is how every worker and host
knows which ids were issued.

Beside the records: a diskcache folder (``<store.path>/sessions``: heads under the session id,
calls under ``("call", id, n)``, opened on first use) or the same Redis (heads as strings
``<prefix>:session:<id>``, calls as the list ``<prefix>:session-calls:<id>``).  Documents of
version 1 (one document with the calls inside, written before) are read as they are and split
into a head and entries by the session's next call.  See :mod:`stabletoolbench_mirror.engine.sessions`.
"""

from __future__ import annotations

import abc
import functools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from stabletoolbench_mirror.stores.base import StoreError

#: the version of a session head (its calls kept as separate entries)
DOC_VERSION = 2
#: the version of the documents written before: one document with its calls inside
LEGACY_DOC_VERSION = 1


class SessionStore(abc.ABC):
    """Session heads and their calls by id, each session expiring ``ttl_s`` after its last write.

    A head is a dict with ``v``, ``id``, ``n_calls`` and whatever the session keeps beside its
    calls; a call is any JSON dict.  A full document (:meth:`load`, iteration) is the head with
    ``calls``: the list of its calls in order.
    """

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = float(ttl_s)

    @abc.abstractmethod
    def load_head(self, session_id: str) -> dict[str, Any] | None:
        """The head (no ``calls``), or ``None`` when there is none (or it expired).

        A version-1 document is split into a head and call entries here (the caller holds the
        session's lock), so that the next :meth:`append` adds to it.
        """

    @abc.abstractmethod
    def calls(self, session_id: str, indexes: Sequence[int]) -> list[dict[str, Any]]:
        """The calls at ``indexes`` (0 is the first call), in that order; missing ones are left out."""

    @abc.abstractmethod
    def create(self, head: Mapping[str, Any]) -> bool:
        """Store a new session's ``head`` (no calls yet) unless its id is taken; whether it was stored."""

    @abc.abstractmethod
    def append(self, head: Mapping[str, Any], call: Mapping[str, Any]) -> bool:
        """Add ``call`` as call number ``head['n_calls'] - 1`` and overwrite the head, only if the session
        still exists; whether it did.  The calls before it are not rewritten."""

    @abc.abstractmethod
    def delete(self, session_id: str) -> bool:
        """Forget a session and its calls; whether there was one."""

    @abc.abstractmethod
    def _ids(self) -> list[str]:
        """The ids of every head (expired ones may still be listed)."""

    def load(self, session_id: str) -> dict[str, Any] | None:
        """The full document (head and ``calls``), or ``None``."""
        raw = self._raw_head(session_id)
        return None if raw is None else self._full(raw)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Every live full document, in no particular order."""
        for session_id in self._ids():
            doc = self.load(session_id)
            if doc is not None:
                yield doc

    def __len__(self) -> int:
        """About how many sessions there are (expired ones may still count)."""
        return len(self._ids())

    def close(self) -> None:  # noqa: B027 - optional: a backend that holds nothing keeps this
        """Release the backend's resources."""

    # -- shared by the backends ---------------------------------------------------------------

    @abc.abstractmethod
    def _raw_head(self, session_id: str) -> dict[str, Any] | None:
        """The stored head or version-1 document as it is, or ``None``."""

    def _full(self, raw: dict[str, Any]) -> dict[str, Any]:
        if raw["v"] == LEGACY_DOC_VERSION:
            return raw
        doc = dict(raw)
        doc["calls"] = self.calls(raw["id"], range(int(raw.get("n_calls", 0))))
        return doc

    @staticmethod
    def encode(doc: Mapping[str, Any]) -> str:
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))

    @staticmethod
    def decode(text: str | bytes) -> dict[str, Any] | None:
        """A head or a version-1 document; ``None`` for anything else."""
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        if not isinstance(doc, dict) or doc.get("v") not in (DOC_VERSION, LEGACY_DOC_VERSION) or not isinstance(doc.get("id"), str):
            return None
        return doc

    @staticmethod
    def decode_call(text: str | bytes | None) -> dict[str, Any] | None:
        if text is None:
            return None
        try:
            call = json.loads(text)
        except ValueError:
            return None
        return call if isinstance(call, dict) else None

    @classmethod
    def split_legacy(cls, doc: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A version-1 document as a head and its calls."""
        calls = [c for c in doc.get("calls", []) if isinstance(c, dict)]
        head = {k: v for k, v in doc.items() if k != "calls"}
        head["v"] = DOC_VERSION
        head["n_calls"] = len(calls)
        head["calls_bytes"] = sum(len(cls.encode(c).encode("utf-8", "surrogatepass")) for c in calls)
        head["in_history"] = [n for n, c in enumerate(calls) if c.get("in_history")]
        return head, calls


class DiskcacheSessionStore(SessionStore):
    """Heads and calls in a diskcache folder (``<store.path>/sessions``), with diskcache's own expiry.

    A head expires ``ttl_s`` after its last write.  Call entries are written once with an expiry
    of ``2 * ttl_s``, and all of a session's entries are given that again (one cheap update each)
    when the last such renewal is more than ``ttl_s / 2`` old: they always outlive their head, and
    are culled at most ``2 * ttl_s`` after it.
    """

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
                        # expired entries are culled by later writes; nothing is evicted for size
                        self._opened = self._diskcache.Cache(self.path, eviction_policy="none", size_limit=2**62, timeout=60)
                    except (OSError, sqlite3.Error) as exc:
                        raise StoreError(f"cannot open the session store at {self.path}: {exc}") from exc
        return self._opened

    def _do(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"session store {what} failed: {exc}") from exc

    @staticmethod
    def _call_key(session_id: str, n: int) -> tuple[str, str, int]:
        return ("call", session_id, int(n))

    def _raw_head(self, session_id: str) -> dict[str, Any] | None:
        raw = self._do("read", lambda: self._cache.get(session_id))
        return None if raw is None else self.decode(raw)

    def load_head(self, session_id: str) -> dict[str, Any] | None:
        raw = self._raw_head(session_id)
        if raw is None or raw["v"] == DOC_VERSION:
            return raw
        head, calls = self.split_legacy(raw)
        head["calls_renewed_at"] = time.time()
        cache = self._cache

        def write() -> bool:
            with cache.transact():
                if session_id not in cache:
                    return False
                for n, call in enumerate(calls):
                    cache.set(self._call_key(session_id, n), self.encode(call), expire=2 * self.ttl_s)
                cache.set(session_id, self.encode(head), expire=self.ttl_s)
                return True

        return head if self._do("write", write) else None

    def calls(self, session_id: str, indexes: Sequence[int]) -> list[dict[str, Any]]:
        cache = self._cache
        found = []
        for n in indexes:
            call = self.decode_call(self._do("read", functools.partial(cache.get, self._call_key(session_id, n))))
            if call is not None:
                found.append(call)
        return found

    def create(self, head: Mapping[str, Any]) -> bool:
        text = self.encode({**head, "calls_renewed_at": time.time()})
        return bool(self._do("write", lambda: self._cache.add(head["id"], text, expire=self.ttl_s)))

    def append(self, head: Mapping[str, Any], call: Mapping[str, Any]) -> bool:
        session_id, index = head["id"], int(head["n_calls"]) - 1
        now = time.time()
        renewed = float(head.get("calls_renewed_at") or 0.0)
        renew = now - renewed > self.ttl_s / 2
        head = {**head, "calls_renewed_at": now if renew else renewed}
        call_text, head_text = self.encode(call), self.encode(head)
        cache = self._cache

        def write() -> bool:
            with cache.transact():
                if session_id not in cache:
                    return False
                if renew:
                    for n in range(index):
                        cache.touch(self._call_key(session_id, n), expire=2 * self.ttl_s)
                cache.set(self._call_key(session_id, index), call_text, expire=2 * self.ttl_s)
                cache.set(session_id, head_text, expire=self.ttl_s)
                return True

        return bool(self._do("write", write))

    def delete(self, session_id: str) -> bool:
        cache = self._cache

        def write() -> bool:
            with cache.transact():
                raw = cache.get(session_id)
                if raw is None:
                    return False
                head = self.decode(raw) or {}
                for n in range(int(head.get("n_calls", 0)) if head.get("v") == DOC_VERSION else 0):
                    cache.delete(self._call_key(session_id, n))
                cache.delete(session_id)
                return True

        return bool(self._do("write", write))

    def _ids(self) -> list[str]:
        return [k for k in self._do("read", lambda: list(self._cache.iterkeys())) if isinstance(k, str)]

    def close(self) -> None:
        if self._opened is not None:
            self._opened.close()


# KEYS: head, calls list; ARGV: head text, call text, ttl ms.  The head is written and the call
# pushed only while the head exists (one atomic step: no other client sees half of it).
_APPEND_LUA = """
if redis.call('exists', KEYS[1]) == 0 then return 0 end
redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[3])
redis.call('rpush', KEYS[2], ARGV[2])
redis.call('pexpire', KEYS[2], ARGV[3])
return 1
"""

# KEYS: head, calls list; ARGV: head text, ttl ms, the calls' texts.  A version-1 document is
# replaced by its head and its calls, only while it exists.
_SPLIT_LUA = """
if redis.call('exists', KEYS[1]) == 0 then return 0 end
redis.call('del', KEYS[2])
for i = 3, #ARGV do redis.call('rpush', KEYS[2], ARGV[i]) end
if #ARGV >= 3 then redis.call('pexpire', KEYS[2], ARGV[2]) end
redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2])
return 1
"""

# KEYS: head, calls list; ARGV: head text, ttl ms.  A new head, and no calls left from before.
_CREATE_LUA = """
if redis.call('set', KEYS[1], ARGV[1], 'nx', 'px', ARGV[2]) then
  redis.call('del', KEYS[2])
  return 1
end
return 0
"""


class RedisSessionStore(SessionStore):
    """Heads as Redis strings ``<prefix>:session:<id>``, calls as lists ``<prefix>:session-calls:<id>``,
    both with the same expiry; shared by every host."""

    def __init__(self, url: str, ttl_s: float, *, prefix: str = "stm", timeout_s: float = 2.0) -> None:
        super().__init__(ttl_s)
        import redis
        from redis.retry import Retry

        from stabletoolbench_mirror.core.secrets import public_url
        from stabletoolbench_mirror.stores.redis_connection import client_options

        self.url = public_url(url)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._prefix = f"{prefix}:session:"
        self._calls_prefix = f"{prefix}:session-calls:"
        try:
            # the store's options: a lost connection is tried again once, a timeout is not
            self._client = redis.Redis.from_url(url, **client_options(timeout_s, Retry))
        except (ValueError, redis.RedisError) as exc:
            raise StoreError(f"invalid redis URL {self.url}: {exc}") from exc
        self._append = self._client.register_script(_APPEND_LUA)
        self._split = self._client.register_script(_SPLIT_LUA)
        self._create = self._client.register_script(_CREATE_LUA)

    def _do(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._errors as exc:
            raise StoreError(f"redis session store at {self.url}: {what} failed: {type(exc).__name__}: {exc}") from exc

    def _key(self, session_id: str) -> str:
        return self._prefix + session_id

    def _calls_key(self, session_id: str) -> str:
        return self._calls_prefix + session_id

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl_s * 1000))

    def _raw_head(self, session_id: str) -> dict[str, Any] | None:
        raw = self._do("read", lambda: self._client.get(self._key(session_id)))
        return None if raw is None else self.decode(raw)

    def load_head(self, session_id: str) -> dict[str, Any] | None:
        raw = self._raw_head(session_id)
        if raw is None or raw["v"] == DOC_VERSION:
            return raw
        head, calls = self.split_legacy(raw)
        keys = [self._key(session_id), self._calls_key(session_id)]
        args: list[str | int] = [self.encode(head), self._ttl_ms, *(self.encode(c) for c in calls)]
        return head if int(self._do("write", lambda: self._split(keys=keys, args=args))) else None

    def calls(self, session_id: str, indexes: Sequence[int]) -> list[dict[str, Any]]:
        indexes = list(indexes)
        if not indexes:
            return []
        key = self._calls_key(session_id)
        if indexes == list(range(indexes[0], indexes[0] + len(indexes))):  # a run: one LRANGE
            raws = self._do("read", lambda: self._client.lrange(key, indexes[0], indexes[-1]))
        else:
            def read() -> list[Any]:
                pipe = self._client.pipeline(transaction=False)
                for n in indexes:
                    pipe.lindex(key, n)
                return pipe.execute()

            raws = self._do("read", read)
        return [c for c in (self.decode_call(r) for r in raws) if c is not None]

    def create(self, head: Mapping[str, Any]) -> bool:
        keys = [self._key(head["id"]), self._calls_key(head["id"])]
        return bool(int(self._do("write", lambda: self._create(keys=keys, args=[self.encode(head), self._ttl_ms]))))

    def append(self, head: Mapping[str, Any], call: Mapping[str, Any]) -> bool:
        keys = [self._key(head["id"]), self._calls_key(head["id"])]
        args: list[str | int] = [self.encode(head), self.encode(call), self._ttl_ms]
        return bool(int(self._do("write", lambda: self._append(keys=keys, args=args))))

    def delete(self, session_id: str) -> bool:
        def write() -> list[Any]:
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(self._key(session_id))
            pipe.delete(self._calls_key(session_id))
            return pipe.execute()

        return int(self._do("write", write)[0]) > 0

    def _ids(self) -> list[str]:
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in self._prefix) + "*"
        keys = self._do("read", lambda: list(self._client.scan_iter(match=pattern, count=500)))
        return [k[len(self._prefix):] for k in keys]

    def close(self) -> None:
        try:
            self._client.close()
        except self._errors:  # pragma: no cover - closing never matters
            pass
