"""Start-up checks (issue 10 items 11-15, 17): what a configuration points at is checked before serving.

Each test runs the real command line (``serve``, ``cache import``, ``doctor``) in its own process,
against real folders, a real OpenAI-compatible stub and a real relay stub on 127.0.0.1, or a
closed port where an endpoint must be dead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.config import UPSTREAM_DEFAULT_API_BASE, load_settings
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.responders.simulator import NO_DOCS_MARK
from stabletoolbench_mirror.stores import DiskcacheStore
from stabletoolbench_mirror.upstream.layout import write_cache_file
from stabletoolbench_mirror.upstream.trees import count_tree, frozen_cache_problem
from tests.helpers import paths
from tests.helpers.api_host import ApiHost, relay_reply
from tests.helpers.live import free_port
from tests.helpers.openai_stub import OpenAIStub
from tests.helpers.payloads import answer_payload

REPO = paths.REPO

#: StableToolBench's server/config.yml as shipped (upstream commit 9fd0a3c), with its relay address
#: replaced by a closed local port: empty api_key and api_base, a log_file
UPSTREAM_CONFIG = """api_key:
api_base:
model: gpt-4-turbo
temperature: 0
toolbench_url: http://127.0.0.1:{relay_port}/rapidapi
tools_folder: "./tools"
cache_folder: "./tool_response_cache"
is_save: true
port: {port}
log_file: "./server.log"
"""

CALL = {"category": "Data", "tool_name": "Demo Tool", "api_name": "search", "tool_input": '{"q": "x"}', "strip": "", "toolbench_key": ""}
ANSWER = {"error": "", "response": "frozen answer for x"}


def flat(text: str) -> str:
    """``text`` with runs of spaces made one (the summary aligns its labels)."""
    return re.sub(r" +", " ", text)


def closed_port() -> int:
    """A local port nothing listens on (connections are refused)."""
    return free_port()


def make_server_folder(root: Path) -> Path:
    """An upstream ``server/`` folder: ``tool_response_cache/`` (2 API files, 3 entries) and ``tools/`` (1 tool, 2 APIs)."""
    server = root / "server"
    cache = server / "tool_response_cache"
    write_cache_file(cache / "Data" / "demo_tool_for_Data" / "search.json", {"{'q': 'x'}": ANSWER, "{'q': 'y'}": {"error": "", "response": "y"}})
    write_cache_file(cache / "Data" / "demo_tool_for_Data" / "lookup.json", {"{}": {"error": "", "response": "z"}})
    tools = server / "tools" / "Data"
    tools.mkdir(parents=True)
    doc = {"tool_name": "Demo Tool", "tool_description": "demo", "api_list": [
        {"name": "search", "description": "search things", "method": "GET", "required_parameters": [], "optional_parameters": []},
        {"name": "lookup", "description": "look up", "method": "GET", "required_parameters": [], "optional_parameters": []},
    ]}
    (tools / "demo_tool.json").write_text(json.dumps(doc))
    return server


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STM_") and k != "OPENAI_API_KEY"}
    clean["PYTHONPATH"] = str(REPO) + os.pathsep + clean.get("PYTHONPATH", "")
    return clean


def cli(*args: str, cwd: Path, extra_env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", *args],
        cwd=cwd, env={**env(), **(extra_env or {})}, capture_output=True, text=True, timeout=timeout,
    )


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


class Served:
    """``serve`` in its own process group; ``output`` is what it printed."""

    def __init__(self, args: list[str], cwd: Path, port: int, extra_env: dict[str, str] | None = None) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = cwd / f"serve-{port}.out"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stabletoolbench_mirror", "serve", *args],
                cwd=cwd, env={**env(), **(extra_env or {})}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"serve exited ({self.proc.returncode}):\n{self.output}"
            try:
                if requests.get(self.url + "/health", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, f"serve did not answer:\n{self.output}"
            time.sleep(0.05)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)


@pytest.fixture
def served() -> Iterator[Any]:
    started: list[Served] = []

    def start(*args: str, cwd: Path, port: int, extra_env: dict[str, str] | None = None) -> Served:
        s = Served(list(args), cwd, port, extra_env)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


# -- item 11: frozen cache paths -------------------------------------------------------------------


def serve_refused(tmp_path: Path, config: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    cfg = write_config(tmp_path / "server_config.yml", {"port": free_port(), "store": {"path": str(tmp_path / "store")}, **config})
    return cli("serve", "--config", str(cfg), cwd=tmp_path, timeout=60)


def test_serve_refuses_a_missing_frozen_cache_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_cache"
    result = serve_refused(tmp_path, {"frozen_caches": [str(missing)]})
    assert result.returncode == 2, result.stderr
    assert f"error: frozen_caches[0]: {missing} does not exist" in result.stderr


@pytest.mark.parametrize(
    "configured, where, suggested",
    [
        ("server", "below", "server/tool_response_cache"),  # one level too high
        ("server/tool_response_cache/Data", "above", "server/tool_response_cache"),  # one level too deep
        ("server/tool_response_cache/Data/demo_tool_for_Data", "above", "server/tool_response_cache"),  # two too deep
        ("server/tools", "beside it", "server/tool_response_cache"),  # the tools folder instead
    ],
)
def test_serve_refuses_a_frozen_cache_one_level_off_and_suggests_the_tree(tmp_path: Path, configured: str, where: str, suggested: str) -> None:
    make_server_folder(tmp_path)
    result = serve_refused(tmp_path, {"frozen_caches": [str(tmp_path / configured)]})
    assert result.returncode == 2, result.stderr
    assert (
        f"error: frozen_caches[0]: {tmp_path / configured} has no cache files (<Category>/<tool>_for_<Category>/<api>.json); "
        f"the folder {where}, {tmp_path / suggested}, looks like a tool_response_cache tree: use that path"
    ) in result.stderr
    assert "not starting" in result.stderr


def test_a_folder_with_no_tree_near_it_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty" / "deeper").mkdir(parents=True)
    problem = frozen_cache_problem(tmp_path / "empty" / "deeper")
    layout = "(<Category>/<tool>_for_<Category>/<api>.json)"
    assert problem == f"{tmp_path / 'empty' / 'deeper'} has no cache files {layout}, nor has any folder just below or above it"


def test_cache_import_of_a_folder_without_cache_files_fails_with_the_hint(tmp_path: Path) -> None:
    server = make_server_folder(tmp_path)
    result = cli("cache", "import", str(server), "--store-path", str(tmp_path / "store"), "-q", cwd=tmp_path)
    assert result.returncode == 2
    assert f"the folder below, {server / 'tool_response_cache'}, looks like a tool_response_cache tree: use that path" in result.stderr
    # nothing was imported: the store was not even created
    assert not (tmp_path / "store").exists()
    ok = cli("cache", "import", str(server / "tool_response_cache"), "--store-path", str(tmp_path / "store"), "-q", cwd=tmp_path)
    assert ok.returncode == 0 and "entries read:     3" in ok.stdout


def test_the_reference_cache_is_counted_from_its_files(reference_dir: Path, tmp_path: Path) -> None:
    tree = reference_dir / "cache"
    expected_entries = sum(len(json.loads(p.read_text())) for p in tree.glob("*/*/*.json"))
    count = count_tree(tree)
    assert (count.files, count.entries) == (len(list(tree.glob("*/*/*.json"))), expected_entries)
    # a copy one level down (as in upstream's server/ folder) is found from above
    shutil.copytree(tree, tmp_path / "server" / "tool_response_cache")
    assert frozen_cache_problem(tmp_path / "server").endswith(
        f"the folder below, {tmp_path / 'server' / 'tool_response_cache'}, looks like a tool_response_cache tree: use that path"
    )
    # a large tree is listed but its entries are not counted at start
    assert count_tree(tree, count_entries=False).entries is None


# -- item 12: StableToolBench's own config.yml ----------------------------------------------------


def test_upstream_config_as_shipped_loads(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yml"
    cfg.write_text(UPSTREAM_CONFIG.format(relay_port=9, port=8080))
    s = load_settings(cfg, environ={})
    assert s.simulator.enabled and s.simulator.style == "gpt-fewshot" and s.simulator.model == "gpt-4-turbo"
    # empty means not set: upstream's OpenAI client then talks to OpenAI with OPENAI_API_KEY
    assert s.simulator.api_base == UPSTREAM_DEFAULT_API_BASE and s.simulator.api_key is None
    assert load_settings(cfg, environ={"OPENAI_API_KEY": "sk-from-env"}).simulator.api_key.get_secret_value() == "sk-from-env"
    assert s.real.enabled and s.real.relay_url == "http://127.0.0.1:9/rapidapi"
    assert s.frozen_caches == ["./tool_response_cache"] and s.tools_folder == "./tools" and s.save is True
    assert s.log_file == "./server.log" and s.resolve(s.log_file) == str(tmp_path / "server.log")


def test_an_empty_value_in_this_projects_own_keys_names_the_key_not_pydantic_types(tmp_path: Path) -> None:
    from stabletoolbench_mirror.config import ConfigError

    cfg = tmp_path / "server_config.yml"
    cfg.write_text("simulator:\n  api_base:\nfrozen_caches: [ok, null]\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(cfg, environ={})
    message = str(caught.value)
    assert f"{cfg}: invalid value for 'simulator.api_base': Input should be a valid string, or Input should be a valid list (got an empty value)" in message
    assert f"{cfg}: invalid value for 'frozen_caches[1]': Input should be a valid string (got an empty value)" in message
    assert "list[str]" not in message and "api_base.str" not in message


def test_upstream_earlier_config_as_shipped_loads(tmp_path: Path) -> None:
    """Upstream's earlier config.yml named the relay ``rapidapi_url``."""
    cfg = tmp_path / "config.yml"
    cfg.write_text(
        "api_key: sk-file\napi_base: http://127.0.0.1:9/v1\nmodel: gpt-4-turbo-preview\ntemperature: 0\n"
        "rapidapi_url: http://127.0.0.1:9/rapidapi\ntools_folder: \"./tools\"\nis_save: true\ncache_folder: \"./tool_response_cache\"\n"
    )
    s = load_settings(cfg, environ={"OPENAI_API_KEY": "sk-env"})
    assert s.real.enabled and s.real.relay_url == "http://127.0.0.1:9/rapidapi"
    assert s.simulator.api_base == "http://127.0.0.1:9/v1" and s.simulator.api_key.get_secret_value() == "sk-file"


