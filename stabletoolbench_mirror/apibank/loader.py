"""Loading an API-Bank folder at start: its API classes, which of them run here, and its tables.

Only ``DIR/apis`` (and ``DIR/lv3_apis`` with ``apibank.level3``) is imported, once, at start,
from the configured path; nothing a request names is ever imported.  API-Bank's files import
their base class as ``from apis.api import API`` (or ``from apis import API``), so while one
folder is imported its package is also ``apis`` in ``sys.modules``; afterwards the previous
``apis`` (if any) is put back and the modules stay under a name of their own
(``stm_apibank_<folder>_<hash>``).  Each file is imported on its own: one that fails (a
missing package such as ``googletrans``) leaves the others usable, and its classes are found
from its source (never run) so that they still get tool docs.

An API **runs here** unless its file cannot be imported or it needs the internet or a model:
its module imports one of :data:`REMOTE_MODULES` (``requests``, ``sentence_transformers``,
``nltk``'s downloads, ...), or it is listed in ``apibank.remote``; ``apibank.local`` overrides
the guess.  Those that do not run here take the normal miss path (cache, then the simulator).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import json
import logging
import sys
import threading
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from stabletoolbench_mirror.config import ConfigError

log = logging.getLogger(__name__)

#: top-level modules whose import marks an API as needing the internet or a model download
REMOTE_MODULES = frozenset(
    {"requests", "urllib", "http", "httpx", "aiohttp", "socket", "googletrans", "sentence_transformers", "transformers", "torch", "openai", "nltk"}
)
#: files of an API folder that hold no API (ToolManager skips them too)
SKIPPED_FILES = ("__init__.py", "api.py")
_IMPORT_LOCK = threading.Lock()


@dataclass(frozen=True)
class ApiClass:
    """One API-Bank API: its class (``None`` when its file cannot be imported here) and its description."""

    name: str
    description: str
    input_parameters: dict[str, Any]
    output_parameters: dict[str, Any]
    database_name: str | None
    file: str
    cls: type | None = None
    required: tuple[str, ...] = ()
    """The inputs ``call`` cannot go without (the rest are optional)."""
    remote: str = ""
    """Why it does not run here (empty: it does)."""


@dataclass
class Suite:
    """One API folder (``apis`` or ``lv3_apis``) of an API-Bank checkout, loaded."""

    root: Path
    folder: str
    tool_name: str
    apis: dict[str, ApiClass] = field(default_factory=dict)
    """By class name."""
    tables: dict[str, Any] = field(default_factory=dict)
    """``init_database``, by table name: read-only, shared by every session."""
    modules: list[ModuleType] = field(default_factory=list)
    """The folder's imported modules (their ``random`` is seeded while a call runs)."""

    @property
    def local(self) -> dict[str, ApiClass]:
        return {n: a for n, a in self.apis.items() if not a.remote and a.cls is not None}

    @property
    def remote(self) -> dict[str, ApiClass]:
        return {n: a for n, a in self.apis.items() if a.remote or a.cls is None}


def _module_prefix(folder: Path) -> str:
    digest = hashlib.sha256(str(folder).encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"stm_apibank_{folder.name}_{digest}"


def _api_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == ".py" and p.name not in SKIPPED_FILES and p.is_file())


