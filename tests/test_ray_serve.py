"""``serve --engine ray`` on a real local Ray, started and stopped by ``serve``: the seed's forecast plugin answers
curl-style requests, boto3 (``invoke_endpoint`` and the response stream) and tritonclient with the same bytes as
``serve`` on this machine; the replicas write the access lines; a killed replica is replaced while the other serves;
an ``inference.py`` script's concurrent requests share ``predict_fn`` calls inside a replica; SIGTERM ends Serve and
every process of the Ray it started. Without Ray Serve, ``--engine ray`` names the extra."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import orjson
import pytest
import tritonclient.http as triton

from inference_server import _ray, ray_serve
from inference_server._settings import Settings
from tests.conftest import Server, free_port, wait_until
from tests.test_asgi import FORECAST, JSON, REQUEST, assert_same_answers, forecast_environment

pytestmark = [pytest.mark.timeout(300)]

#: Seconds a Ray server gets to be ready: a local Ray, Serve's controller and proxy, the replicas and their models.
READY = 180
#: Seconds for Serve's router to learn which replica holds a model (reported through Serve's controller).
ROUTER_UPDATE = 3
#: The replicas' actor processes, as ``ps`` names them.
REPLICA = "ray::ServeReplica:inference-server:"


class RayServer(Server):
    """``serve --engine ray`` in its own session; every process below it is noted while it runs and ended when it
    is stopped."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        super().__init__(["--engine", "ray", *args], env, log, new_session=True)
        self.seen: dict[int, str] = {}

    def wait_serving(self) -> RayServer:
        """Wait until ``/ping`` answers 200 through Serve's proxy (a replica is ready)."""
        end = time.monotonic() + READY
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise AssertionError(f"serve --engine ray exited with {self.process.returncode}:\n{self.output()}")
            with contextlib.suppress(OSError):
                if self.request("GET", "/ping", timeout=5).status == 200:
                    self.note()
                    return self
            time.sleep(0.2)
        raise AssertionError(f"serve --engine ray not ready after {READY} s:\n{self.output()}")

    def note(self) -> dict[int, str]:
        """The processes below ``serve`` now (each with its start time), added to those seen."""
        now = _ray._descendants(self.process.pid)
        self.seen.update(now)
        return now

    def replicas(self) -> list[int]:
        """The replicas' processes now."""
        return [pid for pid in self.note() if _command(pid).startswith(REPLICA)]

    def left(self) -> list[str]:
        """The processes seen below ``serve`` that are still alive."""
        return [f"{pid} {_command(pid)}" for pid, started in self.seen.items() if _ray._started(pid) == started]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.note()
        code = super().stop(sig, timeout)
        for pid, started in self.seen.items():  # whatever a failed test left
            if _ray._started(pid) == started:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        return code


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A --model-root with one more model, for TargetModel."""
    path = tmp_path_factory.mktemp("root")
    (path / "forecast-v2").mkdir()
    (path / "forecast-v2" / "model.txt").write_text("the forecast, again")
    return path


@pytest.fixture(scope="module")
def forecast(
    tmp_path_factory: pytest.TempPathFactory, forecast_model_dir: Path, model_root: Path
) -> Iterator[RayServer]:
    """The forecast plugin on Ray Serve, two replicas, with a model root for TargetModel."""
    log = tmp_path_factory.mktemp("ray") / "serve.log"
    options = ["--replicas", "2", "--model-dir", str(forecast_model_dir), "--model-root", str(model_root)]
    server = RayServer(options, forecast_environment(), log)
    try:
        yield server.wait_serving()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, forecast_model_dir: Path, model_root: Path) -> Iterator[Server]:
    """The same plugin and settings on ``serve`` (granian), for comparison."""
    log = tmp_path_factory.mktemp("local") / "serve.log"
    options = ["--model-dir", str(forecast_model_dir), "--model-root", str(model_root)]
    server = Server(options, forecast_environment(), log)
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def test_answers_are_the_same_bytes_as_serve(forecast: RayServer, local: Server) -> None:
    """Every protocol's request set gets the status, our headers and the body (request ids aside) that serve gives."""
    assert_same_answers(local, forecast)
    assert orjson.loads(forecast.request("POST", "/invocations", REQUEST, JSON).body) == FORECAST


