"""Crowds of misbehaving clients on real sockets (127.0.0.1 only), and a process's resident memory.

Used by the memory tests and ``benchmarks/hardening.py``.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MB, from ``/proc/<pid>/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def stalled_bodies(port: int, count: int, body_bytes: int = 1_048_576, *, source: str = "127.0.0.1",
                   path: str = "/virtual") -> list[socket.socket]:
    """``count`` connections, each sending ``POST <path>`` headers promising ``body_bytes`` and then all of the
    body but its last byte: requests stalled mid-body.  Refused ones may be answered or reset: never raises."""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {body_bytes}\r\n\r\n").encode()
    data = memoryview(b" " * (body_bytes - 1))
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(10)
        socks.append(sock)
        try:
            sock.bind((source, 0))
            sock.connect(("127.0.0.1", port))
            sock.sendall(head)
            sock.sendall(data)
        except OSError:
            pass  # refused at once and closed: fine
    return socks


def request_without_reading(port: int, count: int, body: bytes, *, rcvbuf: int = 16384) -> list[socket.socket]:
    """``count`` connections, each sending one ``POST /virtual`` of ``body`` and never reading the answer
    (a small receive buffer, so the kernel takes little of it)."""
    request = (f"POST /virtual HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
        socks.append(sock)
    return socks


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        try:
            sock.close()
        except OSError:
            pass


def peer_closed(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closed (or reset) ``sock`` within ``within_s`` (reading and dropping what it sends)."""
    deadline = time.monotonic() + within_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        sock.settimeout(left)
        try:
            if not sock.recv(1 << 20):
                return True
        except TimeoutError:
            return False
        except (ConnectionResetError, BrokenPipeError):
            return True


def crowd_of_requests(port: int, bodies_by_source: dict[str, list[bytes]]) -> list[socket.socket]:
    """One connection per request, from each source address (``127.0.0.x``: another client as the server sees
    it), each sending its ``POST /virtual`` at once; the answers are left unread until the sockets close."""
    socks = []
    for source, bodies in bodies_by_source.items():
        for body in bodies:
            sock = socket.socket()
            sock.settimeout(10)
            sock.bind((source, 0))
            sock.connect(("127.0.0.1", port))
            sock.sendall((f"POST /virtual HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
            socks.append(sock)
    return socks
