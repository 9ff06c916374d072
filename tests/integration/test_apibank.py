"""API-Bank as an environment: its APIs served as local tools, per-session state, typed inputs, ``check --apibank``.

The tests over API-Bank itself read ``../shared/reference/apibank`` (they skip when it is absent); the
others build a small API-Bank-shaped folder of their own (its code written here, not API-Bank's).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.apibank import build_apibank_tools, load_suites
from stabletoolbench_mirror.apibank.tools import state_key
from stabletoolbench_mirror.config import ConfigError
from stabletoolbench_mirror.factory import build_layer, build_tool_docs
from tests.helpers.openai_stub import OpenAIStub, Reply
from tests.helpers.paths import REPO
from tests.helpers.payloads import answer_payload
from tests.helpers.processes import ServeProcess

APIBANK = REPO.parent / "shared" / "reference" / "apibank"
LEVEL1 = APIBANK / "lv1-lv2-samples" / "level-1-given-desc"


@pytest.fixture(scope="module")
def apibank() -> Path:
    if not (APIBANK / "apis").is_dir():
        pytest.skip(f"API-Bank's reference copy not found at {APIBANK}")
    return APIBANK


def payload(api: str, tool: str = "API-Bank", **inputs: Any) -> dict[str, Any]:
    return {"category": "APIBank", "tool_name": tool, "api_name": api, "tool_input": json.dumps(inputs), "strip": "", "toolbench_key": ""}


def result_of(outcome_body: str) -> Any:
    body = json.loads(outcome_body)
    assert body["error"] == "", body
    return json.loads(body["response"])


class Client:
    """The layer in-process, a session at a time (what the server's routes call)."""

    def __init__(self, layer) -> None:
        self.layer = layer

    def session(self, task: str = "") -> str:
        return self.layer.sessions.create(task)["id"]

    def call(self, session: str | None, api: str, tool: str = "API-Bank", **inputs: Any) -> Any:
        call = self.layer.prepare(payload(api, tool, **inputs))
        outcome = self.layer.handle_call(call, session)
        assert outcome.status == 200, outcome.body
        return result_of(outcome.body)

    def state(self, session: str) -> dict[str, Any]:
        return self.layer.sessions.get(session)["state"]


# -- a small API-Bank-shaped folder -------------------------------------------------------------

BASE = '''
class API:
    def check_api_call_correctness(self, response, groundtruth):
        return response == groundtruth
'''

APIS = {
    "read_big.py": '''
        from apis.api import API

        class ReadBig(API):
            description = "Reads one row of a big table."
            input_parameters = {"key": {"type": "str", "description": "The row."}}
            output_parameters = {"value": {"type": "str", "description": "Its value."}}
            database_name = "Big"

            def __init__(self, init_database=None):
                self.database = init_database

            def call(self, key):
                return {"api_name": "ReadBig", "input": {"key": key}, "output": self.database[key]["value"], "exception": None}
    ''',
    "add_note.py": '''
        import random
        from apis import API

        class AddNote(API):
            description = "Adds a note and gives it a random id."
            input_parameters = {"text": {"type": "str", "description": "The note."}, "pinned": {"type": "bool", "description": "Pinned."}}
            output_parameters = {"id": {"type": "str", "description": "The note's id."}}
            database_name = "Notes"

            def __init__(self, init_database=None):
                self.database = init_database
                self.added = 0

            def call(self, text, pinned=False):
                note_id = "".join(random.choices("abcdef0123456789", k=12))
                self.database[len(self.database) + 1] = {"id": note_id, "text": text, "pinned": pinned}
                self.added += 1
                return {"api_name": "AddNote", "input": {"text": text, "pinned": pinned}, "output": {"id": note_id, "added": self.added}, "exception": None}
    ''',
    "count_notes.py": '''
        from apis.api import API

        class CountNotes(API):
            description = "Counts the notes."
            input_parameters = {}
            output_parameters = {"count": {"type": "int", "description": "How many."}}
            database_name = "Notes"

            def __init__(self, init_database=None):
                self.database = init_database

            def call(self):
                return {"api_name": "CountNotes", "input": {}, "output": len(self.database), "exception": None}
    ''',
    "web_lookup.py": '''
        import requests
        from apis.api import API

        class WebLookup(API):
            description = "Looks a word up on the web."
            input_parameters = {"word": {"type": "str", "description": "The word."}}
            output_parameters = {"meaning": {"type": "str", "description": "Its meaning."}}

            def call(self, word):
                raise AssertionError("never run here: it needs the internet")
    ''',
}

LV3 = {
    "count_notes.py": '''
        from lv3_apis.api import API

        class CountNotes(API):
            description = "Level-3's own CountNotes (the same class name)."
            input_parameters = {}
            output_parameters = {"count": {"type": "str", "description": "A word."}}

            def call(self):
                return {"api_name": "CountNotes", "input": {}, "output": "level-3", "exception": None}
    ''',
}


def make_bank(root: Path, *, big_rows: int = 20_000) -> Path:
    for folder, files in (("apis", APIS), ("lv3_apis", LV3)):
        (root / folder).mkdir(parents=True)
        (root / folder / "api.py").write_text(BASE)
        for name, code in files.items():
            (root / folder / name).write_text(textwrap.dedent(code))
    (root / "init_database").mkdir()
    big = {f"k{i}": {"value": f"v{i}", "pad": "x" * 200} for i in range(big_rows)}  # about 4.6 MB
    (root / "init_database" / "Big.json").write_text(json.dumps(big))
    (root / "init_database" / "Notes.json").write_text(json.dumps({}))
    return root


def bank_settings(settings_factory, root: Path, **apibank: Any):
    return settings_factory(apibank={"path": str(root), **apibank})


# -- 1: the API classes become local tools, with tool docs ---------------------------------------


def test_the_reference_apis_become_tools_with_docs_and_the_remote_ones_are_listed(apibank: Path, settings_factory) -> None:
    settings = bank_settings(settings_factory, apibank)
    (suite,) = load_suites(settings)
    assert len(suite.apis) == 53 and "AddAgenda" in suite.local and "CheckToken" in suite.local
    assert {"Dictionary", "Translate", "ToolSearcher"} <= set(suite.remote)  # the internet, a model
    tools = build_apibank_tools(settings)
    assert "APIBank/api_bank_for_APIBank/addagenda" in tools.tools
    assert "APIBank/api_bank_for_APIBank/dictionary" not in tools.tools  # the miss path
    docs = build_tool_docs(settings)
    assert docs is not None
    doc = docs.find_by_names("APIBank", "api_bank", "forgotpassword")
    assert doc is not None and doc.tool_name == "API-Bank" and doc.name == "ForgotPassword"
    assert [p["name"] for p in doc.required_parameters] == ["status"]
    assert {p["name"] for p in doc.optional_parameters} == {"username", "email", "verification_code", "new_password"}
    translate = docs.find_by_names("APIBank", "api_bank", "translate")  # not importable here, documented from its source
    assert translate is not None and "translat" in translate.description.lower()
    assert [category for category, _stem, _doc in docs.tools()] == ["APIBank"]


def test_level3_apis_get_their_own_tool_so_class_names_do_not_clash(tmp_path: Path, settings_factory) -> None:
    root = make_bank(tmp_path / "api-bank")
    client = Client(build_layer(bank_settings(settings_factory, root, level3=True), responders=[]))
    assert client.call(None, "CountNotes")["output"] == 0
    assert client.call(None, "CountNotes", tool="API-Bank Level-3")["output"] == "level-3"
    docs = build_tool_docs(bank_settings(settings_factory, root, level3=True))
    assert docs is not None and docs.find_by_names("APIBank", "api_bank_level_3", "countnotes") is not None


def test_remote_and_local_override_the_guess_and_unknown_names_are_refused(tmp_path: Path, settings_factory) -> None:
    root = make_bank(tmp_path / "bank")
    tools = build_apibank_tools(bank_settings(settings_factory, root, remote=["CountNotes"], local=["WebLookup"]))
    assert "APIBank/api_bank_for_APIBank/weblookup" in tools.tools
    assert "APIBank/api_bank_for_APIBank/countnotes" not in tools.tools
    with pytest.raises(ConfigError, match="apibank.remote/apibank.local: no API named Nope"):
        build_apibank_tools(bank_settings(settings_factory, root, remote=["Nope"]))


def test_a_folder_that_is_not_api_bank_stops_the_start_naming_the_key(tmp_path: Path, settings_factory) -> None:
    with pytest.raises(ConfigError, match=r"apibank.path: .* has no apis/ folder"):
        build_layer(bank_settings(settings_factory, tmp_path), responders=[])


# -- 2: a per-session environment ----------------------------------------------------------------


def test_tables_are_shared_between_apis_and_kept_per_session(tmp_path: Path, settings_factory) -> None:
    client = Client(build_layer(bank_settings(settings_factory, make_bank(tmp_path / "bank")), responders=[]))
    a, b = client.session("notes a"), client.session("notes b")
    client.call(a, "AddNote", text="one")
    second = client.call(a, "AddNote", text="two")
    assert second["output"]["added"] == 2  # the instance (and its attribute) was kept
    assert client.call(a, "CountNotes")["output"] == 2  # AddNote's table is CountNotes' too
    assert client.call(b, "CountNotes")["output"] == 0  # another session: its own tables
    assert client.call(None, "CountNotes")["output"] == 0  # outside a session: init_database every call
    state = client.state(a)[state_key(load_suites(bank_settings(settings_factory, tmp_path / "bank"))[0])]
    assert set(state["tables"]) == {"Notes"}  # only the table it wrote
    assert state["attrs"] == {"AddNote": {"added": "2"}}


def test_a_call_copies_no_unchanged_table_whatever_its_size(tmp_path: Path, settings_factory) -> None:
    settings = bank_settings(settings_factory, make_bank(tmp_path / "bank"))
    layer = build_layer(settings, responders=[])
    client = Client(layer)
    sid = client.session("big")
    for i in range(20):
        assert client.call(sid, "ReadBig", key=f"k{i}")["output"] == f"v{i}"
    client.call(sid, "AddNote", text="x")
    env = layer.local_tools.live("apis", sid)
    assert not env.roots["Big"].owned and env.roots["Big"].data is env.suite.tables["Big"]
    assert env.roots["Notes"].owned and env.roots["Notes"].data is not env.suite.tables["Notes"]
    kept = json.dumps(client.state(sid))
    assert len(kept) < 2_000, "the session keeps the table it wrote, never the 4.6 MB one it read"


def test_the_same_task_gives_the_same_ids_and_another_worker_rebuilds_the_session(tmp_path: Path, settings_factory) -> None:
    settings = bank_settings(settings_factory, make_bank(tmp_path / "bank"))
    first, second = Client(build_layer(settings, responders=[])), Client(build_layer(settings, responders=[]))
    a, b, c = first.session("dialogue 1"), first.session("dialogue 1"), first.session("dialogue 2")
    ids_a = [first.call(a, "AddNote", text=t)["output"]["id"] for t in "xyz"]
    ids_b = [first.call(b, "AddNote", text=t)["output"]["id"] for t in "xyz"]
    ids_c = [first.call(c, "AddNote", text=t)["output"]["id"] for t in "xyz"]
    assert ids_a == ids_b and ids_a != ids_c and len(set(ids_a)) == 3
    # another process (its own tools, nothing live) continues session a from its stored state
    d = first.session("dialogue 1")
    first.call(d, "AddNote", text="x")
    second.layer.sessions = first.layer.sessions  # the same session store, as workers share it
    resumed = second.call(d, "AddNote", text="y")
    assert resumed["output"] == {"id": ids_a[1], "added": 2}
    assert second.call(d, "CountNotes")["output"] == 2


def test_forgot_password_keeps_its_code_between_its_two_calls(apibank: Path, settings_factory) -> None:
    client = Client(build_layer(bank_settings(settings_factory, apibank), responders=[]))
    sid = client.session("reset")
    first = client.call(sid, "ForgotPassword", status="Forgot Password", username="foo", email="foo@example.com")
    assert first["exception"] is None, first
    done = client.call(sid, "ForgotPassword", status="Verification Code", verification_code=first["output"], new_password="n3w")
    assert done["output"] == "success"
    assert client.call(sid, "GetUserToken", username="foo", password="n3w")["exception"] is None
    assert client.call(client.session("other"), "GetUserToken", username="foo", password="n3w")["exception"] is not None


def test_a_session_moves_between_workers_with_its_state(tmp_path: Path) -> None:
    import requests

    config = {"store": {"path": str(tmp_path / "store")}, "apibank": {"path": str(make_bank(tmp_path / "bank"))}}
    with ServeProcess(tmp_path, config, workers=2) as server:
        sid = requests.post(server.url + "/sessions", json={"task": "workers"}, timeout=10).json()["id"]
        added = []
        for i in range(16):  # a new connection each call: the two workers take turns as they accept them
            body = requests.post(server.url + "/virtual", json=payload("AddNote", text=str(i)), headers={"X-STM-Session": sid, "Connection": "close"}, timeout=30)
            added.append(result_of(body.text)["output"]["added"])
        count = requests.post(server.url + "/virtual", json=payload("CountNotes"), headers={"X-STM-Session": sid}, timeout=30)
    assert added == list(range(1, 17)) and result_of(count.text)["output"] == 16


# -- 3: inputs typed from input_parameters --------------------------------------------------------


def test_inputs_are_typed_and_bad_ones_are_refused_changing_nothing(tmp_path: Path, settings_factory) -> None:
    client = Client(build_layer(bank_settings(settings_factory, make_bank(tmp_path / "bank")), responders=[]))
    sid = client.session("typed")
    assert client.call(sid, "AddNote", text="a", pinned=True)["input"]["pinned"] is True  # ToolManager: False
    assert client.call(sid, "AddNote", text="b", pinned="True")["input"]["pinned"] is True
    refused = client.call(sid, "AddNote", text="c", colour="red")
    assert refused["output"] is None and refused["exception"] == "invalid parameter name. parameter: colour"
    assert client.call(sid, "CountNotes")["output"] == 2


# -- 5: APIs that need the internet or a model take the miss path ---------------------------------


def test_an_api_that_needs_the_internet_is_answered_by_the_simulator_and_recorded(tmp_path: Path, settings_factory) -> None:
    answer = {"error": "", "response": '{"api_name": "WebLookup", "output": "a greeting"}'}
    with OpenAIStub(lambda body: Reply(content=json.dumps(answer))) as stub:
        settings = settings_factory(
            apibank={"path": str(make_bank(tmp_path / "bank"))},
            simulator={"enabled": True, "api_base": stub.api_base, "max_retries": 0},
        )
        layer = build_layer(settings)
        outcome = answer_payload(layer, payload("WebLookup", word="hello"))
        assert json.loads(outcome.body) == answer and outcome.source == "simulated"
        assert "Looks a word up on the web." in json.dumps(stub.requests[-1])  # the generated doc reached the prompt
        assert len(stub.requests) == 1
        assert json.loads(answer_payload(layer, payload("WebLookup", word="hello")).body) == answer  # now from the cache
        assert len(stub.requests) == 1


def test_the_start_lists_what_runs_here_and_what_takes_the_miss_path(tmp_path: Path) -> None:
    config = tmp_path / "server_config.yml"
    config.write_text(json.dumps({"store": {"path": str(tmp_path / "store")}, "apibank": {"path": str(make_bank(tmp_path / "bank"))}}))
    done = subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", "doctor", "--config", str(config), "--no-probe"], cwd=REPO, capture_output=True, text=True
    )
    assert "3 APIs run here as tool 'API-Bank'" in done.stderr + done.stdout
    assert "WebLookup: imports requests (the internet or a model)" in done.stderr + done.stdout
    # with the simulator on and no tools folder, API-Bank's own docs are enough to start
    config.write_text(config.read_text()[:-1] + ', "simulator": {"enabled": true, "api_base": "http://127.0.0.1:9/v1"}}')
    done = subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", "doctor", "--config", str(config), "--no-probe"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "the simulator has API-Bank's tool docs only" in done.stderr + done.stdout