def test_upstream_config_yml_alone_in_the_folder_is_used_and_said(tmp_path: Path, served: Any) -> None:
    server = make_server_folder(tmp_path)
    port = free_port()
    (server / "config.yml").write_text(UPSTREAM_CONFIG.format(relay_port=closed_port(), port=port))
    with OpenAIStub(model="gpt-4-turbo") as stub:
        # the shipped file's api_base is empty (OpenAI): this test talks to a local stub instead
        s = served(cwd=server, port=port, extra_env={"STM_SIMULATOR__API_BASE": stub.api_base})
        hit = requests.post(s.url + "/virtual", json=CALL, timeout=10)
        assert hit.json() == ANSWER and hit.headers["x-stm-outcome"] == "hit"
        output = s.output
    assert "config.yml + STM_* environment (StableToolBench's config.yml: no server_config.yml in this folder)" in output
    # the log file is honoured: the start-up summary is in it
    log_text = (server / "server.log").read_text()
    assert "StableToolBench's config.yml" in log_text and "frozen cache 0" in log_text


def test_a_config_yml_that_is_not_upstreams_is_not_used_and_the_start_says_why(tmp_path: Path) -> None:
    (tmp_path / "config.yml").write_text("database: postgres\nreplicas: 3\n")
    result = cli("doctor", "--no-probe", cwd=tmp_path)
    expected = "./config.yml not used: unknown keys database, replicas: not StableToolBench's server config; pass --config config.yml to use it"
    assert expected in result.stdout
    assert f"warning: config: {expected}" in result.stdout


