"""A small client for agent frameworks: tool calls inside one session of a running mirror server.

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
"""

from __future__ import annotations

import json
from typing import Any

import requests

__all__ = ["MirrorError", "Session"]


class MirrorError(RuntimeError):
    """The server could not be reached, did not answer in time, or refused the request."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


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
        base = url.rstrip("/")
        if base.endswith("/virtual"):
            base = base[: -len("/virtual")]
        self.url = base
        self.task = task
        self.id = session_id
        self.timeout = float(timeout)
        self.toolbench_key = toolbench_key
        self.delete_on_exit = delete_on_exit
        self._http = requests.Session()
        if token:
            self._http.headers["Authorization"] = f"Bearer {token}"

    # -- the session ------------------------------------------------------------------------------

    def start(self) -> Session:
        """Ask the server for a new session (done by ``with`` and by the first call when needed)."""
        if self.id is None:
            self.id = self._request("POST", "/sessions", json={"task": self.task})["id"]
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
        return self._request("POST", "/virtual", json=payload, headers={"X-STM-Session": str(self.id)})

    def trajectory(self) -> dict[str, Any]:
        """The session as the server keeps it: task, calls with answers and provenance, state."""
        self.start()
        return self._request("GET", f"/sessions/{requests.utils.quote(str(self.id), safe='')}")

    def delete(self) -> None:
        """Delete the session on the server."""
        if self.id is not None:
            self._request("DELETE", f"/sessions/{requests.utils.quote(str(self.id), safe='')}")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            if self.delete_on_exit:
                self.delete()
        finally:
            self.close()

    # -- HTTP -------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        where = f"{method} {self.url}{path}"
        try:
            response = self._http.request(method, self.url + path, timeout=self.timeout, **kwargs)
        except requests.Timeout:
            raise MirrorError(f"{where}: no answer within {self.timeout:g} s") from None
        except requests.ConnectionError as exc:
            raise MirrorError(f"{where}: cannot reach the server ({type(exc).__name__}); is it running?") from None
        except requests.RequestException as exc:
            raise MirrorError(f"{where}: {exc}") from None
        try:
            body = response.json()
        except ValueError:
            raise MirrorError(f"{where}: HTTP {response.status_code}, not JSON: {response.text[:200]!r}", response.status_code) from None
        if response.status_code != 200 and not (response.status_code == 201 and method == "POST"):
            detail = body.get("error") if isinstance(body, dict) else None
            raise MirrorError(f"{where}: HTTP {response.status_code}: {detail or body}", response.status_code)
        return body
