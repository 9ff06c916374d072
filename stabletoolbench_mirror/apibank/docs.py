"""ToolBench tool docs for API-Bank's APIs, made from each class's ``description`` and parameters.

One tool per API folder: category ``APIBank``, tool ``API-Bank`` (``API-Bank Level-3``), one
``api_list`` entry per class (the APIs that do not run here too: the simulator answers them
from their doc).  A parameter ``call`` cannot go without is required, the others optional;
API-Bank's types become ToolBench's (``str`` -> ``STRING``, ``int``/``float`` -> ``NUMBER``,
``bool`` -> ``BOOLEAN``, ``list``/``list(str)`` -> ``ARRAY``), and ``output_parameters`` become
the ``template_response``.  :func:`register_docs` adds them to a
:class:`~stabletoolbench_mirror.upstream.tooldocs.ToolDocs` (see :meth:`ToolDocs.register`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stabletoolbench_mirror.apibank.loader import ApiClass, Suite
from stabletoolbench_mirror.upstream.tooldocs import ToolDocs

CATEGORY = "APIBank"
TYPES = {"str": "STRING", "int": "NUMBER", "float": "NUMBER", "bool": "BOOLEAN", "list": "ARRAY", "list(str)": "ARRAY"}


def _parameter(name: str, spec: Any) -> dict[str, Any]:
    spec = spec if isinstance(spec, dict) else {}
    kind = str(spec.get("type", "str"))
    return {"name": name, "type": TYPES.get(kind, "STRING"), "description": str(spec.get("description", "")), "default": ""}


def api_entry(api: ApiClass) -> dict[str, Any]:
    """One class as a ToolBench ``api_list`` entry."""
    required = [_parameter(n, s) for n, s in api.input_parameters.items() if n in api.required]
    optional = [_parameter(n, s) for n, s in api.input_parameters.items() if n not in api.required]
    outputs = {n: (s.get("type", "") if isinstance(s, dict) else "") for n, s in api.output_parameters.items()}
    return {
        "name": api.name,
        "url": "",
        "description": api.description,
        "method": "POST",
        "required_parameters": required,
        "optional_parameters": optional,
        "template_response": {"api_name": "str", "input": "dict", "output": outputs or "any", "exception": "str or null"},
    }


def tool_doc(suite: Suite) -> dict[str, Any]:
    """The suite as one ToolBench tool doc."""
    return {
        "tool_name": suite.tool_name,
        "tool_description": (
            f"API-Bank's runnable APIs ({suite.folder}/ of {suite.root.name}): each call answers "
            '{"api_name", "input", "output", "exception"} as API-Bank does, over a per-session database.'
        ),
        "title": suite.tool_name,
        "pricing": "FREE",
        "score": None,
        "home_url": "",
        "host": "",
        "api_list": [api_entry(api) for _name, api in sorted(suite.apis.items())],
    }


def register_docs(docs: ToolDocs, suites: Iterable[Suite]) -> ToolDocs:
    """``docs`` with every suite's tool registered under category ``APIBank``."""
    for suite in suites:
        docs.register(CATEGORY, tool_doc(suite))
    return docs
