"""``inference-server transform --endpoint URL``: a job against a real ``serve`` process, reading its
``/execution-parameters`` and retrying what a container fails, as SageMaker does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inference_server.errors import PredictionError, TransformError
from inference_server.transform.endpoint import EndpointPredictor
from tests.test_transform_local import COUNTING

#: The call-logging plugin of the local tests (it fails once on "flaky", always on "fail"), with execution
#: parameters of its own.
CONTAINER = (
    COUNTING
    + """
    @inference_server.plugin_hook
    def batch_strategy():
        return "SingleRecord"

    @inference_server.plugin_hook
    def max_payload_in_mb():
        return 1
"""
)


@pytest.fixture
def container(servers: Any, plugin_site: Any, tmp_path: Path) -> Any:
    """A real server with the container plugin, logging its model's calls."""
    plugin_site.add("container", CONTAINER)
    log = tmp_path / "calls.log"
    server = servers.start("--server", "gunicorn", env={"CALLS_LOG": str(log)})
    server.calls = lambda: [int(line) for line in log.read_text().split()] if log.exists() else []
    return server


def _transform(tmp_path: Path, container: Any, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "inference_server", "transform", str(tmp_path / "in"), str(tmp_path / "out")]
    command += ["--endpoint", f"http://127.0.0.1:{container.port}", *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})


def _inputs(tmp_path: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / name).write_bytes(data)


def test_the_containers_execution_parameters_are_the_jobs_defaults(tmp_path: Path, container: Any) -> None:
    """The container says SingleRecord and 1 MB: one request per line; an option given wins over them."""
    _inputs(tmp_path, {"a.csv": b"ab\ncd\nef\n"})
    result = _transform(tmp_path, container, "--split-type", "Line", "--assemble-with", "Line")
    assert result.returncode == 0, result.stderr
    assert container.calls() == [2, 2, 2]
    assert (tmp_path / "out" / "a.csv.out").read_bytes() == b"AB\nCD\nEF\n"
    result = _transform(tmp_path, container, "--split-type", "Line", "--batch-strategy", "MultiRecord")
    assert result.returncode == 0, result.stderr
    assert container.calls()[3:] == [9]


def test_a_500_is_retried_and_one_that_persists_fails_its_file(tmp_path: Path, container: Any) -> None:
    """A request failing once with 500 is sent again and succeeds; one that always fails is tried 1 + 3 times,
    then its file fails with the container's message while the other files complete."""
    _inputs(tmp_path, {"flaky.txt": b"flaky\n", "bad.txt": b"fail\n", "good.txt": b"good\n"})
    result = _transform(tmp_path, container, "--split-type", "Line")
    assert result.returncode == 1
    assert (tmp_path / "out" / "flaky.txt.out").read_bytes() == b"FLAKY"
    assert (tmp_path / "out" / "good.txt.out").read_bytes() == b"GOOD"
    assert not (tmp_path / "out" / "bad.txt.out").exists()
    assert "failed: bad.txt: the request of records 0 to 0 answered 500: predict_fn raised ValueError" in (
        result.stderr
    )
    assert "(4 attempts)" in result.stderr
    assert sorted(container.calls()) == [4] * 5 + [5] * 2


def test_a_client_error_is_not_retried(container: Any) -> None:
    """A 4xx (here 413: a body over the container's 1 MB) fails at once, without retries."""
    predictor = EndpointPredictor(f"http://127.0.0.1:{container.port}", retries=3)
    try:
        predictor.ready()
        with pytest.raises(PredictionError) as raised:
            predictor.predict(b"x" * (2 << 20), "application/octet-stream")
    finally:
        predictor.close()
    assert raised.value.status == 413
    assert "not retried" in raised.value.message
    assert container.calls() == []


def test_an_endpoint_that_is_not_listening_fails_the_job_at_once(tmp_path: Path, unused_port: int) -> None:
    """No server at the URL: the job stops before any file, saying it cannot connect (exit 1)."""
    with pytest.raises(TransformError, match="cannot connect"):
        EndpointPredictor(f"http://127.0.0.1:{unused_port}")


def test_a_mistyped_content_type_is_sent_once(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """``--content-type text/cvs``: the model fails on the bytes no codec decoded, the container answers 415 and the
    job sends the request once, not once per retry."""
    plugin_site.add(
        "arrays",
        """
        import os

        import inference_server

        @inference_server.plugin_hook
        def predict_fn(data, model):
            with open(os.environ["CALLS_LOG"], "a") as log:
                log.write("call\\n")
            return data.shape
        """,
    )
    log = tmp_path / "calls.log"
    server = servers.start(env={"CALLS_LOG": str(log)})
    predictor = EndpointPredictor(f"http://127.0.0.1:{server.port}", retries=3)
    try:
        predictor.ready()
        with pytest.raises(PredictionError) as raised:
            predictor.predict(b"1,2\n3,4\n", "text/cvs")
    finally:
        predictor.close()
    assert raised.value.status == 415
    assert "text/cvs matches no codec" in raised.value.message
    assert "not retried" in raised.value.message
    assert log.read_text().splitlines() == ["call"]
