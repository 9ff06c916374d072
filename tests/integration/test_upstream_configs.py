"""StableToolBench's own server configs, as shipped, read as the upstream server that reads each one.

Upstream ships three configs in ``server/``, one per server: ``config.yml`` (``main.py``, the GPT
simulator), ``config_mirrorapi.yml`` (``main_mirrorapi.py``) and ``config_mirrorapi_cache.yml``
(``main_mirrorapi_cache.py``).  Both MirrorAPI servers send ``SFT_SYSTEM`` from the
``system_prompts.py`` beside them; they differ in the ``api_name`` they put in the doc.  The files
are read from the reference checkout (``../shared/reference/stabletoolbench``), never copied.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.config import load_settings
from stabletoolbench_mirror.responders.simulator import system_prompt_for
from tests.conftest import REFERENCE
from tests.helpers.live import free_port
from tests.helpers.openai_stub import OpenAIStub
from tests.integration.test_prompt_parity import upstream_messages
from tests.integration.test_startup import served  # noqa: F401 - the fixture

UPSTREAM_SERVER = REFERENCE / "stabletoolbench" / "server"
#: config file -> (the style upstream's server that reads it runs, that server)
SHIPPED = {
    "config.yml": ("gpt-fewshot", "main.py"),
    "config_mirrorapi.yml": ("mirrorapi-sft", "main_mirrorapi.py"),
    "config_mirrorapi_cache.yml": ("mirrorapi-cache", "main_mirrorapi_cache.py"),
}


@pytest.fixture(scope="module")
def upstream_server() -> Path:
    if not all((UPSTREAM_SERVER / name).is_file() for name in (*SHIPPED, "system_prompts.py")):
        pytest.skip(f"StableToolBench's server configs not found at {UPSTREAM_SERVER}")
    return UPSTREAM_SERVER.resolve()


def upstream_constant(path: Path, name: str) -> str:
    """A string constant of upstream's ``system_prompts.py``, read independently of the package."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not in {path}")


def flat(text: str) -> str:
    return re.sub(r" +", " ", text)


@pytest.mark.parametrize("name", list(SHIPPED))
def test_each_shipped_config_runs_the_style_of_the_server_that_reads_it(upstream_server: Path, name: str) -> None:
    style, script = SHIPPED[name]
    settings = load_settings(upstream_server / name, environ={})
    assert settings.simulator.enabled and settings.simulator.style == style
    assert settings.style_source.startswith(f"{style}: {name} is the file StableToolBench's {script} reads")
    if style == "gpt-fewshot":  # upstream's server/ folder: the MirrorAPI configs beside it are named
        assert "; for MirrorAPI pass --config config_mirrorapi.yml or config_mirrorapi_cache.yml" in settings.style_source
    assert "choose another with STM_SIMULATOR__STYLE=<style>" in settings.style_source
    prompt = system_prompt_for(settings)
    if style == "gpt-fewshot":
        assert prompt.source == "built-in"
        return
    # the MirrorAPI servers' ``from system_prompts import SFT_SYSTEM``: the file beside the config
    assert prompt.text == upstream_constant(upstream_server / "system_prompts.py", "SFT_SYSTEM")
    assert prompt.source == f"{upstream_server / 'system_prompts.py'}:SFT_SYSTEM"
    assert settings.simulator.model == "simulation-250123-qwen25-mixed" and settings.simulator.temperature == 0.1


def test_another_style_can_be_chosen_and_the_summary_says_so(upstream_server: Path) -> None:
    settings = load_settings(upstream_server / "config_mirrorapi.yml", environ={"STM_SIMULATOR__STYLE": "mirrorapi-cot"})
    assert settings.simulator.style == "mirrorapi-cot"
    assert settings.style_source.startswith("mirrorapi-cot: set by the environment or command line (the file alone gives mirrorapi-sft")
    assert system_prompt_for(settings).text == upstream_constant(upstream_server / "system_prompts.py", "COT_SYSTEM")


