"""Curation over real parts: ``cache ls/show/delete`` against a running server (diskcache and a real
redis-server), ``cache diff`` of snapshots, and one-file snapshots served from an HTTP server on 127.0.0.1."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.config import ConfigError
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.factory import build_frozen
from stabletoolbench_mirror.stores import DiskcacheStore
from stabletoolbench_mirror.upstream.archives import ArchiveError, local_tree
from tests.helpers import paths
from tests.helpers.live import serve_http
from tests.helpers.openai_stub import OpenAIStub, Reply
from tests.helpers.redis_server import RedisServer, redis_prefix, redis_server  # noqa: F401
from tests.helpers.store_fixtures import shared_spec  # noqa: F401

LOOKUP, SEARCH = "Data/flaky_for_Data/lookup", "Data/flaky_for_Data/search"
CALLS = [(api, n) for api in ("lookup", "search") for n in range(4)]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(paths.REPO)
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def call(api: str, n: int) -> dict[str, Any]:
    return {"category": "Data", "tool_name": "Flaky", "api_name": api, "tool_input": json.dumps({"n": n}), "strip": "", "toolbench_key": ""}


def answering(body: dict[str, Any]) -> Reply:
    return Reply(content=json.dumps({"error": "", "response": "simulated " + body["messages"][-1]["content"][-40:]}))


def run(server) -> dict[tuple[str, int], bytes]:
    with requests.Session() as session:
        out = {}
        for api, n in CALLS:
            r = session.post(server.url + "/virtual", json=call(api, n), timeout=30)
            assert r.status_code == 200, r.text
            out[api, n] = r.content
        return out


def stats(server) -> dict[str, Any]:
    return requests.get(server.url + "/stats", timeout=10).json()


def test_delete_an_api_makes_its_calls_misses_while_the_others_still_hit(shared_spec, serve, settings_factory, tmp_path: Path) -> None:
    config = tmp_path / "curation.yml"
    config.write_text(json.dumps({"store": shared_spec}))
    with OpenAIStub(answering) as stub:
        server = serve(settings_factory(store=shared_spec, simulator={"enabled": True, "api_base": stub.api_base, "max_retries": 0}))
        first = run(server)
        assert run(server) == first and run(server) == first  # hits (on Redis, from the server's memory too)
        assert stats(server)["hits"] == 2 * len(CALLS) and stub.count == len(CALLS)

        listed = cli("cache", "ls", "--config", str(config), cwd=tmp_path)
        assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 1 + len(CALLS)
        assert listed.stdout.splitlines()[0].split("\t") == ["api", "key", "source", "origin", "outcome", "created_at", "size"]
        shown = cli("cache", "show", "Data/Flaky/lookup", "{'n': 2}", "--config", str(config), cwd=tmp_path)  # raw upstream names
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["body"] == first["lookup", 2].decode() and json.loads(shown.stdout)["source"] == "simulated"

        preview = cli("cache", "delete", "--api", LOOKUP, "--config", str(config), cwd=tmp_path)
        assert preview.returncode == 0 and "4 records of 1 APIs would be deleted" in preview.stdout
        assert stats(server)["hits"] == 2 * len(CALLS) and run(server) == first and stub.count == len(CALLS)  # nothing went
        deleted = cli("cache", "delete", "--api", LOOKUP, "--yes", "--config", str(config), cwd=tmp_path)
        assert deleted.returncode == 0 and "deleted 4 records of 1 APIs" in deleted.stdout, deleted.stderr

        # the running server: the deleted API's calls are misses again (asked anew), the other API's still hit
        before = stats(server)
        again = run(server)
        after = stats(server)
        assert stub.count == len(CALLS) + 4
        assert after["misses"] - before["misses"] == 4 and after["hits"] - before["hits"] == 4
        assert all(again[c] == first[c] for c in CALLS if c[0] == "search")
        ls = cli("cache", "ls", "--json", "--api", LOOKUP, "--config", str(config), cwd=tmp_path)
        assert len(ls.stdout.splitlines()) == 4  # recorded again
        counted = json.loads(cli("cache", "stats", "--json", "--config", str(config), cwd=tmp_path).stdout)
        assert counted["entries"] == len(CALLS) and counted["apis"] == 2


def test_delete_needs_a_filter_and_filters_combine(tmp_path: Path) -> None:
    with DiskcacheStore(tmp_path / "store") as store:
        for i in range(4):
            store.add(Record.from_answer(LOOKUP, f"{{'n': {i}}}", {"error": "", "response": str(i)}, "simulated", "A", ), f"c{i}")
        store.add(Record.failure(SEARCH, "{'n': 0}", {"error": "x", "response": ""}, "simulated", "B", reason="r"), "s0")
        store.add(Record(LOOKUP, "{'old': 1}", '{"error":"","response":"old"}', "real", "relay", created_at=1_000_000.0), "old")
    store_path = str(tmp_path / "store")
    refused = cli("cache", "delete", "--yes", "--store-path", store_path, cwd=tmp_path)
    assert refused.returncode == 2 and "name what to delete" in refused.stderr
    assert cli("cache", "delete", "--before", "not a date", "--store-path", store_path, cwd=tmp_path).returncode == 2
    old = cli("cache", "delete", "--before", "2000-01-01", "--yes", "--store-path", store_path, cwd=tmp_path)
    assert "deleted 1 records" in old.stdout
    failures = cli("cache", "delete", "--failures", "--yes", "--store-path", store_path, cwd=tmp_path)
    assert "deleted 1 records" in failures.stdout
    one = cli("cache", "delete", "--key", "{'n': 1}", "--origin", "simulated:A", "--yes", "--store-path", store_path, cwd=tmp_path)
    assert "deleted 1 records" in one.stdout
    with DiskcacheStore(tmp_path / "store") as store:
        assert sorted(r.key for r in store) == ["{'n': 0}", "{'n': 2}", "{'n': 3}"]
        assert store.counts().entries == 3 and store.counts().apis == 1  # type: ignore[union-attr]


# -- cache diff ---------------------------------------------------------------------------------


def _filled(path: Path, n: int = 20) -> DiskcacheStore:
    store = DiskcacheStore(path)
    for i in range(n):
        api = LOOKUP if i % 2 else SEARCH
        store.add(Record.from_answer(api, f"{{'n': {i}}}", {"error": "", "response": f"answer {i}"}, "simulated", "A"), f"c{i}")
    return store


def test_diff_of_snapshots_differing_in_three_answers(tmp_path: Path) -> None:
    store_path = str(tmp_path / "store")
    with _filled(tmp_path / "store"):
        pass
    assert cli("snapshot", str(tmp_path / "a"), "--store-path", store_path, "-q", cwd=tmp_path).returncode == 0
    with DiskcacheStore(store_path) as store:
        for i in (1, 2, 3):
            record = store.get(LOOKUP if i % 2 else SEARCH, f"{{'n': {i}}}")
            assert record is not None
            store.replace(Record.from_answer(record.api, record.key, {"error": "", "response": "changed"}, "simulated", "B"), None)
    assert cli("snapshot", str(tmp_path / "b.tar.gz"), "--store-path", store_path, "-q", cwd=tmp_path).returncode == 0

    result = cli("cache", "diff", str(tmp_path / "a"), str(tmp_path / "b.tar.gz"), "--json", "--show", "2", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert (report["added"], report["removed"], report["changed"]) == (0, 0, 3)
    assert report["by_api"] == {LOOKUP: {"added": 0, "removed": 0, "changed": 2}, SEARCH: {"added": 0, "removed": 0, "changed": 1}}
    assert len(report["changed_keys"]) == 2 and report["changed_keys"][0]["b"] == '{"error":"","response":"changed"}'
    same = cli("cache", "diff", str(tmp_path / "a"), str(tmp_path / "a"), "--json", cwd=tmp_path)
    assert same.returncode == 0 and json.loads(same.stdout)["same"] is True
    assert [json.loads(same.stdout)[k] for k in ("added", "removed", "changed")] == [0, 0, 0]
    # a store against its own snapshot: the same; text output names the changes
    assert cli("cache", "diff", store_path, str(tmp_path / "b.tar.gz"), "-q", cwd=tmp_path).returncode == 0
    text = cli("cache", "diff", str(tmp_path / "a"), store_path, "-q", cwd=tmp_path)
    assert text.returncode == 1 and "added: 0  removed: 0  changed: 3" in text.stdout and f"{LOOKUP}: 0 added, 0 removed, 2 changed" in text.stdout
    # added and removed keys, and an error
    with DiskcacheStore(store_path) as store:
        store.delete(SEARCH, ["{'n': 0}"])
        store.add(Record.from_answer("New/x_for_New/y", "{}", {"error": "", "response": "new"}, "real", "r"), None)
    report = json.loads(cli("cache", "diff", str(tmp_path / "a"), store_path, "--json", cwd=tmp_path).stdout)
    assert (report["added"], report["removed"], report["changed"]) == (1, 1, 3)
    missing = cli("cache", "diff", str(tmp_path / "a"), str(tmp_path / "nowhere"), cwd=tmp_path)
    assert missing.returncode == 2 and "nowhere" in missing.stderr


# -- one-file snapshots over HTTP -----------------------------------------------------------------


class _Files(http.server.SimpleHTTPRequestHandler):
    gets: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the handler's name
        type(self).gets.append(self.path)
        super().do_GET()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def files_server(tmp_path: Path) -> Iterator[tuple[str, Path, list[str]]]:
    """A real HTTP server on 127.0.0.1 serving ``tmp_path/www``: (base URL, folder, paths asked for)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = type("Files", (_Files,), {"gets": []})
    with serve_http(functools.partial(handler, directory=str(root))) as url:
        yield url, root, handler.gets


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tampered(archive: Path, out: Path) -> None:
    """``archive`` with one answer changed and the manifest left as it was."""
    with tarfile.open(archive, "r:gz") as src, tarfile.open(out, "w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            if data is not None and member.name.endswith("lookup.json"):
                data = data.replace(b"simulated", b"SIMULATED", 1)
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)