# -- items 13-15: tool docs, endpoints, the summary ------------------------------------------------


def test_simulator_without_tools_folder_refuses_to_start(tmp_path: Path) -> None:
    result = serve_refused(tmp_path, {"simulator": {"enabled": True, "api_base": f"http://127.0.0.1:{closed_port()}/v1"}})
    assert result.returncode == 2
    assert "error: tools_folder: is not set, but simulator.enabled is true" in result.stderr
    assert "set simulator.allow_without_docs: true" in result.stderr
    (tmp_path / "tools").mkdir()
    result = serve_refused(tmp_path, {"tools_folder": str(tmp_path / "tools"), "simulator": {"enabled": True}})
    assert result.returncode == 2
    assert f"error: tools_folder: gives no tool docs: {tmp_path / 'tools'} has no tool docs (<Category>/<tool>.json)" in result.stderr


def test_simulating_without_docs_when_allowed_warns_once_and_marks_records(tmp_path: Path, served: Any) -> None:
    port = free_port()
    with OpenAIStub() as stub:
        cfg = write_config(tmp_path / "c.yml", {
            "port": port, "store": {"path": str(tmp_path / "store")},
            "simulator": {"enabled": True, "api_base": stub.api_base, "allow_without_docs": True, "max_retries": 0},
        })
        s = served("--config", str(cfg), cwd=tmp_path, port=port)
        answer = requests.post(s.url + "/virtual", json=CALL, timeout=10)
        assert answer.status_code == 200 and answer.headers["x-stm-outcome"] == "recorded"
        assert s.output.count("warning: simulator.allow_without_docs: simulating without tool docs") == 1
        s.stop()
    with DiskcacheStore(tmp_path / "store") as store:
        [record] = list(store)
    assert record.source == "simulated" and record.origin == "MirrorAPI" + NO_DOCS_MARK


def test_records_made_with_tool_docs_are_not_marked(tmp_path: Path) -> None:
    server = make_server_folder(tmp_path)
    with OpenAIStub() as stub:
        settings = load_settings(write_config(tmp_path / "c.yml", {
            "store": {"path": str(tmp_path / "store")}, "tools_folder": str(server / "tools"),
            "simulator": {"enabled": True, "api_base": stub.api_base, "allow_without_docs": True, "max_retries": 0},
        }), environ={})
        layer = build_layer(settings)
        try:
            assert answer_payload(layer, CALL).kind == "recorded"
            [record] = list(layer.store)
        finally:
            layer.close()
    assert record.origin == "MirrorAPI"


