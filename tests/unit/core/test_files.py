"""One atomic write: the target appears whole or not at all, and nothing is left beside it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from stabletoolbench_mirror.core.files import atomic_write, write_bytes, write_text


def test_the_file_appears_whole_and_nothing_else_is_left(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "out.jsonl"
    with atomic_write(target) as out:
        out.write("one\n")
        assert not target.exists()  # not before the block ends
        out.write("two\n")
    assert target.read_text() == "one\ntwo\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.jsonl"]


def test_an_error_leaves_the_target_as_it_was(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("before")
    with pytest.raises(RuntimeError), atomic_write(target) as out:
        out.write("half of it")
        raise RuntimeError("interrupted")
    assert target.read_text() == "before"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_the_mode_and_the_helpers(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_bytes(tmp_path / "secret", b"k", file_mode=0o600, fsync=True)
        write_text(tmp_path / "plain", "é")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o644  # what the umask gives
    assert (tmp_path / "plain").read_bytes() == "é".encode()
    with atomic_write(tmp_path / "lf", newline="\n") as out:
        out.write("a\n")
    assert (tmp_path / "lf").read_bytes() == b"a\n"
