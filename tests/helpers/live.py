"""Real servers on 127.0.0.1 for tests: the mirror app in a uvicorn thread, a folder's files over HTTP, free ports, and
the two ASGI steps every scripted server of the tests takes (read a whole body, send a JSON answer).

:func:`free_port` is written here because no library picks a port the way parallel tests need (``portpicker`` and
``bind(0)`` hand out the kernel's ephemeral ports, which outgoing connections also take)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import requests
import uvicorn


async def read_body(receive: Any) -> bytes:
    """An ASGI request's whole body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def send_json(send: Any, status: int, data: Any, extra_headers: tuple[tuple[str, str], ...] = ()) -> None:
    """``data`` as a JSON answer with its length (and ``extra_headers``, names lower-cased)."""
    payload = json.dumps(data).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra_headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve_http(handler: Any) -> Iterator[str]:
    """An ``http.server`` request handler served on 127.0.0.1 (Python's threading server, in a thread): its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def serve_folder(folder: Path) -> contextlib.AbstractContextManager[str]:
    """``folder``'s files served over HTTP on 127.0.0.1 (Python's own file server): its base URL."""
    return serve_http(functools.partial(_QuietFiles, directory=str(folder)))


def _first_ephemeral_port() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_FIRST_EPHEMERAL = _first_ephemeral_port()
_PICK = random.Random()  # its own generator: hypothesis seeds the module's during its tests


def free_port() -> int:
    """A port free on 127.0.0.1 now, drawn at random below the kernel's ephemeral range: a port a test picks and then
    hands to a server can then not be taken meanwhile by a client's outgoing connection (pytest-xdist runs four
    test processes and their clients side by side), and two processes drawing at once rarely draw the same."""
    while True:
        port = _PICK.randrange(10000, _FIRST_EPHEMERAL)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


class UvicornThread:
    """Runs an ASGI app with uvicorn on 127.0.0.1 in a background thread."""

    def __init__(self, app: Any, port: int | None = None, *, lifespan: str = "on", force_exit: bool = False, **uvicorn_options: Any) -> None:
        """``force_exit`` abandons open connections on exit (scripted servers that hang on purpose)."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.force_exit = force_exit
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan=lifespan, timeout_graceful_shutdown=1, **uvicorn_options
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> UvicornThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.server.force_exit = self.force_exit
        self.thread.join(timeout=20)

    def post(self, payload: Any, **kwargs: Any) -> requests.Response:
        return requests.post(self.url + "/virtual", json=payload, timeout=30, **kwargs)


class ScriptedApp:
    """A test's own ASGI app (``__call__``) run as a real server on 127.0.0.1, at ``port``, inside a ``with`` block."""

    port: int
    _runner: UvicornThread | None = None

    def __enter__(self) -> Self:
        self._runner = UvicornThread(self, self.port, lifespan="off", force_exit=True).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            self._runner.__exit__(*exc)
            self._runner = None

