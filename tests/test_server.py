"""The same end-to-end suite on every HTTP server backend: ping, invocations, errors, chunked and 100 MB bodies,
``Expect: 100-continue``, SIGTERM."""

from __future__ import annotations

import contextlib
import io
import signal
import socket
import time
from typing import Any

import numpy as np
import pytest

from inference_server import codecs
from tests.conftest import GRANIAN_INTERFACE

NPY = "application/x-npy"
FAILING = """
    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        if bytes(data[:4]) == b"boom":
            raise RuntimeError("exploded")
        return data
"""


@pytest.fixture(params=["granian", "gunicorn"])
def backend(request: pytest.FixtureRequest, servers: Any, plugin_site: Any) -> Any:
    """A server on each backend, with a model that echoes and fails on ``boom``; bodies up to 256 MB."""
    plugin_site.add("failing", FAILING)
    server = servers.start("--server", request.param, env={"SAGEMAKER_MAX_PAYLOAD_IN_MB": "256"})
    server.backend = request.param
    return server


def test_backend_is_the_one_asked_for(backend: Any) -> None:
    """The server answering is the backend named by --server."""
    assert backend.request("GET", "/ping").headers["Server"].lower().startswith(backend.backend)


def test_ping_and_head(backend: Any) -> None:
    """/ping answers 200 with an empty body, to GET and HEAD."""
    assert (backend.request("GET", "/ping").status, backend.request("GET", "/ping").body) == (200, b"")
    assert backend.request("HEAD", "/ping").status == 200


def test_invocations_npy_echo(backend: Any) -> None:
    """An npy array comes back equal."""
    array = np.arange(1000, dtype=np.float64).reshape(10, 100)
    reply = backend.request("POST", "/invocations", codecs.dumps(array, NPY), {"Content-Type": NPY})
    assert reply.headers["Content-Type"] == NPY
    assert np.array_equal(np.load(io.BytesIO(reply.body)), array)


def test_errors_keep_the_server_serving(backend: Any) -> None:
    """A 500 from the model and a 404 leave the server answering."""
    assert backend.request("POST", "/invocations", b"boom").status == 500
    assert backend.request("GET", "/missing").status == 404
    assert backend.request("POST", "/invocations", b"calm").body == b"calm"


def test_chunked_upload(backend: Any) -> None:
    """A chunked 5 MB upload is read whole on gunicorn (and on granian's ASGI front, which verifies it); granian's
    WSGI and RSGI interfaces, which cannot tell the app whether a chunked body arrived whole, refuse it while bodies
    have a limit (411, saying what to do instead)."""
    parts = [bytes([i]) * (1 << 20) for i in range(5)]
    with contextlib.closing(backend.connection()) as connection:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # granian answers before the body is sent
            connection.request("POST", "/invocations", body=iter(parts), encode_chunked=True)
        response = connection.getresponse()
        if backend.backend == "granian" and GRANIAN_INTERFACE != "asgi":
            assert response.status == 411
            assert "send it with a Content-Length, or serve with --server gunicorn" in response.read().decode()
        else:
            assert response.status == 200
            assert response.read() == b"".join(parts)


@pytest.mark.parametrize("name", ["granian", "gunicorn"])
def test_chunked_upload_without_a_limit(servers: Any, plugin_site: Any, name: str) -> None:
    """With MaxPayloadInMB 0 (SageMaker's chunked Batch Transform mode) a chunked 5 MB upload is read whole on both
    backends."""
    plugin_site.add("failing", FAILING)
    server = servers.start("--server", name, env={"SAGEMAKER_MAX_PAYLOAD_IN_MB": "0"})
    parts = [bytes([i + 1]) * (1 << 20) for i in range(5)]
    with contextlib.closing(server.connection()) as connection:
        connection.request("POST", "/invocations", body=iter(parts), encode_chunked=True)
        response = connection.getresponse()
        assert response.status == 200
        assert response.read() == b"".join(parts)


def test_100_mb_echo(backend: Any) -> None:
    """A 100 MB float32 npy body is echoed intact."""
    array = np.random.default_rng(0).random(25_000_000, dtype=np.float32)
    reply = backend.request("POST", "/invocations", codecs.dumps(array, NPY), {"Content-Type": NPY}, timeout=120)
    assert reply.status == 200
    assert np.array_equal(np.load(io.BytesIO(reply.body)), array)


def test_expect_100_continue_is_answered(backend: Any) -> None:
    """A client sending ``Expect: 100-continue`` gets the interim 100 before it sends the body (else recv times out)."""
    with socket.create_connection(("127.0.0.1", backend.port), timeout=2) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        interim = sock.recv(1024)
        assert interim.startswith(b"HTTP/1.1 100")
        sock.sendall(b"hello")
        answer = b""
        while b"hello" not in answer:
            chunk = sock.recv(65536)
            assert chunk
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")


def test_sigterm_exits_zero(backend: Any) -> None:
    """SIGTERM stops the server and its workers with status 0 within a few seconds."""
    started = time.monotonic()
    assert backend.stop(signal.SIGTERM) == 0
    assert time.monotonic() - started < 10
