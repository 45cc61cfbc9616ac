"""The documentation site: every example runs, the generated reference is current, and the site builds strictly.

How code blocks in ``docs/`` are written (fences start a line and name their language; tests below enforce it):

- ``python``: run in the page's order, in one namespace per page, in the page's working directory; a ``text`` block
  right after one (nothing but blank lines between) is what it prints, line for line.
- ``sh``: run with bash (``set -euo pipefail``) in the page's working directory; variables it exports reach the
  page's later blocks. ``curl`` fails on an HTTP error status, unless the block's answer is shown (below). Two kinds
  of command are not given to bash: ``[VAR=value ...] inference-server serve ...`` starts the page's server in the
  background (on a free port, one worker unless the page says otherwise; a later one replaces it), and the test waits
  until ``/ping`` answers 200; ``pip install ...`` is checked, not run: an ``inference-server[extra]`` must name an
  extra of ``pyproject.toml``, other packages must be installed in the test environment, and a local project (a
  directory with a ``pyproject.toml``) is made importable with its entry points, as an install would.
- What a page needs beyond the README's quick start is its install line: its first ``pip install``, in a ``sh`` block
  of its opening (before its first example and its second ``##`` section). Every module the page's examples import
  or run is the standard library's, the quick start's (:data:`QUICK_START`), the install line's (:data:`IMPORT_NAMES`
  where names differ) or the page's own; a later ``pip install`` only installs a project of the page's own.
- A process a ``sh`` block starts in a session of its own, writing the session's id to ``NAME.session`` in the page's
  directory (``setsid bash -c 'echo $$ > NAME.session; exec cmd' &``), is ended, with every process of its
  session, when the page ends, whatever happened (the page may end it first).
- ``localhost:8080`` in ``python`` and ``sh`` blocks means the page's server; ``localhost:8081`` its gRPC port, when
  its ``serve`` command has ``--grpc-port 8081`` (given a free port instead).
- A ``json`` or ``text`` block right after a ``sh`` block (nothing but blank lines between) is what that block
  prints: ``json`` equal as JSON, each number to the precision the page writes it with (``0.98`` matches
  ``0.9812``), ``"..."`` standing for any value; ``text`` equal line for line. Other ``json`` and ``toml`` blocks must
  parse.
- ``title="path"`` names a file: under ``examples/`` it shows this repository's file and must be an excerpt of it
  (whole lines, in order, none skipped); any other path is written into the page's working directory when the page
  reaches it (``python`` files are compiled, not run; they run as what the page makes of them).
- ``console``: commands that cannot run here (a new virtualenv, docker, an AWS account): only on the pages of
  :data:`UNEXECUTED`, each with its reason.
- ``text``: output, listings and diagrams, never commands or code.

Each page runs in a fresh working directory laid out as the root of a checkout (``examples/`` is this repository's),
with the plugins of :data:`INSTALLED` installed (``INFERENCE_SERVER_PLUGINS``) and the virtualenv's commands first on
``PATH``.
"""

from __future__ import annotations

import ast
import contextlib
import decimal
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from inference_server._hookspecs import HOOK_NAMES
from tests.conftest import Server, free_port

#: The gRPC port pages serve on (KServe's).
GRPC_PORT = 8081
tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))

#: Pages whose ``console`` blocks cannot run here, and why. Keep it short: every other command runs.
UNEXECUTED = {
    "tutorial.md": "creates a virtualenv and installs into it",
    "deploy/container.md": "builds and runs a container image (tests/test_container.py runs the same build)",
    "deploy/sagemaker.md": "needs an AWS account: ECR, S3, Model.deploy(), Batch Transform jobs",
    "how-to/client.md": "the SageMaker SDK v3 cannot be installed beside v2 (tests/test_client_sdk_v3.py runs it)",
    "contributing.md": "runs this checkout's own scripts: the test suite, the docs server, the page generators",
}
#: The plugins the reader of each page has installed when the page starts (none unless listed).
INSTALLED = {
    "tutorial.md": "shipping_forecast",
    "how-to/client.md": "shipping_forecast",
}
#: Seconds a page's server has to answer ``/ping`` with 200 once it answers at all.
SERVE_READY = 120
LANGUAGES = {"python", "sh", "json", "toml", "console", "text"}