def _runtime(server: Server) -> Any:
    """boto3's SageMaker Runtime client, unmodified, pointed at ``server``."""
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=f"http://127.0.0.1:{server.port}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def test_boto3_invokes_the_endpoint_and_reads_the_response_stream(forecast: RayServer) -> None:
    """boto3's invoke_endpoint and invoke_endpoint_with_response_stream, unmodified, reach a replica."""
    runtime = _runtime(forecast)
    answer = runtime.invoke_endpoint(EndpointName="forecast", Body=REQUEST, ContentType="application/json")
    assert answer["ContentType"] == "application/json"
    assert orjson.loads(answer["Body"].read()) == FORECAST
    streamed = runtime.invoke_endpoint_with_response_stream(
        EndpointName="forecast", Body=REQUEST, ContentType="application/json"
    )
    parts = b"".join(event["PayloadPart"]["Bytes"] for event in streamed["Body"] if "PayloadPart" in event)
    assert orjson.loads(parts) == FORECAST


def test_a_target_models_requests_go_to_the_replica_that_holds_it(forecast: RayServer) -> None:
    """boto3's invoke_endpoint with a TargetModel of the model root: the first request loads the model on a replica;
    once Serve's router knows (Serve's model multiplexing, fed the TargetModel by our proxy middleware), the next 20
    go to that replica, and the model is loaded once in all."""
    runtime = _runtime(forecast)

    def invoke() -> Any:
        answer = runtime.invoke_endpoint(
            EndpointName="forecast", TargetModel="forecast-v2", Body=REQUEST, ContentType="application/json"
        )
        return orjson.loads(answer["Body"].read())

    assert invoke() == FORECAST
    time.sleep(ROUTER_UPDATE)
    assert [invoke() for _ in range(20)] == [FORECAST] * 20
    lines = forecast.output().splitlines()
    loads = [line for line in lines if "Loading the model from " in line and "forecast-v2" in line]
    assert len(loads) == 1, loads


def test_tritonclient_infers_through_serve(forecast: RayServer) -> None:
    """tritonclient's HTTP client sees a ready server and model, and gets the forecast as binary tensors."""
    client = triton.InferenceServerClient(f"127.0.0.1:{forecast.port}")
    try:
        assert client.is_server_ready()
        assert client.is_model_ready("forecast")
        location = triton.InferInput("location", [2], "FP64")
        location.set_data_from_numpy(np.array([59.53, -1.63]))
        result = client.infer("forecast", [location])
        names = [output["name"] for output in result.get_response()["outputs"]]
        assert {name: result.as_numpy(name).item().decode() for name in names} == FORECAST
    finally:
        client.close()


def test_the_replicas_write_the_access_lines_with_the_request_id(forecast: RayServer) -> None:
    """Each request's access line, written by the replica that answered, reaches serve's log with its request id."""
    answer = forecast.request("POST", "/invocations", REQUEST, JSON)
    assert answer.status == 200
    request_id = answer.headers["x-request-id"]  # the proxy's, which the replica was given
    wait_until(lambda: request_id in forecast.output(), 30, "no access line")
    [line] = [line for line in forecast.output().splitlines() if request_id in line]
    assert "ServeReplica" in line
    assert "POST /invocations" in line
    assert " 200 " in line


def test_a_killed_replica_is_replaced_while_the_other_serves(forecast: RayServer) -> None:
    """SIGKILL of a replica: requests keep being answered (by the other), and Serve starts a replica in its place."""
    before = forecast.replicas()
    assert len(before) == 2
    os.kill(before[0], signal.SIGKILL)
    answers = []
    for _ in range(20):
        answers.append(forecast.request("POST", "/invocations", REQUEST, JSON).status)
        time.sleep(0.1)
    wait_until(lambda: len(forecast.replicas()) == 2 and before[0] not in forecast.replicas(), 120, "not replaced")
    assert answers.count(200) >= 19  # a request the router sent before it saw the replica die may fail
    statuses = [forecast.request("POST", "/invocations", REQUEST, JSON).status for _ in range(10)]
    assert statuses == [200] * 10


