"""The examples' images from container/Dockerfile, built and run with podman as SageMaker runs them: ``IMAGE serve``,
the model mounted read-only, ``SAGEMAKER_BIND_TO_PORT`` honoured, SIGTERM drained by inference-server as PID 1; a
multi-model image (``MULTI_MODEL=true``) serving SageMaker's /models API with its models under /opt/ml/models; the
streaming example's image sending tokens as they are made, to an SSE client and to boto3's response stream; and the
same forecast image run as KServe runs a custom predictor, answering the Open Inference Protocol to tritonclient."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import re
import shutil
import subprocess
import tempfile
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import orjson
import pytest
import sseclient
import token_stream
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from packaging.specifiers import SpecifierSet

from tests.conftest import free_port, local_aws_env

ROOT = Path(__file__).resolve().parent.parent
#: The local base image: Debian's Python from the machine's own Debian mirror, kept between runs on one machine.
BASE = "localhost/inference-server-test-base:bookworm"
IMAGE = "localhost/inference-server-test:forecast"
MULTI_MODEL_IMAGE = "localhost/inference-server-test:multi-model"
STREAMING_IMAGE = "localhost/inference-server-test:streaming"
#: SageMaker's label for an image that may serve a multi-model endpoint.
MULTI_MODEL_LABEL = "com.amazonaws.sagemaker.capabilities.multi-models"
#: The seed example's request and answer.
REQUEST = b'{"location": "Fair Isle"}'
FORECAST = {
    "wind": "Southwesterly gale force 8 continuing",
    "sea_state": "Rough or very rough, occasionally moderate in southeast.",
    "weather": "Thundery showers.",
    "visibility": "Good, occasionally poor.",
}
JSON = {"Content-Type": "application/json"}
#: The CA bundle pip trusts on this machine, lent to the build read-only (pip in the image must reach the index).
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
#: Where KServe's storage initializer puts the model, mounted read-only.
KSERVE_MODEL_DIR = "/mnt/models"
#: What KServe and Knative put in the environment of a custom predictor's container (``predictor.containers``), an
#: InferenceService named ``forecast`` with ``STORAGE_URI`` and ``PROTOCOL`` set by its author: Knative's runtime
#: contract sets PORT (the containerPort, 8080 by default) and K_SERVICE, K_CONFIGURATION, K_REVISION; KServe (0.17 on)
#: adds INFERENCE_SERVICE_NAME; its storage initializer downloads STORAGE_URI into /mnt/models and rewrites the variable
#: to that path; KServe reads PROTOCOL (v1 or v2) itself. inference-server reads none of them.
KSERVE_ENV = {
    "PORT": "8080",
    "K_SERVICE": "forecast-predictor",
    "K_CONFIGURATION": "forecast-predictor",
    "K_REVISION": "forecast-predictor-00001",
    "INFERENCE_SERVICE_NAME": "forecast",
    "STORAGE_URI": KSERVE_MODEL_DIR,
    "PROTOCOL": "v2",
}
#: What the InferenceService's author adds to its env for this image: the model's directory and its v2 name.
KSERVE_USER_ENV = {"INFERENCE_SERVER_MODEL_DIR": KSERVE_MODEL_DIR, "INFERENCE_SERVER_MODEL_NAME": "forecast"}
#: runc, since crun fails on this kernel's cgroup layout; limits within the machine's hard limits.
RUN = ["--runtime", "runc"]
LIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]

#: What the recipe installs from the package index by default (its ARG in both stages).
VERSION_ARG = re.compile(r'^ARG INFERENCE_SERVER_VERSION="([^"]*)"$', re.MULTILINE)

pytestmark = [pytest.mark.timeout(600)]


def podman(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``podman *args`` and return what it did; a failure shows podman's last words."""
    done = subprocess.run(["podman", *RUN, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        pytest.fail(f"podman {' '.join(args[:2])} failed ({done.returncode}): {done.stderr[-3000:]}")
    return done


@pytest.fixture(scope="module")
def base() -> str:
    """The local base image, made once per machine with mmdebstrap (about 40 s) and kept; every test that builds or
    runs an image needs it, so it skips them where podman or runc is missing."""
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (.ci/run installs it)")
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


def build(base: str, plugin: str, tag: str, *args: str) -> str:
    """Build ``plugin``'s image from this checkout as the Dockerfile's header says, tagged ``tag``."""
    mounts = ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"] if CA_BUNDLE.exists() else []
    args = ("--build-arg", f"BASE={base}", "--build-arg", f"PLUGIN={plugin}", *args)
    podman("build", "-q", "-f", "container/Dockerfile", *args, "--build-arg", "INFERENCE_SERVER=.", *mounts,
           "-t", tag, str(ROOT), timeout=900)  # fmt: skip
    return tag


@pytest.fixture(scope="module")
def image(base: str) -> str:
    """The shipping forecast's image."""
    return build(base, "examples/shipping_forecast", IMAGE, "--build-arg", "EXTRAS=[grpc]")


@pytest.fixture(scope="module")
def multi_model_image(base: str) -> str:
    """The multi-model example's image, labelled for multi-model endpoints by its build argument."""
    return build(base, "examples/multi_model", MULTI_MODEL_IMAGE, "--build-arg", "MULTI_MODEL=true")


@pytest.fixture(scope="module")
def streaming_image(base: str) -> str:
    """The streaming example's image (the forecast's base and context: only its wheels and their install differ)."""
    return build(base, "examples/streaming", STREAMING_IMAGE)


def _wheel(directory: Path, name: str, version: str) -> Path:
    """A wheel of distribution ``name`` at ``version`` in ``directory``: one empty module, no dependencies."""
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()
    )
    path = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name_in_wheel, data in {**files, f"{dist_info}/RECORD": f"{record}{dist_info}/RECORD,,\n".encode()}.items():
            wheel.writestr(name_in_wheel, data)
    return path


def build_failure(base: str, tmp_path: Path, *args: str) -> str:
    """Build the recipe from a context of one plugin wheel, pip's index a directory (a PEP 503 simple index) holding
    inference-server 1.3.3, PyPI's newest today, and nothing else; the build must fail: its output."""
    context, index = tmp_path / "context", tmp_path / "index"
    (index / "inference-server").mkdir(parents=True)
    context.mkdir(exist_ok=True)
    old = _wheel(index / "inference-server", "inference-server", "1.3.3")
    (index / "inference-server" / "index.html").write_text(f'<a href="{old.name}">{old.name}</a>\n')  # PEP 503
    plugin = _wheel(context, "tiny-plugin", "1.0")
    arguments = ["--build-arg", f"BASE={base}", "--build-arg", f"PLUGIN={plugin.name}", *args]
    arguments += ["--build-arg", "INDEX_URL=file:///index", "-v", f"{index}:/index:ro"]
    dockerfile = str(ROOT / "container" / "Dockerfile")
    done = podman("build", "-f", dockerfile, *arguments, str(context), timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert "inference-server: not found" not in output
    return output


def test_the_recipe_is_for_this_checkouts_major_version() -> None:
    """The version the recipe installs from the index by default (both stages alike) takes this checkout's version,
    a pre-release as it is now, and no other major version."""
    wanted = VERSION_ARG.findall((ROOT / "container" / "Dockerfile").read_text())
    version = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert version is not None
    assert len(wanted) == 2, wanted
    assert len(set(wanted)) == 1, wanted
    major = int(version[1].split(".")[0])
    specifier = SpecifierSet(wanted[0])
    assert specifier.contains(version[1], prereleases=True)
    assert not any(specifier.contains(v, prereleases=True) for v in (f"{major - 1}.99", f"{major + 1}.0.0.dev0"))


def test_the_recipe_refuses_the_index_older_major_version(base: str, tmp_path: Path) -> None:
    """Without INFERENCE_SERVER, from an index whose newest inference-server is 1.3.3, the build fails naming the
    versions it wanted and found, instead of installing 1.3.3 (which has no inference-server command)."""
    output = build_failure(base, tmp_path)
    assert "from versions: 1.3.3" in output, output[-3000:]
    assert "error: no wheels of inference-server>=2.0.0.dev0,<3 and tiny_plugin-1.0-py3-none-any.whl" in output


def test_the_recipe_refuses_another_version_given_as_inference_server(base: str, tmp_path: Path) -> None:
    """INFERENCE_SERVER naming another version's source (here a wheel of 1.9) fails the build saying which version
    was installed and which one the recipe is for."""
    (tmp_path / "context").mkdir()
    old = _wheel(tmp_path / "context", "inference-server", "1.9.0")
    output = build_failure(base, tmp_path, "--build-arg", f"INFERENCE_SERVER={old.name}")
    expected = (
        "error: inference-server 1.9.0 is installed, not inference-server>=2.0.0.dev0,<3 (INFERENCE_SERVER_VERSION)"
    )
    assert expected in output, output[-3000:]


def labels(image: str) -> dict[str, str]:
    """The image's labels."""
    return dict(orjson.loads(podman("image", "inspect", "--format", "{{json .Labels}}", image).stdout))


class Container:
    """A container of the image on a free port of 127.0.0.1, by default running as SageMaker runs it: ``IMAGE serve``
    on ``SAGEMAKER_BIND_TO_PORT``, the model read-only at /opt/ml/model. ``command=()`` runs the image's own command,
    ``bind_to_port=None`` leaves the server on its default port (8080), ``model_mount`` mounts the model elsewhere."""

    def __init__(
        self,
        image: str,
        model_dir: Path,
        *options: str,
        command: tuple[str, ...] = ("serve",),
        bind_to_port: int | None = 9090,
        model_mount: str = "/opt/ml/model",
    ) -> None:
        self.name = f"inference-server-test-{uuid.uuid4().hex[:12]}"
        self.port = free_port()
        self.started = time.monotonic()
        if bind_to_port is None:
            publish = ["-p", f"127.0.0.1:{self.port}:8080"]
        else:
            publish = ["-p", f"127.0.0.1:{self.port}:{bind_to_port}", "-e", f"SAGEMAKER_BIND_TO_PORT={bind_to_port}"]
        model = ["-v", f"{model_dir}:{model_mount}:ro"]
        podman("run", "-d", "--name", self.name, *LIMITS, *publish, *model, *options, image, *command)

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request(method, path, body, headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def wait_ready(self, deadline: float = 60, path: str = "/ping") -> float:
        """Wait for ``path`` (a readiness probe's) to answer 200; return the seconds since the container was started."""
        until = time.monotonic() + deadline
        while time.monotonic() < until:
            with contextlib.suppress(OSError, http.client.HTTPException):
                if self.request("GET", path)[0] == 200:
                    return time.monotonic() - self.started
            time.sleep(0.1)
        pytest.fail(f"{path} did not answer 200 within {deadline} s: {self.logs()[-3000:]}")

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

    def start(image: str, *options: str, **how: Any) -> Container:
        started.append(Container(image, model_dir, *options, **how))
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


def test_an_image_built_without_multi_model_is_not_labelled_for_it(image: str) -> None:
    """MULTI_MODEL defaults to false: SageMaker would not accept the image for a multi-model endpoint."""
    assert labels(image)[MULTI_MODEL_LABEL] == "false"


def test_the_multi_model_image_serves_sagemakers_model_api(
    multi_model_image: str, containers: Any, tmp_path: Path
) -> None:
    """Built with ``MULTI_MODEL=true`` the image carries SageMaker's multi-model label; run as SageMaker runs it
    (``SAGEMAKER_MULTI_MODEL=true``, models read-only under /opt/ml/models) it answers /ping with no model loaded,
    loads two models by their directories, invokes each, lists them, answers 404 for an unloaded one, and drains."""
    assert labels(multi_model_image)[MULTI_MODEL_LABEL] == "true"
    models = tmp_path / "models"
    scores = {"fraud": [4.75], "churn": [3.0]}  # each model's score of the row [1, 2, 3]
    for name, coef, intercept in (("fraud", [0.5, -1.0, 2.0], 0.25), ("churn", [1.0, 1.0, 1.0], -3.0)):
        (models / name).mkdir(parents=True)
        (models / name / "model.json").write_bytes(orjson.dumps({"coef": coef, "intercept": intercept}))
    mount = ["-v", f"{models}:/opt/ml/models:ro"]
    container = containers(multi_model_image, "-e", "SAGEMAKER_MULTI_MODEL=true", *mount)
    container.wait_ready()
    assert container.request("GET", "/ping") == (200, b"")
    status, body = container.request("GET", "/models")
    assert (status, orjson.loads(body)) == (200, {"models": []})
    for name in scores:
        load = orjson.dumps({"model_name": name, "url": f"/opt/ml/models/{name}"})
        status, body = container.request("POST", "/models", load, JSON)
        assert status == 200, body
    for name, score in scores.items():
        status, body = container.request("POST", f"/models/{name}/invoke", b"[[1, 2, 3]]", JSON)
        assert (status, orjson.loads(body)) == (200, score)
    status, body = container.request("GET", "/models")
    listed = [(model["modelName"], model["modelUrl"]) for model in orjson.loads(body)["models"]]
    assert (status, listed) == (200, [("churn", "/opt/ml/models/churn"), ("fraud", "/opt/ml/models/fraud")])
    assert container.request("DELETE", "/models/fraud")[0] == 200
    assert container.request("POST", "/models/fraud/invoke", b"[[1, 2, 3]]", JSON)[0] == 404
    assert container.request("GET", "/models/fraud")[0] == 404
    status, body = container.request("POST", "/models/churn/invoke", b"[[1, 2, 3]]", JSON)
    assert (status, orjson.loads(body)) == (200, scores["churn"])
    assert container.stop() == 0


def test_the_streaming_image_sends_tokens_as_they_are_made(
    streaming_image: str, containers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The streaming example's image, run as SageMaker runs it, sends /invocations' tokens as server-sent events
    read by sseclient-py, the model's tokens in order; a client that reads the first event of 500 tokens and goes
    away stops the model having made only some (so the first was sent before the last was made); boto3's
    invoke_endpoint_with_response_stream reads the same tokens from the Runtime route; and it drains."""
    container = containers(streaming_image)
    container.wait_ready()
    request = {"prompt": "I thought", "max_tokens": 8, "seed": 3, "delay_ms": 10}
    model = token_stream.BigramModel.from_text(token_stream.CORPUS)  # the image's model: its directory is empty
    tokens = list(model.generate(request["prompt"], request["max_tokens"], request["seed"]))
    with stream(container, request, "text/event-stream") as response:
        assert (response.status, response.getheader("Content-Type")) == (200, "text/event-stream")
        events = sseclient.SSEClient(iter(lambda: response.read1(65536), b"")).events()
        first = next(events).data
        assert [first, *(event.data for event in events)] == tokens

    with stream(container, {"prompt": "Call me", "max_tokens": 500, "delay_ms": 20}, "text/event-stream") as response:
        assert response.readline().startswith(b"data: ")
    made = _logged(container, "Made ", "of 500 tokens")
    assert 1 <= int(made.split()[1]) < 500, made

    for name, value in local_aws_env(f"http://127.0.0.1:{container.port}").items():
        monkeypatch.setenv(name, value)
    runtime = boto3.client("sagemaker-runtime")
    answer = runtime.invoke_endpoint_with_response_stream(
        EndpointName="token-stream", Body=orjson.dumps(request), ContentType="application/json"
    )
    assert answer["ContentType"] == "application/jsonlines"
    lines = b"".join(event["PayloadPart"]["Bytes"] for event in answer["Body"]).splitlines()
    assert [orjson.loads(line) for line in lines] == tokens
    assert container.stop() == 0


def test_the_image_serves_v2_as_kserve_runs_a_custom_predictor(image: str, containers: Any) -> None:
    """As KServe runs a custom predictor (own command, port 8080, model in /mnt/models) it serves tritonclient v2,
    over HTTP and, on 8081, over gRPC."""
    environment = {**KSERVE_ENV, **KSERVE_USER_ENV, "INFERENCE_SERVER_GRPC_PORT": "8081"}
    env = [option for name, value in environment.items() for option in ("-e", f"{name}={value}")]
    grpc_port = free_port()
    publish = ["-p", f"127.0.0.1:{grpc_port}:8081"]
    container = containers(image, *env, *publish, command=(), bind_to_port=None, model_mount=KSERVE_MODEL_DIR)
    container.wait_ready(path="/v2/health/ready")
    status, body = container.request("GET", "/v2/health/ready")
    assert (status, orjson.loads(body)) == (200, {"ready": True})
    client = triton.InferenceServerClient(f"127.0.0.1:{container.port}")
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("forecast")
        assert not client.is_model_ready("shipping_forecast")  # the plugin's name, had the env not named it
        assert client.get_model_metadata("forecast") == {
            "name": "forecast",
            "platform": "inference-server",
            "inputs": [{"name": "input_0", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [],
        }
        location = triton.InferInput("location", [2], "FP64")
        location.set_data_from_numpy(np.array([59.53, -1.63]))  # Fair Isle, as binary tensor data
        result = client.infer("forecast", [location])
        outputs = result.get_response()["outputs"]
        assert all(output["datatype"] == "BYTES" and output["shape"] == [] for output in outputs)
        assert all("binary_data_size" in output["parameters"] for output in outputs)
        assert {output["name"]: result.as_numpy(output["name"]).item().decode() for output in outputs} == FORECAST
    finally:
        client.close()
    over_grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")  # KServe's gRPC port
    try:
        assert over_grpc.is_server_ready()
        assert over_grpc.is_model_ready("forecast")
        raw_location = triton_grpc.InferInput("location", [2], "FP64")
        raw_location.set_data_from_numpy(np.array([59.53, -1.63]))  # (raw_input_contents)
        result = over_grpc.infer("forecast", [raw_location])
        names = [output.name for output in result.get_response().outputs]
        assert {name: result.as_numpy(name).item().decode() for name in names} == FORECAST
    finally:
        over_grpc.close()
    assert _logged(container, "Loading the model from ", "") == f"Loading the model from {KSERVE_MODEL_DIR}"
    assert "does not exist" not in container.logs()
    assert container.stop() == 0


@contextlib.contextmanager
def stream(container: Container, request: dict[str, Any], accept: str) -> Iterator[http.client.HTTPResponse]:
    """POST ``request`` to the container's /invocations; the response, its body unread, until the block ends."""
    connection = http.client.HTTPConnection("127.0.0.1", container.port, timeout=30)
    try:
        connection.request("POST", "/invocations", orjson.dumps(request), {**JSON, "Accept": accept})
        yield connection.getresponse()
    finally:
        connection.close()


def _logged(container: Container, start: str, end: str, deadline: float = 10) -> str:
    """The first message of the container's log that starts with ``start`` and ends with ``end``, waiting for it."""
    until = time.monotonic() + deadline
    while True:
        lines = [orjson.loads(line) for line in container.logs().splitlines() if line.startswith("{")]
        messages = [line["message"] for line in lines]
        found = [message for message in messages if message.startswith(start) and message.endswith(end)]
        if found:
            return found[0]
        if time.monotonic() > until:
            pytest.fail(f"no {start}...{end} in the log: {container.logs()[-3000:]}")
        time.sleep(0.1)
