"""API-Bank's tables, shared read-only and copied for a session only when it writes one.

A table (one ``init_database/<Name>.json``) is loaded once at start.  A session's API
instances see it through a :class:`DictView` / :class:`ListView` over a :class:`TableRoot`:
reads go to the shared data; the first write anywhere in the table (a key set or deleted, a
list appended to, at any depth) copies that table for the session (:meth:`TableRoot.own`),
and every view of the table then reads and writes the copy.  A table a session only reads is
never copied, whatever its size; the tables it wrote are the only ones its state keeps.

Views return views for nested dicts and lists (so a nested write is seen too) and plain
values otherwise; :func:`stored` and :func:`json_default` give back plain data (answers are
encoded through them).  :func:`encode` / :func:`decode` keep a session's tables and API
attributes as JSON without losing what JSON cannot say (integer dict keys, tuples, sets,
dates): API-Bank's ``AddAgenda`` keys its table by ``int``.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Iterator, MutableMapping, MutableSequence
from typing import Any

#: the mark of a value :func:`encode` wrote as an object of its own
TAG = "__stm__"
#: the deepest value :func:`encode` writes (deeper: not encodable)
MAX_DEPTH = 200


class TableRoot:
    """One table of one environment: the shared data until the first write, then the environment's own copy."""

    __slots__ = ("name", "data", "owned")

    def __init__(self, name: str, data: Any, *, owned: bool = False) -> None:
        self.name = name
        self.data = data
        self.owned = owned

    def own(self) -> None:
        """Make the data this environment's own (a deep copy, once) before a write."""
        if not self.owned:
            self.data = copy.deepcopy(self.data)
            self.owned = True

    def node(self, path: tuple[Any, ...]) -> Any:
        node = self.data
        for key in path:
            node = node[key]
        return node

    def view(self) -> Any:
        """The table as API code sees it: a view for a dict or list, the value itself otherwise."""
        return wrap(self, (), self.data)


def wrap(root: TableRoot, path: tuple[Any, ...], value: Any) -> Any:
    if type(value) is dict:
        return DictView(root, path)
    if type(value) is list:
        return ListView(root, path)
    return value


