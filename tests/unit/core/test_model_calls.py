"""A recorded model call's name, key and streamed form (core/model_calls.py)."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stabletoolbench_mirror.core import model_calls as mc


def _digest(body: dict) -> str:
    return mc.canonical_digest(body)[0]


def test_key_order_spacing_and_transport_fields_never_change_the_digest() -> None:
    a = mc.parse_request(b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0.0}')
    b = mc.parse_request(b'{"temperature":0,"messages":[{"content":"x","role":"user"}],"model":"m","stream":true,'
                         b'"stream_options":{"include_usage":true},"user":"someone"}')
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest({**a, "temperature": 0.2})
    assert _digest(a) != _digest({**a, "seed": 1})
    assert mc.parse_request(b'{"n": 1e3, "t": 0.25, "big": 1e300}') == {"n": 1000, "t": 0.25, "big": 1e300}


def test_names_and_keys_round_trip() -> None:
    api = mc.model_api("Qwen/Qwen2.5-7B")
    assert api == "@model/Qwen/Qwen2.5-7B/chat_completions" and mc.model_endpoint(api) == ("Qwen/Qwen2.5-7B", "chat_completions")
    assert mc.model_of(api) == "Qwen/Qwen2.5-7B"
    assert mc.model_of("Data/t_for_Data/a") is None and mc.model_endpoint("Data/t_for_Data/a") is None
    key = mc.record_key("a" * 64, 3)
    assert mc.split_key(key) == ("a" * 64, 3)
    assert mc.split_key("{'a': 1}") is None and mc.split_key("abc#1") is None


def test_a_completion_streams_as_two_chunks_usage_and_done() -> None:
    completion = {"id": "c1", "created": 5, "model": "m-1", "system_fingerprint": "fp",
                  "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                      "role": "assistant", "content": None,
                      "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}],
                  "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
    events = list(mc.CHAT.events(completion, include_usage=True))
    assert events[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(e[len(b"data: "):]) for e in events[:-1]]
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 3
    first, last, usage = chunks
    assert first["choices"][0]["delta"]["tool_calls"][0]["index"] == 0 and first["choices"][0]["finish_reason"] is None
    assert last["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "tool_calls"}
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 4 and first["system_fingerprint"] == "fp"
    assert len(list(mc.CHAT.events(completion, include_usage=False))) == 3


def test_usage_is_read_defensively() -> None:
    assert mc.usage_of({"usage": {"prompt_tokens": 5, "completion_tokens": 2}}) == (5, 2)
    assert mc.usage_of({"usage": {"prompt_tokens": True, "completion_tokens": -1}}) == (0, 0)
    assert mc.usage_of({}) == (0, 0)


@pytest.mark.parametrize("text", ["x" * 8, "sk-0123456789"])
def test_an_echoed_key_is_masked_in_a_completion(text: str) -> None:
    from stabletoolbench_mirror.core.secrets import Redactor

    masked = Redactor([text]).data({"choices": [{"message": {"content": f"key={text} and {json.dumps(text)}"}}]})
    assert text not in json.dumps(masked)


def test_both_endpoints_name_their_apis_and_model_of_reads_either() -> None:
    for model in ("gpt-4o", "Qwen/Qwen2.5-7B", "foo/chat", "a/completions"):
        for endpoint in (mc.CHAT, mc.TEXT):
            assert mc.model_of(endpoint.api(model)) == model
    assert mc.TEXT.api("m") == "@model/m/completions" and mc.CHAT.api("m") == "@model/m/chat_completions"
    assert mc.model_of("@model/completions") is None and mc.model_of("@model//chat_completions") is None
    assert mc.ENDPOINTS["/v1/completions"] is mc.TEXT and mc.ENDPOINTS["/v1/chat/completions"] is mc.CHAT


def test_requests_and_answers_of_each_endpoint() -> None:
    assert mc.TEXT.request_problem({"model": "m", "prompt": "hi"}) is None
    assert mc.TEXT.request_problem({"model": "m", "prompt": ["a", "b"]}) is None
    assert "prompt" in (mc.TEXT.request_problem({"model": "m", "messages": []}) or "")
    assert "prompt" in (mc.TEXT.request_problem({"model": "m", "prompt": []}) or "")
    assert "messages" in (mc.CHAT.request_problem({"model": "m", "prompt": "x"}) or "")
    assert mc.TEXT.answer_problem({"choices": [{"text": "t"}]}) is None
    assert mc.CHAT.answer_problem({"choices": [{"message": {"content": "x"}}]}) is None
    for bad in ({"choices": []}, {"error": {"message": "x"}, "choices": [{"message": {}}]}, {"choices": [{"message": "hi"}]},
                {"choices": ["x"]}, [], {"choices": [{"text": "t"}]}):
        assert mc.CHAT.answer_problem(bad) is not None, bad
    assert mc.TEXT.answer_problem({"choices": [{"message": {"content": "x"}}]}) is not None


def test_a_text_completion_streams_as_text_chunks() -> None:
    completion = {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "t",
                  "choices": [{"index": 0, "text": "Thought: x", "logprobs": None, "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    events = list(mc.TEXT.events(completion, include_usage=True))
    chunks = [json.loads(e[len(b"data: "):]) for e in events[:-1]]
    assert events[-1] == b"data: [DONE]\n\n" and {c["object"] for c in chunks} == {"text_completion"}
    assert chunks[0]["choices"] == [{"index": 0, "text": "Thought: x", "logprobs": None, "finish_reason": None}]
    assert chunks[1]["choices"][0]["finish_reason"] == "stop" and chunks[1]["choices"][0]["text"] == ""
    assert chunks[2]["choices"] == [] and chunks[2]["usage"]["total_tokens"] == 5


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(_json, st.booleans(), st.integers(1, 8), st.integers(0, 4), st.integers(1, 4))
def test_json_in_pieces_is_json_dumps_text(value: object, sort_keys: bool, piece: int, small: int, batch: int) -> None:
    expected = json.dumps(value, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False)
    saved = mc.PIECE_CHARS, mc.SMALL_ITEMS, mc.BATCH_ITEMS
    mc.PIECE_CHARS, mc.SMALL_ITEMS, mc.BATCH_ITEMS = piece, small, batch  # every branch, on small values
    try:
        assert "".join(mc.json_parts(value, sort_keys)) == expected
    finally:
        mc.PIECE_CHARS, mc.SMALL_ITEMS, mc.BATCH_ITEMS = saved


def test_a_large_body_is_keyed_in_pieces_as_a_small_one_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mc, "PIECE_CHARS", 7)  # every string longer than 7 characters in pieces
    monkeypatch.setattr(mc, "SMALL_ITEMS", 1)
    body = mc.parse_request(json.dumps({"model": "m", "messages": [{"role": "user", "content": "x\u00e9\n\"\\\u2028" * 50}],
                                        "temperature": 0.0, "stream": True, "n": 1e300, "z": [{}, [], None]}).encode())
    digest, size = mc.canonical_digest(body)
    assert digest == hashlib.sha256(mc.canonical_request(body).encode()).hexdigest() and size == len(mc.canonical_request(body).encode("utf-8"))
    assert mc.json_bytes(body, large=True) == mc.json_bytes(body, large=False)
    with pytest.raises(UnicodeEncodeError):
        mc.canonical_digest({"model": "m", "prompt": "\ud800" * 20})
