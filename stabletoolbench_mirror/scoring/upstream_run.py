"""Running one StableToolBench script, unmodified, in the user's Python: environment, driver, stand-ins, timeouts, logs.

Each script runs as a subprocess of ``--python`` through :mod:`.driver` (a file of this package run by path,
standard library only), in its own session, stdin closed, its output in a log file.  What upstream needs and
its documentation leaves to the user is done here:

* **the environment**: every ``OPENAI_*`` variable (``OPENAI_KEY`` makes upstream's judge add a pool entry
  without ``api_base``, so some judge calls would go around the server), ``API_POOL_FILE``, ``EVAL_MODEL``,
  ``SERVICE_URL``, ``PYTHONPATH``, proxies and ``STM_*`` are removed, then the run's own are set;
  ``NO_PROXY`` covers the loopback server; ``PYTHONHASHSEED`` is the run's seed; no ``__pycache__`` is
  written into the checkout;
* **pdb**: upstream calls ``pdb.set_trace()`` when a model call fails; with stdin closed and the driver's hook
  the process ends at once with status :data:`PDB_EXIT` (:class:`UpstreamFailed` says a model call failed);
* **stand-ins** (``stand_ins=True`` only): :data:`STAND_INS`, imported at the top of upstream's modules and
  never called by an API-model agent or the evaluation, are answered by inert placeholders;
* **sleeps** (``skip_sleeps=True`` only): upstream's own ``time.sleep`` calls return at once (see
  :func:`sleeps_note` for when the session allows it);
* **requirements**: :meth:`UpstreamRunner.missing` runs a script's top-level imports in ``--python`` and
  names what upstream's own import statements need installed (:data:`PIP_NAMES` maps module names to packages).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stabletoolbench_mirror.scoring.driver import PDB_EXIT

DRIVER = Path(__file__).with_name("driver.py")
STAND_INS = ("torch", "transformers", "peft", "sentence_transformers", "accelerate", "vllm", "bitsandbytes", "deepspeed",
             "pandas", "psutil")
"""What upstream's inference and evaluation modules import at the top and an API-model agent and the evaluation never
call (``--stand-ins``): the GPU libraries, and ``pandas`` (the retriever, ``eval_preference``'s unused import) and
``psutil`` (local models' memory), which upstream's requirements do not even list."""
PIP_NAMES = {"yaml": "pyyaml", "sentence_transformers": "sentence-transformers"}
"""Module names whose package is named otherwise."""
_DROPPED = frozenset({"API_POOL_FILE", "EVAL_MODEL", "SERVICE_URL", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONBREAKPOINT"})
_TAIL_CHARS = 4000
PROBE_TIMEOUT_S = 300  # the import probe of upstream's scripts under --python
_POLL_S = 0.5
_PROBED: dict[tuple[str, tuple[str, ...]], list[str]] = {}
"""What :meth:`UpstreamRunner.missing` found, by Python and scripts (a probe imports upstream's modules: seconds)."""


class UpstreamFailed(RuntimeError):
    """An upstream script exited non-zero (``returncode``; ``log`` holds its output)."""

    def __init__(self, what: str, returncode: int, log: Path) -> None:
        why = (" (it reached pdb.set_trace(): a model call failed; in a replay, a call that was not recorded)"
               if returncode == PDB_EXIT else "")
        super().__init__(f"{what} exited {returncode}{why}; its log: {log}; last output:\n{tail(log)}")
        self.returncode = returncode
        self.log = log


class UpstreamTimeout(RuntimeError):
    """An upstream script ran past its timeout and was killed."""


class MissingRequirements(RuntimeError):
    """``--python`` cannot import what upstream's scripts import (the message names what to install)."""


def tail(log: Path) -> str:
    try:
        return log.read_text(encoding="utf-8", errors="replace")[-_TAIL_CHARS:]
    except OSError:
        return ""


def pip_name(module: str) -> str:
    return PIP_NAMES.get(module, module)


@dataclass(frozen=True)
class Finished:
    """How one script's run ended."""

    returncode: int
    seconds: float
    log: Path


@dataclass
class UpstreamRunner:
    """Runs upstream's scripts from one checkout with one Python (see the module's docstring)."""

    root: Path
    """The StableToolBench checkout."""
    python: str = sys.executable
    stand_ins: bool = False
    skip_sleeps: bool = False
    seed: int = 0
    timeout_s: float | None = None
    """The longest one script may run (``None``: no limit)."""
    on_pdb: str = "exit"
    """``exit`` (the process ends at upstream's ``pdb.set_trace()``) or ``continue`` (as if ``c`` was typed)."""

    def environment(self, extra: Mapping[str, str], script_file: Path | None = None) -> dict[str, str]:
        """The subprocess's environment: the caller's, cleaned (see the module's docstring), and the run's own."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OPENAI_", "STM_")) and k not in _DROPPED and not k.lower().endswith("_proxy")}
        env.update({"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1",
                    "PYTHONDONTWRITEBYTECODE": "1", "TQDM_DISABLE": "1", "PYTHONIOENCODING": "utf-8", "PYTHONBREAKPOINT": "0",
                    "PYTHONHASHSEED": str(self.seed), "STM_SEED": str(self.seed), "STM_UPSTREAM_ROOT": str(self.root),
                    "STM_ON_PDB": self.on_pdb, "STM_SKIP_SLEEPS": "1" if self.skip_sleeps else "0"})
        if self.stand_ins:
            env["STM_STAND_INS"] = ",".join(STAND_INS)
        if script_file is not None:
            env["STM_SCRIPT_FILE"] = str(script_file)
        env.update(extra)
        return env

    def run(self, what: str, script: Path, args: Sequence[str], log: Path, *, cwd: Path, env: Mapping[str, str] | None = None,
            script_file: Path | None = None, check: bool = True, timeout_s: float | None = None,
            watch: Callable[[], None] | None = None) -> Finished:
        """Run ``script`` with ``args`` (output to ``log``); ``watch()`` is called every half second while it runs.

        :class:`UpstreamFailed` on a non-zero exit (unless ``check=False``), :class:`UpstreamTimeout` past the
        timeout; on any exception (Ctrl-C included) the script's whole process group is killed first.
        """
        log.parent.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        limit = timeout_s if timeout_s is not None else self.timeout_s
        started = time.monotonic()
        with open(log, "wb") as out:
            proc = subprocess.Popen([self.python, str(DRIVER), str(script), *args], cwd=cwd, env=self.environment(env or {}, script_file),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                returncode = self._wait(proc, started, limit, watch)
            except BaseException:
                _kill(proc)
                raise
        if returncode is None:
            raise UpstreamTimeout(f"{what} ran past {limit:g} s and was killed; its log: {log}; last output:\n{tail(log)}")
        if check and returncode != 0:
            raise UpstreamFailed(what, returncode, log)
        return Finished(returncode, time.monotonic() - started, log)

    @staticmethod
    def _wait(proc: subprocess.Popen[bytes], started: float, limit: float | None, watch: Callable[[], None] | None) -> int | None:
        """The exit status, or ``None`` when ``limit`` passed (the process group then killed)."""
        while True:
            try:
                return proc.wait(timeout=_POLL_S)
            except subprocess.TimeoutExpired:
                pass
            if watch is not None:
                watch()
            if limit is not None and time.monotonic() - started > limit:
                _kill(proc)
                return None

    def python_version(self) -> str | None:
        """``--python``'s version (``3.11.7``), ``None`` when it cannot say."""
        try:
            done = subprocess.run([self.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True,
                                  timeout=60, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() or None if done.returncode == 0 else None

    def missing(self, scripts: Sequence[Path]) -> list[str]:
        """The top-level modules ``scripts`` import (transitively, through upstream's own modules) that ``--python``
        cannot import, sorted (:class:`MissingRequirements` when the probe itself cannot run).

        One probe process per folder of scripts (their ``sys.path`` differ); the answer is kept for this
        Python and these scripts while this process lives.
        """
        key = (self.python, tuple(sorted(str(s) for s in scripts)))
        if key in _PROBED:
            return _PROBED[key]
        found: set[str] = set()
        by_folder: dict[Path, list[str]] = {}
        for script in scripts:
            by_folder.setdefault(Path(script).parent, []).append(str(script))
        env = self.environment({})
        env.pop("STM_STAND_INS", None)
        for folder_scripts in by_folder.values():
            try:
                done = subprocess.run([self.python, str(DRIVER), "--probe", *folder_scripts], cwd=self.root, env=env, capture_output=True,
                                      text=True, timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise MissingRequirements(f"--python {self.python} cannot run ({exc})") from None
            try:
                found.update(json.loads(done.stdout.strip().splitlines()[-1])["missing"])
            except (ValueError, IndexError, KeyError, TypeError):
                raise MissingRequirements(_probe_failed(self.python, self.seed, done)) from None
        _PROBED[key] = sorted(found)
        return _PROBED[key]

    def check_requirements(self, scripts: Sequence[Path]) -> list[str]:
        """The notes to print about what upstream imports; :class:`MissingRequirements` naming what to install."""
        missing = self.missing(scripts)
        light = [m for m in missing if m not in STAND_INS]
        heavy = [m for m in missing if m in STAND_INS]
        problems = []
        if light:
            problems.append(f"install StableToolBench's requirements: {self.python} -m pip install "
                            f"{' '.join(pip_name(m) for m in light)}")
        if heavy and not self.stand_ins:
            problems.append(f"upstream's modules import {', '.join(heavy)} at the top: install them ({self.python} -m pip install "
                            f"{' '.join(pip_name(m) for m in heavy)}), or pass --stand-ins (an API-model agent and the "
                            "evaluation never call them)")
        if problems:
            raise MissingRequirements(f"--python {self.python} cannot import what StableToolBench's scripts import: "
                                      + "; ".join(problems))
        if self.stand_ins:
            return [f"--stand-ins: {', '.join(STAND_INS)} are answered by inert placeholders in upstream's processes "
                    "(imported at the top of its modules, never called by an API-model agent or the evaluation)"]
        return []


def _probe_failed(python: str, seed: int, done: subprocess.CompletedProcess[str]) -> str:
    """What stopped the import probe, its own words first: the Python that did not start (a ``PYTHONHASHSEED`` it
    refuses, a broken install) or the driver that failed, never taken for a missing import."""
    output = (done.stderr or done.stdout or "").strip()
    lines = [line for line in output.splitlines() if line.strip()]
    said = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "no output")
    hint = (f" (the run's seed, --seed {seed}, is its PYTHONHASHSEED, which Python takes from 0 to 4294967295)"
            if "PYTHONHASHSEED" in output else "")
    return (f"--python {python} failed before it could say what upstream's scripts import (exit {done.returncode}): "
            f"{said.strip()[:500]}{hint}; its output:\n{output[-_TAIL_CHARS:]}")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """End the process's whole group (its threads and children): SIGTERM, then SIGKILL after 5 s."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