def test_sigterm_ends_serve_and_every_process_of_its_ray(forecast: RayServer) -> None:
    """SIGTERM: serve deletes the application, stops the Ray it started and exits 0, leaving no process of it."""
    forecast.note()
    assert any(_command(pid).startswith("ray::") for pid in forecast.seen)
    forecast.process.send_signal(signal.SIGTERM)
    assert forecast.process.wait(90) == 0
    wait_until(lambda: not forecast.left(), 15, "processes left")


SCRIPT = """
    import os
    import time

    def model_fn(model_dir):
        return "grouping"

    def predict_fn(data, model):
        with open(os.environ["CALLS_FILE"], "a") as calls:
            calls.write(f"{os.getpid()} {len(data)}\\n")
        if data[0][0] == -1:  # a long request, running
            open(os.environ["CALLS_FILE"] + ".long", "w").close()
        time.sleep(3 if data[0][0] == -1 else 0.2)
        return [[len(data), row[0]] for row in data]
"""


def test_an_inference_script_micro_batches_inside_the_replicas_and_metrics_sum_them(tmp_path: Path) -> None:
    """An inference.py script with --max-batch-size 8 on two replicas: 32 concurrent requests through Serve share
    predict_fn calls (counted by the script) and each gets its own row; /metrics, whichever replica answers it,
    counts the requests of both (they share serve's metrics directory on the local Ray); a request running when
    serve is sent SIGTERM is answered, then serve ends its Ray."""
    model = tmp_path / "model"
    (model / "code").mkdir(parents=True)
    (model / "code" / "inference.py").write_text(textwrap.dedent(SCRIPT))
    calls = tmp_path / "calls.txt"
    env = forecast_environment(CALLS_FILE=str(calls), SAGEMAKER_PROGRAM="inference.py", INFERENCE_SERVER_PLUGINS="")
    options = ["--model-dir", str(model), "--max-batch-size", "8", "--replicas", "2"]
    server = RayServer(options, env, tmp_path / "serve.log")
    try:
        server.wait_serving()

        def post(row: int) -> Any:
            return server.request("POST", "/invocations", orjson.dumps([[row]]), JSON, timeout=60)

        sent = 0
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(post, range(32)))
            sent += 32
            assert [answer.status for answer in answers] == [200] * 32
            assert [orjson.loads(answer.body)[0][1] for answer in answers] == list(range(32))
            sizes = [int(line.split()[1]) for line in calls.read_text().splitlines()]
            assert sum(sizes) == 32
            assert len(sizes) < 32
            assert max(sizes) > 1
            while len({line.split()[0] for line in calls.read_text().splitlines()}) < 2 and sent < 32 * 10:
                assert {answer.status for answer in pool.map(post, range(32))} == {200}  # (until both served)
                sent += 32
        assert len({line.split()[0] for line in calls.read_text().splitlines()}) == 2

        def counted() -> float:
            return server.metric("inference_server_requests_total", route="/invocations")

        wait_until(lambda: counted() == sent, 30, "the metrics do not count both replicas' requests")
        assert [counted() for _ in range(6)] == [sent] * 6
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # SIGTERM while a request runs: it is answered
            long = pool.submit(post, -1)
            wait_until(lambda: Path(f"{calls}.long").exists(), 30, "the long request did not reach the model")
            server.process.send_signal(signal.SIGTERM)
            assert long.result().status == 200
        assert server.process.wait(90) == 0
        wait_until(lambda: not server.left(), 15, "processes left")
    finally:
        server.stop()


VERSIONED = """
    from pathlib import Path

    def model_fn(model_dir):
        return (Path(model_dir) / "version.txt").read_text()

    def predict_fn(data, model):
        return {"version": model}
"""


