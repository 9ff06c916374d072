"""The Python client of a running mirror server: ``/virtual``, ``/sessions``, through one pool of connections.

::

    from stabletoolbench_mirror.client import Session

    with Session("http://127.0.0.1:8080", task="Plan a meeting with Ana") as s:
        token = s.call("Tools", "Example Auth", "login", username="ana", password="pw")["response"]
        s.call("Tools", "Example Meetings", "add_meeting", token=token, name="x", date="2025-01-02")
        print(s.call("Tools", "Example Meetings", "query_meeting", token=token))
        print(s.trajectory()["calls"])

``call`` returns the parsed ``{"error", "response"}`` answer exactly as the server sent it
(an ``error`` text is the tool's answer, not an exception).  Problems reaching the server,
timeouts and HTTP errors raise :class:`MirrorError` with a clear message.

:class:`Client` is the layer below, the one every client of the server's API uses (``check --url``,
``apibank check --url``, :class:`Session`): any request, its :class:`Reply` as sent (status, body text,
headers), kept-alive connections shared by threads.  It sends through ``urllib3``'s pool, the HTTP
layer under ``requests``, without ``requests``' session on top: ``check --url`` sends every call of a
run through it, and on 127.0.0.1 (8 threads, 2 shared cores) a call cost the client 0.74-0.92 ms of CPU
through a ``requests`` session, 0.45-0.47 ms through ``urllib3`` (0.26-0.29 ms through the standard
library's connections ``check`` kept before).  Proxies named in the environment are not used:
the server is usually on this host, as the check commands always assumed.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import urllib3

__all__ = ["Client", "MirrorError", "Reply", "Session"]


class MirrorError(RuntimeError):
    """The server could not be reached, did not answer in time, or refused the request."""

    def __init__(self, message: str, status: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason or message
        """Why, in the words of the layer that failed (``[Errno 111] Connection refused``, ``timed out``)."""


@dataclass(frozen=True)
class Reply:
    """What the server answered: the HTTP status, the body as text, the headers."""

    status: int
    body: str
    headers: Mapping[str, str]


class Client:
    """A mirror server at ``url`` (``http(s)://host:port[/prefix]``; a trailing ``/virtual`` is accepted).

    ``token`` is the server's bearer token when it has one; ``timeout`` bounds each request in seconds
    (connect and read); ``connections`` is how many kept-alive connections threads may share.
    """

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 60.0, connections: int = 10) -> None:
        base = url.rstrip("/")
        self.url = base[: -len("/virtual")] if base.endswith("/virtual") else base
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise MirrorError(f"{url!r} is not http://HOST:PORT or https://HOST:PORT")
        self.timeout = float(timeout)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._prefix = parts.path
        # no redirects followed, no tries again but the one ``again`` asks for
        self._pool = urllib3.connection_from_url(self.url, maxsize=max(1, connections), retries=False, timeout=self.timeout)

    def request(self, method: str, path: str, payload: Any = None, headers: Mapping[str, str] | None = None, *,
                again: bool = False) -> Reply:
        """``method`` on ``path`` with ``payload`` as its JSON body; ``again``: once more on a new connection
        if the kept-alive one failed (only for a request that may be sent twice)."""
        where = f"{method} {self.url}{path}"
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        sent = {**self._headers, **({"Content-Type": "application/json"} if data is not None else {}), **(headers or {})}
        for attempt in (0, 1):
            try:
                response = self._pool.request(method, self._prefix + path, body=data, headers=sent)
                return Reply(response.status, response.data.decode("utf-8", "replace"), response.headers)
            except (urllib3.exceptions.ProtocolError, urllib3.exceptions.NewConnectionError) as exc:  # (before its base)
                if attempt or not again:
                    reason = str(exc.__cause__ or exc.args[-1])  # the socket's words under urllib3's
                    raise MirrorError(f"{where}: cannot reach the server ({reason}); is it running?", reason=reason) from None
            except urllib3.exceptions.TimeoutError:
                raise MirrorError(f"{where}: no answer within {self.timeout:g} s", reason="timed out") from None
            except urllib3.exceptions.HTTPError as exc:
                raise MirrorError(f"{where}: {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def call(self, payload: Mapping[str, Any], *, session: str | None = None, faults: bool = True) -> Reply:
        """``POST /virtual``, in ``session`` if given; ``faults=False`` asks the server to leave its faults out."""
        headers = {"toolbench_key": str(payload.get("toolbench_key", ""))}
        if session is not None:
            headers["X-STM-Session"] = session
        if not faults:
            headers["X-STM-Faults"] = "off"
        return self.request("POST", "/virtual", payload, headers, again=session is None)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def session_path(session_id: str) -> str:
    return f"/sessions/{urllib.parse.quote(session_id, safe='')}"


class Session:
    """One session on a mirror server (``POST /sessions``), and tool calls made in it.

    ``url`` is the server's base URL (``http://host:port``; a trailing ``/virtual`` is
    accepted).  ``session_id`` continues an existing session instead of starting one.
    ``timeout`` bounds each request in seconds (connect and read).  ``token`` is the
    server's bearer token when it has one; ``toolbench_key`` is sent with every call.
    ``delete_on_exit`` deletes the session when the ``with`` block ends (by default it is
    kept, for ``GET /sessions/{id}`` and ``sessions export``).
    """

    def __init__(
        self,
        url: str,
        task: str = "",
        *,
        session_id: str | None = None,
        timeout: float = 60.0,
        token: str | None = None,
        toolbench_key: str = "",
        delete_on_exit: bool = False,
    ) -> None:
        self.client = Client(url, token=token, timeout=timeout)
        self.url, self.timeout = self.client.url, self.client.timeout
        self.task = task
        self.id = session_id
        self.toolbench_key = toolbench_key
        self.delete_on_exit = delete_on_exit

    def start(self) -> Session:
        """Ask the server for a new session (done by ``with`` and by the first call when needed)."""
        if self.id is None:
            self.id = self._json(self.client.request("POST", "/sessions", {"task": self.task}), "POST /sessions")["id"]
        return self

    def call(self, category: str, tool: str, api: str, /, **inputs: Any) -> Any:
        """Call one API of a tool inside this session; the parsed ``{"error", "response"}`` answer."""
        self.start()
        payload = {
            "category": category,
            "tool_name": tool,
            "api_name": api,
            "tool_input": json.dumps(inputs, ensure_ascii=False),
            "strip": "",
            "toolbench_key": self.toolbench_key,
        }
        return self._json(self.client.call(payload, session=str(self.id)), "POST /virtual")

    def trajectory(self) -> dict[str, Any]:
        """The session as the server keeps it: task, calls with answers and provenance, state."""
        self.start()
        path = session_path(str(self.id))
        return self._json(self.client.request("GET", path), f"GET {path}")

    def delete(self) -> None:
        """Delete the session on the server."""
        if self.id is not None:
            path = session_path(str(self.id))
            self._json(self.client.request("DELETE", path), f"DELETE {path}")

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            if self.delete_on_exit:
                self.delete()
        finally:
            self.close()

    def _json(self, reply: Reply, request: str) -> Any:
        method, _, path = request.partition(" ")
        where = f"{method} {self.url}{path}"
        try:
            body = json.loads(reply.body)
        except ValueError:
            raise MirrorError(f"{where}: HTTP {reply.status}, not JSON: {reply.body[:200]!r}", reply.status) from None
        if reply.status != 200 and not (reply.status == 201 and method == "POST"):
            detail = body.get("error") if isinstance(body, dict) else None
            raise MirrorError(f"{where}: HTTP {reply.status}: {detail or body}", reply.status)
        return body
