"""Our Predictor, and the real boto3 and SageMaker SDK clients, against a real server subprocess."""

from __future__ import annotations

import concurrent.futures
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pyarrow as pa
import pytest
import sagemaker
import sagemaker.deserializers
import sagemaker.serializers

from inference_server import client
from inference_server.errors import PredictionError
from tests.conftest import local_aws_env

MODEL = """
    import numpy as np
    import werkzeug.exceptions
    import inference_server

    @inference_server.plugin_hook
    def predict_fn(data, model):
        if isinstance(data, np.ndarray) and data.dtype.kind == "f":
            if np.isnan(data).any():
                raise werkzeug.exceptions.BadRequest("features must not be NaN")
            if (data < 0).any():
                raise ZeroDivisionError("negative features")
            scores = data.sum(axis=-1)
            return {"scores": scores, "conf": np.tanh(scores), "explains": data / scores[..., None]}
        return data
"""


@pytest.fixture
def server(servers: Any, plugin_site: Any) -> Any:
    """A server whose model explains float arrays with three named outputs, and echoes anything else."""
    plugin_site.add("explainer", MODEL)
    return servers.start()


@pytest.fixture
def local_aws(monkeypatch: pytest.MonkeyPatch, server: Any) -> str:
    """Dummy credentials and AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME pointing at the local server."""
    return _point_aws_at(monkeypatch, server)


def _point_aws_at(monkeypatch: pytest.MonkeyPatch, server: Any) -> str:
    """Set the local AWS variables (local_aws_env) for ``server``; return its URL."""
    url = _url(server)
    for name, value in local_aws_env(url).items():
        monkeypatch.setenv(name, value)
    return url


def _url(server: Any) -> str:
    return f"http://127.0.0.1:{server.port}"


def test_predictor_npy_in_npz_out_as_a_dict(server: Any) -> None:
    """NumpySerializer in, NumpyDeserializer(accept npz) out: a dict of the model's named arrays."""
    with client.Predictor(
        _url(server), client.NumpySerializer(), client.NumpyDeserializer(accept="application/x-npz")
    ) as predictor:
        result = predictor.predict(np.array([[1.0, 3.0], [2.0, 2.0]]))
    assert list(result) == ["scores", "conf", "explains"]
    assert result["scores"].tolist() == [4.0, 4.0]


def test_predictor_npy_round_trip_and_connection_reuse(server: Any) -> None:
    """Repeated npy predictions reuse one kept-alive connection per thread."""
    predictor = client.Predictor(_url(server), client.NumpySerializer(), client.NpzDeserializer())
    for _ in range(3):
        result = predictor.predict(np.ones((2, 2)))
        assert result["scores"].tolist() == [2.0, 2.0]
    connection = predictor._transport._local.connection  # type: ignore[attr-defined]
    predictor.predict(np.ones((1, 2)))
    assert predictor._transport._local.connection is connection  # type: ignore[attr-defined]
    predictor.close()


def test_predictor_json_csv_and_arrow(server: Any) -> None:
    """JSON and Arrow come back equal through the echo path; CSV rows arrive as floats and are explained."""
    url = _url(server)
    with client.Predictor(url, client.JSONSerializer(), client.JSONDeserializer()) as predictor:
        assert predictor.predict({"a": [1, 2]}) == {"a": [1, 2]}
    with client.Predictor(url, client.CSVSerializer(), client.NumpyDeserializer(accept="application/x-npz")) as csv:
        assert csv.predict([[1, 2], [3, 4]])["scores"].tolist() == [3.0, 7.0]
    table = pa.table({"x": [1, 2], "y": ["a", "b"]})
    with client.Predictor(url, client.ArrowSerializer(), client.ArrowDeserializer()) as arrow:
        assert arrow.predict(table).equals(table)


