"""The example's image from container/Dockerfile, built and run with podman as SageMaker runs it: ``IMAGE serve``, the
model mounted read-only, ``SAGEMAKER_BIND_TO_PORT`` honoured, SIGTERM drained by inference-server as PID 1."""

from __future__ import annotations

import contextlib
import http.client
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import orjson
import pytest

from tests.conftest import free_port, local_aws_env

ROOT = Path(__file__).resolve().parent.parent
#: The local base image: Debian's Python from the machine's own Debian mirror, kept between runs on one machine.
BASE = "localhost/inference-server-test-base:bookworm"
IMAGE = "localhost/inference-server-test:forecast"
#: The seed example's request and answer.
REQUEST = b'{"location": "Fair Isle"}'
FORECAST = {
    "wind": "Southwesterly gale force 8 continuing",
    "sea_state": "Rough or very rough, occasionally moderate in southeast.",
    "weather": "Thundery showers.",
    "visibility": "Good, occasionally poor.",
}
#: The CA bundle pip trusts on this machine, lent to the build read-only (pip in the image must reach the index).
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
#: runc, since crun fails on this kernel's cgroup layout; limits within the machine's hard limits.
RUN = ["--runtime", "runc"]
LIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]

pytestmark = [
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (.ci/run installs it)"),
    pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed (.ci/run installs it)"),
    pytest.mark.timeout(600),
]


def podman(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``podman *args`` and return what it did; a failure shows podman's last words."""
    done = subprocess.run(["podman", *RUN, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        pytest.fail(f"podman {' '.join(args[:2])} failed ({done.returncode}): {done.stderr[-3000:]}")
    return done


@pytest.fixture(scope="module")
def base() -> str:
    """The local base image, made once per machine with mmdebstrap (about 40 s) and kept."""
    if podman("image", "exists", BASE, check=False).returncode == 0:
        return BASE
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap is not installed to make the local base image (.ci/run installs it)")
    with tempfile.TemporaryDirectory() as work:
        rootfs = Path(work) / "rootfs.tar"
        command = ["mmdebstrap", "--quiet", "--variant=minbase", "--include=python3,python3-venv,ca-certificates"]
        subprocess.run([*command, "bookworm", str(rootfs)], capture_output=True, timeout=600, check=True)
        podman("import", str(rootfs), BASE)
    return BASE


@pytest.fixture(scope="module")
def image(base: str) -> str:
    """The shipping forecast's image, built from this checkout as the Dockerfile's header says."""
    mounts = ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"] if CA_BUNDLE.exists() else []
    args = ["--build-arg", f"BASE={base}", "--build-arg", "PLUGIN=examples/shipping_forecast"]
    podman("build", "-q", "-f", "container/Dockerfile", *args, "--build-arg", "INFERENCE_SERVER=.", *mounts,
           "-t", IMAGE, str(ROOT), timeout=900)  # fmt: skip
    return IMAGE


class Container:
    """A container of the image, running as SageMaker runs it, on a free port of 127.0.0.1."""

    def __init__(self, image: str, model_dir: Path, *options: str) -> None:
        self.name = f"inference-server-test-{uuid.uuid4().hex[:12]}"
        self.port = free_port()
        self.started = time.monotonic()
        publish = ["-p", f"127.0.0.1:{self.port}:9090", "-e", "SAGEMAKER_BIND_TO_PORT=9090"]
        model = ["-v", f"{model_dir}:/opt/ml/model:ro"]
        podman("run", "-d", "--name", self.name, *LIMITS, *publish, *model, *options, image, "serve")

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request(method, path, body, headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def wait_ready(self, deadline: float = 60) -> float:
        """Wait for ``/ping`` 200; return the seconds since the container was started."""
        until = time.monotonic() + deadline
        while time.monotonic() < until:
            with contextlib.suppress(OSError, http.client.HTTPException):
                if self.request("GET", "/ping")[0] == 200:
                    return time.monotonic() - self.started
            time.sleep(0.1)
        pytest.fail(f"/ping did not answer 200 within {deadline} s: {self.logs()[-3000:]}")

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def stop(self) -> int:
        """``podman stop -t 30`` (SIGTERM, then SIGKILL 30 s later, as SageMaker does); the exit status."""
        podman("stop", "-t", "30", self.name, timeout=60)
        return int(podman("inspect", self.name, "--format", "{{.State.ExitCode}}").stdout.strip())

    def remove(self) -> None:
        podman("rm", "-f", "-t", "0", self.name, check=False)


@pytest.fixture
def containers(tmp_path: Path) -> Iterator[Any]:
    """``containers(image, *options)`` starts a container; every one is removed at the test's end."""
    started: list[Container] = []
    model_dir = tmp_path / "model"
    model_dir.mkdir()

    def start(image: str, *options: str) -> Container:
        started.append(Container(image, model_dir, *options))
        return started[-1]

    try:
        yield start
    finally:
        for container in started:
            container.remove()


def test_the_image_serves_as_sagemaker_runs_it_and_drains_on_sigterm(
    image: str, containers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``IMAGE serve`` answers /ping and /invocations on SAGEMAKER_BIND_TO_PORT, boto3 through the Runtime route,
    and ``podman stop`` drains and exits 0 (inference-server is PID 1); its log is JSON lines, as container platforms
    collect them."""
    container = containers(image)
    container.wait_ready()
    assert container.request("GET", "/ping") == (200, b"")
    status, body = container.request("POST", "/invocations", REQUEST, {"Content-Type": "application/json"})
    assert (status, orjson.loads(body)) == (200, FORECAST)
    for name, value in local_aws_env(f"http://127.0.0.1:{container.port}").items():
        monkeypatch.setenv(name, value)
    runtime = boto3.client("sagemaker-runtime")
    answer = runtime.invoke_endpoint(EndpointName="forecast", Body=REQUEST, ContentType="application/json")
    assert orjson.loads(answer["Body"].read()) == FORECAST
    assert container.stop() == 0
    lines = [orjson.loads(line) for line in container.logs().splitlines() if line.strip()]  # JSON: no TTY
    drains = [line for line in lines if line["message"].startswith("SIGTERM: draining")]
    assert [(line["pid"], line["level"], line["logger"]) for line in drains] == [(1, "INFO", "inference_server")]
    assert any(line["message"].startswith("Drained: no request in flight") for line in lines)
    access = [line for line in lines if line["logger"] == "inference_server.access"]
    assert {line["route"] for line in access} >= {"/invocations", "/endpoints/{name}/invocations"}


def test_the_image_runs_as_a_user_without_privileges_on_a_read_only_root(image: str, containers: Any) -> None:
    """Where the platform allows it (KServe; SageMaker runs containers as root), the image serves as nobody with a
    read-only root filesystem: it writes only under /tmp."""
    container = containers(image, "--user", "65534:65534", "--read-only")
    container.wait_ready()
    status, body = container.request("POST", "/invocations", REQUEST, {"Content-Type": "application/json"})
    assert (status, orjson.loads(body)) == (200, FORECAST)
    assert container.stop() == 0