def test_sighup_replaces_the_replicas_with_the_model_loaded_again_without_a_failed_request(tmp_path: Path) -> None:
    """A new model directory's content, then SIGHUP: Serve replaces the replica (the new one started before the old
    stops), which loads the model again; requests sent all along are all answered 200, first by the old model, then
    by the new one."""
    model = tmp_path / "model"
    (model / "code").mkdir(parents=True)
    (model / "code" / "inference.py").write_text(textwrap.dedent(VERSIONED))
    (model / "version.txt").write_text("1")
    env = forecast_environment(SAGEMAKER_PROGRAM="inference.py", INFERENCE_SERVER_PLUGINS="")
    server = RayServer(["--model-dir", str(model)], env, tmp_path / "serve.log")
    try:
        server.wait_serving()
        versions: list[tuple[int, str]] = []
        done = threading.Event()

        def keep_asking() -> None:
            while not done.is_set():
                answer = server.request("POST", "/invocations", b"[1]", JSON, timeout=60)
                body = orjson.loads(answer.body) if answer.status == 200 else {}
                versions.append((answer.status, body.get("version", answer.body.decode(errors="replace"))))

        asker = threading.Thread(target=keep_asking)
        asker.start()
        try:
            wait_until(lambda: versions, 30, "no answer")
            (model / "version.txt").write_text("2")
            server.process.send_signal(signal.SIGHUP)
            wait_until(lambda: "Reloaded: every replica" in server.output(), 120, "not reloaded")
            wait_until(lambda: versions[-1] == (200, "2"), 30, "the new model does not answer")
        finally:
            done.set()
            asker.join()
        assert {status for status, _ in versions} == {200}
        assert versions[0] == (200, "1")
        assert versions[-1] == (200, "2")
    finally:
        server.stop()


def test_without_ray_serve_the_engine_names_the_extra(tmp_path: Path) -> None:
    """With no importable Ray Serve, serve --engine ray exits 1 saying which extra to install."""
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no Ray here')\n")
    env = forecast_environment(PYTHONPATH=str(tmp_path / "shadow"))
    done = subprocess.run(
        [sys.executable, "-m", "inference_server", "serve", "--engine", "ray", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "--engine ray needs Ray Serve: pip install 'inference-server[ray]'" in done.stderr


def test_the_settings_map_to_serves_deployment_options() -> None:
    """--replicas gives a fixed count, --autoscale Serve's autoscaler bounds (starting with at least one replica);
    each replica takes MAX_ONGOING_REQUESTS at once and drains for --graceful-timeout."""
    fixed = ray_serve.deployment_options(Settings.from_env({}, replicas=3, graceful_timeout=7))
    assert fixed == {
        "num_replicas": 3,
        "max_ongoing_requests": 256,
        "graceful_shutdown_timeout_s": 7.0,
        "max_surge_percent": 100,
    }
    scaled = ray_serve.deployment_options(Settings.from_env({}, autoscale="0:4"))
    assert scaled["num_replicas"] == "auto"
    assert scaled["autoscaling_config"] == {"min_replicas": 0, "initial_replicas": 1, "max_replicas": 4}


@pytest.mark.parametrize("value", ["4", "3:1", "0:0", "a:b", "-1:2"])
def test_a_wrong_autoscale_is_refused_at_start(value: str) -> None:
    """--autoscale takes MIN:MAX with 0 <= MIN <= MAX and MAX >= 1; anything else stops serve with exit 2."""
    done = subprocess.run(
        [sys.executable, "-m", "inference_server", "serve", "--engine", "ray", f"--autoscale={value}"],
        env=forecast_environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--autoscale" in done.stderr
    assert "MIN:MAX" in done.stderr


def test_the_proxy_middleware_gives_serve_the_target_model() -> None:
    """Serve's proxy middleware adds the TargetModel as serve_multiplexed_model_id, never twice, and passes anything
    else through unchanged."""
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)

    routing = ray_serve._TargetModelRouting(app)
    target = [(b"x-amzn-sagemaker-target-model", b"m.tar.gz")]
    given = [*target, (b"serve_multiplexed_model_id", b"other")]
    for scope in ({"type": "http", "headers": target}, {"type": "http", "headers": given}, {"type": "lifespan"}):
        asyncio.run(routing(scope, None, None))
    assert seen[0]["headers"] == [*target, (b"serve_multiplexed_model_id", b"m.tar.gz")]
    assert seen[1]["headers"] == given
    assert seen[2] == {"type": "lifespan"}
    [middleware] = ray_serve.proxy_middlewares()
    assert middleware.cls is ray_serve._TargetModelRouting