def test_predictor_large_array(server: Any) -> None:
    """A large npy answer (4 MB) is read whole into one buffer."""
    data = np.arange(500_000, dtype=np.int64)  # int: echoed, not explained
    with client.Predictor(_url(server), client.NumpySerializer(), client.NumpyDeserializer()) as predictor:
        assert np.array_equal(predictor.predict(data), data)


def test_predictor_errors_carry_status_and_message(server: Any) -> None:
    """A 4xx or 5xx answer raises PredictionError with the status, the server's message and the request id."""
    with client.Predictor(_url(server), client.NumpySerializer(), client.NumpyDeserializer()) as predictor:
        with pytest.raises(PredictionError) as caught:
            predictor.predict(np.array([np.nan]))
        assert (caught.value.status, caught.value.message) == (400, "features must not be NaN")
        assert caught.value.request_id
        with pytest.raises(PredictionError) as caught:
            predictor.predict(np.array([-1.0]))
        assert caught.value.status == 500
        assert predictor.predict(np.array([1, 2])).tolist() == [1, 2]  # the connection still works


def test_predictor_reports_a_body_over_the_limit(server: Any) -> None:
    """A body over MaxPayloadInMB (6 MB here) is a PredictionError 413, even though the server answers early."""
    with client.Predictor(_url(server), client.NumpySerializer(), client.NumpyDeserializer()) as predictor:
        with pytest.raises(PredictionError) as caught:
            predictor.predict(np.zeros(1_000_000, dtype=np.int64))
        assert caught.value.status == 413
        assert "MaxPayloadInMB" in caught.value.message


