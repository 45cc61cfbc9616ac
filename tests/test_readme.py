"""The README's examples run as written (against real servers), and its links lead somewhere: it cannot drift.

The examples that moved into the documentation site are run by tests/test_docs.py.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
#: The two set-up commands the README promises, word for word (people copy them).
SETUP = (
    "python3 -m venv .venv && .venv/bin/pip install -e . -e examples/shipping_forecast"
    " && .venv/bin/inference-server serve",
    "bash scripts/test",
)


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, flags=re.DOTALL | re.MULTILINE)


def _on_port(text: str, port: int) -> str:
    return text.replace("localhost:8080", f"127.0.0.1:{port}").replace("127.0.0.1:8080", f"127.0.0.1:{port}")


def test_setup_commands_are_the_promised_ones() -> None:
    """The quick start's two set-up commands are there, word for word."""
    commands = [block.strip() for block in _blocks("sh")]
    for command in SETUP:
        assert command in commands


def test_quick_start_curl_answers_the_forecast(servers: Any) -> None:
    """The quick start's curl, sent to the example server, prints the JSON the README shows."""
    server = servers.start(plugins=["shipping_forecast"])
    curl = next(block for block in _blocks("sh") if block.startswith("curl"))
    output = subprocess.run(shlex.split(_on_port(curl, server.port)), capture_output=True, check=True).stdout
    assert orjson.loads(output) == orjson.loads(_blocks("json")[0])


def test_client_example_runs(servers: Any, capsys: Any) -> None:
    """The Predictor example asks the example server for the forecast and prints the wind."""
    server = servers.start(plugins=["shipping_forecast"])
    example = next(block for block in _blocks("python") if "Predictor(" in block)
    exec(compile(_on_port(example, server.port), "README.md", "exec"), {})
    assert capsys.readouterr().out == "Southwesterly gale force 8 continuing\n"


def test_plugin_example_serves_through_its_entry_point(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """The plugin example, registered under the entry point the README shows, serves a model from its directory."""
    example = next(block for block in _blocks("python") if "plugin_hook" in block)
    (entry_point,) = re.findall(r'^(\w+) = "(\w+)"$', _blocks("toml")[0], flags=re.MULTILINE)
    assert entry_point[0] == entry_point[1]
    plugin_site.add(entry_point[0], example)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    np.save(model_dir / "weights.npy", np.array([0.5, 1.0, 2.0]))
    server = servers.start("--model-dir", str(model_dir))
    reply = server.request("POST", "/invocations", b"[[1, 2, 3]]", {"Content-Type": "application/json"})
    assert (reply.status, reply.json()) == (200, [8.5])


def test_links_lead_to_files() -> None:
    """Every relative link of the README names a file of this repository (the site's pages among them)."""
    links = re.findall(r"\]\((?!https?://)([^)#]+)", README)
    assert links
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"


def _requirement_names(requirements: list[str]) -> set[str]:
    """The normalised names of the requirements that apply without extras (``name[extra]>=1; marker`` -> name)."""
    names = set()
    for requirement in requirements:
        if re.search(r"extra\s*==", requirement):
            continue
        match = re.match(r"\s*([A-Za-z0-9_.-]+)", requirement)
        assert match, f"cannot read the requirement {requirement!r}"
        names.add(re.sub(r"[-_.]+", "-", match[1]).lower())
    return names


def _installs(requirements: list[str]) -> set[str]:
    """Every distribution installing ``requirements`` brings, by the installed packages' metadata."""
    wanted, found = _requirement_names(requirements), set()
    while wanted:
        name = wanted.pop()
        found.add(name)
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            wanted |= _requirement_names(importlib.metadata.requires(name) or []) - found
    return found


def _docs_command(readme: str, pyproject: dict[str, Any]) -> list[str]:
    """What is wrong with the README's command that serves the documentation site, after the quick start."""
    commands = [block.strip() for block in re.findall(r"^```sh\n(.*?)^```", readme, flags=re.DOTALL | re.MULTILINE)]
    served = [command for command in commands if "mkdocs serve" in command]
    if len(served) != 1:
        return [f"the README has {len(served)} sh blocks that run `mkdocs serve`, not one"]
    install = re.match(r"\.venv/bin/pip install -e '\.\[(\w+)\]' && \.venv/bin/mkdocs serve$", served[0])
    if install is None:
        return [f"{served[0]!r} does not install the docs extra into the quick start's .venv before it serves"]
    extras = pyproject["optional-dependencies"]
    extra = install[1]
    if extra not in extras:
        return [f"pyproject.toml has no extra {extra!r}"]
    problems = []
    scripts = {entry.name: entry.dist for entry in importlib.metadata.entry_points(group="console_scripts")}
    mkdocs = scripts.get("mkdocs")
    if mkdocs is None or re.sub(r"[-_.]+", "-", mkdocs.name).lower() not in _installs(extras[extra]):
        problems.append(f"the {extra} extra ({extras[extra]}) does not install the mkdocs command")
    if not any(re.search(rf"^inference-server\[[^\]]*\b{extra}\b", item) for item in extras["test"]):
        problems.append(f"the test extra does not include the {extra} extra, so the suite cannot build the site")
    return problems


def test_docs_command_works_after_the_quick_start() -> None:
    """The README's docs command installs an extra that brings mkdocs (and the test extra has it) before serving."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    problems = _docs_command(README, pyproject)
    assert not problems, "\n".join(problems)


def test_readme_links_every_page_of_the_site() -> None:
    """The README's list of the documentation links every page of docs/ (every how-to among them)."""
    pages = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").rglob("*.md"))
    links = set(re.findall(r"\]\((docs/[^)#]+\.md)", README))
    missing = [page for page in pages if page not in links]
    assert not missing, f"the README's Documentation section does not link {missing}"
