"""A session's API-Bank environment: its tables, its API instances, its seeded random numbers.

One :class:`Environment` is what one ToolManager of API-Bank is for one dialogue:

* **tables**: every API sees ``init_database`` through views (:mod:`.tables`); APIs with the same
  ``database_name`` share one table, and the ``token_checker`` every API with a ``token`` input
  gets is the environment's one ``CheckToken`` (as ToolManager shares them).  A table is copied
  for the environment at its first write only; a table only read is never copied.
* **instances**: an API's instance is made at its first call and kept (``ForgotPassword``'s
  verification code stays between its two calls).
* **random numbers**: while a call runs, the ``random`` and ``uuid`` an API module imported (and
  ``from random import ...`` functions) are a ``random.Random`` seeded from the session's seed
  and the call's number, so a dialogue run again gets the same ids and tokens.  API modules are
  shared by all sessions, so what they see is the generator of the call running in the same thread:
  calls of different sessions run at once (a session's own calls one at a time).

Its state is kept in the session (``state["apibank"]``) as :meth:`Environment.snapshot`: the
tables it wrote, the API attributes that changed since their instance was made, and the number
of calls; a worker that did not run the session's previous call rebuilds the environment from
it (:meth:`Environment.restore`).  The process keeps the live environments of recent sessions,
so a session's next call on the same worker rebuilds nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import secrets
import threading
import types
import uuid
from collections.abc import Iterator
from typing import Any

from stabletoolbench_mirror.apibank.loader import Suite
from stabletoolbench_mirror.apibank.tables import DictView, ListView, NotEncodable, TableRoot, decode, encode

#: version of the state an environment keeps in a session
STATE_VERSION = 1
TOKEN_CHECKER = "CheckToken"


class StateError(ValueError):
    """A session's API-Bank state that cannot be read back (written by something else)."""


def call_rng(seed: str, n: int) -> random.Random:
    """The generator of call ``n`` of an environment seeded with ``seed``."""
    digest = hashlib.sha256(f"{seed}\x00{n}".encode("utf-8", "surrogatepass")).digest()
    return random.Random(int.from_bytes(digest[:16], "big"))


_RANDOM_FUNCTIONS = {name: getattr(random, name) for name in dir(random) if callable(getattr(random, name)) and hasattr(random.Random, name)}

#: the generator of the call this thread runs (``None``: none runs)
_CURRENT = threading.local()
_INSTALL_LOCK = threading.Lock()
_INSTALLED: set[int] = set()


def _current() -> random.Random | None:
    return getattr(_CURRENT, "rng", None)


class _ThreadRandom(types.SimpleNamespace):
    """``random`` as an API module sees it: the running call's seeded generator, in the thread that runs it."""

    def __getattr__(self, name: str) -> Any:
        rng = _current()
        return getattr(rng, name) if rng is not None and hasattr(random.Random, name) else getattr(random, name)


class _ThreadUuid(types.SimpleNamespace):
    """``uuid`` as an API module sees it: ``uuid4`` from the running call's seeded generator."""

    def __getattr__(self, name: str) -> Any:
        return _uuid4 if name == "uuid4" else getattr(uuid, name)


def _uuid4() -> uuid.UUID:
    rng = _current()
    return uuid.uuid4() if rng is None else uuid.UUID(int=rng.getrandbits(128), version=4)


def _thread_function(name: str) -> Any:
    def seeded_function(*args: Any, **kwargs: Any) -> Any:
        rng = _current()
        return getattr(rng if rng is not None else random, name)(*args, **kwargs)

    seeded_function.__name__ = name
    return seeded_function


def _install(modules: list[types.ModuleType]) -> None:
    """Once per module: its ``random``, ``uuid``, ``uuid4`` and ``from random import ...`` names read the thread's generator."""
    with _INSTALL_LOCK:
        for module in modules:
            if id(module) in _INSTALLED:
                continue
            names = vars(module)
            for name, value in list(names.items()):
                if value is random:
                    names[name] = _ThreadRandom()
                elif value is uuid:
                    names[name] = _ThreadUuid()
                elif value is uuid.uuid4:
                    names[name] = _uuid4
                elif any(value is fn for fn in _RANDOM_FUNCTIONS.values()):
                    names[name] = _thread_function(value.__name__)
            _INSTALLED.add(id(module))