def test_dead_endpoints_are_a_warning_at_start_and_the_summary_says_what_was_loaded(tmp_path: Path, served: Any) -> None:
    server = make_server_folder(tmp_path)
    port, dead_sim, dead_relay = free_port(), closed_port(), closed_port()
    cfg = write_config(tmp_path / "c.yml", {
        "port": port, "store": {"path": str(tmp_path / "store")},
        "frozen_caches": [str(server / "tool_response_cache")], "tools_folder": str(server / "tools"),
        "real": {"enabled": True, "relay_url": f"http://127.0.0.1:{dead_relay}/rapidapi"},
        "simulator": {"enabled": True, "api_base": f"http://127.0.0.1:{dead_sim}/v1"},
    })
    s = served("--config", str(cfg), cwd=tmp_path, port=port)
    assert requests.post(s.url + "/virtual", json=CALL, timeout=10).json() == ANSWER
    out = flat(s.output)
    assert f"config: {cfg}" in out and "mode: record" in out
    assert f"store: diskcache at {tmp_path / 'store'}" in out
    assert f"frozen cache 0: {server / 'tool_response_cache'}: 2 files, 1 tool, 1 category, 3 entries" in out
    assert f"tools folder: {server / 'tools'}: 1 tool, 2 APIs, 1 category" in out
    assert f"real API: relay http://127.0.0.1:{dead_relay}/rapidapi: NOT ANSWERING (connection refused)" in out
    assert f"simulator endpoint: http://127.0.0.1:{dead_sim}/v1: NOT ANSWERING (connection refused)" in out
    assert f"warning: simulator.api_base: http://127.0.0.1:{dead_sim}/v1 does not answer (connection refused)" in out
    assert f"warning: real.relay_url: http://127.0.0.1:{dead_relay}/rapidapi does not answer (connection refused)" in out


def test_live_endpoints_are_reported_as_answering(tmp_path: Path, served: Any) -> None:
    server = make_server_folder(tmp_path)
    port = free_port()
    with OpenAIStub(model="served-model") as stub, ApiHost(lambda r: relay_reply("", "ok")) as relay:
        cfg = write_config(tmp_path / "c.yml", {
            "port": port, "store": {"path": str(tmp_path / "store")}, "tools_folder": str(server / "tools"),
            "real": {"enabled": True, "relay_url": relay.url + "/rapidapi", "toolbench_key": "tbk-secret-0001"},
            "simulator": {"enabled": True, "api_base": stub.api_base, "model": "MirrorAPI", "api_key": "sk-sim-0001"},
        })
        s = served("--config", str(cfg), cwd=tmp_path, port=port)
        out = flat(s.output)
        assert f"real API: relay {relay.url}/rapidapi: answered (HTTP 200)" in out
        assert f"simulator endpoint: {stub.api_base}: answered (HTTP 200, does not list 'MirrorAPI')" in out
        assert f"warning: simulator.model: 'MirrorAPI' is not among the models {stub.api_base} serves (served-model)" in out
        assert "tbk-secret-0001" not in out and "sk-sim-0001" not in out
        # the relay probe is one GET with no key
        assert [r.method for r in relay.received] == ["GET"] and "tbk-secret-0001" not in str(relay.received)


# -- item 17: doctor -------------------------------------------------------------------------------


