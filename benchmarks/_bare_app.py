"""The ceiling of the HTTP stack: a bare ASGI app on the server's own uvicorn, httptools and event loop.

It reads the request body and answers a fixed 1 KB JSON body; nothing else.  ``benchmarks/ceiling.py``
drives it and the server alternately.

    python benchmarks/_bare_app.py --port PORT
"""

from __future__ import annotations

import argparse

import uvicorn

ANSWER = ('{"error": "", "response": "' + "x" * 1000 + '"}').encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, http="httptools", log_level="warning")


if __name__ == "__main__":
    main()
