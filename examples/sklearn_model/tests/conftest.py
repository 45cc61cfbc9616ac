"""Test this plugin alone, on a model trained once, and start real servers on free ports with a deadline."""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from inference_server import testing

#: Seconds a server may take to answer /ping (it loads scikit-learn and the model first).
READY_DEADLINE = 30.0


@pytest.fixture(autouse=True)
def _only_this_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No SageMaker or inference-server variables but this package's entry point, and no model loaded before."""
    for name in list(os.environ):
        if name.startswith(("SAGEMAKER_", "INFERENCE_SERVER_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "sklearn_model")
    testing.reset()
    yield
    testing.reset()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory holding the example's model, trained once for the session."""
    from sklearn_model.train import train

    directory = tmp_path_factory.mktemp("model")
    train(directory)
    return directory


class Server:
    """``inference-server serve`` with one worker in a subprocess on a free port of 127.0.0.1, its output in a log
    file (one worker: ready on /ping means its model is loaded)."""

    def __init__(self, args: list[str], log: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.log = log
        command = [sys.executable, "-m", "inference_server", "serve", "--workers", "1"]
        command += ["--host", "127.0.0.1", "--port", str(self.port), *args]
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self) -> Server:
        """Wait until ``/ping`` answers 200, or fail with the server's log."""
        end = time.monotonic() + READY_DEADLINE
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.output()}")
            with contextlib.suppress(OSError):
                if self.request("GET", "/ping", timeout=2)[0] == 200:
                    return self
            time.sleep(0.05)
        raise AssertionError(f"server not ready after {READY_DEADLINE} s:\n{self.output()}")

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None, timeout=30.0
    ) -> tuple[int, str, bytes]:
        """Send one request on a connection of its own; return the status, the content type and the body."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.getheader("Content-Type", ""), response.read()
        finally:
            connection.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 15 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """``serve(*args)``: a ready server with this plugin only, stopped at the end of the test."""
    started: list[Server] = []

    def start(*args: str) -> Server:
        server = Server(list(args), tmp_path / f"server-{len(started)}.log")
        started.append(server)
        return server.wait_ready()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
