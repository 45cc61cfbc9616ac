"""The Open Inference Protocol over gRPC (serve --grpc-port), through the real tritonclient.grpc."""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton

from tests.conftest import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent

#: Echoes each input, and says for each whether it reached predict_fn as a read-only view (``NAME_view``).
ECHO = """
    import numpy as np
    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return "echo"

    @inference_server.plugin_hook
    def predict_fn(data, model):
        if "fail" in data:
            raise ValueError("asked to fail")
        if "sleep" in data:
            import time
            time.sleep(float(data["sleep"][0]))
        out = dict(data)
        for name, array in data.items():
            out[name + "_view"] = np.array([not array.flags.owndata and not array.flags.writeable])
        return out
"""

ARRAYS = {
    "FP32": np.arange(12, dtype=np.float32).reshape(3, 4) / 3,
    "FP64": np.linspace(0, 1, 5),
    "INT8": np.array([-128, 0, 127], dtype=np.int8),
    "INT64": np.array([[-(2**62), 0, 2**62]], dtype=np.int64),
    "UINT16": np.array([0, 65535], dtype=np.uint16),
    "BOOL": np.array([True, False, True]),
    "BYTES": np.array([b"fair", b"", "isle \x00 \u00e9".encode()], dtype=object),
    "FP16": np.array([0.5, -2.0, 65504.0], dtype=np.float16),
}


def start(servers: Any, *args: str, env: dict[str, str] | None = None) -> tuple[Any, triton.InferenceServerClient]:
    servers.plugin_site.add("echo_model", ECHO)
    port = free_port()
    server = servers.start("--grpc-port", str(port), *args, env=env)
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    wait_until(lambda: _live(client), 10, "the gRPC port never answered")
    return server, client


def _live(client: triton.InferenceServerClient) -> bool:
    try:
        return bool(client.is_server_live())
    except triton.InferenceServerException:
        return False


def tensor(name: str, array: np.ndarray, datatype: str) -> triton.InferInput:
    given = triton.InferInput(name, list(array.shape), datatype)
    given.set_data_from_numpy(array)
    return given


def test_the_committed_descriptor_is_the_proto_compiled() -> None:
    """src/inference_server/grpc/_descriptor.py is what scripts/grpc_descriptor.py makes of inference.proto now."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("grpc_descriptor", ROOT / "scripts" / "grpc_descriptor.py")
    assert spec is not None
    assert spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert (ROOT / "src" / "inference_server" / "grpc" / "_descriptor.py").read_text() == script.compiled()


def test_health_metadata_and_every_datatype_both_ways(servers: Any) -> None:
    """Live, ready, model readiness and metadata; each datatype's raw contents reach predict_fn as read-only views
    on the message and come back equal in raw_output_contents."""
    _, client = start(servers, "--workers", "2")
    assert client.is_server_ready()
    assert client.is_model_ready("echo_model")
    assert not client.is_model_ready("other")
    assert "statistics" in client.get_server_metadata().extensions
    assert client.get_model_metadata("echo_model").inputs[0].name == "input_0"
    inputs = [tensor(f"in_{datatype}", array, datatype) for datatype, array in ARRAYS.items()]
    result = client.infer("echo_model", inputs, request_id="42")
    assert result.get_response().id == "42"
    for datatype, array in ARRAYS.items():
        got = result.as_numpy(f"in_{datatype}")
        assert (got.dtype, got.shape) == (array.dtype, array.shape), datatype
        assert got.tolist() == array.tolist(), datatype
        assert result.as_numpy(f"in_{datatype}_view").tolist() == [datatype != "BYTES"], datatype


def test_errors_are_their_status_codes_with_the_https_message(servers: Any) -> None:
    """An unknown model is NOT_FOUND, a raw content of the wrong size INVALID_ARGUMENT, a failing model INTERNAL,
    each with the message HTTP gives; the server goes on serving."""
    _, client = start(servers)
    x = tensor("x", np.ones(3, np.float32), "FP32")
    with pytest.raises(triton.InferenceServerException) as missing:
        client.infer("other", [x])
    assert missing.value.status() == "StatusCode.NOT_FOUND"
    assert "no model named 'other'" in missing.value.message()
    short = tensor("x", np.ones(3, np.float32), "FP32")
    short.set_shape([4])  # (after the data: tritonclient checks neither against the other then)
    with pytest.raises(triton.InferenceServerException) as wrong:
        client.infer("echo_model", [short])
    assert wrong.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "needs 16 bytes" in wrong.value.message()
    with pytest.raises(triton.InferenceServerException) as failed:
        client.infer("echo_model", [tensor("fail", np.ones(1, np.int32), "INT32")])
    assert failed.value.status() == "StatusCode.INTERNAL"
    assert "ValueError" in failed.value.message()
    assert client.infer("echo_model", [x]).as_numpy("x").tolist() == [1.0, 1.0, 1.0]


def test_a_message_over_the_body_limit_is_resource_exhausted(servers: Any) -> None:
    """A ModelInferRequest larger than MaxPayloadInMB is refused by gRPC as RESOURCE_EXHAUSTED."""
    _, client = start(servers, env={"SAGEMAKER_MAX_PAYLOAD_IN_MB": "1"})
    with pytest.raises(triton.InferenceServerException) as big:
        client.infer("echo_model", [tensor("x", np.zeros(300_000, np.float32), "FP32")])
    assert big.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert client.is_server_live()


def test_a_deadline_shorter_than_the_model_is_deadline_exceeded(servers: Any) -> None:
    """The client's gRPC deadline passing while the model works gives DEADLINE_EXCEEDED."""
    _, client = start(servers)
    with pytest.raises(triton.InferenceServerException) as late:
        client.infer("echo_model", [tensor("sleep", np.array([2.0]), "FP64")], client_timeout=0.5)
    assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"


