"""The store kinds' registry and StoreSpec: one parse of a store named on a command line, one public description."""

from __future__ import annotations

from pathlib import Path

import pytest

from stabletoolbench_mirror.config import ConfigError, Settings, load_settings
from stabletoolbench_mirror.stores.kinds import KINDS, StoreSpec, StoreSpecError, backend


def test_where_never_shows_a_credential() -> None:
    spec = StoreSpec("redis", url="redis://user:s3cret@cache.example:6380/2?password=s3cret#frag", prefix="run1")
    assert spec.where == "redis://cache.example:6380/2 (prefix 'run1')"
    assert "s3cret" not in spec.where
    assert StoreSpec("diskcache", path="/data/store").where == "/data/store"


def test_parse_names_a_redis_url_with_its_prefix_or_the_configured_one(tmp_path: Path) -> None:
    configured = StoreSpec("diskcache", path=str(tmp_path / "store"), prefix="stm", timeout_s=5.0)
    named = StoreSpec.parse("redis://127.0.0.1:6379/0#prefix=other", configured)
    assert named == StoreSpec("redis", path=configured.path, url="redis://127.0.0.1:6379/0", prefix="other", timeout_s=5.0)
    assert StoreSpec.parse("rediss://h:1/0", configured).prefix == "stm"  # type: ignore[union-attr]


def test_parse_names_a_diskcache_folder_only_when_it_holds_cache_db(tmp_path: Path) -> None:
    configured = StoreSpec()
    assert StoreSpec.parse(str(tmp_path), configured) is None
    (tmp_path / "cache.db").write_bytes(b"")
    named = StoreSpec.parse(str(tmp_path), configured)
    assert named is not None and named.kind == "diskcache" and named.path == str(tmp_path.resolve())
    assert StoreSpec.parse("http://host:8080", configured) is None


def test_aside_moves_both_the_folder_and_the_prefix() -> None:
    moved = StoreSpec("diskcache", path="/data/store/", prefix="stm").aside("-shadow")
    assert (moved.path, moved.prefix) == ("/data/store-shadow", "stm-shadow")


def test_capabilities_are_the_backends_own() -> None:
    assert backend("diskcache").folder and not backend("diskcache").reads_wait
    assert backend("redis").reads_wait and not backend("redis").folder
    assert all(backend(kind).kind == kind for kind in KINDS)


def test_an_unknown_kind_names_the_key_and_the_choices(tmp_path: Path) -> None:
    with pytest.raises(StoreSpecError, match=r"store\.kind: unknown store kind 'mongodb' \(one of: diskcache, redis"):
        backend("mongodb")
    config = tmp_path / "c.yml"
    config.write_text("store:\n  kind: mongodb\n")
    with pytest.raises(ConfigError, match=r"'store\.kind': Input should be 'diskcache', 'redis'"):
        load_settings(str(config), environ={})


def test_the_settings_name_their_store_resolved(tmp_path: Path) -> None:
    settings = Settings(base_dir=str(tmp_path), store={"kind": "redis", "url": "redis://h/0", "prefix": "p"})  # type: ignore[arg-type]
    spec = StoreSpec.of(settings)
    assert (spec.kind, spec.url, spec.prefix, spec.path) == ("redis", "redis://h/0", "p", str(tmp_path / "cache" / "store"))
