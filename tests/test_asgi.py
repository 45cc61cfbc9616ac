"""``inference_server.asgi`` under a real uvicorn: the seed's forecast plugin answers every protocol's request set
with the same bytes as ``serve``; the model is loaded at the lifespan's startup (or with the first request when
the server sends no lifespan events); a plugin that cannot load fails the startup with the reason; async hooks run
on uvicorn's loop; a body cut short is a 400 and the server keeps serving; SIGTERM ends it cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import PluginSite, Server, free_port, wait_until

REQUEST = b'{"location": "Fair Isle"}'
FORECAST = {
    "wind": "Southwesterly gale force 8 continuing",
    "sea_state": "Rough or very rough, occasionally moderate in southeast.",
    "weather": "Thundery showers.",
    "visibility": "Good, occasionally poor.",
}
JSON = {"Content-Type": "application/json"}
_INFER = {"inputs": [{"name": "location", "datatype": "FP64", "shape": [2], "data": [59.53, -1.63]}]}
#: Requests on every protocol: SageMaker's routes (good, malformed, unsupported types), the Runtime route, the Open
#: Inference Protocol's REST routes, the multi-model API's absence, a route that does not exist.
REQUESTS: list[tuple[str, str, bytes | None, dict[str, str]]] = [
    ("GET", "/ping", None, {}),
    ("POST", "/invocations", REQUEST, {**JSON, "Accept": "application/json"}),
    ("POST", "/invocations", b'{"location": ', JSON),
    ("POST", "/invocations", REQUEST, {"Content-Type": "text/x-unknown"}),
    ("POST", "/invocations", REQUEST, {**JSON, "Accept": "image/png"}),
    ("GET", "/execution-parameters", None, {}),
    ("POST", "/endpoints/forecast/invocations", REQUEST, JSON),
    ("GET", "/v2", None, {}),
    ("GET", "/v2/health/ready", None, {}),
    ("GET", "/v2/models/forecast", None, {}),
    ("GET", "/v2/models/forecast/ready", None, {}),
    ("POST", "/v2/models/forecast/infer", orjson.dumps(_INFER), JSON),
    ("POST", "/v2/models/other/infer", b"{}", JSON),
    ("GET", "/models", None, {}),
    ("GET", "/nowhere", None, {}),
]
#: The answer's headers compared: ours (each server adds its own date and server; Serve's proxy its request id, and
#: its UUIDs make error bodies longer).
COMPARED = ("content-type", "x-amzn-errortype", "allow")


def forecast_environment(**more: str) -> dict[str, str]:
    """This process's environment without our variables, serving the forecast plugin as ``forecast``."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SAGEMAKER_", "INFERENCE_SERVER_", "PROMETHEUS_", "RAY_"))
    }
    return {
        **environment,
        "INFERENCE_SERVER_LOG_FORMAT": "text",
        "INFERENCE_SERVER_PLUGINS": "shipping_forecast",
        "INFERENCE_SERVER_MODEL_NAME": "forecast",
        **more,
    }


def _without_request_id(answer: Any) -> bytes:
    request_id = answer.headers.get("x-request-id")
    return answer.body.replace(request_id.encode(), b"<id>") if request_id else answer.body


def assert_same_answers(reference: Server, server: Server) -> None:
    """Each of :data:`REQUESTS` gets from ``server`` the status, our headers and the body (request ids aside) that
    ``reference`` gives."""
    for method, path, body, headers in REQUESTS:
        ours, theirs = reference.request(method, path, body, headers), server.request(method, path, body, headers)
        assert theirs.status == ours.status, (method, path, theirs.body)
        for name in COMPARED:
            assert theirs.headers.get(name) == ours.headers.get(name), (method, path, name)
        assert _without_request_id(theirs) == _without_request_id(ours), (method, path)


class Uvicorn(Server):
    """``uvicorn --factory inference_server.asgi:create_app`` on a free port of 127.0.0.1."""

    def __init__(self, env: dict[str, str], log: Path, *options: str) -> None:
        self.log, self.port = log, free_port()
        command = [sys.executable, "-m", "uvicorn", "--factory", "inference_server.asgi:create_app"]
        command += ["--host", "127.0.0.1", "--port", str(self.port), *options]
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, forecast_model_dir: Path) -> Iterator[Server]:
    """The forecast plugin on ``serve`` (granian), the reference."""
    log = tmp_path_factory.mktemp("local") / "serve.log"
    server = Server(["--model-dir", str(forecast_model_dir)], forecast_environment(), log)
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture
def uvicorn(tmp_path: Path, forecast_model_dir: Path) -> Iterator[Any]:
    """Start uvicorn servers of the app (settings and more options given); each is stopped at the test's end."""
    started: list[Uvicorn] = []

    def start(*options: str, **env: str) -> Uvicorn:
        server = Uvicorn(
            forecast_environment(INFERENCE_SERVER_MODEL_DIR=str(forecast_model_dir), **env),
            tmp_path / f"uvicorn-{len(started)}.log",
            *options,
        )
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


