"""One config model: file < STM_* env < flags; bad keys fail naming the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stabletoolbench_mirror.config import ConfigError, load_settings
from stabletoolbench_mirror.config_loading import REMOVED_KEYS


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "server_config.yml"
    p.write_text(text)
    return p


def test_defaults() -> None:
    s = load_settings(None, environ={})
    assert (s.mode, s.host, s.port, s.store.kind) == ("record", "127.0.0.1", 8080, "diskcache")
    assert s.auth_token is None and not s.real.enabled and not s.simulator.enabled
    assert s.simulator.style == "mirrorapi-sft" and s.simulator.temperature == 0


@pytest.mark.parametrize(
    "text, key",
    [
        ("mdoe: replay\n", "mdoe"),
        ("simulator:\n  tempreature: 0.1\n", "simulator.tempreature"),
        ("mode: playback\n", "mode"),
        ("port: eighty\n", "port"),
        ("store:\n  kind: mongodb\n", "store.kind"),
        ("simulator:\n  style: gpt5\n", "simulator.style"),
        ("real:\n  connect_timeout_s: 0\n", "real.connect_timeout_s"),
        ("archive_max_members: 0\n", "archive_max_members"),
        ("archive_max_total_mb: -1\n", "archive_max_total_mb"),
        ("download_deadline_s: 0\n", "download_deadline_s"),
        ("download_max_mb: -1\n", "download_max_mb"),
    ],
)
def test_bad_keys_fail_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, text), environ={})
    assert f"'{key}'" in str(err.value)


def test_not_a_mapping_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(write(tmp_path, "- a\n- b\n"), environ={})
    with pytest.raises(ConfigError, match="YAML"):
        load_settings(write(tmp_path, "mode: [\n"), environ={})


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    cfg = write(tmp_path, "mode: replay\nport: 9000\nsimulator:\n  model: FromFile\n")
    s = load_settings(cfg, environ={"STM_PORT": "9100", "STM_SIMULATOR__MODEL": "FromEnv", "STM_SIMULATOR__TEMPERATURE": "0.5"})
    assert (s.mode, s.port, s.simulator.model, s.simulator.temperature) == ("replay", 9100, "FromEnv", 0.5)
    s = load_settings(cfg, overrides={"port": 9200, "mode": "record"}, environ={"STM_PORT": "9100"})
    assert (s.mode, s.port) == ("record", 9200)
    with pytest.raises(ConfigError, match="'nonsense'"):
        load_settings(cfg, environ={"STM_NONSENSE": "1"})
    # the tooling's own variables are not settings
    tooling = {"STM_CONFIG": str(cfg), "STM_VLLM_PYTHON": "/x/python", "STM_VLLM_REQUIRED": "1", "STM_CI_VENV": "/tmp/v"}
    assert load_settings(cfg, environ=tooling).port == 9000


def test_every_stm_variable_the_ci_script_and_the_test_helpers_set_is_not_taken_for_a_setting(tmp_path: Path) -> None:
    """CI exports variables for the test helpers; one the config takes for an unknown key fails every in-process command."""
    import re
    repo = Path(__file__).resolve().parents[2]
    texts = [(repo / ".ci" / "run").read_text(), *(p.read_text() for p in (repo / "tests" / "helpers").glob("*.py"))]
    names = {n for t in texts for n in re.findall(r"\b(STM_[A-Z0-9_]+)\b", t)} - {"STM_"}
    assert "STM_CI_MCP_SQLITE_VENV" in names  # the scan sees what .ci/run exports
    cfg = write(tmp_path, "port: 9000\n")
    from stabletoolbench_mirror.config import Settings
    settings_env = {n for n in names if n.removeprefix("STM_").split("__")[0].lower() in Settings.model_fields}
    assert load_settings(cfg, environ={n: "/tmp/x" for n in names - settings_env}).port == 9000


def test_relative_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    sub = tmp_path / "conf"
    sub.mkdir()
    s = load_settings(write(sub, "store:\n  path: data/store\nfrozen_caches: [frozen]\n"), environ={})
    assert s.resolve(s.store.path) == str(sub / "data" / "store")
    assert s.resolve(s.frozen_caches[0]) == str(sub / "frozen")


def test_stabletoolbench_config_keys(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        "cache_folder: ./tool_response_cache\ntools_folder: ./tools\nport: 8081\nis_save: false\n"
        "toolbench_url: http://127.0.0.1:9/rapidapi\napi_base: http://127.0.0.1:8000/v1\napi_key: sk-xyz\nmodel: gpt-4o\ntemperature: 0.2\n",
    )
    s = load_settings(cfg, environ={})
    assert s.frozen_caches == ["./tool_response_cache"] and s.tools_folder == "./tools" and s.port == 8081
    assert s.save is False
    assert s.real.enabled and s.real.backend == "relay" and s.real.relay_url == "http://127.0.0.1:9/rapidapi"
    assert s.simulator.enabled and s.simulator.api_base == "http://127.0.0.1:8000/v1" and s.simulator.model == "gpt-4o"
    assert s.simulator.api_key.get_secret_value() == "sk-xyz" and s.simulator.temperature == 0.2
    assert "sk-xyz" not in repr(s)


def test_serve_fails_at_start_naming_the_key(tmp_path: Path) -> None:
    cfg = write(tmp_path, "simulator:\n  api_bsae: http://x\n")
    result = subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "simulator.api_bsae" in result.stderr


@pytest.mark.parametrize(
    "text, environ, expected",
    [
        ("simulator:\n  tempreature: 0.1\n", {}, "unknown key 'simulator.tempreature' (did you mean 'simulator.temperature'?)"),
        ("mdoe: replay\n", {}, "unknown key 'mdoe' (did you mean 'mode'?)"),
        ("limits:\n  queue_timeout: 3\n", {}, "unknown key 'limits.queue_timeout' (did you mean 'limits.queue_timeout_s'?)"),
        ("real:\n  relay: http://x\n", {}, "unknown key 'real.relay' (did you mean 'real.relay_url'?)"),
        # upstream-style keys are known keys too
        ("cache_folder: ./c\nis_sav: true\n", {}, "unknown key 'is_sav' (did you mean 'is_save'?)"),
        ("{}\n", {"STM_SIMULATOR__MODLE": "x"}, "unknown key 'simulator.modle' (did you mean 'simulator.model'?)"),
    ],
)
def test_unknown_keys_suggest_the_nearest_known_one(tmp_path: Path, text: str, environ: dict[str, str], expected: str) -> None:
    """Issue 18 item 7d."""
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, text), environ=environ)
    assert expected in str(err.value)


def test_a_config_yml_left_alone_suggests_too(tmp_path: Path) -> None:
    (tmp_path / "config.yml").write_text("cache_foldr: ./tool_response_cache\ndatabase: x\n")
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        note = load_settings(environ={}).config_source
    finally:
        os.chdir(cwd)
    assert note.startswith("defaults (./config.yml not used: ")  # the built-in defaults: no file was used
    assert "unknown keys cache_foldr (did you mean 'cache_folder'?), database: not StableToolBench's server config" in note


def test_no_suggestion_when_nothing_is_close(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, "database: postgres\n"), environ={})
    assert str(err.value).endswith("unknown key 'database'")


# -- Architecture IV: keys that became constants fail naming the key and the value it is fixed at ------------------


@pytest.mark.parametrize("text, environ, added", [
    ("limits:\n  header_timeout_s: 30\n", {}, ""),
    ("{}\n", {"STM_LIMITS__HEADER_TIMEOUT_S": "30"}, " + STM_* environment"),
])
def test_a_key_that_became_a_constant_is_refused_naming_its_fixed_value(tmp_path: Path, text: str, environ: dict[str, str],
                                                                        added: str) -> None:
    cfg = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, environ=environ)
    assert str(err.value) == f"{cfg}{added}: 'limits.header_timeout_s' is no longer a setting (fixed at 10 s); remove it"


def test_every_removed_key_is_refused_with_its_own_line(tmp_path: Path) -> None:
    """Each key of the table is refused as removed: none of them is a setting still, and none is named as unknown."""
    data: dict = {}
    for key in REMOVED_KEYS:
        *sections, name = key.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = 1
    cfg = write(tmp_path, json.dumps(data))
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, environ={})
    assert sorted(str(err.value).splitlines()) == sorted(
        f"{cfg}: '{key}' is no longer a setting (fixed at {fixed}); remove it" for key, fixed in REMOVED_KEYS.items())


def test_each_removed_key_names_the_value_its_constant_holds() -> None:
    """The table's words are written beside the constants' values: this keeps the two from drifting apart."""
    from stabletoolbench_mirror.engine import local_tools, sessions
    from stabletoolbench_mirror.responders import model_servers, real, simulator
    from stabletoolbench_mirror.responders.http_transport import MAX_ANSWER_BYTES
    from stabletoolbench_mirror.responders.simulator.prompts import EXAMPLES_BUDGET_CHARS
    from stabletoolbench_mirror.serving import admission, mcp_front, uvicorn_protocol
    from stabletoolbench_mirror.stores.kinds import LOCK_TTL_S
    from stabletoolbench_mirror.upstream import archives

    constants = {
        "limits.header_timeout_s": f"{uvicorn_protocol.HEADER_TIMEOUT_S:g} s",
        "limits.keep_alive_timeout_s": f"{uvicorn_protocol.KEEP_ALIVE_TIMEOUT_S:g} s",
        "limits.max_queued_requests": f"{admission.MAX_QUEUED_REQUESTS:,} requests",
        "store.lock_ttl_s": f"{LOCK_TTL_S:g} s",
        "real.breaker_failures": f"{real.BREAKER_FAILURES} failures", "real.breaker_reset_s": f"{real.BREAKER_RESET_S:g} s",
        "simulator.backoff_s": f"{simulator.BACKOFF_S:g} s, doubled for each next retry",
        "simulator.examples_budget_chars": f"{EXAMPLES_BUDGET_CHARS:,} characters",
        "sessions.max_state_bytes": f"{local_tools.MAX_STATE_BYTES // 2**20} MiB",
        "sessions.max_task_chars": f"{sessions.MAX_TASK_CHARS:,} characters",
        "mcp.session_idle_timeout_s": f"{mcp_front.SESSION_IDLE_TIMEOUT_S:,g} s",
        "llm.connect_timeout_s": f"{model_servers.CONNECT_TIMEOUT_S:g} s", "llm.max_answer_bytes": f"{MAX_ANSWER_BYTES // 2**20} MiB",
        "download_min_kb_per_s": f"{archives.DOWNLOAD_MIN_BYTES_PER_S // 1024:g} KB/s",
        "download_low_speed_s": f"{archives.DOWNLOAD_LOW_SPEED_S:g} s",
    }
    assert REMOVED_KEYS == constants
    assert local_tools.MAX_STATE_BYTES % 2**20 == 0 and MAX_ANSWER_BYTES % 2**20 == 0


# -- issue 18 item 8: values that cannot work are refused, naming the key and the bound ----------------


@pytest.mark.parametrize(
    "text, key, hint",
    [
        ("limits:\n  queue_timeout_s: 1.0e+300\n", "limits.queue_timeout_s", "at most a day"),
        ("simulator:\n  read_timeout_s: 1.0e+10\n", "simulator.read_timeout_s", "at most an hour"),
        ("workers: 100000\n", "workers", "about one per CPU core"),
        ("real:\n  read_timeout_s: .inf\n", "real.read_timeout_s", "at most an hour"),
        ("store:\n  timeout_s: 1.0e+10\n", "store.timeout_s", "cannot work"),
        ("limits:\n  body_timeout_s: 1.0e+10\n", "limits.body_timeout_s", "cannot work"),
        ("local_tools_timeout_s: 1.0e+10\n", "local_tools_timeout_s", "cannot work"),
        ("sessions:\n  idle_expiry_s: 1.0e+300\n", "sessions.idle_expiry_s", "cannot work"),
        ("simulator:\n  max_retries: 1000000\n", "simulator.max_retries", "cannot work"),
    ],
)
def test_values_that_cannot_work_are_refused_naming_the_key_and_the_bound(tmp_path: Path, text: str, key: str, hint: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, text), environ={})
    message = str(err.value)
    assert f"invalid value for '{key}': Input should be less than or equal to " in message and hint in message, message


def test_bounds_leave_every_sane_value(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, "limits:\n  queue_timeout_s: 86400\nsimulator:\n  read_timeout_s: 3600\nworkers: 256\n"), environ={})
    assert (s.limits.queue_timeout_s, s.simulator.read_timeout_s, s.workers) == (86400, 3600, 256)
    with pytest.raises(ConfigError, match="'workers'"):
        load_settings(write(tmp_path, "{}\n"), overrides={"workers": 100000}, environ={})
