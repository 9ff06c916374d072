"""Runs one StableToolBench script as ``python SCRIPT ARGS...`` would, in the user's Python; or probes its imports.

This file is run by path with the Python that has StableToolBench's requirements (``score --python``), which
need not have this package installed: it imports nothing but the standard library, and nothing of upstream's
until the script runs.  Upstream's files are never edited or copied; what this driver changes is the
process around them, each change named in the environment by :mod:`.upstream_run`:

* ``sys.path`` as ``python SCRIPT`` from the checkout's root with ``PYTHONPATH=./`` gives it (upstream's
  own scripts set it): the script's folder first (``from Tree.Tree import ...``, ``from evaluators import
  ...``), then the checkout (``toolbench``).
* ``STM_STAND_INS=torch,transformers,...``: those modules (and their submodules) are answered by inert
  placeholders, so an API-model agent runs without the GPU libraries it imports at the top and never calls.
* ``STM_ON_PDB``: upstream calls ``pdb.set_trace()`` when a model call fails; ``exit`` (default) ends the
  process at once with status :data:`PDB_EXIT` and a line saying so, ``continue`` returns as if ``c`` had
  been typed (upstream then retries).  stdin is closed too, so a debugger never waits.
* ``STM_SKIP_SLEEPS=1``: ``time.sleep`` returns at once when upstream's own code calls it (the 2 s before
  each tool call, 15 s between parse retries); the libraries' own waits (the openai SDK's and tenacity's
  retries, backoff's) are kept.
* ``STM_SEED``: ``random.seed`` before the script runs (upstream's modules may seed again themselves).
* ``STM_SCRIPT_FILE``: the ``__file__`` the script sees (default: the script).

``driver.py --probe SCRIPT...`` (scripts of one folder) instead runs only their top-level imports, with every module no finder
can find recorded and answered by a placeholder (so the rest of the imports go on), and prints
``{"missing": [top-level module names]}`` as JSON: what to install, found by running upstream's own imports.
"""

import ast
import importlib.abc
import importlib.machinery
import json
import os
import random
import sys
import time
import traceback
import types

PDB_EXIT = 86
"""The exit status of a run that reached upstream's ``pdb.set_trace()`` (``STM_ON_PDB=exit``)."""


# -- placeholders for modules that are not imported for real -------------------------------------------


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (Placeholder,), {})


class Placeholder(metaclass=_Meta):
    """Anything: a class to subclass, a function to call, a decorator (``@torch.inference_mode()``)."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder()


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Meta(name, (Placeholder,), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


class _Placeholders(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers the modules named (and their submodules) with placeholders; with ``under``, instead every module
    that an import statement of a file under that folder names and no finder before this one found (``probe``:
    upstream's missing imports; a name an installed package imports, from Python or from compiled code, is never one)."""

    def __init__(self, names=(), under=None):
        self.names = frozenset(names)
        self.under = None if under is None else os.path.realpath(under) + os.sep
        self.answered = set()

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top in self.names or (self.under is not None and (top in self.answered or self._named_by_upstream(top))):
            self.answered.add(top)
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def _named_by_upstream(self, top):
        """Whether the import being resolved is an import statement of upstream's own code naming ``top``: the nearest
        Python frame is a file under ``under`` and the statement on its current line imports ``top``.  A compiled module
        has no frame of its own, so its imports (pydantic 1.10's ``backports_abc``) look as if that line made them."""
        filename, line = _importer()
        return filename.startswith(self.under) and top in _statement_names(filename, line)

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def _importer():
    """The file and line of the Python code running the import being resolved now (importlib's own frames skipped)."""
    frame = sys._getframe(2)  # type: types.FrameType | None  # noqa: SLF001 - the importing frame: inspect.currentframe reads it so too
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen") or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    return (os.path.realpath(frame.f_code.co_filename), frame.f_lineno) if frame is not None else ("", 0)


_STATEMENTS = {}  # type: dict[str, list[tuple[int, int, set[str]]]]
"""By file: its import statements' lines and the top-level modules each names (absolute imports only)."""