def test_the_app_under_uvicorn_answers_as_serve_does(uvicorn: Any, local: Server) -> None:
    """Every protocol's request set gets the same status, headers of ours and body from uvicorn as from serve, and
    the model was loaded at the lifespan's startup."""
    server = uvicorn().wait_ready()
    assert "Loaded the model" in server.output().split("Application startup complete")[0]
    assert_same_answers(local, server)
    assert orjson.loads(server.request("POST", "/invocations", REQUEST, JSON).body) == FORECAST


def test_without_lifespan_the_model_loads_with_the_first_request(uvicorn: Any) -> None:
    """With uvicorn's --lifespan off, the first request builds the app and loads the model, then is answered."""
    server = uvicorn("--lifespan", "off").wait_ready()
    answer = server.request("POST", "/invocations", REQUEST, JSON)
    assert (answer.status, orjson.loads(answer.body)) == (200, FORECAST)
    assert server.output().count("Loaded the model") == 1


def test_a_plugin_that_cannot_load_fails_the_startup_with_the_reason(uvicorn: Any) -> None:
    """A plugin named but not installed: uvicorn's startup fails with our message and it exits non-zero."""
    server = uvicorn(INFERENCE_SERVER_PLUGINS="no_such_plugin")
    assert server.process.wait(60) != 0
    assert "inference-server: " in server.output()
    assert "no_such_plugin" in server.output()


BROKEN = """
    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        raise OSError("the weights are missing")
"""


def test_a_model_that_cannot_load_fails_the_startup_with_the_reason(uvicorn: Any, plugin_site: PluginSite) -> None:
    """A model_fn that raises: the lifespan's startup fails saying so (a replica on Ray Serve is then replaced, never
    left answering /ping 503), and uvicorn exits non-zero."""
    plugin_site.add("broken_model", BROKEN)
    server = uvicorn(INFERENCE_SERVER_PLUGINS="broken_model", PYTHONPATH=str(plugin_site.path))
    assert server.process.wait(60) != 0
    assert "the weights are missing" in server.output()
    assert "Application startup failed" in server.output()


ASYNC = """
    import asyncio
    import threading

    import inference_server

    @inference_server.plugin_hook
    async def predict_fn(data, model):
        await asyncio.sleep(0.01)
        return {"thread": threading.current_thread().name, "data": data}
"""


def test_async_hooks_run_on_the_servers_loop(uvicorn: Any, plugin_site: PluginSite) -> None:
    """An async def predict_fn runs on uvicorn's event loop (its main thread), not on a thread of ours."""
    plugin_site.add("async_echo", ASYNC)
    server = uvicorn(INFERENCE_SERVER_PLUGINS="async_echo", PYTHONPATH=str(plugin_site.path)).wait_ready()
    answer = server.request("POST", "/invocations", b"[1, 2]", JSON)
    assert (answer.status, orjson.loads(answer.body)) == (200, {"thread": "MainThread", "data": [1, 2]})


def test_a_body_cut_short_is_a_400_and_the_server_keeps_serving(uvicorn: Any) -> None:
    """A chunked body whose connection ends before its last chunk is answered 400 (its access line says so); the
    next request is answered."""
    server = uvicorn().wait_ready()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        connection.sendall(head + b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"loc\r\n')
        connection.shutdown(socket.SHUT_WR)
        connection.recv(1024)  # (the connection has ended: what the app answers goes nowhere)
    wait_until(lambda: '"POST /invocations" 400' in server.output(), 10, "the cut body was not answered 400")
    answer = server.request("POST", "/invocations", REQUEST, JSON)
    assert (answer.status, orjson.loads(answer.body)) == (200, FORECAST)


def test_sigterm_ends_uvicorn_cleanly(uvicorn: Any) -> None:
    """SIGTERM: uvicorn runs the lifespan's shutdown (the app closes), then ends by the signal, as it does for any
    app (uvicorn raises the signal it caught again once it has shut down)."""
    server = uvicorn().wait_ready()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(30) == -signal.SIGTERM
    assert "Application shutdown complete" in server.output()
