"""The example's README walkthrough, run exactly as it is written (only the port is a free one).

Its code blocks run in order in one shell, from a copy of ``examples/meetings``: the first
block (the server) in the background, ``python`` blocks through the venv's interpreter, and
the output of every block followed by a ``text`` block must be exactly that text.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import paths
from tests.helpers.live import free_port
from tests.helpers.processes import _clean_env, _stop_group, _wait_http

REPO = paths.REPO
EXAMPLE = REPO / "examples" / "meetings"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    return [(kind, code) for kind, code in BLOCK.findall((EXAMPLE / "README.md").read_text())]


def test_the_walkthrough_blocks_are_what_this_test_expects() -> None:
    kinds = [k for k, _ in blocks()]
    assert kinds[0] == "bash" and "stabletoolbench_mirror serve" in blocks()[0][1]
    assert kinds.count("python") == 1 and kinds.count("text") >= 5
    assert all(k in ("bash", "python", "text") for k in kinds)


def test_the_readme_walkthrough_runs_as_shown(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    port = str(free_port())
    work = tmp_path / "meetings"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("store", "sessions.jsonl", "__pycache__"))
    config = work / "server_config.yml"
    config.write_text(config.read_text().replace("8077", port))
    env = _clean_env()
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # `python` is this interpreter

    found = [(kind, code.replace("8077", port)) for kind, code in blocks()]
    serve_code = found[0][1]
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(["bash", "-c", serve_code], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", server, 60, "example server", log)
        script, expected = [], []
        steps = found[1:]
        for index, (kind, code) in enumerate(steps):
            if kind == "text":
                continue
            marker = f"@@@ block {index} @@@"
            script.append(f"echo '{marker}'")
            script.append(code if kind == "bash" else f"python - <<'PYTHON_BLOCK'\n{code}PYTHON_BLOCK")
            following = steps[index + 1] if index + 1 < len(steps) else None
            expected.append((marker, following[1] if following and following[0] == "text" else None))
        script.append("echo '@@@ end @@@'")
        done = subprocess.run(["bash", "-e", "-c", "\n".join(script)], cwd=work, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        output = done.stdout
        for (marker, text), (next_marker, _) in zip(expected, expected[1:] + [("@@@ end @@@", None)]):
            got = output.split(marker + "\n", 1)[1].split(next_marker + "\n", 1)[0]
            if text is not None:
                assert got.rstrip("\n") == text.rstrip("\n"), f"after {marker}:\n{got}"
        assert (work / "sessions.jsonl").is_file()
    finally:
        _stop_group(server)