_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
#: Lines a ``text`` block must not start with: those are commands or code, which must run.
_CODE_LINE = re.compile(r"^\s*(\$ |>>> |curl |inference-server |python |pip |import |from \S+ import |def |class )")


@dataclass
class Block:
    """One fenced block of a page."""

    language: str
    title: str | None
    code: str
    line: int
    #: The next block follows this one with nothing but blank lines between.
    output: Block | None = None


def _blocks(page: str) -> list[Block]:
    text = (DOCS / page).read_text()
    blocks: list[Block] = []
    end = -1
    for match in _FENCE.finditer(text):
        info = match["info"].strip()
        title = re.search(r'title="([^"]*)"', info)
        block = Block(info.split(" ")[0], title and title[1], match["code"], text.count("\n", 0, match.start()) + 1)
        if blocks and text[end : match.start()].strip() == "":
            blocks[-1].output = block
        blocks.append(block)
        end = match.end()
    return blocks


def _nav_pages(items: Any) -> list[str]:
    if isinstance(items, str):
        return [items]
    if isinstance(items, dict):
        return [page for value in items.values() for page in _nav_pages(value)]
    return [page for item in items for page in _nav_pages(item)]


class _Written(float):
    """A number as the page writes it: ``precision`` is half a unit of its last digit."""

    precision: float


def _written(text: str) -> _Written:
    number = _Written(text)
    number.precision = 0.5 * 10.0 ** int(decimal.Decimal(text).as_tuple().exponent)
    return number


def _matches(expected: Any, actual: Any) -> bool:
    """Whether printed JSON is what the page shows (parsed with :func:`_written` numbers)."""
    if expected == "...":
        return True
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(_matches(value, actual[key]) for key, value in expected.items())
        )
    if isinstance(expected, list):
        return isinstance(actual, list) and len(expected) == len(actual) and all(map(_matches, expected, actual))
    if isinstance(expected, _Written):
        return isinstance(actual, (int, float)) and abs(actual - expected) <= expected.precision * (1 + 1e-9)
    return bool(expected == actual and type(expected) is type(actual))


def _commands(code: str) -> list[str]:
    """The block's logical lines: continuation lines joined to theirs."""
    return code.replace("\\\n", " ").splitlines()


