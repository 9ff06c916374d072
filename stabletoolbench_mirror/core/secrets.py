"""One home for secrets: which values are secret, and how they are kept out of text and data.

A *secret* is a configured key (``auth_token``, ``real.toolbench_key``, ``real.rapidapi_key``,
``simulator.api_key``, the user, password or a query value of a configured URL such as ``store.url`` or
``llm.upstreams[].base_url``: :func:`url_secrets`) or the
``toolbench_key`` a request carries.  None may reach the store, a log line, ``/stats``, a snapshot or an export:

* :class:`Redactor` replaces every known secret value by :data:`MASK`, in text
  (:meth:`Redactor.text`) and in JSON-like data, object keys included
  (:meth:`Redactor.data`): the real API and simulator answers pass through it before they
  are recorded, so an endpoint that echoes its key (or its ``Authorization`` header) is
  recorded with ``***`` instead;
* :func:`mask_fields` masks the values of fields and headers named like secrets
  (``api_key``, ``Authorization``, ``X-RapidAPI-Key``, ...) in nested dicts;
* :func:`public_url` is a URL without user info, query or fragment (start-up summary, logs,
  record origins);
* :func:`public_settings` is the settings as data with all of these applied (what a snapshot
  manifest shows).

Values shorter than :data:`MIN_LENGTH` characters are not searched for in text (a key of
``"a"`` would mask every ``a``); they are still masked where a field names them.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit


class HasSecrets(Protocol):
    """What the settings offer here (``config.Settings``; ``core`` imports nothing above it)."""

    def secrets(self) -> list[str]:
        """Every secret value configured."""
        ...

    def model_dump(self, *, mode: str) -> dict[str, Any]: ...

MASK = "***"
MIN_LENGTH = 4
#: settings fields and request fields whose value is a secret
SECRET_FIELDS = frozenset({"auth_token", "toolbench_key", "rapidapi_key", "api_key"})
#: fields taken out of a call's ``tool_input`` before it is keyed, recorded or passed on (compared in
#: lower case): this server's own secrets.  ``api_key`` is not among them: it is a real parameter of
#: some RapidAPI tools (4 of the 2,490 reference docs), and a configured key's value is masked anyway
INPUT_SECRET_FIELDS = SECRET_FIELDS - {"api_key"}
#: words in a URL's query parameter names whose values are secrets (``api-key``, ``key``, ``access_token``, ``sig``, ...)
SECRET_QUERY_WORDS = ("key", "token", "secret", "pass", "auth", "sig", "credential")
#: HTTP headers that carry one (compared in lower case)
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-rapidapi-key", "toolbench_key", "api-key", "x-api-key"})


class Redactor:
    """Replaces known secret values by :data:`MASK` (longest first, so a key that contains another goes whole).

    A value is found as it is and also as an echo may encode it: JSON-escaped (any of its characters as
    ``\\uXXXX``, ``/`` as ``\\/``, with any number of backslashes, so JSON inside JSON too),
    percent-encoded (any of its characters as ``%XX``, either case), and base64 (standard or URL-safe,
    at any of the three offsets it can take inside a longer base64 text, e.g. ``Basic`` credentials).
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: tuple[str, ...] = ()
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        found = set(self._secrets) | {s for s in secrets if isinstance(s, str) and len(s) >= MIN_LENGTH}
        self._secrets = tuple(sorted(found, key=len, reverse=True))
        self._encoded: re.Pattern[str] | None = None  # built when first needed (plus() makes one per request)
        self._base64: tuple[str, ...] | None = None

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def plus(self, *extra: str) -> Redactor:
        """This redactor and ``extra`` (e.g. the ``toolbench_key`` of one request)."""
        more = [s for s in extra if s and len(s) >= MIN_LENGTH and s not in self._secrets]
        if not more:
            return self
        return Redactor(self._secrets + tuple(more))

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        if self._secrets and ("\\" in value or "%" in value):
            if self._encoded is None:
                self._encoded = _encoded_regex(self._secrets)
            value = self._encoded.sub(MASK, value)
        if self._base64 is None:
            self._base64 = tuple(sorted({b for s in self._secrets for b in _base64_forms(s)}, key=len, reverse=True))
        for form in self._base64:
            if form in value:
                value = value.replace(form, MASK)
        return value

    def data(self, value: Any) -> Any:
        """``value`` with every secret in its strings (and object keys) replaced; other values unchanged."""
        if not self._secrets:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.data(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.data(v) for v in value]
        return value


#: the shortest base64 text searched for: a shorter one would mask unrelated base64
_MIN_BASE64 = 8


def _hex_class(digit: str) -> str:
    return f"[{digit}{digit.upper()}]" if digit.isalpha() else digit


def _char_pattern(char: str) -> str:
    """``char`` as it is, JSON-escaped (any number of backslashes) or percent-encoded."""
    alternatives = [re.escape(char)]
    code = ord(char)
    if code < 0x10000:
        alternatives.append(r"\\+u" + "".join(_hex_class(d) for d in f"{code:04x}"))
    if char == "/":
        alternatives.append(r"\\+/")
    alternatives.append("".join("%" + "".join(_hex_class(d) for d in f"{b:02x}") for b in char.encode("utf-8")))
    return "(?:" + "|".join(alternatives) + ")"


