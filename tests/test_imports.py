"""Dependencies point one way: each module, imported alone in a fresh interpreter, loads only what it may."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest

import inference_server

OURS = "inference_server"
SERVERS = ("gunicorn", "granian")
WSGI = f"{OURS}.wsgi"
PROTOCOLS = (f"{WSGI}.sagemaker", f"{WSGI}.runtime", f"{WSGI}.prometheus", f"{WSGI}.models")
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
    f"{OURS}._pipeline": (WSGI, f"{OURS}.server", f"{OURS}.cli", *SERVERS),
    WSGI: (f"{OURS}.server", f"{OURS}.cli", *SERVERS),
    # protocol modules import the lifecycle, never each other (nor the app that lists them)
    **{protocol: (f"{WSGI}._app", *(other for other in PROTOCOLS if other != protocol)) for protocol in PROTOCOLS},
    f"{WSGI}._invoke": (f"{WSGI}._app", *PROTOCOLS),
    f"{OURS}.transform": (WSGI, f"{OURS}.server", f"{OURS}.cli", *SERVERS),
    f"{OURS}.testing": (f"{OURS}.server", f"{OURS}.cli", *SERVERS),
    f"{OURS}.server": (f"{OURS}.cli",),
    # the frameworks a container's defaults use are imported when a model needs them, never with our modules
    OURS: ("torch", "transformers", "xgboost", "PIL"),
    # the Prometheus client chooses its multiprocess mode when imported: after serve names the run directory
    f"{OURS}.cli": ("prometheus_client", "opentelemetry"),
    f"{OURS}.wsgi._app": ("prometheus_client", "opentelemetry"),
    f"{OURS}.metrics": ("prometheus_client",),
    # a worker's models know nothing of HTTP
    f"{OURS}._multimodel": (WSGI, f"{OURS}.server", f"{OURS}.cli", *SERVERS),
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
    f"{OURS}._registry",
)

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
        assert {name for name in loaded if name.startswith(OURS)} - root <= {module}


def test_the_rules_name_real_modules() -> None:
    """Every forbidden name of ours is a module that exists (or a room to come), so no rule is mistyped."""
    rooms_to_come = {f"{OURS}.transform"}
    named = {name for names in FORBIDDEN.values() for name in names if name.startswith(OURS)} | set(FORBIDDEN)
    assert named - rooms_to_come <= set(MODULES)


def test_client_loads_fewer_of_our_modules_than_it_did() -> None:
    """``import inference_server.client`` loads only the client, the codecs, errors and settings (16, was 21)."""
    ours = sorted(name for name in _loaded(f"{OURS}.client") if name.startswith(OURS))
    assert [name for name in ours if not _within(name, (f"{OURS}.client", f"{OURS}.codecs"))] == [
        OURS,
        f"{OURS}._settings",
        f"{OURS}.errors",
    ]
