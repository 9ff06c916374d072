"""The upstreams of model calls over an in-memory transport: which one answers a model, the key it gets, the
route, and how a failure to answer is told (no sockets)."""

from __future__ import annotations

import json

import pytest

from stabletoolbench_mirror.config import LLMConfig
from stabletoolbench_mirror.engine.model_calls import ModelServerFailed
from stabletoolbench_mirror.responders import http_transport as ht
from stabletoolbench_mirror.responders.model_servers import ModelServers
from tests.helpers import memory_transport as mt


def upstreams(handler, *configs: dict) -> ModelServers:  # type: ignore[no-untyped-def]
    return ModelServers(LLMConfig(upstreams=list(configs)), mt.MemoryTransport.factory(handler))


def ok(request: mt.Request) -> ht.Reply:
    return ht.Reply(200, {"content-type": "application/json"}, json.dumps({"choices": [], "seen": request.path}).encode())


def test_the_first_upstream_whose_pattern_matches_answers() -> None:
    ups = upstreams(ok, {"base_url": "http://a.test/v1", "models": ["gpt-4*"]}, {"base_url": "http://b.test/v1"})
    assert ups.for_model("gpt-4o").url == "http://a.test/v1"  # type: ignore[union-attr]
    assert ups.for_model("Qwen/Qwen2.5-7B").url == "http://b.test/v1"  # type: ignore[union-attr]
    only = upstreams(ok, {"base_url": "http://a.test/v1", "models": ["gpt-4*", "o1-?"]})
    assert only.for_model("claude") is None and only.for_model("o1-x") is not None


def test_the_key_is_the_variable_s_else_the_client_s(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[mt.Request] = []

    def record(request: mt.Request) -> ht.Reply:
        seen.append(request)
        return ok(request)

    monkeypatch.setenv("MIRROR_UNIT_KEY", "sk-from-the-environment-1234")
    ups = upstreams(record, {"base_url": "http://a.test/v1", "models": ["env*"], "api_key_env": "MIRROR_UNIT_KEY"},
                    {"base_url": "http://b.test/v1?api-version=7"})
    env, passed = ups.for_model("env-model"), ups.for_model("other")
    assert env is not None and passed is not None
    assert env.key("Bearer sk-client-key") == "sk-from-the-environment-1234"
    assert passed.key("Bearer sk-client-key") == "sk-client-key" and passed.key(None) is None and passed.key("Basic x") is None
    passed.complete({"model": "other", "messages": [], "stream": True, "stream_options": {}}, "sk-client-key", 5.0)
    sent = seen[-1]
    assert sent.path == "/v1/chat/completions?api-version=7" and sent.headers["authorization"] == "Bearer sk-client-key"
    assert json.loads(sent.body) == {"model": "other", "messages": []}  # asked whole: the stream is built from it
    monkeypatch.delenv("MIRROR_UNIT_KEY")
    assert env.key("Bearer sk-client-key") == "sk-client-key"  # the variable unset: doctor warns of this


@pytest.mark.parametrize(("raised", "status", "words"), [
    (ht.AnswerTimedOut("late"), 504, "llm.timeout_s"),
    (ht.ConnectFailed("refused"), 502, "cannot reach"),
    (ht.SendFailed("broken pipe"), 502, "cannot reach"),
    (ht.BrokenAnswer("cut off"), 502, "broken answer"),
])
def test_no_answer_is_told_with_a_status_and_the_setting(raised: Exception, status: int, words: str) -> None:
    def fail(request: mt.Request) -> ht.Reply:
        raise raised

    upstream = upstreams(fail, {"base_url": "http://a.test/v1"}).for_model("m")
    assert upstream is not None
    with pytest.raises(ModelServerFailed) as caught:
        upstream.complete({"model": "m", "messages": []}, None, 1.0)
    assert caught.value.status == status and words in str(caught.value)