def _statement_names(filename, line):
    """The top-level modules the import statement of ``filename`` spanning ``line`` names (empty: no such statement)."""
    if filename not in _STATEMENTS:
        try:
            with open(filename, encoding="utf-8") as source:
                tree = ast.parse(source.read(), filename)
        except (OSError, SyntaxError, ValueError):
            tree = ast.Module(body=[], type_ignores=[])
        _STATEMENTS[filename] = [
            (node.lineno, node.end_lineno or node.lineno,
             {alias.name.split(".")[0] for alias in node.names} if isinstance(node, ast.Import) else {(node.module or "").split(".")[0]})
            for node in ast.walk(tree)
            if isinstance(node, ast.Import) or isinstance(node, ast.ImportFrom) and not node.level]
    return set().union(*(names for first, last, names in _STATEMENTS[filename] if first <= line <= last))


# -- what changes around the script --------------------------------------------------------------------


def _set_path(script, root):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(script), root] + [p for p in sys.path if p not in (here, "")]


def _stand_in(names):
    if names:
        sys.meta_path.insert(0, _Placeholders(names))
        print(f"[stabletoolbench-mirror] stand-ins for {', '.join(sorted(names))} (imported by upstream, never called here)",
              file=sys.stderr, flush=True)


def _on_pdb(mode):
    import pdb

    def set_trace(*args, **kwargs):
        where = "".join(traceback.format_stack(limit=4)[:-1])
        print(f"[stabletoolbench-mirror] upstream reached pdb.set_trace() (a model call failed; see the error above) at:\n{where}",
              file=sys.stderr, flush=True)
        if mode != "continue":
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(PDB_EXIT)

    pdb.set_trace = set_trace
    pdb.post_mortem = lambda *args, **kwargs: set_trace()


def _skip_sleeps(root):
    """``time.sleep`` returns at once when called from a file under ``root`` (upstream's own code)."""
    real_sleep = time.sleep
    prefix = os.path.realpath(root) + os.sep

    def sleep(seconds):
        caller = sys._getframe(1).f_code.co_filename  # noqa: SLF001 - who calls sleep decides
        if os.path.realpath(caller).startswith(prefix):
            return None
        return real_sleep(seconds)

    time.sleep = sleep


def _top_level_imports(script):
    with open(script, encoding="utf-8") as source:
        tree = ast.parse(source.read(), script)
    return [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]


def probe(scripts, root):
    """Run the top-level imports of ``scripts`` (of one folder); print the top-level modules no finder could find."""
    _set_path(scripts[0], root)
    finder = _Placeholders(under=root)
    sys.meta_path.append(finder)  # last: only what nothing else finds, imported by upstream's code
    errors = []
    for script in scripts:
        for node in _top_level_imports(script):
            try:
                exec(compile(ast.Module(body=[node], type_ignores=[]), script, "exec"), {"__name__": "__probe__"})
            except Exception as exc:  # noqa: BLE001 - reported, the other imports go on
                errors.append(f"{script} line {node.lineno}: {type(exc).__name__}: {exc}")
    missing = sorted(finder.answered - set(sys.builtin_module_names))
    print(json.dumps({"missing": missing, "errors": errors, "python": sys.version.split()[0]}))
    return 0


def run(script, argv, root):
    _set_path(script, root)
    _stand_in([n for n in os.environ.get("STM_STAND_INS", "").split(",") if n])
    _on_pdb(os.environ.get("STM_ON_PDB", "exit"))
    if os.environ.get("STM_SKIP_SLEEPS") == "1":
        _skip_sleeps(root)
    if os.environ.get("STM_SEED"):
        random.seed(int(os.environ["STM_SEED"]))
    sys.argv = [script, *argv]
    with open(script, encoding="utf-8") as source:
        code = compile(source.read(), script, "exec")
    namespace = {"__name__": "__main__", "__file__": os.environ.get("STM_SCRIPT_FILE") or script, "__builtins__": __builtins__}
    exec(code, namespace)
    return 0


def main(argv):
    root = os.environ["STM_UPSTREAM_ROOT"]
    if argv[:1] == ["--probe"]:
        return probe([os.path.abspath(a) for a in argv[1:]], root)
    return run(os.path.abspath(argv[0]), argv[1:], root)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