def _import(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a spec
        raise ImportError(f"{path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def import_folder(folder: Path) -> tuple[dict[str, ModuleType], dict[str, str], type | None]:
    """The modules of ``folder`` by file stem, why the others failed, and its ``API`` base class."""
    alias = folder.name
    prefix = _module_prefix(folder)
    modules: dict[str, ModuleType] = {}
    failed: dict[str, str] = {}
    with _IMPORT_LOCK:
        saved = {k: v for k, v in sys.modules.items() if k == alias or k.startswith(alias + ".")}
        for key in saved:
            del sys.modules[key]
        try:
            package = ModuleType(alias)
            package.__path__ = [str(folder)]
            package.__file__ = str(folder / "__init__.py")
            sys.modules[alias] = package
            base: type | None = None
            if (folder / "api.py").is_file():
                try:
                    api_module = _import(f"{alias}.api", folder / "api.py")
                    base = getattr(api_module, "API", None)
                    package.API = base  # type: ignore[attr-defined]  # ``from apis import API``
                    package.api = api_module  # type: ignore[attr-defined]
                except BaseException as exc:  # noqa: BLE001 - the user's file may raise anything
                    raise ConfigError(f"apibank.path: {folder / 'api.py'} cannot be imported: {_why(exc)}") from None
            for path in _api_files(folder):
                try:
                    modules[path.stem] = _import(f"{alias}.{path.stem}", path)
                except BaseException as exc:  # noqa: BLE001 - a missing package, or anything the file raises
                    failed[path.stem] = _why(exc)
                    log.info("apibank: %s cannot be imported: %s", path, failed[path.stem])
        finally:
            mine = {k: v for k, v in sys.modules.items() if k == alias or k.startswith(alias + ".")}
            for key in mine:
                del sys.modules[key]
            sys.modules.update(saved)
            for key, module in mine.items():
                sys.modules[prefix + key[len(alias):]] = module
    return modules, failed, base


def _why(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1][:300]


def _required(cls: type) -> tuple[str, ...]:
    try:
        signature = inspect.signature(cls.call)  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return ()
    return tuple(
        p.name
        for p in list(signature.parameters.values())[1:]
        if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


def imported_modules(source: str) -> set[str]:
    """The top-level modules a file's source imports (at any depth of its code)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def classes_in_source(source: str) -> list[dict[str, Any]]:
    """The API classes a file defines (on ``API``), read from its source without running it: name and literal attributes."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        if not any((isinstance(b, ast.Name) and b.id == "API") or (isinstance(b, ast.Attribute) and b.attr == "API") for b in node.bases):
            continue
        attrs: dict[str, Any] = {"name": node.name}
        for item in node.body:
            if isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name):
                try:
                    attrs[item.targets[0].id] = ast.literal_eval(item.value)
                except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                    continue
        found.append(attrs)
    return found


def _entry(attrs: dict[str, Any], file: Path, cls: type | None, remote: str) -> ApiClass:
    inputs = attrs.get("input_parameters")
    outputs = attrs.get("output_parameters")
    database = attrs.get("database_name")
    return ApiClass(
        name=str(attrs["name"]),
        description=str(attrs.get("description") or ""),
        input_parameters=dict(inputs) if isinstance(inputs, dict) else {},
        output_parameters=dict(outputs) if isinstance(outputs, dict) else {},
        database_name=database if isinstance(database, str) else None,
        file=str(file),
        cls=cls,
        required=_required(cls) if cls is not None else tuple(n for n in (inputs or {})),
        remote=remote,
    )


def _remote_reason(source: str, name: str, remote: set[str], local: set[str]) -> str:
    if name in local:
        return ""
    if name in remote:
        return "listed in apibank.remote"
    needs = sorted(imported_modules(source) & REMOTE_MODULES)
    return f"imports {', '.join(needs)} (the internet or a model)" if needs else ""


def load_suite(root: Path, folder: str, tool_name: str, *, remote: Iterable[str] = (), local: Iterable[str] = ()) -> Suite:
    """The APIs of ``root/folder`` and the tables of ``root/init_database``; :class:`ConfigError` naming the key when unusable."""
    where = root / folder
    if not where.is_dir():
        raise ConfigError(f"apibank.path: {root} has no {folder}/ folder (expected an API-Bank checkout, the folder holding apis/ and init_database/)")
    remote_names, local_names = set(remote), set(local)
    modules, failed, base = import_folder(where)
    suite = Suite(root=root, folder=folder, tool_name=tool_name, tables=load_tables(root / "init_database"), modules=list(modules.values()))
    for path in _api_files(where):
        source = path.read_text(encoding="utf-8", errors="replace")
        module = modules.get(path.stem)
        if module is None:
            for attrs in classes_in_source(source):
                suite.apis.setdefault(attrs["name"], _entry(attrs, path, None, f"cannot be imported here: {failed[path.stem]}"))
            continue
        for cls in _api_classes(module, base):
            attrs = {"name": cls.__name__, **{k: getattr(cls, k, None) for k in ("description", "input_parameters", "output_parameters", "database_name")}}
            if cls.__name__ in suite.apis:
                raise ConfigError(f"apibank.path: {folder}/{path.name} and {suite.apis[cls.__name__].file} both define the API {cls.__name__}")
            suite.apis[cls.__name__] = _entry(attrs, path, cls, _remote_reason(source, cls.__name__, remote_names, local_names))
    unknown = sorted((remote_names | local_names) - set(suite.apis))
    if unknown and folder == "apis":
        raise ConfigError(f"apibank.remote/apibank.local: no API named {', '.join(unknown)} in {where} (names are class names, e.g. Dictionary)")
    return suite


def _api_classes(module: ModuleType, base: type | None) -> list[type]:
    """The API classes a module defines itself (not those it imports), as ToolManager finds them."""
    out = []
    for value in vars(module).values():
        if not isinstance(value, type) or value.__module__ != module.__name__:
            continue
        if base is not None and issubclass(value, base) and value is not base:
            out.append(value)
        elif base is None and callable(getattr(value, "call", None)) and hasattr(value, "input_parameters"):
            out.append(value)
    return out


def load_tables(folder: Path) -> dict[str, Any]:
    """``init_database/*.json`` by table name (the file stem); :class:`ConfigError` naming a file that is not JSON."""
    tables: dict[str, Any] = {}
    if not folder.is_dir():
        log.warning("apibank: %s does not exist: the APIs start with empty tables", folder)
        return tables
    for path in sorted(folder.glob("*.json")):
        try:
            tables[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ConfigError(f"apibank.path: {path} cannot be read as JSON: {exc}") from None
    return tables


def folder_of(path: str) -> Path:
    """The API-Bank folder of ``apibank.path``: the folder itself, or the ``api-bank/`` inside a DAMO-ConvAI checkout."""
    root = Path(path)
    if not (root / "apis").is_dir() and (root / "api-bank" / "apis").is_dir():
        root = root / "api-bank"
    return root.resolve()


def describe(suites: Iterable[Suite]) -> list[str]:
    """Lines for the start-up summary: what runs here and what takes the miss path, and why."""
    lines = []
    for suite in suites:
        lines.append(
            f"{suite.root / suite.folder}: {len(suite.local)} APIs run here as tool {suite.tool_name!r}, {len(suite.tables)} tables; "
            f"{len(suite.remote)} take the miss path (the cache, then the simulator when configured)"
        )
        for name, api in sorted(suite.remote.items()):
            lines.append(f"  {name}: {api.remote}")
    return lines

