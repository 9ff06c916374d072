"""No key reaches the store, the log, /stats, an export or a snapshot, even when the simulator's endpoint
echoes its Authorization header (and the prompt) into its answers.  Real HTTP, the CLI server process."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import requests

from tests.conftest import REPO
from tests.helpers.files import files_containing
from tests.helpers.live import free_port
from tests.helpers.openai_stub import OpenAIStub, Reply
from tests.helpers.processes import ServeProcess

SIM_KEY = "sk-SIMKEY-0c9e77d1a2"
AUTH_TOKEN = "AUTHTOKEN-55e1b0f3"
TOOLBENCH_KEY = "TBKEY-CONFIG-a81d2c9e"
RAPID_KEY = "RAPIDKEY-6f0a9d3b"
REQUEST_KEY = "TBKEY-REQUEST-3e4f5a6b"
KEYS = (SIM_KEY, AUTH_TOKEN, TOOLBENCH_KEY, RAPID_KEY, REQUEST_KEY)
KEY_ENV = {
    "STM_SIMULATOR__API_KEY": SIM_KEY,
    "STM_AUTH_TOKEN": AUTH_TOKEN,
    "STM_REAL__TOOLBENCH_KEY": TOOLBENCH_KEY,
    "STM_REAL__RAPIDAPI_KEY": RAPID_KEY,
}


def echoing_endpoint(body: dict[str, Any], headers: dict[str, str]) -> Reply:
    """An endpoint that quotes its Authorization header (and the prompt) in every way it can."""
    auth = headers.get("authorization", "")
    prompt = body["messages"][-1]["content"]
    kind = next((k for k in ("text", "object", "error", "unparsable", "refused") if f"'{k}'" in prompt), "text")
    if kind == "text":
        return Reply(content=json.dumps({"error": "", "response": f"you called me with {auth}; prompt: {prompt}"}))
    if kind == "object":
        return Reply(content=json.dumps({"error": "", "response": {"auth": auth, auth: "as a key", "list": [auth, {"deep": auth}]}}))
    if kind == "error":
        return Reply(content=json.dumps({"error": f"bad key {auth}", "response": ""}))
    if kind == "unparsable":
        return Reply(content=f"not json at all, {auth}")
    return Reply(status=401, message=f"Incorrect API key provided: {auth}")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env.update(KEY_ENV, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_an_echoed_simulator_key_is_never_recorded_logged_exported_or_counted(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    with OpenAIStub(echoing_endpoint, with_headers=True) as stub:
        config = {
            "log_level": "debug",
            "store": {"path": str(work / "store")},
            # the real API is configured (its keys are loaded) but down: every miss goes on to the simulator
            "real": {"enabled": True, "relay_url": f"http://127.0.0.1:{free_port()}/relay"},
            "simulator": {"enabled": True, "api_base": stub.api_base, "max_retries": 0, "allow_without_docs": True},
        }
        with ServeProcess(work, config, env=KEY_ENV) as server:
            served = []
            for n, kind in enumerate(["text", "object", "error", "unparsable", "refused"]):
                for key in (REQUEST_KEY, ""):
                    payload = {"category": "Data", "tool_name": "Echo", "api_name": "Echo", "tool_input": json.dumps({"kind": kind, "n": n, "k": bool(key)}), "toolbench_key": key}
                    reply = requests.post(server.url + "/virtual", json=payload, headers=server.headers, timeout=30)
                    assert reply.status_code == 200, reply.text
                    served.append(reply)
            stats = requests.get(server.url + "/stats", headers=server.headers, timeout=5).text
            health = requests.get(server.url + "/health", headers=server.headers, timeout=5).text
            log_text = server.log.read_text(errors="replace")
        # the endpoint really got the key, and echoed it: its absence below means something
        assert stub.headers and all(h["authorization"] == f"Bearer {SIM_KEY}" for h in stub.headers)
    assert served[0].headers["X-STM-Outcome"] == "recorded" and "you called me with Bearer ***" in served[0].json()["response"]
    assert served[2].json()["response"]["auth"] == "Bearer ***" and "Bearer ***" in served[2].json()["response"]
    # text and object answers were recorded; the error answer (simulator.validity), the unparsable and the
    # refused ones as failure records: all of them scrubbed
    assert (json.loads(stats)["recorded"], json.loads(stats)["failure_records"]) == (4, 6)
    assert "DEBUG" in log_text and "cannot be parsed" in log_text  # the log is at debug and saw the unparsable output

    exported = cli("cache", "export", str(work / "export"), "--store-path", str(work / "store"), "-q", cwd=work)
    assert exported.returncode == 0, exported.stderr
    snapshot = cli("snapshot", str(work / "snap"), "--config", str(server.config_file), "-q", cwd=work)
    assert snapshot.returncode == 0, snapshot.stderr
    cache_stats = cli("cache", "stats", "--json", "--store-path", str(work / "store"), cwd=work)
    manifest = json.loads((work / "snap" / "manifest.json").read_text())
    assert manifest["entries"] >= 6 and manifest["settings"]["simulator"]["api_key"] == "***"

    # the store, the server log, the export, the snapshot (files and manifest): no key anywhere
    assert files_containing(work, KEYS) == []
    for text in [stats, health, cache_stats.stdout, *(r.text for r in served), *(str(dict(r.headers)) for r in served)]:
        for key in KEYS:
            assert key not in text


ESC_KEY = "sk-ESC/KEY-7b2d9e41c0"


def encoded_echo(body: dict[str, Any], headers: dict[str, str]) -> Reply:
    """An endpoint that echoes its key inside the inner JSON in every encoding an agent or a client decodes."""
    key = headers.get("authorization", "").removeprefix("Bearer ")
    escaped = "".join(f"\\u{ord(c):04x}" if i % 3 == 0 else c for i, c in enumerate(key))  # some characters \u-escaped
    slashed = key.replace("/", "\\/")
    inner = (
        '{"auth": "' + escaped + '", "also": "' + slashed + '", "upper": "' + "".join(f"\\u{ord(c):04X}" for c in key) + '", '
        '"url": "https://x/?k=' + quote(key, safe="") + '", "basic": "Basic ' + base64.b64encode(f"me:{key}".encode()).decode() + '", '
        '"token": "' + base64.urlsafe_b64encode(key.encode()).decode() + '"}'
    )
    return Reply(content=json.dumps({"error": "", "response": inner}))


def decoded_forms(text: str) -> list[str]:
    """``text`` and every string in it as an agent may read it: JSON-decoded (as deep as it goes),
    percent-decoded, base64-decoded."""
    strings, todo = [], [text]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            todo += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            todo += item
        elif isinstance(item, str):
            strings.append(item)
            try:
                todo.append(json.loads(item))
            except ValueError:
                pass
    out = []
    for form in strings:
        out += [form, unquote(form)]
        for word in form.replace('"', " ").replace("=", " ").split():
            for decode in (base64.b64decode, base64.urlsafe_b64decode):
                try:
                    out.append(decode(word + "==").decode("utf-8", "replace"))
                except ValueError:
                    pass
    return out


def test_an_echoed_key_json_escaped_percent_encoded_or_base64_is_in_no_record(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = {"STM_SIMULATOR__API_KEY": ESC_KEY}
    with OpenAIStub(encoded_echo, with_headers=True) as stub:
        config = {"store": {"path": str(work / "store")},
                  "simulator": {"enabled": True, "api_base": stub.api_base, "max_retries": 0, "allow_without_docs": True}}
        with ServeProcess(work, config, env=env) as server:
            payload = {"category": "Data", "tool_name": "Echo", "api_name": "Echo", "tool_input": "{}"}
            reply = requests.post(server.url + "/virtual", json=payload, timeout=30)
            again = requests.post(server.url + "/virtual", json=payload, timeout=30)
        assert stub.headers and stub.headers[0]["authorization"] == f"Bearer {ESC_KEY}"  # the endpoint had the key to echo
    assert reply.headers["X-STM-Outcome"] == "recorded" and again.headers["X-STM-Outcome"] == "hit"
    served = reply.json()["response"]
    assert json.loads(served)["auth"] == "***" and json.loads(served)["url"] == "https://x/?k=***"  # what the agent's json.loads sees
    exported = cli("cache", "export", str(work / "export"), "--store-path", str(work / "store"), "-q", cwd=work)
    assert exported.returncode == 0, exported.stderr
    texts = [reply.text, again.text, *(p.read_text() for p in (work / "export").rglob("*.json"))]
    leaks = [form for text in texts for form in decoded_forms(text) if ESC_KEY in form or ESC_KEY.encode().hex() in form]
    assert leaks == []
    assert files_containing(work, (ESC_KEY, quote(ESC_KEY, safe=""))) == []