# -- 4 and the must-show: check --apibank over the level-1 dialogues -------------------------------


def check(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", "check", "--apibank", str(LEVEL1), "--json", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(done.stdout)
    # the exit-code table: 1 when any call is scored wrong
    assert done.returncode == (0 if report["correct"] == report["total"] and not report["problems"] else 1), done.stderr
    return report


def test_check_apibank_scores_the_level1_dialogues_the_same_on_every_fresh_store(apibank: Path, tmp_path: Path) -> None:
    config = {"store": {"path": str(tmp_path / "served")}, "apibank": {"path": str(apibank)}}
    with ServeProcess(tmp_path, config) as server:
        served = check("--url", server.url)
    assert served["total"] == 389 and served["correct"] >= 364, served
    assert set(served) >= {"correct", "total", "identical", "by_api"}
    assert all(isinstance(served[k], int) for k in ("correct", "total", "identical"))
    assert served["by_api"]["GetUserToken"] == {"total": 82, "correct": 82, "identical": 82}
    assert served["by_api"]["RecordHealthData"]["correct"] == 19  # its list inputs are recorded as text
    assert served["largest_state_bytes"] < 8_192
    # again, in-process on another fresh store: the same counts, ids and tokens (every answer byte for byte)
    fresh = tmp_path / "fresh.yml"
    fresh.write_text(json.dumps({"store": {"path": str(tmp_path / "fresh")}, "apibank": {"path": str(apibank)}}))
    again = check("--config", str(fresh), "--mode", "record")
    for key in ("correct", "total", "identical", "by_api", "answers_sha256", "largest_state_bytes"):
        assert again[key] == served[key], key


def test_local_tools_files_still_run_beside_api_bank(tmp_path: Path, settings_factory) -> None:
    tools_file = tmp_path / "tools.py"
    tools_file.write_text('TOOLS = {"Tools/Echo/echo": lambda tool_input, state: {"echo": tool_input}}\n')
    settings = settings_factory(apibank={"path": str(make_bank(tmp_path / "bank"))}, local_tools=[str(tools_file)])
    layer = build_layer(settings, responders=[])
    echo = answer_payload(layer, {"category": "Tools", "tool_name": "Echo", "api_name": "echo", "tool_input": '{"a": 1}', "strip": "", "toolbench_key": ""})
    assert json.loads(json.loads(echo.body)["response"]) == {"echo": {"a": 1}}
    assert Client(layer).call(None, "CountNotes")["output"] == 0


def test_a_long_calculator_formula_holds_no_other_session_hostage_and_is_ended_at_its_timeout(apibank: Path, tmp_path: Path) -> None:
    """A 120 KB formula keeps API-Bank's own Calculator busy for tens of seconds; other sessions' calls are answered at
    once meanwhile, and the long call is answered as a timeout at local_tools_timeout_s and ended (its session calls again)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import requests

    config = {"store": {"path": str(tmp_path / "store")}, "apibank": {"path": str(apibank)}, "local_tools_timeout_s": 3}
    formula = "+".join(["(1+2)*3"] * 15_000)  # 119,999 characters
    with ServeProcess(tmp_path, config) as server, ThreadPoolExecutor(1) as side:
        def session() -> dict[str, str]:
            return {"X-STM-Session": requests.post(server.url + "/sessions", json={}, timeout=30).json()["id"]}

        hog, other = session(), session()
        url = server.url + "/virtual"
        long_call = side.submit(requests.post, url, json=payload("Calculator", formula=formula), headers=hog, timeout=120)
        answered = []
        for i in range(5):  # while the long formula runs
            started = time.monotonic()
            reply = requests.post(url, json=payload("Calculator", formula=f"({i}+2)*3"), headers=other, timeout=60)
            answered.append((time.monotonic() - started, result_of(reply.text)["output"]))
            assert not long_call.done(), "the long formula ended before the other session's calls were made"
        hogged = long_call.result()
        again = requests.post(url, json=payload("Calculator", formula="1+1"), headers=hog, timeout=60)
    assert [out for _, out in answered] == [(i + 2) * 3 for i in range(5)]
    assert max(t for t, _ in answered) < 1.0, answered
    assert "did not answer within 3s" in hogged.json()["response"], hogged.text
    assert result_of(again.text)["output"] == 2  # the ended call holds nothing of its session
