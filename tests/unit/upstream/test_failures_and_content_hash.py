"""Which tree entries are failure records (a manifest's list and its hash) and the snapshot's content hash."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from stabletoolbench_mirror.core.protocol import encode_answer, simulation_failed_answer
from stabletoolbench_mirror.upstream import failures
from stabletoolbench_mirror.upstream.content_hash import API_HASH_HEX, ContentHash, served_line

API = "Data/t_for_Data/a"


@pytest.mark.parametrize(
    ("manifest", "entries"),
    [
        ({}, set()),
        ({"failure_entries": []}, set()),
        ({"failure_entries": [[API, "k1"], [API, "k2"], [API, "k1"]]}, {(API, "k1"), (API, "k2")}),
        ([], set()),  # not an object: lists nothing
        ("text", set()),
        ({"failure_entries": "k1"}, None),
        ({"failure_entries": [[API]]}, None),
        ({"failure_entries": [[API, "k", "x"]]}, None),
        ({"failure_entries": [[API, 1]]}, None),
        ({"failure_entries": [(API, "k")]}, None),  # pairs are JSON lists
    ],
)
def test_failure_entries_of_a_manifest(manifest: object, entries: set[tuple[str, str]] | None) -> None:
    assert failures.failure_entries(manifest) == entries


def test_the_entries_hash_binds_the_list_to_the_content_hash_whatever_its_order() -> None:
    entries = {(API, "k1"), (API, "k2")}
    digest = failures.failure_entries_hash("sha256:abc", entries)
    line = json.dumps(["sha256:abc", [[API, "k1"], [API, "k2"]]], separators=(",", ":"))
    assert digest == "sha256:" + hashlib.sha256(line.encode()).hexdigest()
    assert failures.failure_entries_hash("sha256:abc", set(reversed(sorted(entries)))) == digest
    assert failures.failure_entries_hash("sha256:abd", entries) != digest
    assert failures.failure_entries_hash("sha256:abc", {(API, "k1")}) != digest


def test_a_manifest_changed_after_it_was_written_is_a_problem_and_an_old_one_is_not() -> None:
    entries = [[API, "k1"]]
    good = {"content_hash": "sha256:c", "failure_entries": entries,
            "failure_entries_hash": failures.failure_entries_hash("sha256:c", {(API, "k1")})}
    assert failures.failure_entries_problem(good) is None
    for before in ("stabletoolbench-mirror 0.2.0", "stabletoolbench-mirror 0.1.0"):  # written before the hash was kept
        assert failures.failure_entries_problem({"created_by": before, "failure_entries": entries}) is None
    for since in ({"created_by": "stabletoolbench-mirror 0.3.0"}, {"created_by": "stabletoolbench-mirror 0.10.1"},
                  {"created_by": "someone else"}, {}):  # the field removed from a manifest of a version that writes it
        problem = failures.failure_entries_problem({**since, "failure_entries": entries})
        assert problem is not None and "has no failure_entries_hash" in problem, since
    assert failures.failure_entries_problem("not a manifest") is None
    for changed in (dict(good, failure_entries=[]), dict(good, failure_entries=[[API, "k1"], [API, "k2"]]),
                    dict(good, content_hash="sha256:d"), dict(good, failure_entries="k1")):
        problem = failures.failure_entries_problem(changed)
        assert problem is not None and "failure_entries_hash" in problem and "stabletoolbench-mirror snapshot" in problem


def test_a_trees_failure_entries_come_from_its_manifest(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert failures.tree_failure_entries(tmp_path) == set() and failures.manifest_mtime_ns(tmp_path) == -1
    manifest = tmp_path / failures.MANIFEST_NAME
    manifest.write_text(json.dumps({"failure_entries": [[API, "k"]]}))
    assert failures.tree_failure_entries(tmp_path) == {(API, "k")}
    assert failures.manifest_mtime_ns(tmp_path) == os.stat(manifest).st_mtime_ns
    manifest.write_text("{broken")
    assert failures.tree_failure_entries(tmp_path) == set() and "cannot be read" in caplog.text
    manifest.write_text(json.dumps({"failure_entries": [["only one"]]}))
    assert failures.tree_failure_entries(tmp_path) == set() and "failure_entries is malformed" in caplog.text


def test_upstreams_own_failed_answer_and_listed_entries_are_failures() -> None:
    assert failures.UPSTREAM_FAILURE_BODY == encode_answer(simulation_failed_answer())
    assert failures.is_tree_failure(API, "any", failures.UPSTREAM_FAILURE_BODY, frozenset())
    assert failures.is_tree_failure(API, "k", '{"error":"","response":"ok"}', {(API, "k")})
    assert not failures.is_tree_failure(API, "other", '{"error":"","response":"ok"}', {(API, "k")})
    assert not failures.is_tree_failure(API, "k", encode_answer({"error": "Failed to generate fake response", "response": "x"}), set())


def _reference_hash(entries: list[tuple[str, str, object]]) -> str:
    """The hash as the manifest's ``hash_method`` describes it, computed independently."""
    lines = sorted(entries, key=lambda e: (e[0], e[1]))
    digest = hashlib.sha256()
    for api, key, answer in lines:
        body = json.dumps(answer, ensure_ascii=False, separators=(",", ":"))
        digest.update((json.dumps([api, key, body], ensure_ascii=False, separators=(",", ":")) + "\n").encode())
    return "sha256:" + digest.hexdigest()


