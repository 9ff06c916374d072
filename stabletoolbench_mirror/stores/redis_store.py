"""A store in Redis, shared by several servers on several hosts.

Layout under a key prefix ``P`` (so several caches can share one Redis database):

* ``P:e:<api>``: a hash, upstream key -> record JSON (never pickles);
* ``P:c:<api>``: a hash, canonical key -> upstream key;
* ``P:namespaces``: a set of the APIs that hold records (the name is older than the word "API" here);
* ``P:counts``: a hash of counters kept by every add (``entries``, ``source:<s>``,
  ``category:<c>``, ``origin:<o>``), complete when it has ``counted`` (set by the first add
  into an empty store), so ``cache stats`` needs no scan;
* ``P:lock:<sha256>``: the cross-host single-flight locks (strings with an expiry).

A write reads what the store holds, asks :mod:`.rules` what to do, and sends the plan to one Lua
script (:mod:`.redis_scripts`) that Redis runs atomically and that applies it only while what was
read is unchanged (else the write reads and asks again): the first writer of a key wins on every
host, and nobody ever sees a pointer without its entry.

Every Redis problem becomes a :class:`StoreError` within ``store.timeout_s`` (:mod:`.redis_connection`:
one retry of a lost connection, no second wait within an outage); reads meanwhile serve what the kept reads hold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio
from redis.exceptions import RedisError
from redis.retry import Retry

from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.core.secrets import public_url
from stabletoolbench_mirror.stores import formats, rules
from stabletoolbench_mirror.stores import redis_scripts as scripts
from stabletoolbench_mirror.stores.base import Store, StoreCounts, StoreError, _recording_order
from stabletoolbench_mirror.stores.kinds import LOCK_TTL_S, StoreSpec, StoreSpecError
from stabletoolbench_mirror.stores.redis_connection import (
    AsyncClients,
    FlightLocks,
    Outage,
    client_options,
    optional_text,
    text,
)
from stabletoolbench_mirror.stores.redis_invalidation import EVERYTHING, Invalidations, forget_message
from stabletoolbench_mirror.stores.redis_kept import KeptReads

if TYPE_CHECKING:
    from stabletoolbench_mirror.stores.sessions import SessionStore

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how many times a write reads, plans and applies while other writers change the same record meanwhile
WRITE_TRIES = 16


def _url(spec: StoreSpec) -> str:
    if not spec.url:
        raise StoreSpecError("store.url: required when store.kind is 'redis' (e.g. redis://127.0.0.1:6379/0)")
    return spec.url


class RedisStore(Store):
    """Records as JSON text in Redis hashes, one pair of hashes per API.

    Records already read are also kept in a bounded in-process store of kept reads (``kept_bytes``),
    so a repeated hit costs no round trip.
    """

    kind = "redis"

    @classmethod
    def open_spec(cls, spec: StoreSpec, read_only: bool) -> Store:
        # read_only: its reads (HGET, HGETALL, SCARD, INFO) write nothing anyway; a command reads each record once
        return cls(_url(spec), prefix=spec.prefix, lock_ttl_s=spec.lock_ttl_s, timeout_s=spec.timeout_s,
                   **({"kept_bytes": 0} if read_only else {}))

    @classmethod
    def open_sessions(cls, spec: StoreSpec, ttl_s: float) -> SessionStore:
        from stabletoolbench_mirror.stores.sessions import RedisSessionStore

        return RedisSessionStore(_url(spec), ttl_s, prefix=spec.prefix, timeout_s=spec.timeout_s)

    @classmethod
    def where(cls, spec: StoreSpec) -> str:
        return f"{public_url(spec.url or '')} (prefix '{spec.prefix}')"

    @classmethod
    def spec_of(cls, text: str, configured: StoreSpec) -> StoreSpec | None:
        """``redis://HOST:PORT/DB[#prefix=P]`` (also ``rediss://``, ``unix://``)."""
        if not text.startswith(("redis://", "rediss://", "unix://")):
            return None
        url, _, fragment = text.partition("#")
        prefix = fragment.removeprefix("prefix=") if fragment.startswith("prefix=") else configured.prefix
        return dataclasses.replace(configured, kind=cls.kind, url=url, prefix=prefix)

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "stm",
        lock_ttl_s: float = LOCK_TTL_S,
        timeout_s: float = 2.0,
        kept_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        if lock_ttl_s <= 0 or timeout_s <= 0:
            raise ValueError("lock_ttl_s and timeout_s must be positive")
        self.url = public_url(url)
        self.prefix = prefix
        self.lock_ttl_s = float(lock_ttl_s)
        self.timeout_s = float(timeout_s)
        self._outage = Outage(self.timeout_s)
        self._aclients = AsyncClients(url, self.timeout_s)
        try:
            self._client = redis.Redis.from_url(url, **client_options(self.timeout_s, Retry))
        except (ValueError, RedisError) as exc:
            raise StoreError(f"invalid redis store URL {self.url}: {exc}") from exc
        self._apply = self._client.register_script(scripts.APPLY)
        self._apis_key = f"{prefix}:namespaces"  # the set of APIs (its name predates the word)
        self._counts = f"{prefix}:counts"
        self._delete = self._client.register_script(scripts.DELETE)
        self._kept = KeptReads(kept_bytes)  # serving only while this instance hears what other ones delete or replace
        self._invalidations = Invalidations(lambda: redis.Redis.from_url(url, **client_options(self.timeout_s, Retry)), prefix, self._kept)
        self._locks = FlightLocks(self._client, prefix, self.lock_ttl_s, log)
        self._format_key = f"{prefix}:format"
        self._format: formats.Decision | None = None
        """What the store's format marker asks (``None``: not read yet, Redis was down)."""
        self._read_format()

    def _read_format(self) -> formats.Decision | None:
        """Read the format marker (:mod:`.formats`); :class:`~.formats.FormatError` for a format this version cannot use."""
        if self._format is None:
            try:
                found = formats.parse(self._client.get(self._format_key))
            except RedisError as exc:
                log.info("redis store at %s: format marker not read now (%s); read again before the first write", self.url, exc)
                return None
            self._format = formats.decide(found, f"{self.url} (prefix {self.prefix!r})")
        return self._format

    def _writable(self) -> None:
        """Before a write: Redis is not known to be away (:class:`Outage`), and the format is known to be this
        version's, marked once (a new or older store)."""
        with self._failing("write"):
            self._outage.check()
            if self._format != "use" and self._read_format() == "mark":
                self._client.set(self._format_key, formats.current().to_text())
                self._format = "use"

    def _entries(self, api: str) -> str:
        return f"{self.prefix}:e:{api}"

    def _canonicals(self, api: str) -> str:
        return f"{self.prefix}:c:{api}"

    def _occurrence(self, run: str, digest: str, decide: rules.Decide) -> int:
        """Read a counter, ask the rules, write it back while nobody else did (``WATCH``/``MULTI``): every host counts together."""
        name = f"{self.prefix}:o:{run}:{digest}"
        result: list[int] = []

        def apply(pipe: Any) -> None:
            number, after = decide(rules.Occurrences.from_json(pipe.get(name)))
            pipe.multi()
            if after.at_start:  # every number given back: nothing to keep
                pipe.delete(name)
            else:
                pipe.set(name, after.to_json(), ex=rules.OCCURRENCE_TTL_S)
            result[:] = [int(number)]

        with self._failing("occurrence counter", (RedisError, ValueError, KeyError)):
            self._outage.check()
            self._client.transaction(apply, name)
        return result[0]

    @contextlib.contextmanager
    def _failing(self, what: str, errors: tuple[type[Exception], ...] = (RedisError,)) -> Iterator[None]:
        """Redis's errors (``errors``) in the block as the store's (:meth:`_failed`)."""
        try:
            yield
        except errors as exc:
            raise self._failed(what, exc) from exc

    def _failed(self, what: str, exc: Exception) -> StoreError:
        self._outage.failed(exc)
        return StoreError(f"redis store at {self.url}: {what} failed: {type(exc).__name__}: {exc}")

    @staticmethod
    def _decode(raw: str) -> Record:
        try:
            return Record.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"redis store holds an unreadable record: {exc}") from exc

    # -- Store ------------------------------------------------------------------------------------

    def recall(self, api: str, key: str) -> Record | None:
        """The record of this key if this process keeps it (no I/O), else ``None``."""
        return self._kept.get((api, key))

    # Each read has a sync and an async form (the server reads on its event loop); both go
    # through recall / _remember / _point, so the kept-then-Redis order is written once.

    def _epoch(self, *, wait: bool = True) -> int:
        """The kept reads' epoch before a read (the first read also starts hearing invalidations).

        A read in a thread (``wait``) waits at most ``store.timeout_s`` for the subscription, so the kept reads serve
        from its first read on; when Redis did not confirm it by then, Redis is not asked again within the
        :class:`Outage` window (the read does not wait a second time).  The event loop's reads never wait.
        """
        if not self._kept.live and self._kept.max_bytes:
            if not self._invalidations.start(self.timeout_s if wait else 0.0):
                self._outage.failed(TimeoutError(f"the invalidation channel was not subscribed within {self.timeout_s:g} s"))
        return self._kept.epoch

    def _remember(self, api: str, key: str, raw: str | bytes | None, epoch: int) -> Record | None:
        if raw is None:
            return None
        record = self._decode(text(raw))
        self._kept.put((api, key), record, epoch)
        return record

    def _point(self, api: str, canonical: str, found: str | bytes | None, epoch: int) -> str | None:
        if found is None:
            return None
        key = text(found)
        self._kept.point((api, canonical), key, epoch)
        return key

    def get(self, api: str, key: str) -> Record | None:
        record = self.recall(api, key)
        if record is not None:
            return record
        epoch = self._epoch()
        try:
            self._outage.check()
            raw = self._client.hget(self._entries(api), key)
        except RedisError as exc:
            return self._stale(self._kept.get, (api, key), self._failed("read", exc))
        self._outage.succeeded()
        return self._remember(api, key, raw, epoch)

    async def aget(self, api: str, key: str) -> Record | None:
        record = self.recall(api, key)
        if record is not None:
            return record
        epoch = self._epoch(wait=False)
        try:
            self._outage.check()
            raw = await self._aclients.get().hget(self._entries(api), key)
        except (TimeoutError, RedisError, OSError) as exc:
            return self._stale(self._kept.get, (api, key), self._failed("read", exc))
        self._outage.succeeded()
        return self._remember(api, key, raw, epoch)

    @staticmethod
    def _stale(kept: Callable[..., T | None], where: tuple[str, str], error: StoreError) -> T:
        """While Redis cannot be read, what the kept reads hold for ``where`` at any age (``kept``: a record or a
        pointer); else ``error``."""
        found = kept(where, stale=True)
        if found is None:
            raise error
        return found

    def get_canonical(self, api: str, canonical: str) -> Record | None:
        key = self._kept.pointer((api, canonical))
        if key is None:
            epoch = self._epoch()
            try:
                self._outage.check()
                key = self._point(api, canonical, self._client.hget(self._canonicals(api), canonical), epoch)
            except RedisError as exc:
                key = self._stale(self._kept.pointer, (api, canonical), self._failed("read", exc))
        return self._pointed(api, canonical, None if key is None else self.get(api, key))

    def _pointed(self, api: str, canonical: str, record: Record | None) -> Record | None:
        if record is not None and record.is_failure:
            self._kept.unpoint((api, canonical))
        return record

    async def aget_canonical(self, api: str, canonical: str) -> Record | None:
        key = self._kept.pointer((api, canonical))
        if key is None:
            epoch = self._epoch(wait=False)
            try:
                self._outage.check()
                key = self._point(api, canonical, await self._aclients.get().hget(self._canonicals(api), canonical), epoch)
            except (TimeoutError, RedisError, OSError) as exc:
                key = self._stale(self._kept.pointer, (api, canonical), self._failed("read", exc))
        return self._pointed(api, canonical, None if key is None else await self.aget(api, key))

    # -- writes: read, ask the rules (:mod:`.rules`), apply while what was read holds -------------

    def _read_holding(self, record: Record, canonical: str | None) -> tuple[rules.Holding, list[str]]:
        """What the store holds for ``record`` (as :mod:`.rules` takes it) and what :data:`~.redis_scripts.APPLY` checks."""
        api = record.api
        pipe = self._client.pipeline(transaction=False)
        pipe.hget(self._entries(api), record.key)
        if canonical is not None:
            pipe.hget(self._canonicals(api), canonical)
        replies = pipe.execute()
        raw = optional_text(replies[0])
        target = optional_text(replies[1]) if canonical is not None else None
        seen = scripts.seen(record.key, raw, canonical, target)
        failing = True
        if target is not None and rules.needs_target_record(record, canonical, target):
            target_raw = optional_text(self._client.hget(self._entries(api), target))
            failing = target_raw is None or self._decode(target_raw).is_failure
            seen[4:] = [target, scripts.sha1(target_raw)]
        return rules.Holding(None if raw is None else self._decode(raw), target, failing), seen

    def _script_keys(self, api: str) -> list[str]:
        """The KEYS of :data:`~.redis_scripts.APPLY` and :data:`~.redis_scripts.DELETE`."""
        return [self._entries(api), self._canonicals(api), self._apis_key, self._counts]

    def _write(self, record: Record, canonical: str | None, decide: Any) -> rules.Plan:
        """Read, plan with ``decide`` (:func:`.rules.add` or :func:`.rules.replace`), apply; again while others changed it."""
        for _ in range(WRITE_TRIES):
            held, seen = self._read_holding(record, canonical)
            plan = decide(record, canonical, held)
            if not plan.changes or int(self._apply(keys=self._script_keys(record.api), args=scripts.apply_args(seen, record, plan))) != scripts.CHANGED:
                return plan
        raise StoreError(f"redis store at {self.url}: the record of {clip(record.api)} changed under {WRITE_TRIES} writes in a row")

    def add(self, record: Record, canonical: str | None) -> bool:
        self._writable()
        with self._failing("write"):
            return self._write(record, canonical, rules.add).write

    def add_many(self, items: Iterable[tuple[Record, str | None]]) -> list[bool]:
        """Adds read in one pipeline and applied in another (two round trips per batch); an add whose
        record changed in between (another writer, or an earlier item of the batch) is done alone."""
        items = list(items)
        if not items:
            return []
        self._writable()
        with self._failing("write"):
            plans = self._add_batch(items)
            return [self._write(record, canonical, rules.add).write if plan is None else plan.write
                    for plan, (record, canonical) in zip(plans, items)]

    def _add_batch(self, items: list[tuple[Record, str | None]]) -> list[rules.Plan | None]:
        """The plans of the batch's adds, applied; ``None`` for an add to do alone (it depends on another
        key's record, or what it read changed before its plan was applied)."""
        self._client.script_load(scripts.APPLY)
        reads = self._client.pipeline(transaction=False)
        for record, canonical in items:
            reads.hget(self._entries(record.api), record.key)
            if canonical is not None:
                reads.hget(self._canonicals(record.api), canonical)
        replies = iter(reads.execute())
        plans: list[rules.Plan | None] = []
        writes = self._client.pipeline(transaction=False)
        for record, canonical in items:
            raw = optional_text(next(replies))
            target = optional_text(next(replies)) if canonical is not None else None
            plan = None
            if not rules.needs_target_record(record, canonical, target):
                plan = rules.add(record, canonical, rules.Holding(None if raw is None else self._decode(raw), target, True))
            if plan is not None and plan.changes:
                seen = scripts.seen(record.key, raw, canonical, target)
                self._apply(keys=self._script_keys(record.api), args=scripts.apply_args(seen, record, plan), client=writes)
            plans.append(plan)
        applied = iter(writes.execute())
        return [None if plan is None or (plan.changes and int(next(applied)) == scripts.CHANGED) else plan for plan in plans]

    def delete(self, api: str, keys: Iterable[str]) -> int:
        """Remove records (one script per 1000 keys) and tell every instance to empty its kept reads."""
        keys = list(dict.fromkeys(keys))
        self._writable()
        try:
            with self._failing("delete"):
                return sum(self._delete_some(api, keys[i : i + 1000]) for i in range(0, len(keys), 1000))
        finally:
            if keys:
                self._invalidate(EVERYTHING)

    def _delete_some(self, api: str, keys: list[str]) -> int:
        for _ in range(WRITE_TRIES):
            raws = self._client.hmget(self._entries(api), keys)
            there = [(key, text(raw)) for key, raw in zip(keys, raws) if raw is not None]
            if not there:
                return 0
            args = scripts.delete_args(api, there, rules.delete(self._decode(raw) for _key, raw in there))
            done = int(self._delete(keys=self._script_keys(api), args=args))
            if done != scripts.CHANGED:
                return done
        raise StoreError(f"redis store at {self.url}: records of {clip(api)} changed under {WRITE_TRIES} deletes in a row")

    def replace(self, record: Record, canonical: str | None) -> bool:
        self._writable()
        try:
            with self._failing("write"):
                self._write(record, canonical, rules.replace)
        finally:
            self._invalidate(forget_message(record.api, record.key))
        return True

    def _invalidate(self, message: str) -> None:
        """Tell every instance (this one too) to forget what changed."""
        with self._failing("invalidate"):
            self._invalidations.send(self._client, message)

    def counts(self) -> StoreCounts | None:
        with self._failing("read"):
            raw = self._client.hgetall(self._counts)
            apis = int(self._client.scard(self._apis_key))
            memory = self._client.info("memory").get("used_memory")
        if "counted" not in raw and apis:
            return None  # records written before counters were kept: cache stats scans instead
        counters = [(tuple(text(name).split(":", 1)), int(value)) for name, value in raw.items()]
        return StoreCounts.of([*counters, (("apis",), apis)], memory_bytes=int(memory) if memory else None)

    def iter_groups(self) -> Iterator[tuple[str, list[Record]]]:
        for ns in self.apis():
            group = list(self.iter_api(ns))
            if group:
                yield ns, _recording_order(group)

    def sample(self, api: str, limit: int) -> Iterator[Record]:
        if limit <= 0:
            return
        with self._failing("read"):
            self._outage.check()
            raws = [raw for _key, raw in itertools.islice(self._client.hscan_iter(self._entries(api), count=max(int(limit), 10)), limit)]
        for raw in raws:
            yield self._decode(raw)

    def iter_api(self, api: str) -> Iterator[Record]:
        with self._failing("read"):
            for _key, raw in self._client.hscan_iter(self._entries(api), count=500):
                yield self._decode(raw)

    def apis(self) -> list[str]:
        with self._failing("read"):
            return sorted(text(name) for name in self._client.smembers(self._apis_key))

    def __iter__(self) -> Iterator[Record]:
        for ns in self.apis():
            yield from self.iter_api(ns)

    def _count_records(self) -> int:
        names = self.apis()
        with self._failing("read"):
            pipe = self._client.pipeline(transaction=False)
            for ns in names:
                pipe.hlen(self._entries(ns))
            return sum(int(n) for n in pipe.execute()) if names else 0

    @contextlib.contextmanager
    def flight_lock(self, api: str, canonical: str) -> Iterator[None]:
        """A Redis lock held while filling a miss, shared by every host (:class:`~.redis_connection.FlightLocks`)."""
        with self._failing("lock"):
            self._outage.check()
            held = self._locks.acquire(api, canonical)
        if held is None:
            yield
            return
        with self._locks.held(api, *held):
            yield

    def close(self) -> None:
        self._invalidations.close()
        self._locks.close()
        self._aclients.close()
        try:
            self._client.close()
        except RedisError:  # pragma: no cover - closing never matters
            pass