def test_a_stream_answers_each_request_and_goes_on_after_an_error(servers: Any) -> None:
    """ModelStreamInfer: each request of the stream gets its answer, in order; a failing one its error message."""
    _, client = start(servers)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for value in (1, 2):
            client.async_stream_infer("echo_model", [tensor("x", np.array([value], np.int64), "INT64")])
        client.async_stream_infer("echo_model", [tensor("fail", np.ones(1, np.int32), "INT32")])
        client.async_stream_infer("echo_model", [tensor("x", np.array([3], np.int64), "INT64")])
        got = [answers.get(timeout=10) for _ in range(4)]
    finally:
        client.stop_stream()
    assert [result.as_numpy("x").tolist() for result, _ in (got[0], got[1], got[3])] == [[1], [2], [3]]
    assert got[2][0] is None
    assert "predict_fn raised ValueError" in got[2][1].message()


def test_statistics_and_the_repository_on_a_multi_model_server(servers: Any, tmp_path: Path) -> None:
    """RepositoryIndex, RepositoryModelLoad and RepositoryModelUnload over the same registry as /models, on two
    workers; ModelStatistics counts a loaded model's inferences."""
    for name in ("alpha", "beta"):
        (tmp_path / "root" / name).mkdir(parents=True)
    server, client = start(servers, "--multi-model", "--model-root", str(tmp_path / "root"), "--workers", "2")
    index = client.get_model_repository_index().models
    assert [(model.name, model.state) for model in index] == [("alpha", "UNAVAILABLE"), ("beta", "UNAVAILABLE")]
    client.load_model("alpha")
    assert server.request("GET", "/models/alpha").status == 200
    for _ in range(3):
        client.infer("alpha", [tensor("x", np.ones(2, np.float32), "FP32")])

    def count() -> int:
        return int(client.get_inference_statistics("alpha").model_stats[0].inference_count)

    wait_until(lambda: count() == 3, 10, "the statistics never counted alpha's three inferences")
    listed = {(model.name, model.state) for model in client.get_model_repository_index().models}
    assert listed == {("alpha", "READY"), ("beta", "UNAVAILABLE")}
    client.unload_model("alpha")
    assert server.request("GET", "/models/alpha").status == 404
    with pytest.raises(triton.InferenceServerException) as missing:
        client.load_model("gamma")
    assert missing.value.status() == "StatusCode.NOT_FOUND"
    started = time.monotonic()
    assert not client.is_model_ready("alpha")
    assert time.monotonic() - started < 5
