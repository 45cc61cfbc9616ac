"""``V2Client``: the Open Inference Protocol v2 client, against a real server on 127.0.0.1 (binary tensors both ways
by default, JSON on request, errors as ``PredictionError``)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from inference_server.client import InferenceResponse, V2Client
from inference_server.errors import EncodeError, PredictionError
from tests.test_wsgi_v2 import ECHO

SIGNED = """
    import numpy as np
    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return {"y": np.asarray(data["x"]) * 2, "count": np.array([len(data["x"])])}

    @inference_server.plugin_hook
    def model_metadata(model):
        return {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
            "outputs": [
                {"name": "y", "datatype": "FP32", "shape": [-1, 3]},
                {"name": "count", "datatype": "INT64", "shape": [1]},
            ],
        }
"""

ARRAYS = {
    "FP64": np.random.default_rng(0).standard_normal((10, 3, 4)),
    "FP32": np.arange(12, dtype=np.float32).reshape(3, 4) / 3,
    "INT64": np.array([[-(2**62), 0, 2**62]], dtype=np.int64),
    "UINT8": np.array([0, 255], dtype=np.uint8),
    "BOOL": np.array([True, False, True]),
    "BYTES": np.array([b"fair", b"", "isle \x00 \u00e9".encode()], dtype=object),
    "FP16": np.array([0.5, -2.0, 65504.0], dtype=np.float16),
}


@pytest.fixture
def echo(servers: Any) -> Any:
    servers.plugin_site.add("echo_model", ECHO)
    return servers.start()


def url(server: Any) -> str:
    return f"http://127.0.0.1:{server.port}"


def _owner(array: np.ndarray) -> Any:
    """The object whose memory an array views: down its bases to the buffer ``np.frombuffer`` was given."""
    base: Any = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


@pytest.mark.parametrize("binary", [True, False])
def test_every_datatype_comes_back_equal_as_binary_or_json(echo: Any, binary: bool) -> None:
    """Each datatype's tensor sent and answered as binary data (the default) or as JSON comes back equal, with its
    dtype and shape; FP16 cannot travel as JSON and says so before anything is sent."""
    with V2Client(url(echo), "echo_model", binary=binary) as client:
        for datatype, array in ARRAYS.items():
            if datatype == "FP16" and not binary:
                with pytest.raises(EncodeError, match="input 't' is FP16, which cannot be sent as JSON"):
                    client.infer({"t": array})
                continue
            response = client.infer({"t": array}, request_id=f"id-{datatype}")
            assert isinstance(response, InferenceResponse)
            got = response.outputs["t"]
            assert (got.shape, got.dtype) == (array.shape, array.dtype), datatype
            assert got.tolist() == array.tolist(), datatype
            assert response.datatypes == {"t": datatype}
            assert (response.model_name, response.id) == ("echo_model", f"id-{datatype}")


def test_binary_outputs_are_views_on_the_answer_and_outputs_select(echo: Any) -> None:
    """Binary outputs are views on the one buffer the answer was read into (no copy per tensor); ``outputs`` picks
    tensors by name, and JSON may be asked for the outputs alone."""
    client = V2Client(url(echo), "echo_model")
    a, b = np.arange(1000, dtype=np.float64), np.ones((4, 4), dtype=np.int32)
    response = client.infer({"a": a, "b": b})
    assert _owner(response.outputs["a"]) is _owner(response.outputs["b"])
    assert isinstance(_owner(response.outputs["a"]), np.ndarray)  # the answer's buffer
    only_b = client.infer({"a": a, "b": b}, ["b"], binary_output=False)
    assert list(only_b.outputs) == ["b"]
    np.testing.assert_array_equal(only_b.outputs["b"], b)
    client.close()


def test_health_metadata_and_errors(servers: Any) -> None:
    """is_live/is_ready/is_model_ready, the server's and the model's metadata, and error answers raised as
    PredictionError with the server's status and message (unknown model, a shape the signature refuses, an output
    the model lacks)."""
    servers.plugin_site.add("signed", SIGNED)
    server = servers.start()
    with V2Client(url(server), "signed") as client:
        assert client.is_live()
        assert client.is_ready()
        assert client.is_model_ready()
        assert not client.is_model_ready("nothing")
        assert "binary_tensor_data" in client.server_metadata()["extensions"]
        assert client.model_metadata()["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
        response = client.infer({"x": np.ones((5, 3), dtype=np.float32)})
        np.testing.assert_array_equal(response.outputs["y"], np.full((5, 3), 2.0, dtype=np.float32))
        assert response.outputs["count"].tolist() == [5]
        for call, status, says in (
            (lambda: client.infer({"x": np.ones((1, 3), np.float32)}, model_name="nothing"), 404, "no model named"),
            (
                lambda: client.infer({"x": np.ones((1, 4), np.float32)}),
                400,
                "shape [1, 4], but the model takes [-1, 3]",
            ),
            (lambda: client.infer({"x": np.ones((1, 3), np.float32)}, ["z"]), 400, "requested output 'z'"),
            (lambda: client.model_metadata("nothing"), 404, "no model named 'nothing'"),
        ):
            with pytest.raises(PredictionError) as refused:
                call()
            assert refused.value.status == status
            assert says in refused.value.message
        assert client.infer({"x": np.zeros((1, 3), np.float32)}).outputs["count"].tolist() == [1]  # still serving
    with pytest.raises(ValueError, match="which model"):
        V2Client(url(server)).infer({"x": np.ones((1, 3), np.float32)})


def test_one_client_serves_many_threads_each_on_its_own_connection(echo: Any) -> None:
    """Threads sharing a client each get their own kept-alive connection (closed by each); every answer is its own
    request's."""
    client = V2Client(url(echo), "echo_model")
    failures: list[str] = []

    def work(index: int) -> None:
        for round_ in range(20):
            array = np.full(100, index * 1000 + round_, dtype=np.int64)
            got = client.infer({"v": array}).outputs["v"]
            if not np.array_equal(got, array):
                failures.append(f"thread {index} round {round_}")
        client.close()  # this thread's connection

    threads = [threading.Thread(target=work, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
