"""The shipped demo cache answers the README's example request."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO


def test_demo_config_answers_readme_example(tmp_path: Path, serve, settings_factory) -> None:
    from stabletoolbench_mirror.config import load_settings

    settings = load_settings(REPO / "server_config.yml", overrides={"store": {"path": str(tmp_path / "s")}}, environ={})
    server = serve(settings)
    payload = {
        "category": "Weather",
        "tool_name": "Demo Weather",
        "api_name": "Current Weather",
        "tool_input": '{"city": "Paris"}',
        "strip": "",
        "toolbench_key": "",
    }
    r = server.post(payload)
    assert r.status_code == 200
    assert r.json()["error"] == ""
    assert '"city": "Paris"' in r.json()["response"]
