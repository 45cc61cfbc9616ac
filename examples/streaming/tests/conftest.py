"""Test this plugin alone, and start real servers on free ports with a deadline; boto3 pointed at them."""

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

import boto3
import pytest

from inference_server import testing

#: Seconds a server may take to answer /ping.
READY_DEADLINE = 30.0
#: Seconds within which a line the model logs is in the server's log (it writes them a few milliseconds later).
LOG_DEADLINE = 10.0


@pytest.fixture(autouse=True)
def _only_this_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No SageMaker or inference-server variables but this package's entry point, and no model loaded before."""
    for name in list(os.environ):
        if name.startswith(("SAGEMAKER_", "INFERENCE_SERVER_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "token_stream")
    testing.reset()
    yield
    testing.reset()


class Server:
    """``inference-server serve`` with one worker in a subprocess on a free port of 127.0.0.1, its output in a log
    file, the model directory empty (the model is the built-in text's)."""

    def __init__(self, args: list[str], log: Path, model_dir: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.log = log
        command = [sys.executable, "-m", "inference_server", "serve", "--workers", "1", "--model-dir", str(model_dir)]
        command += ["--host", "127.0.0.1", "--port", str(self.port), *args]
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self) -> Server:
        """Wait until ``/ping`` answers 200, or fail with the server's log."""
        end = time.monotonic() + READY_DEADLINE
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.output()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                try:
                    connection.request("GET", "/ping")
                    if connection.getresponse().status == 200:
                        return self
                finally:
                    connection.close()
            time.sleep(0.05)
        raise AssertionError(f"server not ready after {READY_DEADLINE} s:\n{self.output()}")

    @contextlib.contextmanager
    def generate(self, request: dict[str, Any], accept: str | None = None) -> Iterator[http.client.HTTPResponse]:
        """POST ``request`` as JSON to /invocations; the response, its body unread, until the block ends."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Content-Type": "application/json", **({"Accept": accept} if accept else {})}
        try:
            connection.request("POST", "/invocations", json.dumps(request).encode(), headers)
            yield connection.getresponse()
        finally:
            connection.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def logged(self, message: str) -> list[str]:
        """The messages of the log's lines that start with ``message``, waiting up to :data:`LOG_DEADLINE` for one
        (the log is JSON lines: its output is no terminal)."""
        end = time.monotonic() + LOG_DEADLINE
        while True:
            lines = [json.loads(line) for line in self.output().splitlines() if line.startswith("{")]
            found = [line["message"] for line in lines if line["message"].startswith(message)]
            if found or time.monotonic() > end:
                return found
            time.sleep(0.05)

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
    model_dir = tmp_path / "model"
    model_dir.mkdir()

    def start(*args: str) -> Server:
        server = Server(list(args), tmp_path / f"server-{len(started)}.log", model_dir)
        started.append(server)
        return server.wait_ready()

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Callable[[Server], Any]:
    """``runtime(server)``: boto3's SageMaker Runtime client talking to ``server``, with dummy credentials and no AWS
    configuration files, as a local test needs."""

    def client(server: Server) -> Any:
        environment = {
            "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": f"http://127.0.0.1:{server.port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        }
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        return boto3.client("sagemaker-runtime")

    return client