@functools.lru_cache(maxsize=256)
def _encoded_pattern(secret: str) -> str:
    return "".join(_char_pattern(c) for c in secret)


def _encoded_regex(secrets: tuple[str, ...]) -> re.Pattern[str]:
    # the lookahead lets the engine skip, at one character test each, what cannot start a match
    starts = "".join(sorted({re.escape(s[0]) for s in secrets}))
    return re.compile(f"(?=[{starts}\\\\%])(?:" + "|".join(_encoded_pattern(s) for s in secrets) + ")")


@functools.lru_cache(maxsize=256)
def _base64_forms(secret: str) -> frozenset[str]:
    """The base64 text of ``secret`` that does not depend on its neighbours, at each offset mod 3."""
    raw = secret.encode("utf-8")
    forms = set()
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + raw).decode("ascii")
        # the characters made of the secret's bits only: from the first after the offset's bytes to the last whole one
        core = encoded[-(-8 * offset // 6): 8 * (offset + len(raw)) // 6]
        if len(core) >= _MIN_BASE64:
            forms |= {core, core.replace("+", "-").replace("/", "_")}
    return frozenset(forms)


def redactor_for(settings: HasSecrets) -> Redactor:
    return Redactor(settings.secrets())


def is_secret_name(name: str) -> bool:
    """Whether a field or header of this name holds a secret."""
    lowered = name.lower()
    return lowered in SECRET_FIELDS or lowered in SECRET_HEADERS


#: what every name of :data:`INPUT_SECRET_FIELDS` ends with (``_key``, ``_token``)
_INPUT_SECRET_ENDINGS = tuple(sorted({name[name.rindex("_"):] for name in INPUT_SECRET_FIELDS}))


def may_name_a_secret_field(text: str) -> bool:
    """Whether ``text`` (``str()`` of an input, or its JSON) could name one of :data:`INPUT_SECRET_FIELDS`.

    A cheap test before :func:`without_secret_fields` walks the input: ``False`` means it names none.
    """
    lowered = text.lower()
    return any(ending in lowered for ending in _INPUT_SECRET_ENDINGS)


def without_secret_fields(tool_input: Any) -> Any:
    """``tool_input`` without the :data:`INPUT_SECRET_FIELDS` of its objects, at any depth.

    The same value (not a copy) when it holds none, which is the usual case.  ``ValueError``
    when it holds one too deep to rebuild.
    """
    if not _holds_secret_field(tool_input):
        return tool_input
    try:
        return _drop_secret_fields(tool_input)
    except RecursionError:
        raise ValueError("a secret field nested too deep in tool_input") from None


def _holds_secret_field(value: Any) -> bool:
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            if any(isinstance(k, str) and k.lower() in INPUT_SECRET_FIELDS for k in item):
                return True
            todo.extend(v for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            todo.extend(v for v in item if isinstance(v, (dict, list)))
    return False


def _drop_secret_fields(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _drop_secret_fields(v) for k, v in value.items() if not (isinstance(k, str) and k.lower() in INPUT_SECRET_FIELDS)
        }
    if isinstance(value, list):
        return [_drop_secret_fields(v) for v in value]
    return value


def mask_fields(value: Any) -> Any:
    """Nested dicts with the value of each secret-named field or header masked (``None`` stays ``None``)."""
    if isinstance(value, Mapping):
        return {k: (MASK if v else v) if isinstance(k, str) and is_secret_name(k) else mask_fields(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_fields(v) for v in value]
    return value


def public_url(url: str, *, keep_path: bool = True) -> str:
    """``url`` without user info, query or fragment: what may be shown, logged or recorded as an origin.

    (A password or a key in a query string stays out; ``keep_path=False`` keeps ``scheme://host:port`` only.)
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = host + (f":{parts.port}" if parts.port is not None else "")
    except ValueError:
        return "<invalid URL>"
    return urlunsplit((parts.scheme, netloc, parts.path if keep_path else "", "", ""))


def public_settings(settings: HasSecrets) -> dict[str, Any]:
    """The settings as JSON data without any secret: secret fields masked, URLs public, key values removed."""
    redactor = redactor_for(settings)

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, str):
            return redactor.text(public_url(value) if "://" in value else value)
        return value

    return clean(mask_fields(settings.model_dump(mode="json")))


def url_secrets(url: str) -> list[str]:
    """The parts of ``url`` that are credentials: its password (or its user name when it has no password, as a
    token sent as the user is), and the value of each query parameter named like one (``?api-key=...``,
    ``?key=``, ``?access_token=``, ``?sig=``; :data:`SECRET_QUERY_WORDS`).  Nothing for a URL that cannot be read."""
    try:
        parts = urlsplit(url)
        found = [parts.password or ""] if parts.password else [parts.username or ""]
    except ValueError:
        return []
    found += [unquote(f) for f in found if "%" in f]
    found += [value for name, value in parse_qsl(parts.query) if any(word in name.lower() for word in SECRET_QUERY_WORDS)]
    return [f for f in found if f]