def test_predictor_is_thread_safe(server: Any) -> None:
    """Threads sharing a Predictor each get their own connection and the right answers; one thread's close() leaves
    the requests of the others to finish, and closes their connections once they are done."""
    predictor = client.Predictor(_url(server), client.NumpySerializer(), client.NumpyDeserializer())
    failures: list[BaseException] = []

    def work(value: int) -> None:
        try:
            for _ in range(20):
                assert predictor.predict(np.full(3, value)).tolist() == [value] * 3
        except BaseException as exc:
            failures.append(exc)

    def work_and_close(value: int) -> None:
        work(value)
        predictor.close()  # while other threads are still at work: their requests go on

    threads = [threading.Thread(target=work_and_close, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert _established(server.port) == 0  # each connection closed once its requests were done


def _established(port: int) -> int:
    """Client sockets connected to 127.0.0.1:``port`` and ESTABLISHED, on this machine (from /proc/net/tcp)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state = fields[2], fields[3]
        if remote == f"0100007F:{port:04X}" and state == "01":
            count += 1
    return count


def test_close_closes_the_connection_of_every_thread(server: Any) -> None:
    """close() closes the kept-alive connections of every thread that used the Predictor (a thread pool's), not only
    the calling thread's; the Predictor opens new ones if used again."""
    predictor = client.Predictor(_url(server), client.NumpySerializer(), client.NumpyDeserializer())
    together = threading.Barrier(4, timeout=30)

    def work(value: int) -> list[int]:
        together.wait()  # four threads of the pool, each with a connection of its own
        return predictor.predict(np.full(2, value)).tolist()  # type: ignore[no-any-return]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert list(pool.map(work, range(4))) == [[value, value] for value in range(4)]
        assert _established(server.port) == 4
        predictor.close()
        assert _established(server.port) == 0
        assert pool.submit(predictor.predict, np.ones(1, dtype=np.int64)).result(30).tolist() == [1]
        predictor.close()
        assert _established(server.port) == 0


def test_predictor_sends_sagemaker_headers(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """Custom attributes come back; inference id and target model reach the server as SageMaker's headers (the
    target model routed to that model under --model-root)."""
    (tmp_path / "m.tar.gz").mkdir()
    server = servers.start("--model-root", str(tmp_path), plugins=[])
    with client.Predictor(_url(server), client.IdentitySerializer(), client.BytesDeserializer()) as predictor:
        answer = predictor.predict(b"x", custom_attributes="a=1", inference_id="id-1", target_model="m.tar.gz")
    assert answer == b"x"


def test_boto3_invoke_endpoint(local_aws: str) -> None:
    """Unmodified boto3 reaches the local server: body, content type and custom attributes."""
    runtime = boto3.client("sagemaker-runtime")
    body = client.NumpySerializer().serialize(np.array([[1.0, 1.0]]))
    response = runtime.invoke_endpoint(
        EndpointName="my-endpoint",
        Body=body,
        ContentType="application/x-npy",
        Accept="application/x-npz",
        CustomAttributes="trace=on",
        InferenceId="inference-42",
    )
    assert response["ContentType"] == "application/x-npz"
    assert response["CustomAttributes"] == "trace=on"
    assert response["InvokedProductionVariant"] == "AllTraffic"
    result = client.NumpyDeserializer().deserialize(response["Body"], response["ContentType"])
    assert result["scores"].tolist() == [2.0]


def test_boto3_model_error(local_aws: str) -> None:
    """A container error reaches boto3 as ModelError carrying the original status and message."""
    runtime = boto3.client("sagemaker-runtime")
    body = client.NumpySerializer().serialize(np.array([np.nan]))
    with pytest.raises(runtime.exceptions.ModelError) as caught:
        runtime.invoke_endpoint(EndpointName="e", Body=body, ContentType="application/x-npy")
    assert caught.value.response["OriginalStatusCode"] == 400
    assert "features must not be NaN" in caught.value.response["OriginalMessage"]
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 424


def test_predictor_for_endpoint(local_aws: str) -> None:
    """Predictor.for_endpoint goes through boto3; a model error is a PredictionError with the model's status."""
    predictor = client.Predictor.for_endpoint("e", client.NumpySerializer(), client.NpzDeserializer())
    assert predictor.predict(np.array([[2.0, 2.0]]), custom_attributes="x=1")["scores"].tolist() == [4.0]
    with pytest.raises(PredictionError) as caught:
        predictor.predict(np.array([-1.0]))
    assert caught.value.status == 500


def test_sagemaker_sdk_predictor_with_sdk_serializers(local_aws: str) -> None:
    """The SageMaker SDK v2 Predictor with its own NumpySerializer and NumpyDeserializer(accept npz)."""
    predictor = sagemaker.Predictor(
        "my-endpoint",
        serializer=sagemaker.serializers.NumpySerializer(),
        deserializer=sagemaker.deserializers.NumpyDeserializer(accept="application/x-npz"),
    )
    result = predictor.predict(np.array([[1.0, 3.0]]))
    assert result["explains"].tolist() == [[0.25, 0.75]]  # the SDK's lazy NpzFile, read by name


def test_sagemaker_sdk_predictor_with_ours(local_aws: str) -> None:
    """Our serializer and deserializer drop into the SDK's Predictor and give a plain dict."""
    predictor = sagemaker.Predictor(
        "my-endpoint",
        serializer=client.NumpySerializer(),
        deserializer=client.NumpyDeserializer(accept="application/x-npz"),
    )
    result = predictor.predict(np.array([[1.0, 3.0]]))
    assert type(result) is dict
    assert result["scores"].tolist() == [4.0]


@pytest.fixture
def echo_aws(monkeypatch: pytest.MonkeyPatch, servers: Any) -> str:
    """A server with the built-in hooks only (an echo), and the local AWS variables pointing at it."""
    return _point_aws_at(monkeypatch, servers.start(plugins=[]))


def test_sagemaker_sdk_predictor_sends_text_mode_files_and_strings(echo_aws: str, tmp_path: Any) -> None:
    """Our CSVSerializer in the SDK's Predictor with open(path) in text mode, io.StringIO and rows of strings."""
    import io

    path = tmp_path / "rows.csv"
    path.write_text("1,2\n3,4")
    predictor = sagemaker.Predictor(
        "my-endpoint", serializer=client.CSVSerializer(), deserializer=client.CSVDeserializer()
    )
    with open(path) as rows:
        assert predictor.predict(rows) == [["1.0", "2.0"], ["3.0", "4.0"]]
    assert predictor.predict(io.StringIO("5,6")) == [["5.0", "6.0"]]
    assert predictor.predict(["1,2", "3,4"]) == [["1.0", "2.0"], ["3.0", "4.0"]]


def test_our_predictor_sends_str_bodies_as_utf8(echo_aws: str) -> None:
    """Serializers returning str (JSON, CSV) reach the server as UTF-8, not http.client's Latin-1."""
    with client.Predictor(echo_aws, client.JSONSerializer(), client.JSONDeserializer()) as predictor:
        assert predictor.predict({"name": "Fair Isle ✓"}) == {"name": "Fair Isle ✓"}
    with client.Predictor(echo_aws, client.CSVSerializer(), client.CSVDeserializer()) as predictor:
        assert predictor.predict(["1,2", "3,4"]) == [["1.0", "2.0"], ["3.0", "4.0"]]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers a POST with its body, recording its path and headers (``server.seen``)."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append((self.path, dict(self.headers)))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[Any]:
    """An HTTP server on a free port of 127.0.0.1 that records what it is sent (:class:`_Recorder`)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_initial_args_are_invoke_endpoint_parameters_for_a_url_and_an_endpoint_alike(recorder: Any) -> None:
    """``initial_args`` takes InvokeEndpoint's parameters: sent as SageMaker's headers to a container's URL as boto3
    sends them to an endpoint; any other key is refused with the same ValueError in both modes, before sending."""
    url = f"http://127.0.0.1:{recorder.server_port}"
    runtime = boto3.client(
        "sagemaker-runtime",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    predictors = [client.Predictor(url), client.Predictor.for_endpoint("e", client=runtime)]
    args = {"TargetVariant": "blue", "SessionId": "session-1", "InferenceComponentName": "ic-1", "InferenceId": "i"}
    for predictor in predictors:
        assert predictor.predict(b"x", initial_args=args) == b"x"
    sent = [
        {name.lower(): value for name, value in headers.items() if name.lower().startswith("x-amzn-sagemaker-")}
        for _, headers in recorder.seen
    ]
    expected = {
        "x-amzn-sagemaker-target-variant": "blue",
        "x-amzn-sagemaker-session-id": "session-1",
        "x-amzn-sagemaker-inference-component": "ic-1",
        "x-amzn-sagemaker-inference-id": "i",
    }
    assert [path for path, _ in recorder.seen] == ["/invocations", "/endpoints/e/invocations"]
    assert sent == [expected, expected]
    for predictor in predictors:
        with pytest.raises(
            ValueError, match=r"^initial_args takes InvokeEndpoint's ContentType, .*, not 'TargetModle'$"
        ):
            predictor.predict(b"x", initial_args={"TargetModle": "m"})
        with pytest.raises(
            ValueError, match=r", not 'EndpointName' \(the endpoint is the Predictor's, the body the data\)"
        ):
            predictor.predict_stream(b"x", initial_args={"EndpointName": "other"})
    assert len(recorder.seen) == 2
    predictors[0].close()


def test_initial_args_keys_are_invoke_endpoint_parameters_sent_as_its_headers() -> None:
    """The keys ``initial_args`` takes are InvokeEndpoint's parameters (besides EndpointName and Body), each sent to a
    URL as the header botocore sends it as."""
    import botocore.session

    from inference_server.client._predictor import _HEADERS

    shape = botocore.session.get_session().get_service_model("sagemaker-runtime").operation_model("InvokeEndpoint")
    members = shape.input_shape.members
    headers = {name: member.serialization["name"] for name, member in members.items() if name in _HEADERS}
    assert headers == _HEADERS
    assert set(members) - set(_HEADERS) == {"EndpointName", "Body"}
