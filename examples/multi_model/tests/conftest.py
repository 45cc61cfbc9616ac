"""Test this plugin alone, and start real multi-model servers on free ports with a deadline."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import multi_model
import pytest

from inference_server import testing

#: Seconds a server may take to answer /ping.
READY_DEADLINE = 30.0
#: Two models of the family: name -> (coefficients, intercept).
MODELS = {"fraud": ([0.5, -1.0, 2.0], 0.25), "churn": ([1.0, 1.0, 1.0], -3.0)}


@pytest.fixture(autouse=True)
def _only_this_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No SageMaker or inference-server variables but this package's entry point, and no model loaded before."""
    for name in list(os.environ):
        if name.startswith(("SAGEMAKER_", "INFERENCE_SERVER_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "multi_model")
    testing.reset()
    yield
    testing.reset()


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    """A directory holding one directory per model of :data:`MODELS`, as SageMaker lays them out."""
    root = tmp_path / "models"
    for name, (coef, intercept) in MODELS.items():
        multi_model.save(root / name, coef, intercept)
    return root


class Reply:
    """A status, a content type and a body."""

    def __init__(self, status: int, content_type: str, body: bytes) -> None:
        self.status, self.content_type, self.body = status, content_type, body

    def json(self) -> Any:
        return json.loads(self.body)


class Server:
    """``inference-server serve`` in a subprocess on a free port of 127.0.0.1, its output in a log file."""

    def __init__(self, args: list[str], log: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.log = log
        command = [sys.executable, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        with log.open("wb") as out:
            self.process = subprocess.Popen([*command, *args], stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self) -> Server:
        """Wait until ``/ping`` answers 200, or fail with the server's log."""
        end = time.monotonic() + READY_DEADLINE
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.output()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if self.request("GET", "/ping", timeout=2).status == 200:
                    return self
            time.sleep(0.05)
        raise AssertionError(f"server not ready after {READY_DEADLINE} s:\n{self.output()}")

    def request(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Reply:
        """Send one request on a connection of its own (``body`` as JSON unless None)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {} if body is None else {"Content-Type": "application/json"}
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            return Reply(response.status, response.getheader("Content-Type", ""), response.read())
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
