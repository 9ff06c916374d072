"""A store records its format; stores of each released format open, a newer format is refused at start.

``tests/data/stores/`` holds a small store written by each released format, by that release's
own code: ``diskcache-format-1/`` (a diskcache folder, with its ``cache.db-generation``) and
``redis-format-1.json`` (every key of a Redis store, loaded into a real redis-server here), both
written by 0.2.0 (commit 4181fcd) with an answer, a real API's answer and a failure record.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from stabletoolbench_mirror import __version__
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import DiskcacheStore, formats
from stabletoolbench_mirror.stores.base import StoreError
from stabletoolbench_mirror.stores.redis_store import RedisStore
from tests.helpers.live import free_port
from tests.helpers.paths import REPO
from tests.helpers.redis_server import RedisServer, redis_prefix, redis_server  # noqa: F401

DATA = Path(__file__).resolve().parents[1] / "data" / "stores"
API = "Weather/demo_weather/current_weather"
ANSWERS = {"{'city': 'Paris'}": '{"temperature_c": 14.0}', "{'city': 'Rome'}": '{"temperature_c": 21.5}'}


def _format_1_diskcache(tmp_path: Path) -> Path:
    folder = tmp_path / "format-1"
    shutil.copytree(DATA / "diskcache-format-1", folder)
    return folder


def _load_redis_format_1(server: RedisServer, prefix: str) -> None:
    dump = json.loads((DATA / "redis-format-1.json").read_text())
    client = redis.Redis.from_url(server.url, decode_responses=True)
    for item in dump["keys"]:
        key = prefix + item["key"][len(dump["prefix"]):]
        if item["type"] == "hash":
            client.hset(key, mapping=item["value"])
        elif item["type"] == "set":
            client.sadd(key, *item["value"])
        else:
            client.set(key, item["value"])
    client.close()


def _check_format_1_records(store: Any) -> None:
    for key, response in ANSWERS.items():
        record = store.get(API, key)
        assert record is not None and json.loads(record.body)["response"] == response
    failure = store.get(API, "{'city': 'Oslo'}")
    assert failure is not None and failure.is_failure and failure.reason == "simulator unavailable: connection failed"
    counts = store.counts()
    assert (counts.entries, counts.by_source, counts.by_outcome) == (3, {"real": 1, "simulated": 2}, {"failure": 1})


# -- the rules -----------------------------------------------------------------------------------


def test_the_rules_mark_new_and_older_stores_use_this_format_and_refuse_a_newer_one() -> None:
    assert formats.decide(None, "s") == "mark"  # new, or format 1 (no marker)
    assert formats.decide(formats.Marker(1, "0.2.0"), "s") == "mark"
    assert formats.decide(formats.current(), "s") == "use"
    with pytest.raises(formats.FormatError) as caught:
        formats.decide(formats.Marker(formats.FORMAT + 1, "9.9.9"), "/data/store")
    message = str(caught.value)
    assert f"format {formats.FORMAT + 1}" in message and "9.9.9" in message and __version__ in message
    assert "/data/store" in message and "pip install -U stabletoolbench-mirror" in message
    with pytest.raises(formats.FormatError, match="not written by stabletoolbench-mirror"):
        formats.parse("{not json")
    assert formats.parse(formats.current().to_text()) == formats.current()


# -- diskcache ---------------------------------------------------------------------------------


def test_a_format_1_diskcache_store_opens_serves_and_is_marked(tmp_path: Path) -> None:
    folder = _format_1_diskcache(tmp_path)
    with DiskcacheStore(folder, read_only=True) as reader:  # read-only: read as it is, nothing written
        _check_format_1_records(reader)
    with DiskcacheStore(folder) as store:
        _check_format_1_records(store)
        store.add(Record.from_answer(API, "{'city': 'Lima'}", {"error": "", "response": "new"}, "simulated", "t"), None)
        assert store.counts().entries == 4
    marker = formats.parse(_raw_marker(folder))
    assert marker == formats.current()


def _raw_marker(folder: Path) -> str:
    import diskcache

    cache = diskcache.Cache(str(folder))
    try:
        return cache.get("m\x00format")
    finally:
        cache.close()


def test_a_writer_of_this_version_keeps_a_format_1_reader_beside_it_fresh(tmp_path: Path) -> None:
    # 0.2.0's readers trust cache.db-generation: a write of this version gives it new bytes when it is there
    folder = _format_1_diskcache(tmp_path)
    generation = folder / "cache.db-generation"
    before = generation.read_bytes()
    with DiskcacheStore(folder) as store:
        store.add(Record.from_answer(API, "{'city': 'Lima'}", {"error": "", "response": "new"}, "simulated", "t"), None)
        assert generation.read_bytes() != before and len(generation.read_bytes()) == 8
    # a store of this format never makes one
    with DiskcacheStore(tmp_path / "new") as store:
        store.add(Record.from_answer(API, "{'city': 'Lima'}", {"error": "", "response": "new"}, "simulated", "t"), None)
    assert not (tmp_path / "new" / "cache.db-generation").exists()


def test_the_generation_file_is_never_followed_out_of_the_store(tmp_path: Path) -> None:
    folder = _format_1_diskcache(tmp_path)
    outside = tmp_path / "outside"
    outside.write_bytes(b"untouched")
    (folder / "cache.db-generation").unlink()
    (folder / "cache.db-generation").symlink_to(outside)
    with DiskcacheStore(folder) as store:
        store.add(Record.from_answer(API, "{'city': 'Lima'}", {"error": "", "response": "new"}, "simulated", "t"), None)
    assert outside.read_bytes() == b"untouched"


def _newer(folder: Path) -> None:
    import diskcache

    cache = diskcache.Cache(str(folder))
    cache.set("m\x00format", json.dumps({"format": formats.FORMAT + 1, "written_by": "9.9.9"}))
    cache.close()


def test_a_diskcache_store_of_a_newer_format_is_refused_naming_both_versions(tmp_path: Path) -> None:
    folder = _format_1_diskcache(tmp_path)
    _newer(folder)
    for read_only in (False, True):
        with pytest.raises(StoreError) as caught:
            DiskcacheStore(folder, read_only=read_only)
        assert f"format {formats.FORMAT + 1}" in str(caught.value) and "9.9.9" in str(caught.value)
        assert __version__ in str(caught.value)


def test_serve_refuses_a_store_of_a_newer_format_at_start(tmp_path: Path) -> None:
    folder = _format_1_diskcache(tmp_path)
    _newer(folder)
    port = free_port()
    config = tmp_path / "server.yml"
    config.write_text(json.dumps({"port": port, "mode": "replay", "store": {"kind": "diskcache", "path": str(folder)}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    proc = subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", "serve", "--config", str(config)], cwd=tmp_path,
                          env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"format {formats.FORMAT + 1}" in proc.stderr and "9.9.9" in proc.stderr and __version__ in proc.stderr
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=2)


# -- Redis ---------------------------------------------------------------------------------------


@pytest.mark.redis
def test_a_format_1_redis_store_opens_serves_and_is_marked_at_its_first_write(redis_server: RedisServer, redis_prefix: str) -> None:  # noqa: F811
    _load_redis_format_1(redis_server, redis_prefix)
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    store = RedisStore(redis_server.url, prefix=redis_prefix)
    try:
        _check_format_1_records(store)
        assert client.get(f"{redis_prefix}:format") is None  # reading writes nothing
        store.add(Record.from_answer(API, "{'city': 'Lima'}", {"error": "", "response": "new"}, "simulated", "t"), None)
        assert formats.parse(client.get(f"{redis_prefix}:format")) == formats.current()
        assert store.counts().entries == 4
    finally:
        store.close()
        client.close()


@pytest.mark.redis
def test_a_redis_store_of_a_newer_format_is_refused_naming_both_versions(redis_server: RedisServer, redis_prefix: str) -> None:  # noqa: F811
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.set(f"{redis_prefix}:format", json.dumps({"format": formats.FORMAT + 1, "written_by": "9.9.9"}))
    client.close()
    with pytest.raises(StoreError) as caught:
        RedisStore(redis_server.url, prefix=redis_prefix)
    assert f"format {formats.FORMAT + 1}" in str(caught.value) and "9.9.9" in str(caught.value) and __version__ in str(caught.value)
