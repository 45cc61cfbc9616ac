"""The Open Inference Protocol over gRPC (serve --grpc-port), through the real tritonclient.grpc."""

from __future__ import annotations

import contextlib
import queue
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ARRIVED, Arrivals, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent

#: Echoes each input, and says for each whether it reached predict_fn as a read-only view (``NAME_view``).
ECHO = (
    ARRIVED
    + """
    import numpy as np
    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return "echo"

    @inference_server.plugin_hook
    def predict_fn(data, model):
        arrived()
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
)

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


def start(
    servers: Any, *args: str, env: dict[str, str] | None = None, model: tuple[str, str] = ("echo_model", ECHO)
) -> tuple[Any, triton.InferenceServerClient]:
    """A server of ``model`` (plugin name, source) with --grpc-port on a free port (its ``grpc_port``), and a gRPC
    client once that port answers."""
    servers.plugin_site.add(*model)
    port = free_port()
    server = servers.start("--grpc-port", str(port), *args, env=env)
    server.grpc_port = port
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
    """Live, ready, model readiness and metadata, on --host alone; each datatype's raw contents reach predict_fn as
    read-only views on the message and come back equal in raw_output_contents."""
    server, client = start(servers, "--workers", "2")
    assert client.is_server_ready()
    elsewhere = triton.InferenceServerClient(f"127.0.0.2:{server.grpc_port}")  # (another loopback address)
    with pytest.raises(triton.InferenceServerException):  # the workers listen on --host (127.0.0.1) alone
        elsewhere.is_server_live(client_timeout=2)
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
    each with the message HTTP gives, an RPC not served UNIMPLEMENTED; the server goes on serving."""
    server, client = start(servers)
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
    import grpc

    with grpc.insecure_channel(
        f"127.0.0.1:{server.grpc_port}"
    ) as channel:  # a request message that is not one: never a 500
        for method in ("ModelReady", "ModelMetadata", "ModelStatistics", "ModelInfer"):
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            with pytest.raises(grpc.RpcError) as garbage:
                call(b"\xff\xff\xff")
            assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert "protobuf message" in (garbage.value.details() or ""), method
    with pytest.raises(triton.InferenceServerException) as unimplemented:
        client.get_model_config("echo_model")  # (Triton's model configuration: not served)
    assert unimplemented.value.status() == "StatusCode.UNIMPLEMENTED"
    assert client.infer("echo_model", [x]).as_numpy("x").tolist() == [1.0, 1.0, 1.0]


def test_a_modelinfer_the_front_refuses_is_counted_and_logged(servers: Any) -> None:
    """A ModelInfer the front refuses before the app sees it (a message that is not one: 400; a model name with a
    ``/``: 404), alone or in a stream, is counted in /metrics (route ``other``) and has its access line with the
    client's request id, as the app's own refusals before a route do."""
    import grpc

    server, _ = start(servers)
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as garbage:
            infer(b"\xff\xff\xff", metadata=(("x-request-id", "refused-1"),))
        assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        from tritonclient.grpc import service_pb2

        slashed = service_pb2.ModelInferRequest(model_name="a/b").SerializeToString()
        with pytest.raises(grpc.RpcError) as unnamed:
            infer(slashed, metadata=(("x-request-id", "refused-2"),))
        assert unnamed.value.code() == grpc.StatusCode.NOT_FOUND
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        answers = list(stream(iter([b"\xff\xff\xff"]), metadata=(("x-request-id", "refused-3"),)))
        assert len(answers) == 1  # its error message, and the stream ends with the client's requests
    wait_until(
        lambda: server.metric("inference_server_requests_total", route="other", method="POST", status="400") == 2,
        10,
        "the two refusals of messages that are not ones counted",
    )
    assert server.metric("inference_server_requests_total", route="other", method="POST", status="404") == 1
    assert server.metric("inference_server_requests_in_flight") == 0  # (never counted in, never counted out)
    lines = [orjson.loads(line) for line in server.output().splitlines() if '"inference_server.access"' in line]
    logged = {(line.get("request_id"), line["status"], line["route"], line["path"]) for line in lines}
    path = "/inference.GRPCInferenceService/ModelInfer"
    assert {
        ("refused-1", 400, "other", path),
        ("refused-2", 404, "other", path),
        ("refused-3", 400, "other", path),
    } <= (logged)


def test_a_message_over_the_body_limit_is_resource_exhausted(servers: Any) -> None:
    """A ModelInferRequest larger than MaxPayloadInMB is refused by gRPC as RESOURCE_EXHAUSTED."""
    _, client = start(servers, env={"SAGEMAKER_MAX_PAYLOAD_IN_MB": "1"})
    with pytest.raises(triton.InferenceServerException) as big:
        client.infer("echo_model", [tensor("x", np.zeros(300_000, np.float32), "FP32")])
    assert big.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert client.is_server_live()


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_a_deadline_shorter_than_the_model_is_deadline_exceeded(servers: Any, arrivals: Arrivals, backend: str) -> None:
    """The client's gRPC deadline passing while the model works gives DEADLINE_EXCEEDED (the work finishes: only
    --timeout ends running work); requests whose deadline passes while they wait for the one model slot are never
    run (the statistics count them as failures, and two predict_fn calls in all), and the worker goes on serving."""
    _, client = start(servers, "--workers", "1", "--threads", "1", "--server", backend, env=arrivals.env)
    with pytest.raises(triton.InferenceServerException) as late:
        client.infer("echo_model", [tensor("sleep", np.array([0.3]), "FP64")], client_timeout=0.1)
    assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(client.infer, "echo_model", [tensor("sleep", np.array([1.5]), "FP64")])
        arrivals.wait(2)  # (the first sleeper's call, then the slow one's: it holds the one model slot)
        for _ in range(3):  # (each waits for the one model slot, and never gets it before its deadline)
            with pytest.raises(triton.InferenceServerException) as expired:
                client.infer("echo_model", [tensor("x", np.ones(1, np.int32), "INT32")], client_timeout=0.3)
            assert expired.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        slow.result(timeout=10)

    def counted() -> dict[str, Any]:
        return client.get_inference_statistics("echo_model").model_stats[0].inference_stats  # type: ignore[no-any-return]

    # (the first sleeper ran past its client's deadline: once the model runs only --timeout bounds it, a success)
    wait_until(lambda: counted().fail.count == 3, 10, "the expired requests were never counted as failures")
    assert counted().compute_infer.count == 2  # the first sleeper's and the slow one's: never the expired one's
    assert arrivals.count() == 2
    assert client.infer("echo_model", [tensor("x", np.ones(1, np.int32), "INT32")]).as_numpy("x").tolist() == [1]


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
    client.load_model("beta")
    with pytest.raises(triton.InferenceServerException) as twice:
        client.load_model("beta")
    assert twice.value.status() == "StatusCode.ALREADY_EXISTS"
    started = time.monotonic()
    assert not client.is_model_ready("alpha")
    assert time.monotonic() - started < 5


#: A decoupled model: each request's "n" (INT64) is answered with n responses, one per item of a generator; a
#: negative n breaks the generator after its first item.
COUNTER = """
    import numpy as np
    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return "counter"

    @inference_server.plugin_hook
    def predict_fn(data, model):
        n = int(data["n"][0])
        for index in range(max(n, 1)):
            yield {"index": np.array([index], np.int64)}
        if n < 0:
            raise RuntimeError("broken stream")
"""


def test_a_streamed_model_answers_modelstreaminfer_once_per_item(servers: Any) -> None:
    """A generator predict_fn (Triton's decoupled model): each request of a ModelStreamInfer stream gets one
    response per item, in order, through tritonclient's stream; a generator that breaks ends its request with an
    error message and the stream goes on; ModelInfer says to call ModelStreamInfer."""
    _, client = start(servers, model=("counter", COUNTER))
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("counter", [tensor("n", np.array([3], np.int64), "INT64")], request_id="a")
        client.async_stream_infer("counter", [tensor("n", np.array([2], np.int64), "INT64")], request_id="b")
        client.async_stream_infer("counter", [tensor("n", np.array([-1], np.int64), "INT64")], request_id="c")
        client.async_stream_infer("counter", [tensor("n", np.array([1], np.int64), "INT64")], request_id="d")
        got = [answers.get(timeout=10) for _ in range(8)]
    finally:
        client.stop_stream()
    broken = got.pop(6)  # (c's first item came before its error)
    assert broken[0] is None
    assert "the model's stream failed: the response stream raised RuntimeError" in broken[1].message()
    assert [error for _, error in got] == [None] * 7
    responses = [(result.get_response().id, result.as_numpy("index").tolist()) for result, _ in got]
    assert responses == [("a", [0]), ("a", [1]), ("a", [2]), ("b", [0]), ("b", [1]), ("c", [0]), ("d", [0])]
    with pytest.raises(triton.InferenceServerException) as unary:
        client.infer("counter", [tensor("n", np.array([1], np.int64), "INT64")])
    assert unary.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "ModelStreamInfer" in unary.value.message()


def test_an_empty_final_response_ends_each_request_when_asked(servers: Any) -> None:
    """With tritonclient's enable_empty_final_response, a decoupled model's answers to a request end with an empty
    response flagged triton_final_response (its others flagged false), as Triton sends them."""
    _, client = start(servers, model=("counter", COUNTER))
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        n = tensor("n", np.array([2], np.int64), "INT64")
        client.async_stream_infer("counter", [n], request_id="e", enable_empty_final_response=True)
        got = [answers.get(timeout=10) for _ in range(3)]
    finally:
        client.stop_stream()
    responses = [result.get_response() for result, _ in got]
    assert [response.id for response in responses] == ["e", "e", "e"]
    assert [response.parameters["triton_final_response"].bool_param for response in responses] == [False, False, True]
    assert [len(response.outputs) for response in responses] == [1, 1, 0]


def test_the_asyncio_client_streams_too(servers: Any) -> None:
    """tritonclient.grpc.aio's stream_infer reads a streamed model's responses as they come."""
    import asyncio

    import tritonclient.grpc.aio as aio

    server, _ = start(servers, model=("counter", COUNTER))
    port = server.grpc_port

    async def run() -> list[int]:
        async with aio.InferenceServerClient(f"127.0.0.1:{port}") as client:

            async def requests() -> Any:
                yield {"model_name": "counter", "inputs": [tensor("n", np.array([4], np.int64), "INT64")]}

            indices = []
            async for result, error in client.stream_infer(requests()):
                assert error is None
                indices.append(int(result.as_numpy("index")[0]))
                if len(indices) == 4:
                    break
            return indices

    assert asyncio.run(run()) == [0, 1, 2, 3]


#: A decoupled model that yields "a", then waits for the file named by its "gate" input, then yields "b" and "c".
GATED = """
    import os
    import time

    import numpy as np
    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return "gated"

    @inference_server.plugin_hook
    def predict_fn(data, model):
        gate = data["gate"][0].decode()
        yield {"item": np.array([b"a"], dtype=object)}
        while not os.path.exists(gate):
            time.sleep(0.02)
        yield {"item": np.array([b"b"], dtype=object)}
        yield {"item": np.array([b"c"], dtype=object)}
"""


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_sigterm_lets_an_open_stream_finish(backend: str, servers: Any, tmp_path: Path) -> None:
    """A ModelStreamInfer stream open when SIGTERM comes goes on to its last response; a new RPC meanwhile is
    UNAVAILABLE; then the server exits."""
    server, client = start(servers, "--server", backend, "--workers", "1", model=("gated", GATED))
    gate = tmp_path / "gate"
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("gated", [tensor("gate", np.array([str(gate).encode()], dtype=object), "BYTES")])
        first, error = answers.get(timeout=10)
        assert error is None
        assert first.as_numpy("item").tolist() == [b"a"]
        server.process.send_signal(signal.SIGTERM)
        wait_until(lambda: not client.is_server_ready(), 10, "the server still ready after SIGTERM")
        with pytest.raises(triton.InferenceServerException) as refused:
            client.infer("gated", [tensor("gate", np.array([b"x"], dtype=object), "BYTES")])
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        gate.write_text("go")
        rest = [answers.get(timeout=10) for _ in range(2)]
    finally:
        client.stop_stream()
    assert [result.as_numpy("item").tolist() for result, _ in rest] == [[b"b"], [b"c"]]
    assert server.process.wait(20) == 0


def _valid_request() -> bytes:
    """A ModelInferRequest of two inputs, one raw and one in typed contents, as tritonclient's messages make it."""
    from inference_server.grpc._messages import message

    request = message("ModelInferRequest")(model_name="m", id="1")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 2])
    request.inputs.add(name="s", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    request.raw_input_contents.append(b"\x02\x00\x00\x00hi")
    return request.SerializeToString()  # type: ignore[no-any-return]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200) | st.builds(lambda cut, flip: (cut, flip), st.integers(0, 80), st.integers(0, 255)))
def test_hostile_messages_are_decode_errors(case: Any) -> None:
    """Random bytes, and a valid message cut short or with a byte changed, decode or raise DecodeError (a 400),
    never anything else."""
    from inference_server.errors import DecodeError
    from inference_server.grpc import wire

    if isinstance(case, tuple):
        body = bytearray(_valid_request())
        cut, flip = case
        body[cut % len(body)] ^= flip
        body = body[: len(body) - cut % 7]
    else:
        body = case
    with contextlib.suppress(DecodeError):
        wire.decode_request(bytes(body))


def test_raw_contents_are_views_on_the_message_and_typed_contents_are_checked() -> None:
    """In-process: raw contents decode as views sharing the message's memory; typed contents of the wrong count,
    a missing raw content, contents given both ways, millions of tiny fields and a negative dimension are
    DecodeErrors saying so."""
    from inference_server.errors import DecodeError
    from inference_server.grpc import wire
    from inference_server.grpc._messages import message

    body = _valid_request()
    name, request = wire.decode_request(body)
    assert name == "m"
    assert np.shares_memory(request.inputs["x"], np.frombuffer(body, np.uint8))
    assert request.inputs["s"].tolist() == [b"hi"]
    typed = message("ModelInferRequest")(model_name="m")
    typed.inputs.add(name="i", datatype="INT32", shape=[3]).contents.int_contents.extend([1, 2])
    with pytest.raises(DecodeError, match=r"input 'i': has 2 values in contents.int_contents, but shape \[3\] holds 3"):
        wire.decode_request(typed.SerializeToString())
    uneven = message("ModelInferRequest").FromString(body)
    del uneven.raw_input_contents[1]
    with pytest.raises(DecodeError, match="2 inputs but 1 raw_input_contents"):
        wire.decode_request(uneven.SerializeToString())
    both = message("ModelInferRequest").FromString(body)
    both.inputs[0].contents.fp32_contents.extend([0.0] * 4)
    with pytest.raises(DecodeError, match="has contents, but the request has raw_input_contents"):
        wire.decode_request(both.SerializeToString())
    started = time.monotonic()
    with pytest.raises(DecodeError, match="the ModelInferRequest has over 16448 fields"):
        wire.decode_request(b"\x08\x00" * 3_000_000)  # (6 MB of tiny fields: refused at once, not walked)
    assert time.monotonic() - started < 1
    negative = message("ModelInferRequest")(model_name="m")
    negative.inputs.add(name="n", datatype="FP32", shape=[-1]).contents.fp32_contents.append(1.0)
    with pytest.raises(DecodeError, match="negative dimension"):
        wire.decode_request(negative.SerializeToString())
