"""The Python client against a real server: calls in a session, parsed answers, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from stabletoolbench_mirror.client import MirrorError, Session
from tests.helpers.live import free_port

TOOLS = """\
import time

def echo(tool_input, state):
    state["calls"] = state.get("calls", 0) + 1
    return {"input": tool_input, "calls": state["calls"]}

def nap(tool_input, state):
    time.sleep(tool_input["seconds"])
    return "awake"

TOOLS = {"Tools/Echo/Echo": echo, "Tools/Echo/Nap": nap}
"""


@pytest.fixture
def server(serve, settings_factory, tmp_path: Path):
    tools = tmp_path / "echo_tools.py"
    tools.write_text(TOOLS)
    return serve(settings_factory(local_tools=[str(tools)], auth_token="t0ken-for-tests"))


def test_calls_in_a_session_return_parsed_answers(server) -> None:
    with Session(server.url + "/virtual", task="say things", token="t0ken-for-tests") as s:
        assert s.id
        first = s.call("Tools", "Echo", "echo", category="not the category", tool="nor the tool", api=1)
        assert first == {"error": "", "response": '{"input": {"category": "not the category", "tool": "nor the tool", "api": 1}, "calls": 1}'}
        assert s.call("Tools", "Echo", "echo")["response"].endswith('"calls": 2}')
        trajectory = s.trajectory()
        assert trajectory["task"] == "say things" and len(trajectory["calls"]) == 2
        sid = s.id
    # the session is kept after the block, and can be continued
    with Session(server.url, session_id=sid, token="t0ken-for-tests", delete_on_exit=True) as s:
        assert s.call("Tools", "Echo", "echo")["response"].endswith('"calls": 3}')
    r = requests.get(f"{server.url}/sessions/{sid}", headers={"Authorization": "Bearer t0ken-for-tests"}, timeout=10)
    assert r.status_code == 404  # delete_on_exit


def test_errors_are_clear(server) -> None:
    with pytest.raises(MirrorError, match="HTTP 401") as info:
        Session(server.url).start()
    assert info.value.status == 401
    with pytest.raises(MirrorError, match="at most 128 characters") as info:
        Session(server.url, session_id="x" * 200, token="t0ken-for-tests").call("Tools", "Echo", "echo")
    assert info.value.status == 422
    with pytest.raises(MirrorError, match="HTTP 404.*no session"):
        Session(server.url, session_id="never-made", token="t0ken-for-tests").trajectory()
    with Session(server.url, token="t0ken-for-tests", timeout=0.5) as s:
        with pytest.raises(MirrorError, match=r"no answer within 0.5 s"):
            s.call("Tools", "Echo", "nap", seconds=2)


def test_an_unreachable_server_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(MirrorError, match="cannot reach the server"):
        with Session(url, task="t", timeout=2):
            pass