def stored(value: Any) -> Any:
    """What a write puts in a table (and what a view is compared and joined as): plain data, copied out of any view."""
    if isinstance(value, (DictView, ListView)):
        return copy.deepcopy(value.target)
    if type(value) is dict:
        return {k: stored(v) for k, v in value.items()}
    if type(value) is list:
        return [stored(v) for v in value]
    if type(value) is tuple:
        return tuple(stored(v) for v in value)
    return value


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)``: a view is encoded as its data; anything else JSON cannot say as its text."""
    if isinstance(value, (DictView, ListView)):
        return value.target
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return str(value)


class _View:
    __slots__ = ("_root", "_path")

    def __init__(self, root: TableRoot, path: tuple[Any, ...]) -> None:
        self._root = root
        self._path = path

    @property
    def target(self) -> Any:
        """The node this view shows (the shared data or the environment's copy)."""
        return self._root.node(self._path)

    def _writable(self) -> Any:
        self._root.own()
        return self._root.node(self._path)

    def __eq__(self, other: object) -> bool:
        return bool(stored(self) == stored(other))

    __hash__ = None  # type: ignore[assignment]  # mutable, like dict and list

    def __repr__(self) -> str:
        return repr(self.target)

    def copy(self) -> Any:
        """A plain copy (a deep one: changing it never changes the table)."""
        return copy.deepcopy(self.target)

    def __copy__(self) -> Any:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copy.deepcopy(self.target, memo)


class DictView(_View, MutableMapping):
    """A dict of a table, as :class:`TableRoot` describes."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        return wrap(self._root, (*self._path, key), self.target[key])

    def __setitem__(self, key: Any, value: Any) -> None:
        self._writable()[key] = stored(value)

    def __delitem__(self, key: Any) -> None:
        del self._writable()[key]

    def __iter__(self) -> Iterator[Any]:
        # as a dict's iterator: a change of size meanwhile is a RuntimeError at the next step (also when
        # the change was the first write, which moved the view to the environment's copy)
        target = self.target
        size = len(target)
        for key in target:
            yield key
            if len(self.target) != size:
                raise RuntimeError("dictionary changed size during iteration")

    def __len__(self) -> int:
        return len(self.target)

    def __contains__(self, key: object) -> bool:
        return key in self.target

    def get(self, key: Any, default: Any = None) -> Any:
        target = self.target
        return wrap(self._root, (*self._path, key), target[key]) if key in target else default

    def pop(self, key: Any, *default: Any) -> Any:
        if key not in self.target:
            if default:
                return default[0]
            raise KeyError(key)
        return self._writable().pop(key)

    def popitem(self) -> tuple[Any, Any]:
        return self._writable().popitem()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self.target:
            self._writable()[key] = stored(default)
        return self[key]

    def __or__(self, other: Any) -> dict[Any, Any]:
        return {**stored(self), **stored(other)}


class ListView(_View, MutableSequence):
    """A list of a table, as :class:`TableRoot` describes."""

    __slots__ = ()

    def __getitem__(self, index: Any) -> Any:
        target = self.target
        if isinstance(index, slice):
            return copy.deepcopy(target[index])
        position = index + len(target) if isinstance(index, int) and index < 0 else index
        return wrap(self._root, (*self._path, position), target[index])

    def __setitem__(self, index: Any, value: Any) -> None:
        self._writable()[index] = stored(value)

    def __delitem__(self, index: Any) -> None:
        del self._writable()[index]

    def __len__(self) -> int:
        return len(self.target)

    def __iter__(self) -> Iterator[Any]:
        i = 0  # as a list's iterator: by position, so items added meanwhile are seen
        while i < len(self.target):
            yield wrap(self._root, (*self._path, i), self.target[i])
            i += 1

    def __contains__(self, value: object) -> bool:
        return stored(value) in self.target

    def insert(self, index: int, value: Any) -> None:
        self._writable().insert(index, stored(value))

    def append(self, value: Any) -> None:
        self._writable().append(stored(value))

    def pop(self, index: int = -1) -> Any:
        return self._writable().pop(index)

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._writable().sort(*args, **kwargs)

    def __add__(self, other: Any) -> list[Any]:
        return [*stored(self), *stored(other)]


# -- tagged JSON: a session's tables and attributes as JSON, types kept --------------------------


class NotEncodable(ValueError):
    """A value :func:`encode` cannot keep (an object of the API's own, a model, a file)."""


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON data that :func:`decode` turns back into an equal value of the same types."""
    if depth > MAX_DEPTH:
        raise NotEncodable("nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)) and type(value) in (int, float):
        return value
    if isinstance(value, (DictView, ListView)):
        return encode(value.target, depth)
    if type(value) in (dict, list, tuple, set, frozenset):
        return _encode_collection(value, depth)
    if type(value) in (datetime.datetime, datetime.date):
        return {TAG: type(value).__name__, "iso": value.isoformat()}
    raise NotEncodable(f"a {type(value).__name__} cannot be kept as JSON")


def _encode_collection(value: dict[Any, Any] | list[Any] | tuple[Any, ...] | set[Any] | frozenset[Any], depth: int) -> Any:
    """:func:`encode` of a dict, list, tuple, set or frozenset (of exactly that type)."""
    if type(value) is dict:
        if all(type(k) is str for k in value) and TAG not in value:
            return {k: encode(v, depth + 1) for k, v in value.items()}
        return {TAG: "dict", "items": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if type(value) is list:
        return [encode(v, depth + 1) for v in value]
    items = list(value) if type(value) is tuple else sorted(value, key=repr)
    return {TAG: type(value).__name__, "items": [encode(v, depth + 1) for v in items]}


def decode(value: Any) -> Any:
    """The value :func:`encode` wrote; data that is not :func:`encode`'s raises ``ValueError``."""
    if type(value) is list:
        return [decode(v) for v in value]
    if type(value) is not dict:
        return value
    tag = value.get(TAG)
    if tag is None:
        return {k: decode(v) for k, v in value.items()}
    if tag == "dict":
        return {_key(decode(k)): decode(v) for k, v in value["items"]}
    if tag in ("tuple", "set", "frozenset"):
        items = [decode(v) for v in value["items"]]
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "datetime":
        return datetime.datetime.fromisoformat(value["iso"])
    if tag == "date":
        return datetime.date.fromisoformat(value["iso"])
    raise ValueError(f"unknown kept value {tag!r}")


def _key(key: Any) -> Any:
    if isinstance(key, (list, dict, set)):
        raise ValueError("a kept dict key is not hashable")
    return key
