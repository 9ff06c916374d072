"""The documentation stays true: the code layout of CONTRIBUTING.md is the package's, the example configs load
(and the README shows them as they are), a replay example passes ``doctor``, and every link resolves.

The messages the documentation quotes are checked in ``tests/integration/test_startup.py``
(``test_readme_quotes_the_exact_messages``), over README.md, CONTRIBUTING.md and ``docs/*.md``.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from stabletoolbench_mirror.config import load_settings
from tests.helpers import paths
from tests.integration.test_startup import cli, make_server_folder

REPO = paths.REPO
PACKAGE = REPO / "stabletoolbench_mirror"
EXAMPLES = REPO / "examples" / "configs"
#: the documentation files: what users read first, what developers read, the reference
DOC_FILES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```$", re.S | re.M)
#: where the upstream paths of the examples point; the test puts a made-up server/ folder there
UPSTREAM = "/path/to/StableToolBench/server"


def all_docs() -> str:
    """Every documentation file, one after the other (what ``test_startup`` checks quotes against)."""
    return "\n".join(path.read_text(encoding="utf-8") for path in DOC_FILES)


# -- the code layout --------------------------------------------------------------------------------


def section(text: str, heading: str) -> str:
    """The text under the markdown heading ``heading`` (any level), up to the next heading of that level or above."""
    match = re.search(rf"^(#+) {re.escape(heading)}\n", text, re.M)
    assert match, f"no heading {heading!r}"
    level = len(match.group(1))
    rest = text[match.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def documented_layout() -> dict[str, set[str]]:
    """``package -> module files`` from the table of CONTRIBUTING.md's "Code layout" (``""`` for the top level)."""
    layout: dict[str, set[str]] = {}
    for line in section((REPO / "CONTRIBUTING.md").read_text(encoding="utf-8"), "Code layout").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not line.startswith("|") or set(cells[0]) <= set("-: "):
            continue
        name = cells[0]
        if name == "package":
            continue
        package = "" if name == "(top level)" else name.strip("`").rstrip("/")
        layout[package] = set(re.findall(r"`([\w.]+\.py)`", cells[1]))
    return layout


def actual_layout() -> dict[str, set[str]]:
    """``package -> module files`` of the package itself (``""`` for the top level)."""
    layout: dict[str, set[str]] = {}
    for init in PACKAGE.rglob("__init__.py"):
        if "__pycache__" in init.parts:
            continue
        folder = init.parent
        package = folder.relative_to(PACKAGE).as_posix()
        modules = {p.name for p in folder.glob("*.py")}
        # a sub-package's own __init__.py goes without saying; the top level's is listed
        layout["" if package == "." else package] = modules if package == "." else modules - {"__init__.py"}
    return layout


def test_the_layout_in_contributing_is_the_package() -> None:
    documented, actual = documented_layout(), actual_layout()
    assert "core" in documented and "" in documented, documented
    assert sorted(documented) == sorted(actual), "the sub-packages of CONTRIBUTING.md's layout are not the package's"
    for package in actual:
        assert documented[package] == actual[package], (
            f"{package or '(top level)'}: listed but missing {sorted(documented[package] - actual[package])}, "
            f"present but not listed {sorted(actual[package] - documented[package])}"
        )


def test_the_readme_names_the_packages_of_the_layout() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    pointer = next(line for line in readme.split("\n- ") if "(CONTRIBUTING.md)" in line)
    named = set(re.findall(r"`(\w+)/`", pointer))
    top = {package for package in actual_layout() if package and "/" not in package}
    assert named == top, f"the README's pointer to CONTRIBUTING.md names {sorted(named)}, the package has {sorted(top)}"


# -- the example configs ----------------------------------------------------------------------------


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yml"))


def test_there_is_an_example_for_each_job() -> None:
    names = {path.stem for path in example_files()}
    assert {"replay", "record-mirrorapi", "record-openai", "replay-snapshot"} <= names, names


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_an_example_config_loads(path: Path) -> None:
    settings = load_settings(path, environ={})  # unknown keys and invalid values raise ConfigError
    assert settings.mode.value in path.read_text()