def test_doctor_passes_a_good_config_and_changes_nothing(tmp_path: Path) -> None:
    server = make_server_folder(tmp_path)
    cfg = write_config(tmp_path / "c.yml", {
        "store": {"path": str(tmp_path / "store")}, "frozen_caches": [str(server / "tool_response_cache")],
        "tools_folder": str(server / "tools"),
    })
    result = cli("doctor", "--config", str(cfg), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no errors, 0 warning(s)" in result.stdout
    assert f"store: diskcache at {tmp_path / 'store'}: does not exist yet (created at the first start)" in flat(result.stdout)
    assert not (tmp_path / "store").exists()


def test_doctor_reports_every_error_and_exits_non_zero(tmp_path: Path) -> None:
    make_server_folder(tmp_path)
    cfg = write_config(tmp_path / "c.yml", {
        "store": {"path": str(tmp_path / "store")},
        "frozen_caches": [str(tmp_path / "server"), str(tmp_path / "missing")],
        "simulator": {"enabled": True, "api_base": f"http://127.0.0.1:{closed_port()}/v1"},
    })
    result = cli("doctor", "--config", str(cfg), cwd=tmp_path)
    assert result.returncode == 1
    out = result.stdout
    assert f"error: frozen_caches[0]: {tmp_path / 'server'} has no cache files" in out
    assert f"error: frozen_caches[1]: {tmp_path / 'missing'} does not exist" in out
    assert "error: tools_folder: is not set, but simulator.enabled is true" in out
    assert "does not answer (connection refused)" in out
    assert "3 error(s), 1 warning(s)" in out
    bad_log = write_config(tmp_path / "log.yml", {"store": {"path": str(tmp_path / "store")}, "log_file": str(tmp_path / "no" / "dir" / "x.log")})
    result = cli("doctor", "--config", str(bad_log), "--no-probe", cwd=tmp_path)
    assert result.returncode == 1 and f"error: log_file: {tmp_path / 'no' / 'dir' / 'x.log'} cannot be written" in result.stdout


# -- issue 18 item 7e: nothing can answer ------------------------------------------------------------


@pytest.mark.parametrize("mode, what", [
    ("replay", "replay mode with nothing to replay"),
    ("record", "record mode with nothing to answer a miss (neither real.enabled nor simulator.enabled) and nothing recorded"),
])
def test_nothing_to_answer_from_is_a_doctor_error_and_a_serve_warning(tmp_path: Path, served: Any, mode: str, what: str) -> None:
    port = free_port()
    cfg = write_config(tmp_path / "c.yml", {"mode": mode, "port": port, "store": {"path": str(tmp_path / "store")}})
    expected = (f"mode: {what}: the store is empty and no frozen cache is configured (frozen_caches), "
                "so every call will be a miss, answered 'API not working error...'")
    result = cli("doctor", "--config", str(cfg), "--no-probe", cwd=tmp_path)
    assert result.returncode == 1 and f"error: {expected}" in result.stdout, result.stdout
    # serve starts: another process may fill the store while it runs (cache import, warm)
    s = served("--config", str(cfg), cwd=tmp_path, port=port)
    assert f"warning: {expected}" in s.output
    missed = requests.post(s.url + "/virtual", json=CALL, timeout=10)
    assert missed.headers["x-stm-outcome"] == "unanswered"
    # one text in both modes (a run recorded so replays byte for byte), true of both: never "(replay mode)" alone
    assert missed.json()["response"].endswith(" (not in the caches, and this server fills no miss: replay mode, or neither the "
                                              "real API nor the simulator enabled)."), missed.text
    s.stop()
    # an unusable frozen cache is no better than none
    bad = write_config(tmp_path / "bad.yml", {"mode": mode, "store": {"path": str(tmp_path / "store")}, "frozen_caches": [str(tmp_path / "nope")]})
    assert "no frozen cache is usable, so every call will be a miss" in cli("doctor", "--config", str(bad), "--no-probe", cwd=tmp_path).stdout


def test_something_to_answer_from_is_no_error(tmp_path: Path) -> None:
    server = make_server_folder(tmp_path)
    frozen = {"store": {"path": str(tmp_path / "store")}, "frozen_caches": [str(server / "tool_response_cache")]}
    for mode in ("replay", "record"):
        result = cli("doctor", "--config", str(write_config(tmp_path / "c.yml", {"mode": mode, **frozen})), "--no-probe", cwd=tmp_path)
        assert result.returncode == 0 and "every call will be a miss" not in result.stdout, result.stdout
    assert "mode: record (neither real.enabled nor simulator.enabled: misses are not filled)" in flat(result.stdout)
    # a store with records is something to replay
    with DiskcacheStore(str(tmp_path / "recorded")) as store:
        store.add(Record.from_answer("Data/demo_tool_for_Data/search", str({"q": "x"}), ANSWER, "real", "relay"), '{"q":"x"}')
    recorded = write_config(tmp_path / "r.yml", {"mode": "replay", "store": {"path": str(tmp_path / "recorded")}})
    result = cli("doctor", "--config", str(recorded), "--no-probe", cwd=tmp_path)
    assert result.returncode == 0 and "every call will be a miss" not in result.stdout, result.stdout
    # a simulator fills misses: record mode is fine with an empty store
    sim = write_config(tmp_path / "s.yml", {"store": {"path": str(tmp_path / "empty")}, "tools_folder": str(server / "tools"),
                                            "simulator": {"enabled": True}})
    result = cli("doctor", "--config", str(sim), "--no-probe", cwd=tmp_path)
    assert result.returncode == 0 and "every call will be a miss" not in result.stdout, result.stdout


# -- issue 18 item 8: a system_prompt_file that is not a regular file, or too large --------------------


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a prompt file read without a bound fails fast


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "sparse"])
def test_a_prompt_file_that_is_not_a_bounded_regular_file_is_an_error_naming_the_key(tmp_path: Path, kind: str) -> None:
    server = make_server_folder(tmp_path)
    if kind == "fifo":
        path = tmp_path / "prompt.fifo"
        os.mkfifo(path)
        expected = f"{path} is not a regular file"
    elif kind == "sparse":
        path = tmp_path / "prompt.txt"
        with open(path, "wb") as fh:
            fh.truncate(3 << 30)  # 3 GB, no blocks
        expected = f"{path}: 3,221,225,472 bytes, more than a prompt file may have"
    else:
        path, expected = Path(kind), "/dev/zero is not a regular file"
    cfg = write_config(tmp_path / "c.yml", {  # a port of its own: serve checks that it can listen before the prompt file
        "port": free_port(), "store": {"path": str(tmp_path / "store")}, "tools_folder": str(server / "tools"),
        "simulator": {"enabled": True, "api_base": f"http://127.0.0.1:{closed_port()}/v1", "system_prompt_file": str(path)},
    })
    for command in ("doctor", "serve"):
        result = subprocess.run(
            [sys.executable, "-m", "stabletoolbench_mirror", command, "--config", str(cfg), *(["--no-probe"] if command == "doctor" else [])],
            cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=60, preexec_fn=_limit_memory,
        )
        assert result.returncode == (1 if command == "doctor" else 2), result.stdout + result.stderr
        assert f"error: simulator.system_prompt_file: {expected}" in result.stdout + result.stderr
        assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr


# -- the documentation (README.md, CONTRIBUTING.md, docs/*.md) quotes the exact messages ----------