def test_the_content_hash_is_what_its_method_says_whatever_the_key_order() -> None:
    entries = [("A/t_for_A/a", "k2", {"error": "", "response": "é"}), ("A/t_for_A/a", "k1", {"error": "", "response": 1}),
               ("B/t_for_B/b", "k", {"error": "e", "response": ""})]
    content = ContentHash()
    content.add_api("A/t_for_A/a", [("k2", entries[0][2]), ("k1", entries[1][2])])
    content.add_api_bodies("B/t_for_B/b", [("k", encode_answer(entries[2][2]))])
    assert content.hexdigest() == _reference_hash(entries)
    one = ContentHash()
    one.add_api("A/t_for_A/a", [("k1", entries[1][2]), ("k2", entries[0][2])])
    assert one.apis["A/t_for_A/a"] == content.apis["A/t_for_A/a"]
    count, own = content.apis["A/t_for_A/a"].split(":")
    assert count == "2" and len(own) == API_HASH_HEX and content.apis["B/t_for_B/b"].startswith("1:")


def test_a_changed_answer_changes_its_apis_hash_only() -> None:
    def hashed(answer: object) -> ContentHash:
        content = ContentHash()
        content.add_api("A/t_for_A/a", [("k", {"response": 1})])
        content.add_api("B/t_for_B/b", [("k", answer)])
        return content

    before, after = hashed({"response": 1}), hashed({"response": 2})
    assert before.hexdigest() != after.hexdigest()
    assert before.apis["A/t_for_A/a"] == after.apis["A/t_for_A/a"] and before.apis["B/t_for_B/b"] != after.apis["B/t_for_B/b"]


def test_apis_must_come_in_order_and_an_empty_hash_is_sha256_of_nothing() -> None:
    content = ContentHash()
    assert content.hexdigest() == "sha256:" + hashlib.sha256(b"").hexdigest()
    content.add_api("B/t_for_B/b", [])
    for api in ("A/t_for_A/a", "B/t_for_B/b"):
        with pytest.raises(ValueError, match="api order"):
            content.add_api(api, [])
    assert content.apis == {"B/t_for_B/b": "0:" + hashlib.sha256(b"").hexdigest()[:API_HASH_HEX]}


def test_a_served_line_keeps_unicode_and_lone_surrogates() -> None:
    assert served_line("A/t/a", "k", '{"response":"é"}') == '["A/t/a","k","{\\"response\\":\\"é\\"}"]\n'.encode()
    assert served_line("A/t/a", "\ud800", "{}").decode("utf-8", "surrogatepass") == '["A/t/a","\ud800","{}"]\n'
