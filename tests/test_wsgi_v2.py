"""The Open Inference Protocol v2 on a real server: the real tritonclient (health, metadata, infer with every
common datatype, binary and JSON both ways, output selection), every error as {"error"} with its status, hostile
bodies never a 500, the model_metadata signature, readiness following the drain, the same model on /invocations
and v2, and the model repository over the multi-model registry."""

from __future__ import annotations

import http.client
import io
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as triton
import werkzeug.test
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference_server import _plugins, plugin_hook
from inference_server._settings import Settings
from inference_server.wsgi._app import App
from tests.conftest import wait_until

#: A model that echoes its inputs (a dict of arrays): each output is the input of the same name.
ECHO = """
    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return "echo"

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return data
"""

#: A model with a signature: one FP32 input "x" of shape [-1, 3], one output "y" (x doubled).
SIGNED = """
    import numpy as np
    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return "signed"

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return {"y": np.asarray(data["x"]) * 2}

    @inference_server.plugin_hook
    def model_metadata(model):
        return {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
        }
"""


#: A model written for /invocations alone: it takes one number (a JSON body such as ``1.5``), not v2's dict of arrays.
SCALAR = """
    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return [float(data) * 2]
"""


@pytest.fixture
def echo(servers: Any) -> Any:
    servers.plugin_site.add("echo_model", ECHO)
    return servers.start()


def connect(server: Any) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(f"127.0.0.1:{server.port}")


def tensor(name: str, array: np.ndarray, datatype: str, binary: bool) -> triton.InferInput:
    given = triton.InferInput(name, list(array.shape), datatype)
    given.set_data_from_numpy(array, binary_data=binary)
    return given


ARRAYS = {
    "FP32": np.arange(12, dtype=np.float32).reshape(3, 4) / 3,
    "INT64": np.array([[-(2**62), 0, 2**62]], dtype=np.int64),
    "BOOL": np.array([True, False, True]),
    "BYTES": np.array([b"fair", b"", "isle \x00 \u00e9".encode()], dtype=object),
    "FP16": np.array([0.5, -2.0, 65504.0], dtype=np.float16),
}