def documentation() -> str:
    """README.md, CONTRIBUTING.md and every ``docs/*.md``, one after the other."""
    files = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
    assert all(path.is_file() for path in files[:2]) and len(files) > 2
    return "\n".join(path.read_text(encoding="utf-8") for path in files)


def test_readme_quotes_the_exact_messages(tmp_path: Path) -> None:
    readme = documentation()
    data = tmp_path / "data"
    make_server_folder(data)
    quoted = {
        "one level too high": frozen_cache_problem(data / "server"),
        "missing": frozen_cache_problem(data / "tool_response_cache"),
    }
    for what, message in quoted.items():
        assert message is not None
        shown = f"error: frozen_caches[0]: {message}".replace(str(tmp_path), "")
        assert shown in readme, f"the documentation does not quote the {what} message: {shown}"
    (tmp_path / "config.yml").write_text("database: postgres\nreplicas: 3\n")
    out = cli("doctor", "--no-probe", cwd=tmp_path).stdout
    warning = next(line for line in out.splitlines() if line.startswith("warning: config: "))
    assert warning in readme
    assert "config: config.yml (StableToolBench's config.yml: no server_config.yml in this folder)" in readme
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "server_config.yml").write_text("simulator:\n  api_base:\n")
    refused = cli("doctor", cwd=tmp_path / "own")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[0] == "configuration error:"
    assert f"configuration error: {refused.stderr.strip().splitlines()[1]}" in readme
    from stabletoolbench_mirror.snapshots.tree_import import READER_DIED

    assert f"error: {READER_DIED}" in readme
    # the simulator warning, as it reads for the default api_base (issue 18 item 7j: the README said 8000)
    from stabletoolbench_mirror.config import SimulatorConfig

    dead = f"http://127.0.0.1:{closed_port()}/v1"
    server = make_server_folder(tmp_path / "sim")
    sim = write_config(tmp_path / "sim.yml", {"store": {"path": str(tmp_path / "store")}, "tools_folder": str(server / "tools"),
                                              "simulator": {"enabled": True, "api_base": dead}})
    out = cli("doctor", "--config", str(sim), cwd=tmp_path).stdout
    warning = next(line for line in out.splitlines() if line.startswith("warning: simulator.api_base: "))
    shown = warning.replace(dead, str(SimulatorConfig().api_base)).split("): ")[0] + "): ..."
    assert f"`{shown}`" in readme, shown
    # nothing to answer from (issue 18 item 7e)
    nothing = write_config(tmp_path / "nothing.yml", {"mode": "replay", "store": {"path": str(tmp_path / "empty")}})
    error = next(line for line in cli("doctor", "--config", str(nothing), "--no-probe", cwd=tmp_path).stdout.splitlines()
                 if line.startswith("error: mode: "))
    assert error.split(". Point")[0] + ". ..." in readme, error
    # the warning of a MirrorAPI style without system_prompt_file (the README's record-with-MirrorAPI job)
    from stabletoolbench_mirror.responders.simulator import prompt_warning

    mirror = load_settings(REPO / "examples" / "configs" / "record-mirrorapi.yml", environ={})
    mirror.simulator.system_prompt_file = None
    warning = prompt_warning(mirror)
    assert warning is not None and f"`{warning.split(', but ')[0]}, ...`" in readme, warning


# -- item 14: warm stops early on a dead dependency, and says why each call failed ------------------


def warm_config(tmp_path: Path, api_base: str) -> Path:
    server = make_server_folder(tmp_path)
    return write_config(tmp_path / "warm.yml", {
        "store": {"path": str(tmp_path / "store")}, "tools_folder": str(server / "tools"),
        "simulator": {"enabled": True, "api_base": api_base, "max_retries": 0, "connect_timeout_s": 1},
    })


