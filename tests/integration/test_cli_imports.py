"""A command imports what it runs: ``cache stats`` starts without the other commands, the engine or the HTTP clients.

Every run of a short command paid for importing all of them (about 0.2 s of CPU of its 0.45 s); ``--help`` and an
unknown command still list every command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stabletoolbench_mirror.commands.cli import COMMANDS
from stabletoolbench_mirror.stores import DiskcacheStore
from tests.helpers import paths

SHOW_IMPORTS = """
import json, sys
from stabletoolbench_mirror.commands.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _run(*args: str, cwd: Path) -> tuple[int, list[str], str]:
    done = subprocess.run([sys.executable, "-c", SHOW_IMPORTS, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(paths.REPO), "PATH": "/usr/bin:/bin"})
    report = json.loads(done.stderr.strip().splitlines()[-1])
    return report["code"], report["modules"], done.stdout


def test_cache_stats_imports_no_other_command_nor_the_engine(tmp_path: Path) -> None:
    DiskcacheStore(tmp_path / "store").close()
    code, modules, out = _run("cache", "stats", "--store-path", str(tmp_path / "store"), "--json", cwd=tmp_path)
    assert code == 0 and json.loads(out)["entries"] == 0
    other_commands = {module for name, module in COMMANDS.items() if name != "cache"}
    assert other_commands.isdisjoint(modules)
    for heavy in ("stabletoolbench_mirror.engine.layer", "stabletoolbench_mirror.responders.simulator", "httpcore",
                  "stabletoolbench_mirror.upstream.tooldocs", "rapidfuzz"):
        assert heavy not in modules, f"cache stats imported {heavy}"


def test_help_and_an_unknown_command_still_list_every_command(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(paths.REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0
    assert all(name in done.stdout for name in COMMANDS)
    wrong = subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", "cahce", "stats"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, env={"PYTHONPATH": str(paths.REPO), "PATH": "/usr/bin:/bin"})
    assert wrong.returncode == 2 and "invalid choice: 'cahce'" in wrong.stderr
    assert all(repr(name) in wrong.stderr for name in COMMANDS)


def test_under_python_OO_each_command_still_says_what_it_does(tmp_path: Path) -> None:
    """``-OO`` drops docstrings, which are the commands' ``--help`` descriptions: their summary stands in."""
    for name in ("doctor", "check", "report", "warm", "fidelity", "snapshot", "score"):
        done = subprocess.run([sys.executable, "-OO", "-m", "stabletoolbench_mirror", name, "--help"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env={"PYTHONPATH": str(paths.REPO), "PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stderr
        described = done.stdout.split("\n\n")[1]  # after the usage block, before the options
        assert not described.startswith(("options:", "positional arguments:")) and len(described.split()) >= 4, (name, done.stdout[:600])
