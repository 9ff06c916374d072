"""A minimal tool-doc lookup for direct RapidAPI calls.

TEMPORARY: written before the shared tool-doc registry (``stabletoolbench_mirror.tooldocs``)
existed; :func:`stabletoolbench_mirror.real.build_real_responder` should switch to that
registry.  Only this module and the ``find_doc`` argument there need to change: the
RapidAPI backend takes any ``ToolCall -> API doc dict | None`` function.

Layout (ToolBench's tools folder): ``<tools_folder>/<Category>/<standardize(tool)>.json``
with ``api_list[]`` entries; an API matches when ``change_name(standardize(name))`` or
``standardize(name)`` equals the call's API name.  The tool-level ``host`` is copied
into the returned entry when the entry has none.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any, Mapping, Optional

from ..call import ToolCall
from ..naming import change_name, is_safe_path_component, standardize, standardize_category

log = logging.getLogger(__name__)
MAX_CACHED_TOOLS = 20_000


class ToolsFolderDocs:
    """Reads tool docs from a ToolBench tools folder, each file once (thread-safe)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._lock = threading.Lock()
        self._tools: dict[tuple[str, str], Optional[dict[str, Any]]] = {}

    def __call__(self, call: ToolCall) -> Optional[Mapping[str, Any]]:
        tool = self._tool(call)
        if tool is None:
            return None
        for api in tool.get("api_list") or []:
            if not isinstance(api, dict) or not isinstance(api.get("name"), str):
                continue
            std = standardize(api["name"])
            if call.names.api in (change_name(std), std):
                entry = dict(api)
                if not entry.get("host") and isinstance(tool.get("host"), str):
                    entry["host"] = tool["host"]
                return entry
        return None

    def _tool(self, call: ToolCall) -> Optional[dict[str, Any]]:
        categories = [call.names.category, standardize_category(call.category), call.category]
        for category in dict.fromkeys(categories):
            key = (category, call.names.tool)
            with self._lock:
                if key in self._tools:
                    cached = self._tools[key]
                    if cached is not None:
                        return cached
                    continue
            tool = self._load(category, call.names.tool)
            with self._lock:
                if len(self._tools) < MAX_CACHED_TOOLS:  # names come from requests: keep memory bounded
                    self._tools[key] = tool
            if tool is not None:
                return tool
        return None

    def _load(self, category: str, tool: str) -> Optional[dict[str, Any]]:
        if not (is_safe_path_component(category) and is_safe_path_component(tool + ".json")):
            return None
        path = self.folder / category / f"{tool}.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("cannot read tool doc %s: %s", path, exc)
            return None
        return data if isinstance(data, dict) else None
