"""Every process using a Redis store forgets at once what ``cache delete`` or a refresh changed.

A :class:`~.redis_store.RedisStore` keeps the records it read in process, its kept reads (a hit then costs
no round trip), which is sound only while a recorded answer never changes.  ``cache delete``
and ``mode: refresh`` change answers, so each publishes what it changed on the channel
``<prefix>:invalidate`` (:data:`EVERYTHING`, or the JSON ``[api, key]`` of one replaced record),
and every store instance listens on it from a thread of its own (:class:`Invalidations`):

* the kept reads serve nothing until the subscription is confirmed; when the subscription is lost
  (Redis restarting, say) the kept reads go on serving what they hold (answers stay available while
  Redis is down, and nobody can delete through a Redis that is down), and they are emptied when the
  subscription is back, as messages may have been missed meanwhile;
* each message empties the kept reads (or forgets one record), and bumps their epoch, so a read that
  was in flight when the message came is not remembered (:meth:`KeptReads.put` checks it).

The listener starts with the store's first read and is the only extra cost: the hit path checks
one flag.

What bounds staleness: a message is delivered to every confirmed subscription (Redis pub/sub drops
nothing on a live connection; a subscriber too slow to read is disconnected, which is a lost
subscription, and the kept reads are emptied when it is back).  What no message covers (one published
while the subscription was down, a Redis restarted from an older dump, a key removed with
``redis-cli``, a writer that does not publish) is bounded by age: the kept reads serve a record for
at most :data:`~.redis_kept.KEPT_MAX_AGE_S` after reading it; the store then reads Redis again (and
serves what is kept, whatever its age, only while Redis cannot be read).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

log = logging.getLogger(__name__)

#: the message that empties every process's kept reads (``cache delete``)
EVERYTHING = "*"
#: seconds between reconnection attempts after the subscription was lost
RECONNECT_S = 0.5


def forget_message(api: str, key: str) -> str:
    return json.dumps([api, key], ensure_ascii=False)


class Invalidations:
    """A thread subscribed to the store's channel, applying what it hears to ``kept``."""

    def __init__(self, make_client: Callable[[], Any], prefix: str, kept: Any) -> None:
        self._make_client = make_client
        self.channel = f"{prefix}:invalidate"
        self.kept = kept
        self._stop = threading.Event()
        self._started = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._first = threading.Event()
        """Set once the first subscription was confirmed or failed."""
        # a forked child has no listening thread: its copy of the kept reads must not serve until it listens itself
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork(ref))

    def _forked(self) -> None:
        self.kept.live = False
        self.kept.clear()
        self._started = False
        self._thread = None
        self._lock = threading.Lock()
        self._first = threading.Event()

    def start(self, wait_s: float = 0.0) -> bool:
        """Subscribe and listen in a thread of its own; wait at most ``wait_s`` for the first subscription to be
        confirmed or to fail (the kept reads serve once it is confirmed).  ``False`` when it was still waiting for
        Redis after ``wait_s``: Redis did not answer in time.  The server's event loop passes 0 and never waits
        (a Redis that hangs would hold up every request for the subscription's timeouts); a read in a thread
        waits, so the kept reads serve from the first read on."""
        with self._lock:
            if not (self._started or self._stop.is_set()):
                self._started = True
                # the thread holds the listener only while it subscribes or applies: a store dropped without close() stops it
                self._thread = threading.Thread(target=_subscribe_and_listen, args=(weakref.ref(self), self._stop), daemon=True,
                                                name="stm-redis-invalidate")
                self._thread.start()
        return wait_s <= 0 or self._first.wait(wait_s)

    def _subscribe(self) -> Any:
        """A confirmed subscription (the kept reads are emptied and serve again), or ``None``."""
        pubsub = None
        try:
            pubsub = self._make_client().pubsub()
            pubsub.subscribe(self.channel)
            while True:
                message = pubsub.get_message(timeout=2.0)
                if message is None:
                    raise TimeoutError("no subscription confirmed")
                if message.get("type") == "subscribe":
                    break
        except (RedisError, OSError) as exc:
            log.debug("redis invalidation channel not subscribed: %s", exc)
            if pubsub is not None:
                _close(pubsub)
            return None
        self.kept.go_live()
        return pubsub

    def send(self, client: Any, message: str) -> None:
        """Apply ``message`` (:data:`EVERYTHING` or :func:`forget_message`) here, then publish it to every other instance."""
        self._apply(message)
        client.publish(self.channel, message)

    def _apply(self, data: Any) -> None:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        if text != EVERYTHING:
            try:
                api, key = json.loads(text)
                self.kept.forget((str(api), str(key)))
                return
            except (ValueError, TypeError):
                pass
        self.kept.clear()

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)


def _subscribe_and_listen(ref: weakref.ReferenceType[Invalidations], stop: threading.Event) -> None:
    """The listening thread: the first subscription, then :func:`_listen`."""
    listener = ref()
    if listener is None:
        return
    pubsub = listener._subscribe()  # noqa: SLF001 - its own thread
    listener._first.set()  # noqa: SLF001 - its own thread
    del listener
    _listen(ref, stop, pubsub)


def _listen(ref: weakref.ReferenceType[Invalidations], stop: threading.Event, pubsub: Any) -> None:
    """The listening thread, until closed or until its store is gone.

    It holds its listener only to apply a message or to subscribe again, never while it waits: a
    store dropped without ``close()`` is collected, and its thread ends at its next turn.
    """
    while not stop.is_set():
        if pubsub is None:
            if stop.wait(RECONNECT_S):
                break
            listener = ref()
            if listener is None:
                break
            pubsub = listener._subscribe()  # noqa: SLF001 - its own thread
            del listener
            continue
        try:
            message = pubsub.get_message(timeout=0.5)
        except (RedisError, OSError, ValueError) as exc:
            log.warning("redis invalidation channel lost (%s): the kept reads are emptied when it is back", exc)
            _close(pubsub)
            pubsub = None
            continue
        listener = ref()
        if listener is None:
            break
        if message is not None and message.get("type") == "message":
            listener._apply(message.get("data"))  # noqa: SLF001 - its own thread
        del listener
    if pubsub is not None:
        _close(pubsub)


def _after_fork(ref: weakref.ReferenceType[Invalidations]) -> None:
    listener = ref()
    if listener is not None:
        listener._forked()  # noqa: SLF001 - its own fork hook


def _close(pubsub: Any) -> None:
    try:
        pubsub.close()
    except (RedisError, OSError):  # pragma: no cover - closing never matters
        pass
