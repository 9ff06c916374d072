"""Direct RapidAPI calls, built from the tool doc alone.

ToolBench's own server imports each tool's generated ``api.py`` and calls it with
the request's input; nothing of that code is imported, executed or evaluated
here.  The HTTP request is derived from an API doc entry (``url``, ``method``,
``required_parameters``, ``optional_parameters``, and the tool's ``host``):

* ``{name}`` placeholders in the URL path are filled (percent-encoded) from the arguments;
* the other arguments go to the query string (GET, DELETE, HEAD, OPTIONS) or a JSON body
  (POST, PUT, PATCH);
* headers ``X-RapidAPI-Key`` (the configured key) and ``X-RapidAPI-Host`` (the doc's
  ``host``, else the URL's host);
* ``base_url`` replaces the doc URL's scheme and host (tests, proxies).

The agent sees parameter names standardised (``id`` -> ``is_id``, ``Page-Size`` ->
``page_size``); they are mapped back to the doc's names.  A JSON answer is kept as
returned (the parsed value), any other answer as text.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, quote, urlsplit, urlunsplit

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.core.naming import parameter_name
from stabletoolbench_mirror.core.secrets import public_url
from stabletoolbench_mirror.responders.real.responder import Fetched
from stabletoolbench_mirror.responders.real.transport import Reply, Transport
from stabletoolbench_mirror.upstream.tooldocs import ToolDocs

QUERY_METHODS = frozenset({"GET", "DELETE", "HEAD", "OPTIONS"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_PLACEHOLDER = re.compile(r"\{([^{}/]+)\}")

#: finds the API doc entry of a call (``None`` when there is none)
log = logging.getLogger(__name__)
DocFinder = Callable[[ToolCall], Mapping[str, Any] | None]


def exact_doc_finder(docs: ToolDocs) -> DocFinder:
    """Finds a call's API entry in the shared registry, refusing fuzzy matches.

    A real call spends the user's key: a name that only resembles a documented API must not
    send it to a different API.
    """

    def find(call: ToolCall) -> Mapping[str, Any] | None:
        doc = docs.find(call.names)
        if doc is None:
            return None
        if doc.fuzzy:
            log.info("rapidapi: %s only matches the doc of %s/%s fuzzily; no real call", clip(call.api), doc.tool_name, doc.name)
            return None
        return doc.as_api_entry()

    return find


class RequestBuildError(ValueError):
    """The doc and the arguments do not make an HTTP request (the message names no secret)."""


@dataclass(frozen=True)
class PreparedRequest:
    """One direct call, ready to send; it holds no key."""

    method: str
    url: str
    """Scheme, host and the filled-in path (plus any query the doc's URL has)."""
    rapidapi_host: str
    query: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] | None = None

    @property
    def origin(self) -> str:
        """``scheme://host[:port]`` of the target: what an answer's provenance records."""
        return public_url(self.url, keep_path=False)

    def headers(self, rapidapi_key: str) -> dict[str, str]:
        headers = {"X-RapidAPI-Host": self.rapidapi_host, "accept": "application/json"}
        if rapidapi_key:
            headers["X-RapidAPI-Key"] = rapidapi_key
        return headers


def doc_parameter_names(api_doc: Mapping[str, Any]) -> list[str]:
    """The doc's parameter names, required ones first."""
    names: list[str] = []
    for group in ("required_parameters", "optional_parameters"):
        for param in api_doc.get(group) or []:
            name = param.get("name") if isinstance(param, Mapping) else None
            if isinstance(name, str) and name and name not in names:
                names.append(name)
    return names


