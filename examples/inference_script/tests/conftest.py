"""The script served alone (no installed plugin), on a model its own training code saved, by real servers on free
ports with a deadline."""

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

#: The script, as a model author keeps it beside the tests.
SCRIPT = Path(__file__).parent.parent / "code" / "inference.py"
#: Seconds a server may take to answer /ping (it loads scikit-learn and the model first).
READY_DEADLINE = 30.0


@pytest.fixture(autouse=True)
def _only_the_script(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No SageMaker, inference-server or AWS variables, no installed plugin, and no model loaded before."""
    for name in list(os.environ):
        if name.startswith(("SAGEMAKER_", "INFERENCE_SERVER_", "AWS_", "SM_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "")
    testing.reset()
    yield
    testing.reset()


def _train(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="session")
def script() -> Path:
    """The script's path."""
    return SCRIPT


@pytest.fixture(scope="session")
def train() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``train(*args, env=None)``: run the script as a training job runs it, ``python inference.py *args``."""
    return _train


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory with the model.joblib the script's training saved, once for the session."""
    directory = tmp_path_factory.mktemp("model")
    done = _train("--model-dir", str(directory))
    assert done.returncode == 0, done.stderr
    return directory


class Server:
    """``inference-server serve`` with one worker in a subprocess on a free port of 127.0.0.1, its output in a log
    file (one worker: ready on /ping means its model is loaded)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        command = [sys.executable, "-m", "inference_server", "serve", "--workers", "1"]
        command += ["--host", "127.0.0.1", "--port", str(self.port), *args]
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self) -> Server:
        """Wait until ``/ping`` answers 200, or fail with the server's log."""
        end = time.monotonic() + READY_DEADLINE
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.output()}")
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            with contextlib.suppress(OSError), contextlib.closing(connection):
                connection.request("GET", "/ping")
                if connection.getresponse().status == 200:
                    return self
            time.sleep(0.05)
        raise AssertionError(f"server not ready after {READY_DEADLINE} s:\n{self.output()}")

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
    """``serve(*args, env={})``: a ready server, stopped at the end of the test."""
    started: list[Server] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Server:
        server = Server(list(args), env or {}, tmp_path / f"server-{len(started)}.log")
        started.append(server)
        return server.wait_ready()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