@contextlib.contextmanager
def seeded(modules: list[types.ModuleType], rng: random.Random) -> Iterator[None]:
    """The API modules' ``random``/``uuid`` seeded by ``rng`` while the block runs, in this thread only.

    The modules are shared by every session, so what they see is per thread (their names are set once
    to objects that read the thread's generator): calls of different sessions run at once, and none
    waits behind another's long call.
    """
    _install(modules)
    previous = _current()
    _CURRENT.rng = rng
    try:
        yield
    finally:
        _CURRENT.rng = previous


def _attr_texts(obj: Any) -> dict[str, str]:
    """An instance's attributes that a session keeps, as JSON text (tables, other APIs and what JSON cannot keep left out)."""
    out: dict[str, str] = {}
    for name, value in vars(obj).items():
        if isinstance(value, (DictView, ListView)) or _is_api(value):
            continue
        try:
            out[name] = json.dumps(encode(value), ensure_ascii=False, sort_keys=True)
        except (NotEncodable, TypeError, ValueError, RecursionError):
            continue
    return out


def _is_api(value: Any) -> bool:
    return hasattr(type(value), "check_api_call_correctness") and hasattr(type(value), "input_parameters")


class Environment:
    """One session's API-Bank (see the module doc)."""

    def __init__(self, suite: Suite, seed: str, *, stamp: str | None = None) -> None:
        self.suite = suite
        self.seed = seed
        self.stamp = stamp or secrets.token_hex(8)
        """Which environment this is: a live one is used for a session only when the session's state has its stamp and count."""
        self.n = 0
        """Calls made (the next call's random numbers are seeded with it)."""
        self.roots = {name: TableRoot(name, data) for name, data in suite.tables.items()}
        self.instances: dict[str, Any] = {}
        self._baseline: dict[str, dict[str, str]] = {}
        self._kept_attrs: dict[str, dict[str, str]] = {}
        """Attributes kept in the state for APIs not made yet here (applied when they are)."""

    # -- instances ------------------------------------------------------------------------------

    def instance(self, name: str) -> Any:
        """The API's instance in this environment, made as ToolManager makes it on first use."""
        if name in self.instances:
            return self.instances[name]
        api = self.suite.apis[name]
        assert api.cls is not None
        args: list[Any] = []
        if api.database_name is not None and api.database_name in self.roots:
            args.append(self.roots[api.database_name].view())
        if name != TOKEN_CHECKER and "token" in api.input_parameters and TOKEN_CHECKER in self.suite.local:
            args.append(self.instance(TOKEN_CHECKER))
        obj = api.cls(*args)
        self._baseline[name] = _attr_texts(obj)
        for attr, text in self._kept_attrs.pop(name, {}).items():
            setattr(obj, attr, decode(json.loads(text)))
        self.instances[name] = obj
        return obj

    # -- state ----------------------------------------------------------------------------------

    def changed_tables(self) -> dict[str, Any]:
        return {name: root.data for name, root in self.roots.items() if root.owned}

    def snapshot(self) -> dict[str, Any]:
        """What the session keeps: the tables written, the attributes changed since their instance was made, the count."""
        attrs: dict[str, dict[str, str]] = {k: dict(v) for k, v in self._kept_attrs.items()}
        for name, obj in self.instances.items():
            now = _attr_texts(obj)
            changed = {a: t for a, t in now.items() if self._baseline.get(name, {}).get(a) != t}
            if changed:
                attrs[name] = changed
        return {
            "v": STATE_VERSION,
            "stamp": self.stamp,
            "n": self.n,
            "tables": {name: encode(data) for name, data in sorted(self.changed_tables().items())},
            "attrs": attrs,
        }

    @classmethod
    def restore(cls, suite: Suite, seed: str, state: Any) -> Environment:
        """The environment a :meth:`snapshot` describes; :class:`StateError` when ``state`` is not one."""
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION:
            raise StateError(f"not an API-Bank state of version {STATE_VERSION}")
        try:
            env = cls(suite, seed, stamp=str(state["stamp"]))
            env.n = int(state["n"])
            for name, data in state["tables"].items():
                env.roots[name] = TableRoot(name, decode(data), owned=True)
            env._kept_attrs = {str(k): {str(a): str(t) for a, t in v.items()} for k, v in state["attrs"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"an API-Bank state that cannot be read: {exc}") from None
        return env

    def matches(self, state: Any) -> bool:
        """Whether this live environment is the one ``state`` was saved from, after its last call."""
        return isinstance(state, dict) and state.get("stamp") == self.stamp and state.get("n") == self.n
