"""Injected faults (issue 23): chosen by a seed, the same in every run, served and never recorded.

Real parts only: the mirror served on 127.0.0.1 (in a thread, and as ``serve --workers 2``), a real
OpenAI-compatible stub simulator filling the misses, real diskcache stores, the reference data's
solvable queries, and StableToolBench's own client code (``_step``) read from the reference checkout.
"""

from __future__ import annotations

import ast
import json
import time
import types
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.fault_kinds import ERROR_KINDS, KINDS
from stabletoolbench_mirror.core.keys import session_key
from stabletoolbench_mirror.core.protocol import VirtualRequest
from stabletoolbench_mirror.engine.faults import FaultPlan, draw
from stabletoolbench_mirror.stores import DiskcacheStore
from tests.conftest import REFERENCE, make_settings
from tests.helpers.openai_stub import OpenAIStub
from tests.helpers.payloads import distinct_default_payloads
from tests.helpers.processes import ServeProcess

RAPIDAPI = REFERENCE / "stabletoolbench" / "toolbench" / "inference" / "Downstream_tasks" / "rapidapi.py"


def post_all(url: str, payloads: list[dict[str, Any]], headers: dict[str, str] | None = None) -> list[requests.Response]:
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda p: requests.post(url + "/virtual", json=p, headers=headers, timeout=60), payloads))


def sim_config(tmp_path: Path, reference_dir: Path, api_base: str, store: str, **faults: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "mode": "record", "store": {"kind": "diskcache", "path": str(tmp_path / store)},
        "tools_folder": str(reference_dir / "toolenv" / "tools"),
        "simulator": {"enabled": True, "api_base": api_base, "max_retries": 0},
    }
    if faults:
        config["faults"] = faults
    return config


def test_500_default_calls_seeded_faults_same_on_another_server_never_recorded(
    tmp_path: Path, reference_dir: Path, serve: Any
) -> None:
    payloads = distinct_default_payloads(reference_dir, 500)
    assert len(payloads) == 500
    faults = {"seed": 23, "rate": 0.3, "slow_s": 0.05}
    with OpenAIStub() as stub:
        first = serve(make_settings(tmp_path, **sim_config(tmp_path, reference_dir, stub.api_base, "store", **faults)))
        run1 = post_all(first.url, payloads)
        stats = requests.get(first.url + "/stats", timeout=10).json()
        metrics = requests.get(first.url + "/metrics", timeout=10).text
        # the same seed on another server: two worker processes over a store of their own, filled anew
        with ServeProcess(tmp_path, sim_config(tmp_path, reference_dir, stub.api_base, "store2", **faults), workers=2) as second:
            run2 = post_all(second.url, payloads)
        other = serve(make_settings(tmp_path, **sim_config(tmp_path, reference_dir, stub.api_base, "store", **{**faults, "seed": 24})))
        run3 = post_all(other.url, payloads)
        clean = serve(make_settings(tmp_path, **sim_config(tmp_path, reference_dir, stub.api_base, "store")))
        run4 = post_all(clean.url, payloads)
        simulated = stub.count

    assert all(r.status_code == 200 for r in run1 + run2 + run3 + run4)
    seen = Counter(r.headers["X-STM-Fault"] for r in run1 if "X-STM-Fault" in r.headers)
    faulted = sum(seen.values())
    assert 0.25 * 500 <= faulted <= 0.35 * 500, faulted
    assert set(seen) == set(KINDS), seen  # every kind drawn at these numbers
    # the same seed: the same faults and the same bytes, on a server with two workers and its own store
    assert [r.content for r in run2] == [r.content for r in run1]
    assert [r.headers.get("X-STM-Fault") for r in run2] == [r.headers.get("X-STM-Fault") for r in run1]
    # another seed: another set of faulted calls
    set1 = {i for i, r in enumerate(run1) if "X-STM-Fault" in r.headers}
    set3 = {i for i, r in enumerate(run3) if "X-STM-Fault" in r.headers}
    assert set3 != set1 and len(set1 ^ set3) > 100, len(set1 ^ set3)
    # /stats faults equals the headers seen; /metrics has the same counts
    assert stats["faults"] == dict(seen)
    for kind, n in seen.items():
        assert f'stm_faults_served_total{{kind="{kind}"}} {float(n)}' in metrics
    # never recorded: faults off afterwards, every call is a clean hit with the answer recorded before
    assert simulated == 1000  # each store filled once (500 misses each); runs 3 and 4 were all hits
    assert all(r.headers["X-STM-Outcome"] == "hit" and "X-STM-Fault" not in r.headers for r in run4)
    with DiskcacheStore(str(tmp_path / "store")) as store:
        for payload, answer in zip(payloads, run4):
            call = ToolCall.from_request(VirtualRequest.model_validate(payload))
            record = store.get(call.api, call.key)
            assert record is not None and not record.is_failure
            assert answer.content.decode() == record.body
    for i, (faulty, good) in enumerate(zip(run1, run4)):
        kind = faulty.headers.get("X-STM-Fault")
        if kind is None or kind == "slow":
            assert faulty.content == good.content, i
        else:
            assert faulty.content != good.content, (i, kind)


