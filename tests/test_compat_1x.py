"""Plugins and tests written for inference-server 1.x: 1.3.3's own test suite, and ``--default-hooks passthrough``
answering byte for byte as 1.3.3 does (1.3.3 from PyPI, in a virtualenv of its own, made once per test run)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServerFactory, downloaded, make_venv

LEGACY = "inference-server==1.3.3"


@pytest.fixture(scope="session")
def legacy_tests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1.3.3's test suite, from its sdist on PyPI (downloaded on first use, never stored in this repository)."""
    where = tmp_path_factory.mktemp("sdist")
    (sdist,) = downloaded(LEGACY, sdists=True).glob("inference_server-1.3.3.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(where, filter="data")
    tests = where / "inference_server-1.3.3" / "tests"
    assert (tests / "test_inference_server.py").is_file()
    return tests


@pytest.fixture(scope="session")
def legacy_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a virtualenv with inference-server 1.3.3 installed from PyPI."""
    # 1.3.3's testing module imports pytest
    return make_venv(LEGACY, "pytest")


def test_the_1x_test_suite_passes(legacy_tests: Path, tmp_path: Path) -> None:
    """inference-server 1.3.3's own 21 tests pass against this package, with no errors (its fixtures call
    inference_server._model.cache_clear() and register and unregister plugins in testing.plugin_manager())."""
    env = {"INFERENCE_SERVER_PLUGINS": "", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(legacy_tests), "."],
        cwd=legacy_tests,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert "21 passed" in done.stdout, done.stdout[-2000:]
    assert "error" not in done.stdout.splitlines()[-1].lower()


#: A plugin as written for 1.x: only model_fn and predict_fn, parsing the bytes it is given itself.
PLUGIN_1X = """
    import inference_server


    @inference_server.plugin_hook()
    def model_fn(model_dir):
        return lambda data: data


    @inference_server.plugin_hook()
    def predict_fn(data, model):
        assert isinstance(data, bytes), type(data)
        if data.startswith(b"{"):
            return data.upper()
        return b";".join(reversed(data.split(b",")))
"""

#: (body, Content-Type, Accept): JSON, CSV, binary, and a body no codec knows.
BODIES: list[tuple[bytes, str, str]] = [
    (b'{"location": "Fair Isle", "n": [1, 2.50]}', "application/json", "application/json"),
    (b"1,2,3", "text/csv", "text/csv"),
    (b"1,2,3", "text/csv", "*/*"),
    (bytes(range(256)), "application/octet-stream", "application/octet-stream"),
    (b"\x93NUMPY\x01\x00", "application/x-npy", "application/x-npy"),
    (b"text", "application/x-unknown", "*/*"),
]


def _legacy_answers(python: Path, plugin: str | None) -> list[dict[str, Any]]:
    """Each body of BODIES answered by 1.3.3's app (its testing helper), with ``plugin`` registered if given."""
    script = textwrap.dedent(
        """
        import json, sys, types
        import inference_server, inference_server.testing

        plugin = sys.argv[1]
        if plugin:
            module = types.ModuleType("legacy_plugin")
            exec(compile(plugin, "legacy_plugin", "exec"), module.__dict__)
            inference_server.testing.plugin_manager().register(module)
        answers = []
        for body, content_type, accept in json.loads(sys.stdin.read()):
            response = inference_server.testing.post_invocations(
                data=bytes.fromhex(body), headers={"Content-Type": content_type, "Accept": accept}
            )
            answers.append(
                {"status": response.status_code, "type": response.headers["Content-Type"], "body": response.data.hex()}
            )
        print(json.dumps(answers))
        """
    )
    bodies = json.dumps([[body.hex(), content_type, accept] for body, content_type, accept in BODIES])
    done = subprocess.run(
        [str(python), "-c", script, textwrap.dedent(plugin or "")],
        input=bodies,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("with_plugin", [False, True], ids=["built-in hooks", "1.x plugin"])
def test_passthrough_answers_as_1x_byte_for_byte(
    with_plugin: bool, legacy_python: Path, servers: ServerFactory
) -> None:
    """--default-hooks passthrough: the same status, Content-Type and body as 1.3.3 for JSON, CSV and binary bodies,
    with the built-in hooks alone and with a plugin written for 1.x (model_fn and predict_fn only)."""
    if with_plugin:
        servers.plugin_site.add("legacy_plugin", PLUGIN_1X)
    server = servers.start("--default-hooks", "passthrough")
    expected = _legacy_answers(legacy_python, PLUGIN_1X if with_plugin else None)
    for (body, content_type, accept), legacy in zip(BODIES, expected, strict=True):
        reply = server.request("POST", "/invocations", body, {"Content-Type": content_type, "Accept": accept})
        ours = {"status": reply.status, "type": reply.headers["Content-Type"], "body": reply.body.hex()}
        assert ours == legacy, (body, content_type)
    assert "default hooks: passthrough" in server.output()


def test_the_codecs_default_is_said_at_start_up(servers: ServerFactory) -> None:
    """Without --default-hooks the start-up summary says the codecs are active and how to get 1.x's defaults."""
    server = servers.start()
    assert "default hooks: codecs" in server.output()
    assert "--default-hooks passthrough" in server.output()
    reply = server.request("POST", "/invocations", b"1,2,3", {"Content-Type": "text/csv", "Accept": "text/csv"})
    assert reply.body == b"1.0,2.0,3.0\n"


@pytest.mark.parametrize(
    ("requirement", "warned"),
    [("inference-server<2", True), ("inference-server~=1.3", True), ("inference-server>=1.2", False)],
)
def test_a_plugin_requiring_1x_is_warned_about(requirement: str, warned: bool, servers: ServerFactory) -> None:
    """A plugin whose distribution requires inference-server 1.x gets a start-up warning naming the option,
    unless the default hooks were chosen explicitly."""
    servers.plugin_site.add("legacy_plugin", PLUGIN_1X, requires=[requirement])
    server = servers.start()
    assert ("plugin 'legacy_plugin' requires inference-server 1.x" in server.output()) is warned
    chosen = servers.start(env={"INFERENCE_SERVER_DEFAULT_HOOKS": "codecs"})
    assert "requires inference-server 1.x" not in chosen.output()
