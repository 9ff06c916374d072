"""API-Bank as an environment: its runnable APIs as local tools, a per-session database, its own checks.

``apibank: {path: DIR}`` in the settings: :mod:`.loader` imports ``DIR/apis`` once at start,
:mod:`.docs` makes ToolBench docs for it, :mod:`.tools` runs a call in the session's
:mod:`.environment` with its inputs typed by :mod:`.inputs` over the tables of :mod:`.tables`,
and ``check --apibank`` (:mod:`stabletoolbench_mirror.checking.apibank`) replays API-Bank's
dialogues and scores each call with the API's own check.  See docs/apibank.md.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from stabletoolbench_mirror.apibank.docs import register_docs
from stabletoolbench_mirror.apibank.loader import Suite, folder_of, load_suite
from stabletoolbench_mirror.apibank.tools import TOOL_NAMES, ApiBankTools

if TYPE_CHECKING:
    from stabletoolbench_mirror.config import Settings
    from stabletoolbench_mirror.upstream.tooldocs import ToolDocs

_loaded: dict[tuple[str, bool, tuple[str, ...], tuple[str, ...]], list[Suite]] = {}
_loaded_lock = threading.Lock()


def load_suites(settings: Settings) -> list[Suite]:
    """The API folders ``settings.apibank`` names, loaded once per process (``[]`` without ``apibank``)."""
    cfg = settings.apibank
    if cfg is None:
        return []
    root = folder_of(settings.resolve(cfg.path))
    key = (str(root), cfg.level3, tuple(cfg.remote), tuple(cfg.local))
    with _loaded_lock:
        if key not in _loaded:
            folders = ["apis", "lv3_apis"] if cfg.level3 else ["apis"]
            _loaded[key] = [load_suite(root, f, TOOL_NAMES[f], remote=cfg.remote, local=cfg.local) for f in folders]
        return _loaded[key]


def build_apibank_tools(settings: Settings) -> ApiBankTools:
    """API-Bank's local tools, with the ``local_tools`` files' tools beside them."""
    from stabletoolbench_mirror.engine.local_tools import LocalTools

    user = LocalTools.load([settings.resolve(p) for p in settings.local_tools]).tools if settings.local_tools else {}
    return ApiBankTools(load_suites(settings), user, timeout_s=settings.local_tools_timeout_s)


def register_apibank_docs(settings: Settings, docs: ToolDocs | None) -> ToolDocs:
    """``docs`` (a new registry without a folder when ``None``) with API-Bank's tool docs registered."""
    from stabletoolbench_mirror.upstream.tooldocs import ToolDocs

    if docs is None:
        docs = ToolDocs(None, fuzzy_score=settings.simulator.fuzzy_match_score, allow_symlinks=settings.allow_symlinks)
    return register_docs(docs, load_suites(settings))


__all__ = ["ApiBankTools", "Suite", "build_apibank_tools", "load_suites", "register_apibank_docs"]