def _words(command: str) -> tuple[dict[str, str], list[str]]:
    """A command's leading ``VAR=value`` assignments and the rest of its words."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return {}, []
    assignments = {}
    while words and _ASSIGNMENT.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        assignments[name] = value
    if any(word in ("&&", "||", ";", "|") for word in words):
        return {}, []
    return assignments, words


def _kind(command: str) -> str:
    _, words = _words(command)
    if len(words) >= 2 and Path(words[0]).name == "inference-server" and words[1] == "serve":
        return "serve"
    if len(words) >= 2 and Path(words[0]).name in ("pip", "pip3") and words[1] == "install":
        return "pip"
    return "bash"


@dataclass
class PageRun:
    """The state of one page being run: its directory, environment, namespace and server."""

    page: str
    work: Path
    site: Path
    logs: Path
    monkeypatch: pytest.MonkeyPatch
    env: dict[str, str] = field(default_factory=dict)
    namespace: dict[str, Any] = field(default_factory=dict)
    server: Server | None = None
    servers: list[Server] = field(default_factory=list)
    #: The port the page's ``--grpc-port 8081`` was given instead.
    grpc_port: int | None = None

    def where(self, block: Block) -> str:
        return f"docs/{self.page}:{block.line}"

    def on_port(self, text: str, block: Block) -> str:
        for port, actual in ((8080, self.server.port if self.server else None), (GRPC_PORT, self.grpc_port)):
            if f"localhost:{port}" not in text and f"127.0.0.1:{port}" not in text:
                continue
            if actual is None:
                pytest.fail(f"{self.where(block)} talks to localhost:{port}, but the page started no server on it")
            address = f"127.0.0.1:{actual}"
            text = text.replace(f"localhost:{port}", address).replace(f"127.0.0.1:{port}", address)
        return text

    # python ------------------------------------------------------------------------------------------------------

    def python(self, block: Block) -> None:
        for name in set(os.environ) | set(self.env):
            if name not in self.env:
                self.monkeypatch.delenv(name)
            elif os.environ.get(name) != self.env[name]:
                self.monkeypatch.setenv(name, self.env[name])
        source = "\n" * block.line + self.on_port(block.code, block)  # tracebacks give the page's line numbers
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(source, f"docs/{self.page}", "exec"), self.namespace)
        expected = block.output if block.output is not None and block.output.language == "text" else None
        if expected is not None:
            output = printed.getvalue()
            lines = [line.rstrip() for line in output.rstrip().splitlines()]
            shown = [line.rstrip() for line in expected.code.rstrip().splitlines()]
            assert lines == shown, f"{self.where(block)} printed:\n{output}\nthe page shows:\n{expected.code}"

    # sh ----------------------------------------------------------------------------------------------------------

    def sh(self, block: Block) -> None:
        expected = block.output if block.output is not None and block.output.language in ("json", "text") else None
        output = ""
        pending: list[str] = []
        for command in [*_commands(block.code), None]:
            kind = "end" if command is None else _kind(command)
            if kind == "bash":
                pending.append(command or "")
                continue
            if pending:
                output += self.bash("\n".join(pending), block, fail_on_http_errors=expected is None)
                pending = []
            if kind == "serve":
                self.serve(command or "", block)
            elif kind == "pip":
                self.pip(command or "", block)
        if expected is not None and expected.language == "text":
            printed = [line.rstrip() for line in output.rstrip().splitlines()]
            shown = [line.rstrip() for line in expected.code.rstrip().splitlines()]
            assert printed == shown, f"{self.where(block)} printed:\n{output}\nthe page shows:\n{expected.code}"
        elif expected is not None:
            try:
                actual = orjson.loads(output)
            except orjson.JSONDecodeError:
                pytest.fail(f"{self.where(block)} printed {output!r}, not the JSON the page shows")
            want = json.loads(expected.code, parse_float=_written, parse_int=_written)
            assert _matches(want, actual), f"{self.where(block)} printed {actual!r}; the page shows {expected.code}"

    def bash(self, script: str, block: Block, *, fail_on_http_errors: bool) -> str:
        env_file = self.logs / "env"
        fail = "--fail-with-body" if fail_on_http_errors else ""
        prelude = f'set -euo pipefail\ncurl() {{ command curl --silent --show-error {fail} "$@"; }}\n'
        epilogue = f'\nenv -0 > "{env_file}"\n'
        done = subprocess.run(
            ["bash", "-c", prelude + self.on_port(script, block) + epilogue],
            env=self.env,
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        if done.returncode != 0:
            log = f"\nserver log:\n{self.server.output()[-3000:]}" if self.server else ""
            pytest.fail(
                f"{self.where(block)} exited with {done.returncode}:\n{script}\n"
                f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}{log}"
            )
        exported = dict(item.split("=", 1) for item in env_file.read_text().split("\0") if "=" in item)
        self.env = {name: value for name, value in exported.items() if name not in ("_", "SHLVL", "PWD", "OLDPWD")}
        return done.stdout

    def serve(self, command: str, block: Block) -> None:
        assignments, words = _words(command)
        if self.server is not None:
            self.server.stop(timeout=60)  # (a server on Ray Serve stops its Ray)
        env = {"SAGEMAKER_MODEL_SERVER_WORKERS": "1", **self.env, **assignments}
        args = words[2:]
        self.grpc_port = None
        if "--grpc-port" in args:  # (the page's 8081, on a free port)
            at = args.index("--grpc-port") + 1
            assert args[at] == str(GRPC_PORT), f"{self.where(block)}: a page serves gRPC on {GRPC_PORT}"
            self.grpc_port = free_port()
            args[at] = str(self.grpc_port)
        self.server = Server(args, env, self.logs / f"server-{len(self.servers)}.log")
        self.servers.append(self.server)
        try:
            self.server.wait_ready(60)
        except AssertionError as exc:
            pytest.fail(f"{self.where(block)}: {command}\n{exc}")
        # (a server on Ray Serve: its proxy answers before a replica has loaded the model)
        deadline = time.monotonic() + SERVE_READY
        while (ping := self.server.request("GET", "/ping")).status != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ping.status == 200, f"{self.where(block)}: /ping answered {ping.status}:\n{self.server.output()}"

    def pip(self, command: str, block: Block) -> None:
        _, words = _words(command)
        for word in words[2:]:
            if word.startswith("-"):
                continue
            project = self.work / word
            if (project / "pyproject.toml").is_file():
                self.install(project)
                continue
            requirement = re.match(r"([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", word)
            assert requirement, f"{self.where(block)}: cannot read the requirement {word!r}"
            name, extras = requirement[1], requirement[2]
            if name == "inference-server" and extras:
                ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
                unknown = {extra.strip() for extra in extras.split(",")} - set(ours)
                assert not unknown, f"{self.where(block)}: inference-server has no extra {', '.join(unknown)}"
            try:
                importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                pytest.fail(f"{self.where(block)} installs {name}, which the test environment lacks")

    def install(self, project: Path) -> None:
        """What ``pip install`` of a local project gives: its packages importable, its entry points registered."""
        project_table = tomllib.loads((project / "pyproject.toml").read_text())["project"]
        groups = project_table.get("entry-points", {})
        try:
            importlib.metadata.distribution(project_table["name"])  # this repository's examples are installed
        except importlib.metadata.PackageNotFoundError:
            self.make_importable(project, project_table)
        plugins = [self.env.get("INFERENCE_SERVER_PLUGINS", ""), *groups.get("inference_server", {})]
        self.env["INFERENCE_SERVER_PLUGINS"] = ",".join(plugin for plugin in plugins if plugin)

    def make_importable(self, project: Path, project_table: dict[str, Any]) -> None:
        """The project's packages on the path (in this process too) and its metadata and entry points in a
        ``.dist-info``, as installing it would leave them."""
        name, version = project_table["name"], project_table["version"]
        dist_info = self.site / f"{name.replace('-', '_')}-{version}.dist-info"
        dist_info.mkdir(parents=True)
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (dist_info / "entry_points.txt").write_text(
            "".join(
                f"[{group}]\n" + "".join(f"{entry} = {target}\n" for entry, target in points.items())
                for group, points in project_table.get("entry-points", {}).items()
            )
        )
        src = project / "src"
        paths = [str(self.site), str(src if src.is_dir() else project)]
        self.env["PYTHONPATH"] = os.pathsep.join([*paths, self.env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        for path in paths:
            self.monkeypatch.syspath_prepend(path)

    # files -------------------------------------------------------------------------------------------------------

    def file(self, block: Block) -> None:
        assert block.title is not None
        if block.language == "python":
            compile(block.code, f"{self.where(block)} ({block.title})", "exec")
        if block.language == "toml":
            tomllib.loads(block.code)
        if block.title.startswith("examples/"):
            lines, excerpt = (ROOT / block.title).read_text().splitlines(), block.code.splitlines()
            assert any(lines[i : i + len(excerpt)] == excerpt for i in range(len(lines))), (
                f"{self.where(block)} is not an excerpt of {block.title}: copy it from the file again"
            )
            return
        path = self.work / block.title
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.code)

    def stop(self) -> None:
        for server in self.servers:
            server.stop(timeout=60)
        for session in self.work.glob("*.session"):  # what the page started in sessions of its own (setsid)
            _end_session(int(session.read_text()))


def _end_session(session: int) -> None:
    """Kill every process of ``session`` (Linux's ``/proc``)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session:  # (state, ppid, pgrp, session)
                os.kill(int(stat.parent.name), signal.SIGKILL)


def _run_page(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work, site, logs = tmp_path / "work", tmp_path / "site", tmp_path / "logs"
    for directory in (work, site, logs):
        directory.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "INFERENCE_SERVER_PLUGINS": INSTALLED.get(page, ""),
        # Hermetic AWS clients: no configuration files, no instance metadata (the pages export dummy credentials).
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    }
    run = PageRun(page, work, site, logs, monkeypatch, env)
    monkeypatch.chdir(work)
    try:
        blocks = _blocks(page)
        outputs = {id(block.output) for block in blocks if block.language == "sh" and block.output is not None}
        for block in blocks:
            if block.title is not None:
                run.file(block)
            elif block.language == "python":
                run.python(block)
            elif block.language == "sh":
                run.sh(block)
            elif block.language == "json" and id(block) not in outputs:
                orjson.loads(block.code)
            elif block.language == "toml":
                tomllib.loads(block.code)
    finally:
        run.stop()


def _executable(page: str) -> bool:
    return any(block.language in ("python", "sh") or block.title for block in _blocks(page))


#: Pages that start more than one server on Ray (each a Ray of its own, or a cluster of two nodes), in seconds.
SLOW_PAGES = {"how-to/ray-serve.md": 420}


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(page, marks=[pytest.mark.timeout(SLOW_PAGES[page])] if page in SLOW_PAGES else [])
        for page in PAGES
        if _executable(page)
    ],
)
def test_page_examples_run(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every python and sh block of the page runs, in order, and the output the page shows is what it prints."""
    _run_page(page, tmp_path, monkeypatch)


def test_code_blocks_follow_the_convention() -> None:
    """Fences start a line and name a known language; console blocks only on UNEXECUTED pages; text is not code."""
    problems = []
    for page in PAGES:
        text = (DOCS / page).read_text()
        for match in re.finditer(r"^[ \t]+```|^~~~", text, flags=re.MULTILINE):
            problems.append(f"{page}:{text.count(chr(10), 0, match.start()) + 1}: an indented or ~~~ fence is not run")
        for block in _blocks(page):
            where = f"{page}:{block.line}"
            if block.language not in LANGUAGES:
                problems.append(f"{where}: fence language {block.language!r}, not one of {sorted(LANGUAGES)}")
            if block.language == "console" and page not in UNEXECUTED:
                problems.append(f"{where}: a console block is never run; run it as sh, or add the page to UNEXECUTED")
            if block.language == "text" and any(_CODE_LINE.match(line) for line in block.code.splitlines()):
                problems.append(f"{where}: a text block holds commands or code, which must run (sh or python)")
    assert not problems, "\n".join(problems)


def test_unexecuted_list_is_current() -> None:
    """Every page allowed console blocks still has one, so the list of what cannot run stays short and true."""
    stale = [page for page in UNEXECUTED if not any(block.language == "console" for block in _blocks(page))]
    assert not stale, f"no console block left on {stale}: remove them from UNEXECUTED"


# What each page needs -----------------------------------------------------------------------------------------------

#: The modules a requirement gives a page where they are not its own name (``-`` read as ``_``): its own, and those
#: of its dependencies that the pages use. Only requirements the pages or pyproject's extras name; keep it short.
IMPORT_NAMES = {
    "boto3": {"boto3", "botocore"},
    "dask": {"dask", "distributed", "pandas"},  # the dask extra's dask[dataframe,distributed]
    "mkdocs-material": {"material", "mkdocs"},
    "opentelemetry-sdk": {"opentelemetry"},
    "sagemaker": {"sagemaker", "boto3", "botocore"},
    "scikit-learn": {"sklearn", "joblib"},
}
#: What a page may use without saying so: the README's quick start (a virtualenv, with pip; this project with
#: pyproject's ``dependencies``; the example plugin) and the standard library.
QUICK_START = ("inference-server", "examples/shipping_forecast")


def _requirement(text: str) -> tuple[str, set[str]]:
    """A requirement's normalised name and extras: ``'inference-server[a,b]>=2'`` is ``inference-server``, {a, b}."""
    match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", text)
    assert match, f"cannot read the requirement {text!r}"
    name = re.sub(r"[-_.]+", "-", match[1]).lower()
    return name, {extra.strip() for extra in (match[2] or "").split(",") if extra.strip()}


def _modules_of(requirement: str) -> set[str]:
    """The modules ``pip install requirement`` gives: inference-server's, with its extras', or by IMPORT_NAMES."""
    name, extras = _requirement(requirement)
    if name != "inference-server":
        return IMPORT_NAMES.get(name, {name.replace("-", "_")})
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    modules = {"inference_server"}
    for extra in sorted(extras):
        assert extra in project["optional-dependencies"], f"inference-server has no extra {extra!r}"
        modules |= {
            module for dependency in project["optional-dependencies"][extra] for module in _modules_of(dependency)
        }
    return modules | {module for dependency in project["dependencies"] for module in _modules_of(dependency)}


def _project_modules(pyproject: str) -> set[str]:
    """What ``pip install`` of a local project gives: its own modules and its dependencies'."""
    project = tomllib.loads(pyproject)["project"]
    modules = {_requirement(project["name"])[0].replace("-", "_")}
    modules |= {target.split(".")[0] for target in project.get("entry-points", {}).get("inference_server", {}).values()}
    return modules | {module for dependency in project.get("dependencies", []) for module in _modules_of(dependency)}


def _quick_start_modules() -> set[str]:
    example = (ROOT / QUICK_START[1] / "pyproject.toml").read_text()
    return set(sys.stdlib_module_names) | {"pip"} | _modules_of(QUICK_START[0]) | _project_modules(example)


def _imports(code: str) -> set[str]:
    """The top-level names of the modules ``code`` imports (absolute imports, wherever they stand)."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _segments(command: str) -> list[list[str]]:
    """The simple commands of a logical line (split at ``|``, ``&&``, ``;``, ``$(``...), each as its words."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    segments: list[list[str]] = [[]]
    with contextlib.suppress(ValueError):  # an unbalanced quote: the words read so far
        for token in lexer:
            if token and all(char in "();<>|&" for char in token):
                segments.append([])
            else:
                segments[-1].append(token)
    return [words for words in segments if words]


@dataclass
class Needs:
    """What a page's examples use, and what it installs."""

    #: Each module the examples import or run (python blocks, files the page writes or runs, commands), and where.
    used: dict[str, str] = field(default_factory=dict)
    #: What the page gives itself: its install line, the local projects it installs, the modules it writes.
    given: set[str] = field(default_factory=set)
    #: The page's install line (its first ``pip install``, which must stand in the page's opening).
    install: str | None = None
    problems: list[str] = field(default_factory=list)


def _needs(page: str) -> Needs:
    """What the page's examples use, what its install line and its own steps give, and what is misplaced."""
    needs, blocks, text = Needs(), _blocks(page), (DOCS / page).read_text()
    written = {block.title: block for block in blocks if block.title and not block.title.startswith("examples/")}
    needs.given = {Path(part).stem for title in written for part in Path(title).parts}
    headings = [text.count("\n", 0, match.start()) + 1 for match in re.finditer(r"^## ", text, flags=re.MULTILINE)]
    pip = re.compile(r"^\s*pip3? install ", re.MULTILINE)
    runs = [b.line for b in blocks if b.title in written or (not b.title and b.language == "python")]
    runs += [b.line for b in blocks if not b.title and b.language == "sh" and not pip.search(b.code)]
    opening = min([*headings[1:2], *runs], default=len(text))  # the install line stands before both
    scripts = {entry.name: entry.value for entry in importlib.metadata.entry_points(group="console_scripts")}
    seen_pip = False

    def use(modules: set[str], where: str) -> None:
        for module in sorted(modules):
            needs.used.setdefault(module, where)

    def local(word: str) -> str | None:
        """The ``pyproject.toml`` of the local project ``pip install word`` installs, if it is one."""
        path = Path(word).as_posix().strip("/")
        pyproject = "pyproject.toml" if path == "." else f"{path}/pyproject.toml"
        if pyproject in written:
            return written[pyproject].code
        return (ROOT / pyproject).read_text() if path.startswith("examples/") else None

    for block in blocks:
        where = f"docs/{page}:{block.line}"
        if block.language == "python" and (block.title is None or block.title in written):
            use(_imports(block.code), where)
        if block.language != "sh" or block.title is not None:
            continue
        for command in _commands(block.code):
            for found in re.finditer(r"examples/[\w./-]+?\.py\b", command):  # a script of this repository it runs
                use(_imports((ROOT / found[0]).read_text()), f"{where} ({found[0]})")
            for words in _segments(command):
                while words and _ASSIGNMENT.match(words[0]):
                    words.pop(0)
                program, arguments = (Path(words[0]).name, words[1:]) if words else ("", [])
                if program in ("pip", "pip3") and arguments[:1] == ["install"]:
                    requirements = [word for word in arguments[1:] if not word.startswith("-")]
                    for word in requirements:
                        pyproject = local(word)
                        needs.given |= _project_modules(pyproject) if pyproject else _modules_of(word)
                    if not seen_pip and block.line < opening:
                        needs.install = " ".join(words)
                    elif any(local(word) is None for word in requirements):
                        needs.problems.append(
                            f"{where}: `{' '.join(words)}` installs more than the page's own projects: name what the"
                            " page needs in one pip install line in its opening, before its first example"
                        )
                    seen_pip = True
                elif re.fullmatch(r"python[0-9.]*", program) and arguments[:1] == ["-m"] and len(arguments) > 1:
                    use({arguments[1].split(".")[0]}, where)
                elif re.fullmatch(r"python[0-9.]*", program) and arguments[:1] == ["-c"] and len(arguments) > 1:
                    use(_imports(arguments[1]), where)
                elif program in scripts:
                    use({scripts[program].split(":")[0].split(".")[0]}, f"{where} (the {program} command)")
    return needs


@pytest.mark.parametrize("page", PAGES)
def test_page_names_what_it_needs(page: str) -> None:
    """Every module the page's examples import or run is the quick start's, or given by the page's install line."""
    needs = _needs(page)
    missing = {
        module: where for module, where in needs.used.items() if module not in _quick_start_modules() | needs.given
    }
    problems = [*needs.problems]
    problems += [
        f"{where} uses {module}, which neither the quick start nor the page installs"
        for module, where in missing.items()
    ]
    if missing:
        problems.append(
            f"give it in docs/{page}'s opening, before its first example: "
            f"{'add to' if needs.install else 'a sh block with'} `{needs.install or 'pip install ...'}`"
        )
    assert not problems, "\n".join(problems)


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "scripts" / "docs_reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", ["reference/cli.md", "reference/settings.md", "reference/http.md"])
def test_generated_reference_is_current(path: str) -> None:
    """The committed CLI, settings and HTTP reference pages are what the generator writes from the code now."""
    generator = _generator()
    assert set(generator.PAGES) == {"reference/cli.md", "reference/settings.md", "reference/http.md"}
    assert (DOCS / path).read_text() == generator.PAGES[path](), (
        f"docs/{path} is out of date: run python scripts/docs_reference.py"
    )


def test_hooks_reference_lists_every_hook() -> None:
    """Every hook of the specification has its row in the hooks reference."""
    page = (DOCS / "reference" / "hooks.md").read_text()
    missing = [name for name in HOOK_NAMES if f"| `{name}(" not in page]
    assert not missing, f"docs/reference/hooks.md has no row for {missing}"


def test_home_page_links_every_page() -> None:
    """The home page links every other page of the site, so every capability's guide is one click from it."""
    home = (DOCS / "index.md").read_text()
    links = set(re.findall(r"\]\(([^)#]+\.md)", home))
    missing = [page for page in PAGES if page != "index.md" and page not in links]
    assert not missing, f"docs/index.md does not link {missing}"


def test_every_page_is_in_the_nav() -> None:
    """mkdocs.yml's nav lists every page under docs/ exactly once."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    assert sorted(nav) == PAGES


def test_site_builds_strictly(tmp_path: Path) -> None:
    """mkdocs build --strict succeeds (every link and anchor resolves), into a directory outside the repository."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner about its successor, printed every build
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert not (ROOT / "site").exists()