def map_arguments(api_doc: Mapping[str, Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` keyed by the doc's parameter names.

    An argument named as the agent saw the parameter (``parameter_name(doc name)``) or
    by the doc's own name maps to the doc name; any other argument is kept as given.
    """
    doc_names = doc_parameter_names(api_doc)
    by_shown_name: dict[str, str] = {}
    for name in doc_names:
        by_shown_name.setdefault(parameter_name(name), name)
    mapped: dict[str, Any] = {}
    for key, value in arguments.items():
        key = str(key)
        target = key if key in doc_names else by_shown_name.get(key, key)
        if target in mapped and key != target:
            continue  # the doc's exact name wins over a standardised alias
        mapped[target] = value
    return mapped


def build_request(api_doc: Mapping[str, Any], arguments: Any, *, base_url: str | None = None) -> PreparedRequest:
    """The HTTP request of a call to the API described by ``api_doc``."""
    parts, method = _url_and_method(api_doc)
    if not isinstance(arguments, Mapping):
        raise RequestBuildError("the tool input is not a JSON object")
    values = map_arguments(api_doc, arguments)
    path = _fill_path(parts.path, values)
    target = _target(parts, path, base_url)
    host = api_doc.get("host")
    rapidapi_host = host if isinstance(host, str) and host else parts.netloc

    present = {k: v for k, v in values.items() if v is not None}
    if method in BODY_METHODS:
        return PreparedRequest(method, target, rapidapi_host, body=present)
    return PreparedRequest(method, target, rapidapi_host, query={k: _query_value(v) for k, v in present.items()})


def _url_and_method(api_doc: Mapping[str, Any]) -> tuple[SplitResult, str]:
    url = api_doc.get("url")
    if not isinstance(url, str) or not url:
        raise RequestBuildError("the API doc has no url")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RequestBuildError("the API doc's url is not an http(s) URL")
    method = str(api_doc.get("method") or "GET").upper()
    if method not in QUERY_METHODS | BODY_METHODS:
        raise RequestBuildError(f"unsupported method {method!r}")
    return parts, method


def _fill_path(path: str, values: dict[str, Any]) -> str:
    """``path`` with its ``{name}`` placeholders filled (and taken out of ``values``)."""
    for name in _PLACEHOLDER.findall(path):
        key = name if name in values else parameter_name(name) if parameter_name(name) in values else None
        if key is None or values[key] is None:
            raise RequestBuildError(f"missing path parameter {name!r}")
        path = path.replace("{" + name + "}", quote(_text(values.pop(key)), safe=""))
    return path


def _target(parts: SplitResult, path: str, base_url: str | None) -> str:
    if not base_url:
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
    base = urlsplit(base_url)
    if base.scheme not in ("http", "https") or not base.hostname:
        raise RequestBuildError("real.rapidapi_base_url is not an http(s) URL")
    return urlunsplit((base.scheme, base.netloc, base.path.rstrip("/") + path, parts.query, ""))


def answer_from_reply(reply: Reply) -> tuple[Any | None, str]:
    """The ``{"error", "response"}`` answer of a host's reply, or ``(None, why)``."""
    if not reply.ok:
        return None, reply.failure
    if not 200 <= reply.status < 300:
        return None, f"HTTP {reply.status}"
    try:
        value: Any = json.loads(reply.content) if reply.content.strip() else reply.text()
    except (ValueError, RecursionError):
        value = reply.text()
    return {"error": "", "response": value}, ""


class RapidAPIBackend:
    """Calls RapidAPI hosts directly with the user's key."""

    def __init__(
        self, transport: Transport, find_doc: DocFinder, rapidapi_key: str = "", base_url: str | None = None
    ) -> None:
        self.transport = transport
        self.find_doc = find_doc
        self.rapidapi_key = rapidapi_key
        self.base_url = base_url
        self.origin = public_url(base_url, keep_path=False) if base_url else "rapidapi"

    def fetch(self, call: ToolCall) -> Fetched:
        doc = self.find_doc(call)
        if doc is None:
            return Fetched(None, self.origin, "rapidapi: no tool doc for this API")
        try:
            prepared = build_request(doc, call.tool_input, base_url=self.base_url)
        except RequestBuildError as exc:
            return Fetched(None, self.origin, f"rapidapi: {exc}")
        reply = self.transport.send(
            prepared.method,
            prepared.url,
            headers=prepared.headers(self.rapidapi_key),
            params=prepared.query or None,
            json_body=prepared.body,
        )
        answer, why = answer_from_reply(reply)
        if answer is None:
            return Fetched(None, prepared.origin, f"rapidapi: {why}")
        return Fetched(answer, prepared.origin)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


def _query_value(value: Any) -> Any:
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        return [str(v) for v in value]  # repeated keys
    return _text(value)