def test_a_renamed_mirrorapi_config_is_still_read_as_a_mirrorapi_one(upstream_server: Path, tmp_path: Path) -> None:
    """Under another name, the keys decide: none of main.py's (cache_folder, toolbench_url, is_save)."""
    renamed = tmp_path / "my_simulator.yml"
    renamed.write_text((upstream_server / "config_mirrorapi.yml").read_text())
    settings = load_settings(renamed, environ={})
    assert settings.simulator.style == "mirrorapi-sft"
    assert "has none of main.py's keys" in settings.style_source
    renamed.write_text((upstream_server / "config.yml").read_text())
    assert load_settings(renamed, environ={}).simulator.style == "gpt-fewshot"


@pytest.mark.parametrize("name", ["config_mirrorapi.yml", "config_mirrorapi_cache.yml"])
def test_serving_a_shipped_mirrorapi_config_sends_mirrorapis_prompt(
    upstream_server: Path, reference_dir: Path, reference_calls: list[dict[str, Any]], tmp_path: Path, name: str, served: Any
) -> None:
    style, script = SHIPPED[name]
    layout = json.loads((reference_dir / "mirrorapi_prompts.json").read_text())
    tools = reference_dir / "toolenv" / "tools"
    port = free_port()
    with OpenAIStub() as stub:
        # the shipped file as it is; only what points at the authors' machines is moved here
        s = served("--config", str(upstream_server / name), cwd=tmp_path, port=port, extra_env={
            "STM_PORT": str(port), "STM_STORE__PATH": str(tmp_path / "store"),
            "STM_TOOLS_FOLDER": str(tools), "STM_SIMULATOR__API_BASE": stub.api_base,
        })
        payload = reference_calls[0]["payload"]
        answer = requests.post(s.url + "/virtual", json=payload, timeout=30)
        assert answer.status_code == 200 and answer.headers["x-stm-outcome"] == "recorded"
        [sent] = stub.requests
        out = flat(s.output)
    expected = upstream_messages(layout, tools, payload, style)
    expected[0]["content"] = upstream_constant(upstream_server / "system_prompts.py", "SFT_SYSTEM")
    assert sent["messages"] == expected
    assert sent["model"] == "simulation-250123-qwen25-mixed" and sent["temperature"] == 0.1
    assert f"simulator: {style}, model 'simulation-250123-qwen25-mixed'" in out
    assert f"simulator style: {style}: {name} is the file StableToolBench's {script} reads" in out
    assert f"simulator prompt: {upstream_server / 'system_prompts.py'}:SFT_SYSTEM" in out
    assert "built-in system prompt" not in out


# -- issue 18 item 7c: one typo does not make the file "not StableToolBench's" ------------------------


def test_a_typo_in_upstreams_config_yml_is_an_error_naming_the_key(upstream_server: Path, tmp_path: Path) -> None:
    from tests.integration.test_startup import cli

    shipped = (upstream_server / "config.yml").read_text()
    assert "is_save:" in shipped
    (tmp_path / "config.yml").write_text(shipped.replace("is_save:", "is_sav:"))
    for command in (["doctor", "--no-probe"], ["serve", "--port", str(free_port())]):
        result = cli(*command, cwd=tmp_path, timeout=60)
        assert result.returncode == 2, result.stdout + result.stderr
        assert re.search(r"^config\.yml( \+ command line)?: unknown key 'is_sav'", result.stderr, re.M), result.stderr
        assert "not StableToolBench's server config" not in result.stdout + result.stderr
    # a file with keys of neither kind is still left alone
    (tmp_path / "config.yml").write_text("database: postgres\nreplicas: 3\nport: 8080\n")
    left = cli("doctor", "--no-probe", cwd=tmp_path)
    assert "./config.yml not used: unknown keys database, replicas: not StableToolBench's server config" in left.stdout
    assert left.returncode != 2 and "configuration error" not in left.stderr