def test_each_error_kind_gives_its_status_code_through_stabletoolbench_step(tmp_path: Path, serve: Any) -> None:
    """StableToolBench's own ``_step`` (read from the reference checkout) maps each error fault to its status code."""
    if not RAPIDAPI.is_file():
        pytest.skip(f"StableToolBench's client code not found at {RAPIDAPI}")
    step = upstream_step()
    payload = {"category": "Weather", "tool_name": "Demo Weather", "api_name": "Current Weather"}
    for kind, text in ERROR_KINDS.items():
        settings = make_settings(tmp_path, mode="replay", frozen_caches=[str(Path(__file__).parents[2] / "cache" / "frozen")],
                                 faults={"rate": 1.0, "kinds": [kind]})
        server = serve(settings)
        env = client_env(server.url + "/virtual", payload)
        obs, code = step(env, action_name="current_weather_for_demo_weather", action_input=json.dumps({"city": "Paris"}))
        assert code == 6 + list(ERROR_KINDS).index(kind), (kind, obs)  # the client's status codes, 6 to 11 in this order
        assert json.loads(obs) == {"error": text, "response": ""}
    # the broken answers: malformed is the client's "request invalid" (12); empty and truncated are answers (0)
    expected = {"malformed": 12, "empty": 0, "truncated": 0, "slow": 0}
    for kind, status in expected.items():
        settings = make_settings(tmp_path, mode="replay", frozen_caches=[str(Path(__file__).parents[2] / "cache" / "frozen")],
                                 faults={"rate": 1.0, "kinds": [kind], "slow_s": 0.3})
        server = serve(settings)
        started = time.monotonic()
        obs, code = step(client_env(server.url + "/virtual", payload), action_name="current_weather_for_demo_weather",
                         action_input=json.dumps({"city": "Paris"}))
        assert code == status, (kind, obs)
        if kind == "slow":
            assert time.monotonic() - started >= 0.3
            assert "temperature_c" in json.loads(obs)["response"]


