"""Runs StableToolBench's own ``rapidapi_wrapper`` over query files and prints each query's functions.

``python tests/helpers/upstream_functions.py STABLETOOLBENCH_DIR TOOLS_DIR QUERY_FILE...`` prints one
JSON line per query upstream runs: ``{"group", "query_id", "functions"}`` (``env.functions``).

Upstream's ``rapidapi.py`` imports its models, search algorithms and server at the top; they play no
part in building the functions, so a temporary package stands in for them (empty classes), and
``toolbench.utils`` holds only ``standardize`` and ``change_name``, taken out of upstream's file
with ``ast`` (the file imports torch).  ``rapidapi.py`` and ``base_env.py`` themselves run
unmodified, from a copy in the temporary folder.  The task list is built as upstream's
``pipeline_runner.generate_task_list`` builds it (its own ``get_white_list`` and ``contain``).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

STUBS = {
    "toolbench/__init__.py": "",
    "toolbench/inference/__init__.py": "",
    "toolbench/inference/LLM/__init__.py": "",
    "toolbench/inference/LLM/chatgpt_function_model.py": "class ChatGPTFunction: pass\n",
    "toolbench/inference/LLM/davinci_model.py": "class Davinci: pass\n",
    "toolbench/inference/LLM/tool_llama_lora_model.py": "class ToolLLaMALoRA: pass\n",
    "toolbench/inference/LLM/tool_llama_model.py": "class ToolLLaMA: pass\n",
    "toolbench/inference/LLM/retriever.py": "class ToolRetriever: pass\n",
    "toolbench/inference/Algorithms/__init__.py": "",
    "toolbench/inference/Algorithms/single_chain.py": "class single_chain: pass\n",
    "toolbench/inference/Algorithms/DFS.py": "class DFS_tree_search: pass\n",
    "toolbench/inference/server.py": "def get_rapidapi_response(*a, **k): raise RuntimeError('not here')\n",
    "toolbench/inference/Downstream_tasks/__init__.py": "",
    "termcolor.py": "def colored(text, color=None, *a, **k):\n    return text\n",
}


def _utils_source(utils_path: Path) -> str:
    tree = ast.parse(utils_path.read_text(encoding="utf-8"))
    keep = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in ("standardize", "change_name")]
    body = "\n\n".join(ast.get_source_segment(utils_path.read_text(encoding="utf-8"), node) or "" for node in keep)
    return "import re\n\n" + body + "\n\ndef replace_llama_with_condense(ratio):\n    raise RuntimeError('not here')\n"


def main(argv: list[str]) -> int:
    upstream, tools_dir, *query_files = argv
    root = Path(upstream)
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in STUBS.items():
            path = Path(tmp, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        Path(tmp, "toolbench/utils.py").write_text(_utils_source(root / "toolbench/utils.py"), encoding="utf-8")
        for name in ("rapidapi.py", "base_env.py"):
            shutil.copy(root / "toolbench/inference/Downstream_tasks" / name, Path(tmp, "toolbench/inference/Downstream_tasks", name))
        sys.path.insert(0, tmp)
        os.environ.setdefault("TQDM_DISABLE", "1")
        from toolbench.inference.Downstream_tasks import rapidapi  # type: ignore[import-not-found]
        from toolbench.utils import standardize  # type: ignore[import-not-found]

        args = types.SimpleNamespace(
            tool_root_dir=tools_dir, toolbench_key="", rapidapi_key="", use_rapidapi_key=False, api_customization=False,
            max_observation_length=1024, observ_compress_method="truncate", retrieved_api_nums=5,
        )
        white_list = rapidapi.get_white_list(tools_dir)
        for query_file in query_files:
            group = Path(query_file).stem
            for index, query in enumerate(json.load(open(query_file, encoding="utf-8"))):
                query_id = query.get("query_id", index)
                # as pipeline_runner.generate_task_list builds a task
                tool_des = rapidapi.contain([standardize(c["tool_name"]) for c in query["api_list"]], white_list)
                if tool_des is False:
                    continue
                tool_des = [[c["standard_tool_name"], c["description"]] for c in tool_des]
                env = rapidapi.rapidapi_wrapper(query, tool_des, None, args)
                print(json.dumps({"group": group, "query_id": str(query_id), "functions": env.functions}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
