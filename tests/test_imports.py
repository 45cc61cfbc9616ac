"""Dependencies point one way: each module, imported alone in a fresh interpreter, loads only what it may."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import inference_server

OURS = "inference_server"
SERVERS = ("gunicorn", "granian")
WSGI = f"{OURS}.wsgi"
PROTOCOLS = (f"{WSGI}.sagemaker", f"{WSGI}.runtime", f"{WSGI}.prometheus", f"{WSGI}.models")
#: Batch Transform's engines: each runs the job's files its own way, with what lies below them.
ENGINES = tuple(f"{OURS}.transform.{engine}" for engine in ("local", "dask", "ray"))
#: Module prefix -> modules (and their submodules) that no module under the prefix may load.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    f"{OURS}.codecs": (
        f"{OURS}.client",
        f"{OURS}._pipeline",
        WSGI,
        f"{OURS}.server",
        f"{OURS}._plugins",
        f"{OURS}._hookspecs",
        f"{OURS}.default_plugin",
        "pluggy",
        "werkzeug",
        *SERVERS,
    ),
    f"{OURS}.client": (
        f"{OURS}._pipeline",
        WSGI,
        f"{OURS}.server",
        f"{OURS}._plugins",
        f"{OURS}._hookspecs",
        f"{OURS}.default_plugin",
        "pluggy",
        "werkzeug",
        *SERVERS,
    ),
    # the hooks' pipeline is told what to record by its maker (stage and timed callbacks): no metrics, no tracing
    f"{OURS}._pipeline": (WSGI, f"{OURS}.server", f"{OURS}.cli", f"{OURS}.metrics", f"{OURS}._tracing", *SERVERS),
    WSGI: (f"{OURS}.server", f"{OURS}.cli", *SERVERS),
    # protocol modules import the lifecycle, never each other (nor the app that lists them)
    **{protocol: (f"{WSGI}._app", *(other for other in PROTOCOLS if other != protocol)) for protocol in PROTOCOLS},
    f"{WSGI}._invoke": (f"{WSGI}._app", *PROTOCOLS),
    # the lifecycle on the loop, and gunicorn's thread waiting for it, know no protocol and no app
    **{module: (f"{WSGI}._app", *PROTOCOLS) for module in (f"{WSGI}._async", f"{WSGI}._onloop")},
    f"{OURS}.transform": (WSGI, f"{OURS}.server", f"{OURS}.cli", *SERVERS),
    # what every engine runs a file with lies below the engines and below the planning of tasks they share
    f"{OURS}.transform.job": (*ENGINES, f"{OURS}.transform.tasks"),
    f"{OURS}.testing": (f"{OURS}.server", f"{OURS}.cli", *SERVERS),
    f"{OURS}.server": (f"{OURS}.cli",),
    # the frameworks a container's defaults use are imported when a model needs them, never with our modules
    OURS: ("torch", "transformers", "xgboost", "PIL"),
    # the Prometheus client chooses its multiprocess mode when imported: after serve names the run directory
    f"{OURS}.cli": ("prometheus_client", "opentelemetry"),
    f"{OURS}.wsgi._app": ("prometheus_client", "opentelemetry"),
    f"{OURS}.metrics": ("prometheus_client",),
    # the batcher is handed its recorder: it counts groups without importing what records them
    f"{OURS}.batching": (f"{OURS}.metrics", f"{OURS}._tracing"),
    # a worker's models know nothing of HTTP, nor of the hooks' pipeline (the app hands one over)
    f"{OURS}._multimodel": (WSGI, f"{OURS}.server", f"{OURS}.cli", f"{OURS}._pipeline", *SERVERS),
}
#: Module -> modules it never imports, not even inside a function (where ``sys.modules`` cannot see it).
NEVER: dict[str, tuple[str, ...]] = {
    f"{OURS}.transform.job": (*ENGINES, f"{OURS}.transform.tasks"),
    f"{OURS}.transform.tasks": ENGINES,
    f"{OURS}._pipeline": (f"{OURS}.metrics", f"{OURS}._tracing"),
    # a protocol sees the app through its narrow interface (wsgi._service.Service), not even to name its type
    **{protocol: (f"{WSGI}._app",) for protocol in (*PROTOCOLS, f"{WSGI}.v2")},
}
#: The chosen backend alone is imported: importing one never loads the other, and the package loads neither.
EXACT: dict[str, tuple[str, ...]] = {
    f"{OURS}.server": SERVERS,
    f"{OURS}.server.gunicorn": ("granian",),
    f"{OURS}.server.granian": ("gunicorn",),
}
#: Leaves: these load none of our modules beyond what ``import inference_server`` itself loads.
LEAVES = (
    f"{OURS}._hookspecs",
    f"{OURS}.errors",
    f"{OURS}._settings",
    f"{OURS}._rundir",
    f"{OURS}.metrics",
    f"{OURS}._logging",
    f"{OURS}._tracing",
    f"{OURS}._registry",  # (and the leaf it names costs with: LEAF_DEPENDS)
    f"{OURS}._memory",
    f"{OURS}._version",
    f"{OURS}._mapped",  # (what a model_fn calls: numpy and the standard library)
)
#: The leaves a leaf may load.
LEAF_DEPENDS = {f"{OURS}._registry": (f"{OURS}._memory",)}

MODULES = sorted([OURS] + [info.name for info in pkgutil.walk_packages(inference_server.__path__, f"{OURS}.")])


def _loaded(module: str) -> set[str]:
    """The modules in ``sys.modules`` after importing ``module`` alone."""
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(result.stdout))


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


@pytest.mark.parametrize("module", [m for m in MODULES if m != f"{OURS}.__main__"])
def test_module_loads_nothing_it_must_not(module: str) -> None:
    """A module never pulls in what lies above it (client and codecs: no pipeline, app, server or pluggy)."""
    forbidden = [f for prefix, names in FORBIDDEN.items() if _within(module, (prefix,)) for f in names]
    forbidden += EXACT.get(module, ())
    loaded = _loaded(module)
    assert not [name for name in loaded if _within(name, tuple(forbidden))]
    if module in LEAVES:
        root = _loaded(OURS)
        assert {name for name in loaded if name.startswith(OURS)} - root <= {module, *LEAF_DEPENDS.get(module, ())}


def test_the_rules_name_real_modules() -> None:
    """Every module of ours a rule names (forbidden, never imported, a leaf) exists, so no rule is mistyped."""
    named = {name for names in FORBIDDEN.values() for name in names if name.startswith(OURS)} | set(FORBIDDEN)
    named |= {name for names in NEVER.values() for name in names} | set(NEVER) | set(LEAVES)
    named |= {name for names in LEAF_DEPENDS.values() for name in names} | set(LEAF_DEPENDS)
    assert named <= set(MODULES)


def _source(module: str) -> ast.Module:
    path = Path(inference_server.__file__).parent.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return ast.parse(path.read_text(), str(path))


def _imported_anywhere(module: str) -> set[str]:
    """The modules ``module``'s source imports anywhere (inside functions too), each with its parent packages."""
    names: set[str] = set()
    for node in ast.walk(_source(module)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


#: The import cycles allowed, each closed by a package's face choosing a module below it only when called: the
#: ``transform()`` function runs the local engine, ``serve`` the chosen backend or engine (which import the package's
#: names).
DEFERRED_CHOICES = {
    (f"{OURS}.transform", f"{OURS}.transform.local"),
    (f"{OURS}.server", f"{OURS}.server.granian"),
    (f"{OURS}.server", f"{OURS}.server.gunicorn"),
    (f"{OURS}.server", f"{OURS}.ray_serve"),
}


def _runtime_imports(module: str) -> set[str]:
    """The modules of ours that ``module``'s source imports anywhere outside ``if TYPE_CHECKING:`` blocks."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module is not None:
                for alias in child.names:
                    submodule = f"{child.module}.{alias.name}"
                    found.add(submodule if submodule in MODULES else child.module)
            visit(child)

    visit(_source(module))
    return {name for name in found if name in MODULES and name != module}


def test_no_import_cycle_but_a_packages_deferred_choice() -> None:
    """No chain of imports of ours (function-level ones included) leads back to where it started, except through a
    package's face choosing an engine or a backend when called: a cycle hidden in a function is a layering fault."""
    graph = {module: _runtime_imports(module) for module in MODULES if module != f"{OURS}.__main__"}
    for edge in DEFERRED_CHOICES:
        assert edge[1] in graph[edge[0]], f"{edge} is no longer imported: drop it from DEFERRED_CHOICES"
        graph[edge[0]].discard(edge[1])
    cycles = []
    for start in graph:  # a depth-first search from each module, for a path back to it
        stack, seen = [(start, (start,))], set()
        while stack:
            module, path = stack.pop()
            for imported in graph.get(module, ()):
                if imported == start:
                    cycles.append(" -> ".join((*path, start)))
                elif imported not in seen:
                    seen.add(imported)
                    stack.append((imported, (*path, imported)))
    assert cycles == []


@pytest.mark.parametrize("module", sorted(NEVER))
def test_module_never_imports_what_lies_above_it_even_inside_a_function(module: str) -> None:
    """transform.tasks (the engines' shared planning) never imports an engine, and transform.job (what every engine
    runs a file with) neither an engine nor the planning: a function-level import would hide a cycle; the pipeline
    neither metrics nor tracing; a protocol module not the app, even for its type."""
    assert not [name for name in _imported_anywhere(module) if _within(name, NEVER[module])]


def test_the_package_loads_only_its_settings_and_version() -> None:
    """``import inference_server`` loads, of ours, only the package, its settings (BatchStrategy, with the errors
    they raise) and its version: the other public names (create_app, warmup, plugin_hook, MIMEAccept) stay lazy."""
    ours = {name for name in _loaded(OURS) if _within(name, (OURS,))}
    assert ours == {OURS, f"{OURS}._settings", f"{OURS}.errors", f"{OURS}._version"}


def test_no_module_takes_the_version_from_the_package() -> None:
    """Modules that name the version (the CLI, v2's server metadata, the tracer's scope) read it from the leaf
    ``_version``, never from the package's face, whose lazy names lead back up to the app."""
    takers = []
    for module in MODULES:
        if module == OURS:
            continue
        for node in ast.walk(_source(module)):
            from_root = isinstance(node, ast.ImportFrom) and node.module == OURS
            if from_root and any(alias.name == "__version__" for alias in node.names):
                takers.append(module)
            if isinstance(node, ast.Attribute) and node.attr == "__version__" and ast.unparse(node.value) == OURS:
                takers.append(module)
    assert takers == []


def test_client_loads_fewer_of_our_modules_than_it_did() -> None:
    """``import inference_server.client`` loads only the client, the codecs, errors, settings and the version."""
    ours = sorted(name for name in _loaded(f"{OURS}.client") if name.startswith(OURS))
    assert [name for name in ours if not _within(name, (f"{OURS}.client", f"{OURS}.codecs"))] == [
        OURS,
        f"{OURS}._settings",
        f"{OURS}._version",
        f"{OURS}.errors",
    ]