def test_archive_round_trip_over_http_and_refusals(files_server, serve, settings_factory, tmp_path: Path) -> None:
    base, www, gets = files_server
    with OpenAIStub(answering) as stub:
        recorder = serve(settings_factory(simulator={"enabled": True, "api_base": stub.api_base, "max_retries": 0}))
        observed = run(recorder)
    made = cli("snapshot", str(www / "snap.tar.gz"), "--store-path", str(tmp_path / "store"), "-q", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    url = f"{base}/snap.tar.gz#sha256={_sha(www / 'snap.tar.gz')}"
    download_dir = str(tmp_path / "downloads")

    def replayer(frozen: str):
        return settings_factory(mode="replay", frozen_caches=[frozen], download_dir=download_dir,
                                store={"kind": "diskcache", "path": str(tmp_path / "empty")})

    server = serve(replayer(url))
    assert gets == ["/snap.tar.gz"]  # downloaded once
    calls = tmp_path / "calls.jsonl"
    calls.write_text("".join(json.dumps({"payload": call(*c), "observed": json.loads(observed[c])}) + "\n" for c in CALLS))
    checked = cli("check", "--calls", str(calls), "--url", server.url, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"identical: {len(CALLS)} answers" in checked.stdout
    # a second start uses the local copy
    build_frozen(replayer(url))
    assert gets == ["/snap.tar.gz"]
    # cache import takes the URL too (the copy kept)
    imported = cli("cache", "import", url, "--store-path", str(tmp_path / "imported"), "-q", cwd=tmp_path)
    assert imported.returncode == 0 and f"added:            {len(CALLS)}" in imported.stdout, imported.stderr

    # a wrong #sha256: refused, naming both hashes
    wrong = "0" * 64
    with pytest.raises(ConfigError, match=f"does not match the expected {wrong}"):
        build_frozen(replayer(f"{base}/snap.tar.gz#sha256={wrong}"))
    # a tampered archive (an answer changed, the manifest kept): refused at the start, naming both hashes
    _tampered(www / "snap.tar.gz", www / "tampered.tar.gz")
    manifest_hash = json.loads(next(p for p in Path(local_tree(url, download_dir)).glob("manifest.json")).read_text())["content_hash"]
    from stabletoolbench_mirror.startup.checks import inspect

    report = inspect(replayer(f"{base}/tampered.tar.gz"), probe_endpoints=False)
    [error] = [f for f in report.errors if f.key == "frozen_caches[0]"]
    assert f"does not match the manifest's content_hash {manifest_hash}" in error.message and "sha256:" in error.message.split("hash ")[1]
    # docs/curation.md quotes both messages as they read
    docs = (paths.REPO / "docs" / "curation.md").read_text(encoding="utf-8")
    files_hash = error.message.split("the files' content hash ")[1].split(" ")[0]
    quoted = error.message.split(": ", 1)[1].replace(files_hash, "sha256:<files>").replace(manifest_hash, "sha256:<manifest>")
    assert quoted in docs, quoted
    with pytest.raises(ConfigError) as refused:  # a URL not downloaded before: checked as it arrives, and not kept
        build_frozen(replayer(f"{base}/snap.tar.gz?again#sha256={wrong}"))
    assert len(list(Path(download_dir).glob("*-snap.tar.gz"))) == 1
    actual = _sha(www / "snap.tar.gz")
    quoted = str(refused.value).split(": ", 1)[1].replace(f"{base}/snap.tar.gz?again", "https://example.org/stm/run1.tar.gz")
    quoted = quoted.replace(actual, "<downloaded>").replace(wrong, "<given>")
    assert f"error: frozen_caches[0]: {quoted}" in docs, quoted
    with pytest.raises(ConfigError, match="does not match the manifest's content_hash"):
        build_frozen(replayer(str(www / "tampered.tar.gz")))
    assert not any(p.name.startswith("tampered") for p in Path(download_dir).iterdir())  # nothing of it kept unpacked
    verified = cli("snapshot", "--verify", url, "--config", str(_config(tmp_path, url, download_dir)), "-q", cwd=tmp_path)
    assert verified.returncode == 0 and "OK: the snapshot matches its manifest" in verified.stdout, verified.stderr
    tampered = cli("snapshot", "--verify", str(www / "tampered.tar.gz"), "--config", str(_config(tmp_path, url, download_dir)), cwd=tmp_path)
    assert tampered.returncode == 1 and manifest_hash in tampered.stderr
    started = cli("serve", "--config", str(_config(tmp_path, f"{base}/tampered.tar.gz", download_dir)), cwd=tmp_path)
    assert started.returncode != 0 and "not starting" in started.stderr and manifest_hash in started.stderr


def _config(tmp_path: Path, frozen: str, download_dir: str) -> Path:
    path = tmp_path / "serve.yml"
    path.write_text(json.dumps({"mode": "replay", "frozen_caches": [frozen], "download_dir": download_dir, "port": 0,
                                "store": {"kind": "diskcache", "path": str(tmp_path / "empty")}}))
    return path


@pytest.mark.parametrize("member", ["../escape.json", "/abs.json", "link"])
def test_an_archive_reaching_outside_its_folder_is_refused(member: str, tmp_path: Path) -> None:
    archive = tmp_path / "bad.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        manifest = b'{"content_hash": "sha256:x"}'
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        info = tarfile.TarInfo(member)
        if member == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(ArchiveError, match="not unpacked|link or special file"):
        local_tree(str(archive), tmp_path / "downloads")
    assert not (tmp_path / "escape.json").exists() and not Path("/abs.json").exists()
    assert [p.name for p in (tmp_path / "downloads").iterdir()] == []


@pytest.mark.redis
def test_a_redis_record_memory_serves_through_an_outage_and_is_emptied_when_the_channel_is_back(tmp_path: Path) -> None:
    """While Redis is down nobody can delete through it: remembered answers are served; once the
    invalidation channel is back (messages may have been missed) the memory starts empty."""
    from stabletoolbench_mirror.stores.redis_store import RedisStore
    from tests.helpers.redis_server import require_redis_server

    require_redis_server()
    with RedisServer(tmp_path / "redis") as server:
        writer, reader = RedisStore(server.url, prefix="outage"), RedisStore(server.url, prefix="outage")
        try:
            writer.add(Record.from_answer(LOOKUP, "{'n': 1}", {"error": "", "response": "one"}, "simulated", "A"), "c1")
            assert reader.get(LOOKUP, "{'n': 1}") is not None and reader.recall(LOOKUP, "{'n': 1}") is not None
            server.stop()
            assert reader.get(LOOKUP, "{'n': 1}") is not None  # from memory, Redis down
            server.start()
            deadline = time.monotonic() + 10
            while reader.recall(LOOKUP, "{'n': 1}") is not None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert reader.recall(LOOKUP, "{'n': 1}") is None
            writer.delete(LOOKUP, ["{'n': 1}"])
            assert reader.get(LOOKUP, "{'n': 1}") is None
        finally:
            writer.close()
            reader.close()


@pytest.mark.redis
def test_a_forked_child_does_not_serve_the_parents_record_memory(redis_server: RedisServer, redis_prefix: str) -> None:  # noqa: F811
    from stabletoolbench_mirror.stores.redis_store import RedisStore

    store = RedisStore(redis_server.url, prefix=redis_prefix)
    try:
        store.add(Record.from_answer(LOOKUP, "{'n': 1}", {"error": "", "response": "one"}, "simulated", "A"), "c1")
        assert store.get(LOOKUP, "{'n': 1}") is not None and store.recall(LOOKUP, "{'n': 1}") is not None
        pid = os.fork()
        if pid == 0:  # the child: nothing is served from the copied memory (no thread hears deletes for it)
            os._exit(0 if store.recall(LOOKUP, "{'n': 1}") is None else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert store.recall(LOOKUP, "{'n': 1}") is not None  # the parent's memory is its own
    finally:
        store.close()


def test_a_redis_store_dropped_without_close_stops_listening(redis_server: RedisServer, redis_prefix: str) -> None:  # noqa: F811
    import gc

    from stabletoolbench_mirror.stores.redis_store import RedisStore

    store = RedisStore(redis_server.url, prefix=redis_prefix)
    store.add(Record.from_answer(LOOKUP, "{'n': 1}", {"error": "", "response": "one"}, "simulated", "A"), "c1")
    before = set(threading.enumerate())  # other tests' stores may still be listening: only this store's thread counts
    assert store.get(LOOKUP, "{'n': 1}") is not None  # the first read starts the listening thread
    listening = [t for t in threading.enumerate() if t.name == "stm-redis-invalidate" and t not in before]
    assert listening
    del store
    deadline = time.monotonic() + 30  # generous: a loaded machine schedules the thread's turns late
    while any(t.is_alive() for t in listening) and time.monotonic() < deadline:
        gc.collect()  # the store is a cycle (its client factory names it): collected between two turns
        for thread in listening:
            thread.join(timeout=0.6)  # it holds the store only during a turn: it ends at the next one
    assert not any(t.is_alive() for t in listening), "a dropped store's thread would reconnect forever"


def test_a_raw_api_name_is_split_as_an_api_path() -> None:
    """``--api``'s raw names are split under the API path's one rule (core.naming.ApiPath): a fourth part is
    the tool name's slash, as upstream reads it (a three-way split once matched the text only)."""
    from stabletoolbench_mirror.core.selection import api_names

    assert api_names("Data/movies/Get Title") == {"Data/movies/Get Title", "Data/movies_for_Data/get_title"}
    assert api_names("Data/x/y/get") == {"Data/x/y/get", "Data/x_y_for_Data/get"}
    assert api_names("Data/get") == {"Data/get"} and api_names("Data//get") == {"Data//get"}
