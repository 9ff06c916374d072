"""The HTTP server: the ASGI front, admission, the settings hand-off to workers."""
