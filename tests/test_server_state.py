"""The state a serving process shares with its workers: drain flag, requests in flight, readiness, recycling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from inference_server.server import _state


@pytest.fixture
def supervisor() -> Iterator[_state.Supervisor]:
    """A run directory, named in the environment as ``serve`` does it."""
    supervisor = _state.Supervisor()
    try:
        yield supervisor
    finally:
        supervisor.close()


def test_worker_counts_requests_in_flight(supervisor: _state.Supervisor) -> None:
    """The supervisor reads each worker's requests in flight; unknown or missing workers count none."""
    worker = _state.Worker.attach(lambda reason: None)
    assert worker is not None
    pid = os.getpid()
    assert supervisor.in_flight([pid, 999999999]) == 0
    worker.enter()
    worker.enter()
    assert supervisor.in_flight([pid]) == 2
    worker.leave()
    worker.leave()
    assert supervisor.in_flight([pid]) == 0


def test_drain_flag_reaches_workers(supervisor: _state.Supervisor) -> None:
    """start_drain is seen by every worker at once (shared memory, no system call)."""
    worker = _state.Worker.attach(lambda reason: None)
    assert worker is not None
    assert not worker.draining
    assert not supervisor.draining
    supervisor.start_drain()
    assert worker.draining
    assert supervisor.draining


def test_ready_marks_a_worker_that_serves(supervisor: _state.Supervisor) -> None:
    """A worker is ready once it says so."""
    worker = _state.Worker.attach(lambda reason: None)
    assert worker is not None
    assert not supervisor.ready(os.getpid())
    worker.mark_ready()
    assert supervisor.ready(os.getpid())


def test_max_requests_asks_once_for_replacement(supervisor: _state.Supervisor) -> None:
    """After max_requests (plus jitter) the worker asks to be replaced, once."""
    reasons: list[str] = []
    worker = _state.Worker.attach(reasons.append, max_requests=3, jitter=2)
    assert worker is not None
    assert 3 <= worker.max_requests <= 5
    for _ in range(10):
        worker.enter()
        worker.leave()
    assert len(reasons) == 1
    assert f"served {worker.max_requests} requests" in reasons[0]


def test_recycle_by_supervisor_leaves_a_note_and_signals(supervisor: _state.Supervisor) -> None:
    """A worker's replacement request is a note for its pid plus SIGUSR1 to the parent; read once."""
    heard: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: heard.append(signum))
    parent = os.getppid
    try:
        os.getppid = os.getpid  # type: ignore[assignment]  # this process plays the parent
        _state.recycle_by_supervisor("too old")
    finally:
        os.getppid = parent  # type: ignore[assignment]
        signal.signal(signal.SIGUSR1, previous)
    assert heard == [signal.SIGUSR1]
    assert supervisor.recycle_requests([os.getpid()]) == [os.getpid()]
    assert supervisor.recycle_requests([os.getpid()]) == []


def test_attach_outside_serve_is_none() -> None:
    """Without a run directory (the app in another server) there is no worker state."""
    assert os.environ.get(_state.RUN_DIR_ENV) is None
    assert _state.Worker.attach(lambda reason: None) is None


def test_close_removes_the_run_directory(supervisor: _state.Supervisor) -> None:
    """close() removes the directory and the variable."""
    path = supervisor.path
    supervisor.close()
    assert not path.exists()
    assert _state.RUN_DIR_ENV not in os.environ
    supervisor.close()  # again: nothing happens


def test_a_worker_whose_server_died_before_it_attached_exits(supervisor: _state.Supervisor) -> None:
    """A worker that attaches after its serving process died (kill -9 while it was starting) exits at once, instead
    of taking init for its parent and serving on as an orphan."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    code = "import time; from inference_server.server import _state; _state.Worker.attach(print); time.sleep(30)"
    env = {**os.environ, _state.SERVING_PID_ENV: str(dead.pid)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=10)
    assert done.returncode == 1
    assert f"the serving process {dead.pid} is gone" in done.stderr