def upstream_step() -> Any:
    """``rapidapi_wrapper._step``, compiled from StableToolBench's file alone (its heavy imports left out).

    Its module globals are what ``_step`` uses: ``json``, ``requests``, ``time`` (its 2 s rate-limit
    habit and 10 s rate-limit sleep made instant), ``colored`` (termcolor, only for process 0).
    """
    tree = ast.parse(RAPIDAPI.read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "rapidapi_wrapper"]
    (func,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_step"]
    module = ast.Module(body=[func], type_ignores=[])
    namespace: dict[str, Any] = {
        "json": json, "requests": requests, "time": types.SimpleNamespace(sleep=lambda s: None),
        "colored": lambda text, color=None: text, "get_rapidapi_response": None,
    }
    exec(compile(module, str(RAPIDAPI), "exec"), namespace)  # noqa: S102 - upstream's own client code, from the reference checkout
    return namespace["_step"]


def client_env(url: str, payload: dict[str, str]) -> Any:
    """The attributes ``_step`` reads from its environment, for one function."""
    name = "current_weather_for_demo_weather"
    return types.SimpleNamespace(
        functions=[{"function": {"name": name}}], api_name_reflect={name: payload["api_name"]},
        cate_names=[payload["category"]], tool_names=[payload["tool_name"]], observ_compress_method="truncate",
        toolbench_key="", process_id=1, use_rapidapi_key=False, api_customization=False, service_url=url,
    )


def test_header_stats_startup_and_check_compare_the_unfaulted_record(tmp_path: Path, serve: Any) -> None:
    from tests.integration.test_startup import cli

    frozen = str(Path(__file__).parents[2] / "cache" / "frozen")
    settings = make_settings(tmp_path, mode="replay", frozen_caches=[frozen], faults={"rate": 1.0, "kinds": ["unauthorized"]})
    server = serve(settings)
    payload = {"category": "Weather", "tool_name": "Demo Weather", "api_name": "Current Weather",
               "tool_input": json.dumps({"city": "Paris"}), "strip": "", "toolbench_key": ""}
    faulty = server.post(payload)
    assert faulty.headers["X-STM-Fault"] == "unauthorized" and faulty.json() == {"error": "Unauthorized error...", "response": ""}
    clean = server.post(payload, headers={"X-STM-Faults": "off"})  # what check asks for
    assert "X-STM-Fault" not in clean.headers and "temperature_c" in clean.json()["response"]
    assert requests.get(server.url + "/stats", timeout=5).json()["faults"] == {"unauthorized": 1}
    calls = tmp_path / "calls.jsonl"
    calls.write_text(json.dumps({"payload": payload, "observed": clean.json()}) + "\n")
    config = tmp_path / "faulty.yml"
    config.write_text(json.dumps({"mode": "replay", "frozen_caches": [frozen], "store": {"path": str(tmp_path / "s")},
                                  "faults": {"rate": 1.0, "kinds": ["unauthorized"]}}))
    # against the server and in process: the unfaulted record by default; --with-faults sees the fault
    assert cli("check", "--calls", str(calls), "--url", server.url, "-q", cwd=tmp_path).returncode == 0
    assert cli("check", "--calls", str(calls), "--url", server.url, "-q", "--with-faults", cwd=tmp_path).returncode == 1
    assert cli("check", "--calls", str(calls), "--config", str(config), "-q", cwd=tmp_path).returncode == 0
    assert cli("check", "--calls", str(calls), "--config", str(config), "-q", "--with-faults", cwd=tmp_path).returncode == 1
    doctor = cli("doctor", "--config", str(config), "--no-probe", cwd=tmp_path)
    assert "faults:" in doctor.stdout and "seed 0, 100.0% of calls: unauthorized 100%" in doctor.stdout


def test_a_session_call_is_faulted_on_its_history_hash_and_its_history_stays_clean(tmp_path: Path, serve: Any) -> None:
    frozen = str(Path(__file__).parents[2] / "cache" / "frozen")
    faults = {"rate": 0.5, "seed": 5, "kinds": ["empty", "unauthorized"]}
    with OpenAIStub() as stub:
        base = {"mode": "record", "frozen_caches": [frozen], "simulator": {"enabled": True, "api_base": stub.api_base,
                "allow_without_docs": True, "max_retries": 0}}
        settings = make_settings(tmp_path, **base, faults=faults)
        faulty = serve(settings)
        payloads = [{"category": "Weather", "tool_name": "Demo Weather", "api_name": "Current Weather",
                     "tool_input": json.dumps({"city": f"City {i}"}), "strip": "", "toolbench_key": ""} for i in range(40)]
        sid = requests.post(faulty.url + "/sessions", json={"task": "t"}, timeout=10).json()["id"]
        answers = [requests.post(faulty.url + "/virtual", json=p, headers={"X-STM-Session": sid}, timeout=30) for p in payloads]
        doc = requests.get(f"{faulty.url}/sessions/{sid}", timeout=10).json()
    plan = FaultPlan(settings.faults)
    calls = doc["calls"]
    assert len(calls) == len(payloads)
    histories = set()
    for payload, answer, entry in zip(payloads, answers, calls):
        call = ToolCall.from_request(VirtualRequest.model_validate(payload))
        # decided on the key the call was answered under: the plain key plus the session's history hash
        assert answer.headers.get("X-STM-Fault") == plan.kind_for(call.api, session_key(call.key, entry["history"]))
        assert entry["answer"]["error"] == "" and entry["answer"]["response"]  # the session kept the clean answer
        histories.add(entry["history"])
    assert len(histories) == len(payloads)  # the clean answers made the history: every call in a new state
    assert 5 <= sum("X-STM-Fault" in a.headers for a in answers) <= 35


def test_decisions_depend_on_seed_api_and_key_only_and_survive_another_python_hash_seed(tmp_path: Path) -> None:
    import subprocess
    import sys

    keys = [("Cat/tool_for_Cat/api", f"{{'n': {i}}}") for i in range(300)]
    here = [draw(7, api, key) for api, key in keys]
    code = ("import json,sys; from stabletoolbench_mirror.engine.faults import draw; "
            "print(json.dumps([draw(7, a, k) for a, k in json.load(sys.stdin)]))")
    for hash_seed in ("1", "4242"):
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps(keys), capture_output=True, text=True,
                             env={"PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(Path(__file__).parents[2])}, check=True)
        assert [tuple(x) for x in json.loads(out.stdout)] == here
    assert [draw(8, api, key) for api, key in keys] != here