def payload_file(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "payloads.jsonl"
    path.write_text("".join(json.dumps({**CALL, "tool_input": json.dumps({"q": f"x{i}"})}) + "\n" for i in range(n)))
    return path


def test_warm_stops_early_when_its_first_calls_all_fail_for_one_cause(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    result = cli("warm", "--config", str(warm_config(tmp_path, dead)), "--payloads", str(payload_file(tmp_path, 40)),
                 "--concurrency", "1", "--quiet", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    out = result.stdout
    assert "5 calls made in" in out  # not 40
    assert "stopped early: the first 5 calls all failed with the same cause: failed: simulated: simulator unavailable: connection failed" in out
    assert "fix it and run the same command again" in out
    # the cause is in every FAILED line, and the start already warned about the endpoint
    failed = [line for line in out.splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 5 and all("simulated: simulator unavailable: connection failed" in line and "refused" in line for line in failed)
    assert f"warning: simulator.api_base: {dead} does not answer (connection refused)" in result.stderr


def test_warm_stops_early_across_worker_processes(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    result = cli("warm", "--config", str(warm_config(tmp_path, dead)), "--payloads", str(payload_file(tmp_path, 400)),
                 "--processes", "2", "--concurrency", "4", "--quiet", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    made = int(re.search(r"(\d+) calls made in", result.stdout).group(1))
    assert 5 <= made < 400 and "stopped early: the first 5 calls all failed with the same cause" in result.stdout


def test_warm_goes_on_when_a_first_call_succeeds_and_failed_lines_carry_the_cause(tmp_path: Path) -> None:
    from tests.helpers.openai_stub import Reply

    def responder(body: dict[str, Any]) -> Reply:
        # the first call of the run answers; the others get HTTP 500
        return Reply() if "'x0'" in str(body["messages"][-1]["content"]) else Reply(status=500, message="model crashed")

    with OpenAIStub(responder) as stub:
        result = cli("warm", "--config", str(warm_config(tmp_path, stub.api_base)), "--payloads", str(payload_file(tmp_path, 12)),
                     "--concurrency", "1", "--quiet", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "12 calls made in" in result.stdout and "stopped early" not in result.stdout
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED ")]
    cause = ": failed: simulated: simulator unavailable: HTTP 500: model crashed (answered: API not working error..."
    assert len(failed) == 11 and all(cause in line for line in failed)


def test_first_calls_stop_only_when_all_failed_alike() -> None:
    from stabletoolbench_mirror.warming.runner import FirstCalls

    watch = FirstCalls(3)
    assert [watch.see(False, f"refused <conn object at 0x{i:x}>") for i in range(3)] == [None, None, "refused <conn object at 0x2>"]
    watch = FirstCalls(3)
    assert [watch.see(*c) for c in [(False, "a"), (False, "b"), (False, "a"), (False, "a")]] == [None] * 4
    watch = FirstCalls(3)
    assert [watch.see(*c) for c in [(False, "a"), (True, ""), (False, "a"), (False, "a")]] == [None] * 4
    assert FirstCalls(0).see(False, "a") is None


def test_counts_skip_what_the_frozen_cache_refuses(tmp_path: Path) -> None:
    """Files the frozen cache would refuse are reported unreadable; symbolic links count only when allowed."""
    server = make_server_folder(tmp_path)
    tree = server / "tool_response_cache"
    tool = tree / "Data" / "demo_tool_for_Data"
    (tool / "deep.json").write_text('{"{}": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (tool / "surrogate.json").write_text('{"{}": {"error": "", "response": "\\ud800"}}')
    outside = tmp_path / "outside" / "linked_for_Data"
    write_cache_file(outside / "a.json", {"{}": ANSWER})
    (tree / "Data" / "linked_for_Data").symlink_to(outside)
    count = count_tree(tree)
    assert (count.files, count.entries) == (4, 3) and sorted(Path(p).name for p in count.unreadable) == ["deep.json", "surrogate.json"]
    assert count_tree(tree, follow_symlinks=True).files == 5
    cfg = write_config(tmp_path / "c.yml", {"store": {"path": str(tmp_path / "store")}, "frozen_caches": [str(tree)]})
    out = cli("doctor", "--config", str(cfg), "--no-probe", cwd=tmp_path).stdout
    assert "warning: frozen_caches[0]: 2 cache files cannot be read and are skipped" in out


@pytest.mark.parametrize(("trusted", "warned"), [(["127.0.0.1"], True), (["127.0.0.0/8", "10.0.0.0/8"], True), (["*"], True),
                                                 (["::1"], True), (["127.0.0.2"], False), (["10.0.0.0/8"], False)])
def test_doctor_warns_when_the_trusted_proxies_take_in_every_local_client(tmp_path: Path, trusted: list[str], warned: bool) -> None:
    cfg = write_config(tmp_path / "c.yml", {"store": {"path": str(tmp_path / "store")}, "limits": {"trusted_proxies": trusted}})
    result = cli("doctor", "--config", str(cfg), "--no-probe", cwd=tmp_path)
    text = flat(result.stdout)
    assert "trusted proxies: " + ", ".join(trusted) in text
    assert ("where every local client connects from" in text) is warned
    if warned:
        assert "limits.trusted_proxies" in text and "proxy_bind 127.0.0.2" in text


def test_doctor_says_that_local_tools_and_api_bank_run_their_code(tmp_path: Path) -> None:
    tools = tmp_path / "tools.py"
    tools.write_text("TOOLS = {}\n")
    bank = tmp_path / "bank"
    (bank / "apis").mkdir(parents=True)
    (bank / "init_database").mkdir()
    (bank / "apis" / "ran.py").write_text(f"open({str(tmp_path / 'ran-at-doctor')!r}, 'w').close()\n")
    cfg = write_config(tmp_path / "c.yml", {"store": {"path": str(tmp_path / "store")}, "local_tools": [str(tools)],
                                            "apibank": {"path": str(bank)}})
    result = cli("doctor", "--config", str(cfg), "--no-probe", cwd=tmp_path)
    text = flat(result.stdout)
    assert "their code runs in this process: name only files you trust" in text
    assert "its API modules were imported, which ran their code in this process (doctor too)" in text
    assert (tmp_path / "ran-at-doctor").exists()  # what the summary says is what happened


# -- a snapshot's model calls are counted; replay warns of nothing it never uses ---------------------------


def test_a_snapshots_model_calls_are_counted_and_replay_warns_of_nothing_it_does_not_use(tmp_path: Path, served: Any) -> None:
    """A snapshot of 2 tool answers and 12 recorded model calls of 2 models (``@model/<model>/chat_completions.json``)
    is 14 entries in the summary, not 2; in replay mode, a simulator and a real API that are enabled in the file,
    a simulator with no tool docs and an upstream whose key is not set get no warning (replay asks none of them)."""
    from stabletoolbench_mirror.core.model_calls import model_api

    with DiskcacheStore(str(tmp_path / "recorded")) as store:
        for city in ("x", "y"):
            store.add(Record.from_answer("Data/demo_tool_for_Data/search", str({"q": city}), ANSWER, "real", "relay"), None)
        for model in ("gpt-4o-mini", "judge"):
            for i in range(6):
                store.add(Record(api=model_api(model), key=f"{i:064x}#1", body='{"id": "c", "choices": []}', source="model", origin=model), None)
    assert cli("snapshot", str(tmp_path / "snap"), "--store-path", str(tmp_path / "recorded"), "-q", cwd=tmp_path).returncode == 0
    dead = f"http://127.0.0.1:{closed_port()}"
    port = free_port()
    cfg = write_config(tmp_path / "replay.yml", {
        "mode": "replay", "port": port, "store": {"path": str(tmp_path / "replay-store")}, "frozen_caches": [str(tmp_path / "snap")],
        "simulator": {"enabled": True, "api_base": dead + "/v1"}, "real": {"enabled": True, "relay_url": dead + "/relay"},
        "llm": {"upstreams": [{"base_url": dead + "/v1", "models": ["gpt-4o-mini"], "api_key_env": "STM_TEST_UNSET_KEY"}]},
    })
    counted = f"{tmp_path / 'snap'}: 3 files, 1 tool, 1 category, 2 models, 14 entries (12 model calls)"
    doctor = cli("doctor", "--config", str(cfg), cwd=tmp_path)
    assert doctor.returncode == 0 and "no errors, 0 warning(s)" in doctor.stdout, doctor.stdout
    assert f"frozen cache 0: {counted}" in flat(doctor.stdout)
    assert "simulator: not used: replay mode answers from the caches only" in flat(doctor.stdout)
    assert "real API: not used: replay mode answers from the caches only" in flat(doctor.stdout)
    s = served("--config", str(cfg), cwd=tmp_path, port=port)
    assert counted in flat(s.output) and "warning" not in s.output.lower(), s.output
    s.stop()
    # the same file recording asks them all: the warnings (and the missing tool docs' error) are back
    record = cli("doctor", "--config", str(cfg), "--mode", "record", cwd=tmp_path)
    assert record.returncode == 1 and "error: tools_folder: is not set, but simulator.enabled is true" in record.stdout
    for key in ("simulator.api_base", "real.relay_url", "llm.upstreams[0].api_key_env"):
        assert f"warning: {key}:" in record.stdout, (key, record.stdout)


# -- serve outside the folder of its config -------------------------------------------------------------


def test_serve_outside_the_folder_of_its_config_says_so_and_names_the_config_to_pass(tmp_path: Path, served: Any) -> None:
    """No ``server_config.yml`` (nor ``config.yml``) in the current folder: the defaults, whose relative store path is a
    store there, and no frozen cache.  The summary says where it looked and names the config to pass (this checkout's
    demo config), in replay and record mode alike; ``doctor`` calls it an error; with ``--config`` that config works
    from any folder."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    explained = (f"mode: no config file was found in {elsewhere} (no server_config.yml or config.yml): the built-in defaults "
                 f"were used, so the store is {elsewhere / 'cache' / 'store'}, in this folder, and no frozen cache is served; run "
                 f"from the folder of your config or pass --config FILE (the demo caches: --config {REPO / 'server_config.yml'}). ")
    doctor = cli("doctor", "--mode", "replay", cwd=elsewhere)
    assert doctor.returncode == 1 and f"error: {explained}replay mode with nothing to replay" in flat(doctor.stdout), doctor.stdout
    for mode, what in (("replay", "replay mode with nothing to replay"), ("record", "record mode with nothing to answer a miss")):
        port = free_port()
        s = served("--mode", mode, "--port", str(port), cwd=elsewhere, port=port)
        said = flat(s.output)
        assert f"config: defaults + command line (no server_config.yml or config.yml in {elsewhere}: the built-in defaults" in said
        assert f"warning: {explained}{what}" in said, said
        s.stop()
    # the demo's config from another folder: its relative paths are its own folder's, so the demo cache answers
    port = free_port()
    s = served("--config", str(REPO / "server_config.yml"), "--mode", "replay", "--store-path", str(tmp_path / "replay-store"),
               "--port", str(port), cwd=elsewhere, port=port)
    paris = {"category": "Weather", "tool_name": "Demo Weather", "api_name": "Current Weather", "tool_input": '{"city": "Paris"}'}
    r = requests.post(s.url + "/virtual", json=paris, timeout=10)
    assert r.headers["x-stm-outcome"] == "hit" and "Paris" in r.json()["response"], r.text
    assert "warning" not in s.output.lower(), s.output
