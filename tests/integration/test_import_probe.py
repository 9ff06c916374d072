"""``score``'s import probe and stand-ins in a Python of StableToolBench's own pins (pydantic 1.10.7, nothing else).

A real venv, built once for the file with pip (skipped when pip cannot install pydantic 1.10.7), runs the probe
of upstream's five scripts in the reference checkout: it names only what upstream's own import statements need
(pydantic 1.10's compiled modules try ``backports_abc``, which nothing needs); ``--stand-ins`` covers the
modules upstream's API path imports and never calls (``pandas``, ``psutil``: not in its requirements); a seed
Python refuses as ``PYTHONHASHSEED`` is reported as such.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from stabletoolbench_mirror.scoring.checkout import SCRIPTS
from stabletoolbench_mirror.scoring.upstream_run import STAND_INS, MissingRequirements, UpstreamRunner
from tests.helpers.upstream_pipeline import UPSTREAM

PINNED = "pydantic==1.10.7"


@pytest.fixture(scope="module")
def pinned_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A venv holding only StableToolBench's pydantic pin (and what pip installs with it)."""
    if not (UPSTREAM / SCRIPTS["qa_pipeline"]).is_file():
        pytest.skip(f"no StableToolBench checkout at {UPSTREAM}")
    venv = tmp_path_factory.mktemp("pinned") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", PINNED], capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        pytest.skip(f"pip cannot install {PINNED} here: {done.stderr[-500:]}")
    return python


def _scripts() -> list[Path]:
    return [UPSTREAM / rel for rel in SCRIPTS.values()]


def _named_by_upstream() -> set[str]:
    """Every top-level module an import statement of the checkout's own files names."""
    names: set[str] = set()
    for path in UPSTREAM.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_the_probe_names_only_what_upstreams_own_imports_need(pinned_python: str) -> None:
    missing = UpstreamRunner(UPSTREAM, python=pinned_python).missing(_scripts())
    assert "backports_abc" not in missing and "pydantic" not in missing, missing
    assert set(missing) <= _named_by_upstream(), set(missing) - _named_by_upstream()
    assert {"openai", "torch", "pandas", "psutil"} <= set(missing), missing  # what it lacks is found


def test_stand_ins_cover_pandas_and_psutil_in_a_python_without_them(pinned_python: str, tmp_path: Path) -> None:
    with pytest.raises(MissingRequirements) as without:
        UpstreamRunner(UPSTREAM, python=pinned_python).check_requirements(_scripts())
    to_install, stood_in = str(without.value).split("; ", 1)
    assert "pandas" not in to_install and "psutil" not in to_install and "backports" not in to_install, to_install
    assert "pandas" in stood_in and "psutil" in stood_in and "--stand-ins" in stood_in, stood_in
    with pytest.raises(MissingRequirements) as stood:  # the light requirements are still named, and only they
        UpstreamRunner(UPSTREAM, python=pinned_python, stand_ins=True).check_requirements(_scripts())
    message = str(stood.value)
    assert "openai" in message and not any(f" {name}" in message.split("pip install", 1)[1] for name in ("pandas", "psutil", "torch"))
    # and in a run: upstream's `import pandas as pd` / `import psutil` at the top get the placeholders
    script = tmp_path / "uses.py"
    script.write_text("import pandas as pd\nimport psutil\nprint('imported', type(pd).__name__, type(psutil).__name__)\n")
    log = tmp_path / "uses.log"
    runner = UpstreamRunner(UPSTREAM, python=pinned_python, stand_ins=True)
    assert set(runner.environment({})["STM_STAND_INS"].split(",")) == set(STAND_INS)
    runner.run("uses", script, [], log, cwd=tmp_path, timeout_s=120)
    assert "imported _Module _Module" in log.read_text(), log.read_text()


def test_a_seed_python_refuses_is_reported_as_what_it_is(tmp_path: Path) -> None:
    if not (UPSTREAM / SCRIPTS["convert"]).is_file():
        pytest.skip(f"no StableToolBench checkout at {UPSTREAM}")
    with pytest.raises(MissingRequirements) as failed:
        UpstreamRunner(UPSTREAM, seed=10**30).missing([UPSTREAM / SCRIPTS["convert"]])
    message = str(failed.value)
    assert "PYTHONHASHSEED must be" in message.split("; its output:", 1)[0], message
    assert f"--seed {10**30}" in message and "could not check the imports" not in message, message