def test_the_job_examples_say_what_they_must() -> None:
    replay = load_settings(EXAMPLES / "replay.yml", environ={})
    assert replay.mode == "replay" and replay.frozen_caches == [f"{UPSTREAM}/tool_response_cache"]
    mirror = load_settings(EXAMPLES / "record-mirrorapi.yml", environ={}).simulator
    assert mirror.enabled and mirror.style == "mirrorapi-sft" and mirror.system_prompt_file == f"{UPSTREAM}/system_prompts.py"
    gpt = load_settings(EXAMPLES / "record-openai.yml", environ={}).simulator
    assert gpt.enabled and gpt.style == "gpt-fewshot" and gpt.api_key is None  # the key comes from the environment


def test_the_readme_shows_each_example_as_it_is() -> None:
    """The README shows the examples of its quick starts; an example of one feature is shown in its doc."""
    readme = YAML_BLOCK.findall((REPO / "README.md").read_text(encoding="utf-8"))
    docs = [block for doc in DOC_FILES for block in YAML_BLOCK.findall(doc.read_text(encoding="utf-8"))]
    for path in example_files():
        text = path.read_text(encoding="utf-8")
        assert text in docs, f"no doc shows {path.relative_to(REPO)} as it is"
        if path.stem in README_EXAMPLES:
            assert text in readme, f"the README does not show {path.relative_to(REPO)} as it is"


#: the examples of the README's quick starts (the others are shown in their feature's doc)
README_EXAMPLES = {"replay", "record-mirrorapi", "record-openai", "replay-snapshot"}


def test_every_yaml_block_of_the_docs_is_a_config_that_loads(tmp_path: Path) -> None:
    for doc in DOC_FILES:
        for i, block in enumerate(YAML_BLOCK.findall(doc.read_text(encoding="utf-8"))):
            path = tmp_path / f"{doc.stem}-{i}.yml"
            path.write_text(block)
            load_settings(path, environ={})


@pytest.mark.parametrize("name", ["replay", "record-mirrorapi", "record-openai"])
def test_an_example_passes_doctor_offline(tmp_path: Path, name: str) -> None:
    """The example as shipped, with only its StableToolBench paths pointed at a made-up ``server/`` folder."""
    server = make_server_folder(tmp_path)
    (server / "system_prompts.py").write_text('SFT_SYSTEM = "You are an API simulator."\nCOT_SYSTEM = "Think, then answer."\n')
    config = tmp_path / f"{name}.yml"
    config.write_text((EXAMPLES / f"{name}.yml").read_text().replace(UPSTREAM, str(server)))
    result = cli("doctor", "--config", str(config), "--no-probe", cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "built-in system prompt" not in out  # system_prompt_file is set where it matters


def test_the_replay_of_a_snapshot_example_passes_doctor_on_a_snapshot(tmp_path: Path) -> None:
    server = make_server_folder(tmp_path)
    config = tmp_path / "replay-snapshot.yml"
    config.write_text((EXAMPLES / "replay-snapshot.yml").read_text().replace(UPSTREAM, str(server)))
    shutil.copytree(server / "tool_response_cache", tmp_path / "snapshots" / "run1")  # a snapshot is an upstream tree
    result = cli("doctor", "--config", str(config), "--no-probe", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# -- links ------------------------------------------------------------------------------------------


LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation out, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_every_relative_link_and_anchor_resolves() -> None:
    problems = []
    for doc in [*DOC_FILES, REPO / "examples" / "meetings" / "README.md"]:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            where = (doc.parent / file).resolve() if file else doc
            if not where.exists():
                problems.append(f"{doc.relative_to(REPO)}: {target}: no such file")
            elif anchor and (where.suffix != ".md" or anchor not in anchors(where)):
                problems.append(f"{doc.relative_to(REPO)}: {target}: no such heading")
    assert not problems, "\n".join(problems)


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    head = readme.split("A stable, reproducible virtual API layer")[0]
    assert "stabletoolbench-mirror serve\n" in head and "python -m pytest -q\n" in head
