"""A live stdio server's lines, bounded as they stream (responders.mcp_live.stdio): an endless line is never held."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("mcp")

from stabletoolbench_mirror.responders.mcp_live.stdio import _Lines  # noqa: E402


def _answer(request_id: object, text: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": text}]}}).encode() + b"\n"


def test_lines_split_across_chunks_are_parsed_and_blank_lines_skipped() -> None:
    lines = _Lines(1000)
    data = _answer(1, "a") + b"\n" + _answer("x", "b")
    out = [m for i in range(0, len(data), 7) for m in lines.feed(data[i:i + 7])]
    assert [m.message.id for m in out] == [1, "x"]


def test_a_line_past_the_bound_is_dropped_as_it_streams_and_its_request_gets_an_error() -> None:
    lines = _Lines(10_000)
    out = lines.feed(b'{"jsonrpc":"2.0",')  # the id comes in the chunk that takes the line past the bound
    out += lines.feed(b'"id":7,"result":{"content":[{"type":"text","text":"' + b"g" * 20_000)
    for _ in range(2_000):  # 128 MB of one line, 64 KiB at a time
        out += lines.feed(b"g" * 65536)
        assert len(lines.line) <= 10_000  # never more than the bound held
    out += lines.feed(b'"}]}}\n' + _answer(8, "next"))
    error, following = out
    assert error.message.id == 7 and "over 10000 bytes" in error.message.error.message
    assert following.message.id == 8  # the next line is read as usual


def test_a_line_too_long_without_an_id_is_left_out_and_garbage_is_an_error_value() -> None:
    lines = _Lines(100)
    assert lines.feed(b"x" * 500 + b"\n") == []
    [bad] = lines.feed(b"{not json\n")
    assert isinstance(bad, ValueError)