def test_tritonclient_sees_a_live_ready_server_and_its_model(echo: Any) -> None:
    """is_server_live, is_server_ready, is_model_ready and the metadata, as the real tritonclient reads them; an
    unknown model is not ready."""
    client = connect(echo)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("echo_model")
    assert not client.is_model_ready("no_such_model")
    metadata = client.get_server_metadata()
    assert metadata["name"] == "inference-server"
    assert "binary_tensor_data" in metadata["extensions"]
    assert client.get_model_metadata("echo_model") == {
        "name": "echo_model",
        "platform": "inference-server",
        "inputs": [{"name": "input_0", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [],
    }


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_requests_and_answers_compressed(echo: Any, algorithm: str, binary: bool) -> None:
    """tritonclient's request_compression_algorithm (Content-Encoding gzip or deflate, the whole body compressed:
    the JSON header and the binary tensors behind it) and response_compression_algorithm (an answer of JSON
    tensors comes back compressed, and tritonclient decodes it): the tensors come back equal."""
    array = np.arange(4096, dtype=np.float32).reshape(64, 64)
    result = connect(echo).infer(
        "echo_model",
        [tensor("t", array, "FP32", binary)],
        outputs=[triton.InferRequestedOutput("t", binary_data=binary)],
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("t"), array)
    request = {"inputs": [{"name": "t", "shape": [64, 64], "datatype": "FP32", "data": array.ravel().tolist()}]}
    headers = {"Accept-Encoding": algorithm, "Content-Type": "application/json"}
    raw = echo.request("POST", "/v2/models/echo_model/infer", orjson.dumps(request), headers)
    assert raw.headers["Content-Encoding"] == algorithm  # (what tritonclient decoded: a JSON answer, compressed)


@pytest.mark.parametrize("datatype", list(ARRAYS))
@pytest.mark.parametrize(("binary_in", "binary_out"), [(True, True), (False, False), (True, False), (False, True)])
def test_tritonclient_infers_each_datatype_binary_and_json_both_ways(
    echo: Any, datatype: str, binary_in: bool, binary_out: bool
) -> None:
    """FP32, INT64, BOOL, BYTES and FP16 tensors come back equal, sent and answered as binary data or JSON (FP16
    only as binary: as JSON it is a 400 on the way in and a 406 on the way out)."""
    client = connect(echo)
    array = ARRAYS[datatype]
    inputs = [tensor("t", array, datatype, binary_in)]
    outputs = [triton.InferRequestedOutput("t", binary_data=binary_out)]
    if datatype == "FP16" and not binary_in:
        with pytest.raises(triton.InferenceServerException) as refused:
            client.infer("echo_model", inputs, outputs=outputs)
        assert refused.value.status() == "400"
        assert "FP16" in refused.value.message()
        return
    if datatype == "FP16" and not binary_out:
        with pytest.raises(triton.InferenceServerException) as refused:
            client.infer("echo_model", inputs, outputs=outputs)
        assert refused.value.status() == "406"
        return
    result = client.infer("echo_model", inputs, outputs=outputs, request_id="req-7")
    got = result.as_numpy("t")
    assert got.shape == array.shape
    if datatype == "BYTES":  # (tritonclient gives JSON strings back as str)
        assert [item if isinstance(item, bytes) else item.encode() for item in got.tolist()] == array.tolist()
    else:
        assert got.dtype == array.dtype
        np.testing.assert_array_equal(got, array)
    assert result.get_response()["id"] == "req-7"
    assert "model_version" not in result.get_response()


def test_outputs_are_selected_by_name_in_the_requests_order(echo: Any) -> None:
    """outputs names which of the prediction's tensors come back, each binary or JSON as asked; an output the
    model does not have is a 400 naming it."""
    client = connect(echo)
    inputs = [tensor("a", np.array([1, 2], dtype=np.int32), "INT32", True), tensor("b", np.ones(2), "FP64", True)]
    result = client.infer("echo_model", inputs, outputs=[triton.InferRequestedOutput("b", binary_data=False)])
    assert [output["name"] for output in result.get_response()["outputs"]] == ["b"]
    assert result.get_response()["outputs"][0]["data"] == [1.0, 1.0]
    assert result.as_numpy("a") is None
    with pytest.raises(triton.InferenceServerException) as refused:
        client.infer("echo_model", inputs, outputs=[triton.InferRequestedOutput("c")])
    assert refused.value.status() == "400"
    assert "'c'" in refused.value.message()


def raw(server: Any, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("POST", path, body, headers or {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, orjson.loads(response.read())
    finally:
        connection.close()


def json_request(*inputs: dict[str, Any]) -> bytes:
    return orjson.dumps({"inputs": list(inputs)})


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "says"),
    [
        (
            "/v2/models/echo_model/infer",
            json_request({"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}),
            None,
            400,
            "'x'",
        ),
        (
            "/v2/models/echo_model/infer",
            json_request({"name": "x", "shape": [1], "datatype": "FLOAT128", "data": [1.0]}),
            None,
            400,
            "FLOAT128",
        ),
        (
            "/v2/models/nobody/infer",
            json_request({"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}),
            None,
            404,
            "nobody",
        ),
        ("/v2/models/echo_model/infer", b'{"inputs": [', None, 400, "JSON"),
        (
            "/v2/models/echo_model/infer",
            json_request({"name": "x", "shape": [-2], "datatype": "FP32", "data": []}),
            None,
            400,
            "shape",
        ),
        (
            "/v2/models/echo_model/infer",
            json_request({"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}})
            + b"\x00" * 8,
            {"Content-Type": "application/octet-stream"},
            400,
            "Inference-Header-Content-Length",
        ),
    ],
    ids=["size-mismatch", "bad-datatype", "unknown-model", "malformed-json", "negative-shape", "no-header-length"],
)
def test_every_error_is_an_error_object_with_its_status(
    echo: Any, path: str, body: bytes, headers: dict[str, str] | None, status: int, says: str
) -> None:
    """Hand-made requests: a size that does not match the shape, an unknown datatype, an unknown model, malformed
    JSON, a negative dimension and a binary body without Inference-Header-Content-Length each get their status and
    {"error": "..."} saying what is wrong; the server goes on serving."""
    got, answer = raw(echo, path, body, headers)
    assert got == status
    assert set(answer) == {"error"}
    assert says in answer["error"]
    assert connect(echo).is_server_ready()


class _Echo:
    @plugin_hook
    def predict_fn(self, data: Any, model: Any) -> Any:
        return data


@pytest.fixture(scope="module")
def app() -> App:
    """An app in this process with a model that echoes its inputs."""
    return App(Settings(model_dir="/nonexistent"), _plugins.build_manager([], [_Echo()]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda inputs: orjson.dumps({"inputs": inputs}),
            st.lists(
                st.fixed_dictionaries(
                    {
                        "name": st.text(max_size=3),
                        "shape": st.lists(st.integers(-2, 4), max_size=3),
                        "datatype": st.sampled_from(["FP32", "INT8", "BOOL", "BYTES", "FP16", "UINT64", "X"]),
                    },
                    optional={
                        "data": st.recursive(
                            st.one_of(st.integers(-300, 300), st.floats(), st.booleans(), st.text(max_size=3)),
                            lambda inner: st.lists(inner, max_size=4),
                            max_leaves=8,
                        ),
                        "parameters": st.fixed_dictionaries({"binary_data_size": st.integers(-1, 20)}),
                    },
                ),
                max_size=3,
            ),
        ),
    ),
    header_length=st.one_of(
        st.none(),
        st.integers(-1, 400).map(str),
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=4),
    ),
)
def test_hostile_bodies_never_get_a_500(app: App, body: bytes, header_length: str | None) -> None:
    """Random bytes and random tensor lists, with random Inference-Header-Content-Length values, are answered
    200 or 4xx with an error object: never a 500."""
    headers = {"Content-Type": "application/octet-stream"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = header_length
    client = werkzeug.test.Client(app)
    response = client.post("/v2/models/model/infer", data=io.BytesIO(body), headers=headers)
    assert response.status_code < 500, response.get_data()
    if response.status_code >= 400:
        assert set(orjson.loads(response.get_data())) == {"error"}


def test_a_models_signature_is_its_metadata_and_checks_requests(servers: Any) -> None:
    """model_metadata's signature is what GET /v2/models/NAME shows; a request with another input name, datatype
    or shape is a 400 saying which, and a matching one is answered (with -1 matching any size)."""
    servers.plugin_site.add("signed", SIGNED)
    server = servers.start()
    client = connect(server)
    metadata = client.get_model_metadata("signed")
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    result = client.infer("signed", [tensor("x", np.ones((5, 3), dtype=np.float32), "FP32", True)])
    np.testing.assert_array_equal(result.as_numpy("y"), np.full((5, 3), 2.0, dtype=np.float32))
    for name, array, datatype, says in (
        ("z", np.ones((1, 3), dtype=np.float32), "FP32", "'z' is not one of the model's inputs"),
        ("x", np.ones((1, 3), dtype=np.float64), "FP64", "'x' is FP64, but the model takes FP32"),
        ("x", np.ones((1, 4), dtype=np.float32), "FP32", "shape [1, 4], but the model takes [-1, 3]"),
    ):
        with pytest.raises(triton.InferenceServerException) as refused:
            client.infer("signed", [tensor(name, array, datatype, True)])
        assert refused.value.status() == "400"
        assert says in refused.value.message()


def test_a_model_without_a_signature_says_what_it_takes(echo: Any) -> None:
    """Without model_metadata, GET /v2/models/NAME names one input, input_0, of shape [-1] (any tensor is taken, and
    the model gets a dict of arrays by name), and a request with that input is answered under its name."""
    client = connect(echo)
    inputs = client.get_model_metadata("echo_model")["inputs"]
    assert inputs == [{"name": "input_0", "datatype": "BYTES", "shape": [-1]}]
    result = client.infer("echo_model", [tensor("input_0", np.array([1.5, 2.5]), "FP64", True)])
    assert result.as_numpy("input_0").tolist() == [1.5, 2.5]


def test_a_model_that_fails_on_v2s_dict_gets_a_500_saying_what_v2_gives_it(servers: Any) -> None:
    """A predict_fn written for /invocations (float(data)) answers there, and on v2 its TypeError is a 500 whose
    error says that v2 gives predict_fn a dict of arrays by input name, names the request's inputs and points at the
    how-to."""
    servers.plugin_site.add("scalar_model", SCALAR)
    server = servers.start()
    reply = server.request("POST", "/invocations", b"1.5", {"Content-Type": "application/json"})
    assert (reply.status, orjson.loads(reply.body)) == (200, [3.0])
    status, answer = raw(
        server,
        "/v2/models/scalar_model/infer",
        json_request({"name": "input_0", "shape": [1], "datatype": "FP64", "data": [1.5]}),
    )
    assert status == 500
    assert answer["error"].startswith("predict_fn raised TypeError on what v2 gives it: a dict of arrays by input name")
    assert "{'input_0': FP64 [1]}" in answer["error"]
    assert "docs/how-to/v2.md" in answer["error"]
    assert "see the server log for request" in answer["error"]


def test_a_model_that_fails_otherwise_on_v2_keeps_the_usual_500() -> None:
    """A predict_fn that raises an error of another kind than code raises on data it did not expect (here
    RuntimeError) gets the usual 500 naming the hook and the exception's class, without the v2 hint."""

    class Failing:
        @plugin_hook
        def predict_fn(self, data: Any, model: Any) -> Any:
            raise RuntimeError("out of order")

    app = App(Settings(model_dir="/nonexistent", model_name="model"), _plugins.build_manager([], [Failing()]))
    response = werkzeug.test.Client(app).post(
        "/v2/models/model/infer", data=json_request({"name": "x", "shape": [1], "datatype": "FP32", "data": [1]})
    )
    assert response.status_code == 500
    assert orjson.loads(response.get_data())["error"].startswith("predict_fn raised RuntimeError; see the server log")


def test_readiness_follows_the_drain(servers: Any, tmp_path: Path) -> None:
    """After SIGTERM, while a request is still running, /v2/health/ready and the model's ready are 503 (as /ping)
    and live stays 200."""
    servers.plugin_site.add(
        "sleepy",
        """
        import pathlib, time
        import inference_server

        @inference_server.plugin_hook
        def predict_fn(data, model):
            deadline = time.monotonic() + 20
            while not pathlib.Path(data["gate"][0].decode()).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            return data
        """,
    )
    server = servers.start()
    gate = tmp_path / "gate"
    body = json_request({"name": "gate", "shape": [1], "datatype": "BYTES", "data": [str(gate)]})
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("POST", "/v2/models/sleepy/infer", body, {"Content-Type": "application/json"})
    server.wait_in_flight(1)
    os.kill(server.process.pid, signal.SIGTERM)
    wait_until(lambda: server.request("GET", "/v2/health/ready").status == 503, 10, "still ready after SIGTERM")
    assert server.request("GET", "/v2/models/sleepy/ready").status == 503
    assert server.request("GET", "/v2/health/live").status == 200
    gate.write_text("go")
    assert connection.getresponse().status == 200
    connection.close()


def test_the_same_model_answers_on_invocations_and_v2(servers: Any) -> None:
    """One server, one model: .npz on /invocations and binary tensors on v2 reach the same predict_fn with the
    same dict of arrays, and come back equal."""
    servers.plugin_site.add("echo_model", ECHO)
    server = servers.start()
    array = np.arange(120, dtype=np.float64).reshape(10, 3, 4)
    npz = io.BytesIO()
    np.savez(npz, x=array)
    reply = server.request(
        "POST", "/invocations", npz.getvalue(), {"Content-Type": "application/x-npz", "Accept": "application/x-npz"}
    )
    assert reply.status == 200
    np.testing.assert_array_equal(np.load(io.BytesIO(reply.body))["x"], array)
    result = connect(server).infer("echo_model", [tensor("x", array, "FP64", True)])
    np.testing.assert_array_equal(result.as_numpy("x"), array)


def test_the_repository_extension_loads_and_unloads_over_the_multi_model_registry(servers: Any, tmp_path: Path) -> None:
    """With --multi-model and --model-root: the index lists the root's models (unloaded until loaded), load and
    unload go through the same registry as SageMaker's /models API (a model loaded by either is seen by both),
    and each loaded model is served by its name."""
    servers.plugin_site.add("echo_model", ECHO)
    for name in ("alpha", "beta"):
        (tmp_path / "root" / name).mkdir(parents=True)
    server = servers.start("--multi-model", "--model-root", str(tmp_path / "root"), "--workers", "2")
    client = connect(server)
    assert "model_repository" in client.get_server_metadata()["extensions"]
    assert client.get_model_repository_index() == [
        {"name": "alpha", "state": "UNAVAILABLE", "reason": "unloaded"},
        {"name": "beta", "state": "UNAVAILABLE", "reason": "unloaded"},
    ]
    client.load_model("alpha")
    assert server.request("GET", "/models/alpha").status == 200  # SageMaker's API sees it
    assert client.is_model_ready("alpha")
    assert not client.is_model_ready("beta")
    result = client.infer("alpha", [tensor("v", np.array([1, 2, 3], dtype=np.int64), "INT64", True)])
    assert result.as_numpy("v").tolist() == [1, 2, 3]
    listed = client.get_model_repository_index()
    assert {"name": "alpha", "state": "READY"} in listed
    client.unload_model("alpha")
    assert server.request("GET", "/models/alpha").status == 404
    with pytest.raises(triton.InferenceServerException) as missing:
        client.load_model("gamma")
    assert missing.value.status() == "404"


def test_the_model_is_named_by_its_plugin_or_model_name_and_no_v2_turns_the_routes_off(servers: Any) -> None:
    """The one model is named after its plugin unless --model-name says otherwise (another name is a 404 naming
    the served one); with --no-v2 there is no /v2 at all, and /invocations still answers."""
    servers.plugin_site.add("echo_model", ECHO)
    named = servers.start("--model-name", "forecast")
    assert connect(named).is_model_ready("forecast")
    status, answer = raw(named, "/v2/models/echo_model/infer", json_request())
    assert status == 404
    assert "'forecast'" in answer["error"]
    off = servers.start("--no-v2")
    assert off.request("GET", "/v2/health/ready").status == 404
    assert off.request("POST", "/invocations", b"[1]", {"Content-Type": "application/json"}).status == 200


def test_names_of_no_model_never_fill_the_per_name_cache(tmp_path: Path) -> None:
    """On a multi-model server, inferences naming models that do not exist are 404s and leave nothing cached;
    a model that loads is remembered once."""
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    app = App(
        Settings(model_dir="/nonexistent", multi_model=True, model_root=str(root)),
        _plugins.build_manager([], [_Echo()]),
    )
    client = werkzeug.test.Client(app)
    body = json_request({"name": "x", "shape": [1], "datatype": "INT32", "data": [7]})
    for index in range(50):
        response = client.post(f"/v2/models/nothing-{index}/infer", data=body)
        assert response.status_code == 404, response.get_data()
    assert app._model_targets is not None
    assert app._model_targets._kept == {}
    assert client.post("/v2/repository/models/real/load", data=b"").status_code == 200
    for _ in range(3):
        assert client.post("/v2/models/real/infer", data=body).status_code == 200
    assert list(app._model_targets._kept) == [("real", False)]


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ([], "model_metadata returned a list, not a dict or None"),
        ({"inputs": [{"name": "x", "shape": [1]}]}, "inputs[0] ('x') with datatype None, not a v2 datatype"),
        ({"inputs": [{"datatype": "FP32", "shape": [1]}]}, "inputs[0] without a str name"),
        ({"outputs": [{"name": "y", "datatype": "FP32", "shape": [-2]}]}, "outputs[0] ('y') with shape [-2]"),
    ],
)
def test_a_signature_that_is_not_one_is_the_hooks_500_saying_what_is_wrong(metadata: Any, says: str) -> None:
    """A model_metadata answer that is not a signature makes the metadata route and inference a 500 whose error
    names the hook and what is wrong with its answer (not a KeyError from deep inside)."""

    class Broken(_Echo):
        @plugin_hook
        def model_metadata(self, model: Any) -> Any:
            return metadata

    app = App(Settings(model_dir="/nonexistent", model_name="model"), _plugins.build_manager([], [Broken()]))
    client = werkzeug.test.Client(app)
    for response in (
        client.get("/v2/models/model"),
        client.post(
            "/v2/models/model/infer", data=json_request({"name": "x", "shape": [1], "datatype": "FP32", "data": [1]})
        ),
    ):
        assert response.status_code == 500
        assert says in orjson.loads(response.get_data())["error"]


#: A model that sleeps ``{"sleep": [seconds]}`` in predict_fn, or fails on a negative sleep.
SLEEPER = """
    import time
    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        seconds = float(data["sleep"][0])
        if seconds < 0:
            raise ValueError("a negative sleep")
        time.sleep(seconds)
        return data
"""


def _sleep(client: triton.InferenceServerClient, model: str, seconds: float) -> None:
    client.infer(model, [tensor("sleep", np.array([seconds], dtype=np.float64), "FP64", True)])


def test_statistics_count_every_protocols_invocations_over_the_workers(servers: Any) -> None:
    """tritonclient's get_inference_statistics after infers on two workers: successes over v2 and /invocations,
    a failure apart, each stage's count and time (predict_fn's sleeps within compute_infer), the last inference."""
    servers.plugin_site.add("sleeper", SLEEPER)
    server = servers.start("--workers", "2")
    client = connect(server)
    before = client.get_inference_statistics("sleeper")["model_stats"][0]
    assert before["inference_count"] == 0
    assert before["last_inference"] == 0
    for _ in range(4):
        _sleep(client, "sleeper", 0.05)
    reply = server.request("POST", "/invocations", b'{"sleep": [0.05]}', {"Content-Type": "application/json"})
    assert reply.status == 200
    with pytest.raises(triton.InferenceServerException):
        _sleep(client, "sleeper", -1.0)

    def stats() -> dict[str, Any]:
        return client.get_inference_statistics("sleeper")["model_stats"][0]  # type: ignore[no-any-return]

    wait_until(
        lambda: stats()["inference_stats"]["fail"]["count"] == 1 and stats()["inference_count"] == 5,
        3,
        "the statistics never counted the six invocations",
    )
    found = stats()
    assert found["name"] == "sleeper"
    assert found["execution_count"] == 5
    timings = found["inference_stats"]
    for part in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert timings[part]["count"] == 5, part
    assert 5 * 0.05e9 <= timings["compute_infer"]["ns"] < timings["success"]["ns"]
    assert timings["fail"]["ns"] > 0
    assert abs(found["last_inference"] / 1000 - time.time()) < 60
    assert client.get_inference_statistics()["model_stats"] == [found]  # every model: the one
    assert "statistics" in client.get_server_metadata()["extensions"]
    with pytest.raises(triton.InferenceServerException) as missing:
        client.get_inference_statistics("other")
    assert missing.value.status() == "404"
    assert server.request("GET", "/v2/models/sleeper/versions/1/stats").status == 200


def test_statistics_on_a_multi_model_server_are_per_loaded_model(servers: Any, tmp_path: Path) -> None:
    """On a multi-model endpoint each loaded model has its own statistics (none for a model never invoked), and
    a model not loaded is a 404."""
    servers.plugin_site.add("sleeper", SLEEPER)
    for name in ("alpha", "beta"):
        (tmp_path / "root" / name).mkdir(parents=True)
    server = servers.start("--multi-model", "--model-root", str(tmp_path / "root"), "--workers", "2")
    client = connect(server)
    client.load_model("alpha")
    client.load_model("beta")
    for _ in range(3):
        _sleep(client, "alpha", 0.0)

    def counts() -> dict[str, int]:
        return {stat["name"]: stat["inference_count"] for stat in client.get_inference_statistics()["model_stats"]}

    wait_until(lambda: counts() == {"alpha": 3, "beta": 0}, 10, "the statistics never counted alpha's invocations")
    assert client.get_inference_statistics("alpha")["model_stats"][0]["inference_stats"]["compute_infer"]["count"] == 3
    client.unload_model("beta")
    with pytest.raises(triton.InferenceServerException) as missing:
        client.get_inference_statistics("beta")
    assert missing.value.status() == "404"


def test_statistics_are_off_with_the_metrics(servers: Any) -> None:
    """With --no-metrics the statistics route is absent and the extension is not announced."""
    servers.plugin_site.add("echo_model", ECHO)
    server = servers.start("--no-metrics")
    assert "statistics" not in connect(server).get_server_metadata()["extensions"]
    assert server.request("GET", "/v2/models/stats").status == 404
