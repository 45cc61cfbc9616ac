"""Our AsyncPredictor, and the SageMaker SDK v2's own, against a real server (``serve --async-output``) writing to a
real local S3 (moto's) or to a local directory."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
import sagemaker
import sagemaker.async_inference
import sagemaker.exceptions
import sagemaker.predictor_async

from inference_server import client
from inference_server.errors import PredictionError
from tests.conftest import S3_CREDENTIALS, local_aws_env, wait_until

#: A model that echoes what it is given, refuses arrays with a negative value (a 400 with its message) and sleeps
#: ``{"sleep": seconds}`` before answering a JSON object.
MODEL = """
    import time

    import numpy as np

    import inference_server
    from inference_server.errors import BadRequest

    @inference_server.plugin_hook
    def predict_fn(data, model):
        if isinstance(data, np.ndarray) and (data < 0).any():
            raise BadRequest("negative features")
        if isinstance(data, dict) and "sleep" in data:
            time.sleep(data["sleep"])
        return data
"""
#: Polling fast enough for a local server, long enough for any answer here.
PATIENT = client.WaiterConfig(max_attempts=300, delay=0.05)


def _url(server: Any) -> str:
    return f"http://127.0.0.1:{server.port}"


def _start(servers: Any, plugin_site: Any, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    plugin_site.add("echo_or_refuse", MODEL)
    environment = {**local_aws_env("http://unused"), **(env or {})}
    return servers.start("--async-queue", str(tmp_path / "queue"), *args, env=environment)


@pytest.fixture
def s3_server(servers: Any, plugin_site: Any, tmp_path: Path, s3: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A server writing answers to s3://jobs/out and errors to s3://jobs/failures in moto's S3; this process's boto3
    reaches the same S3 through AWS_ENDPOINT_URL_S3, and SageMaker Runtime at the server."""
    server = _start(
        servers,
        plugin_site,
        tmp_path,
        "--async-output",
        "s3://jobs/out",
        "--async-failure",
        "s3://jobs/failures",
        env={**S3_CREDENTIALS, "AWS_ENDPOINT_URL_S3": s3.endpoint},
    )
    for name, value in {**local_aws_env(_url(server)), "AWS_ENDPOINT_URL_S3": s3.endpoint}.items():
        monkeypatch.setenv(name, value)
    return server


def test_numpy_round_trip_through_s3(s3_server: Any, s3: Any) -> None:
    """An array is uploaded under input_path with the serializer's Content-Type, answered at OutputLocation, and read
    back equal (dtype too) through boto3's own S3 client (AWS_ENDPOINT_URL_S3); the result is kept."""
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    with client.AsyncPredictor(
        _url(s3_server), client.NumpySerializer(), client.NumpyDeserializer(), input_path="s3://jobs/in/"
    ) as predictor:
        response = predictor.predict_async(array, inference_id="np-1")
    assert response.inference_id == "np-1"
    stem = response.output_path.removeprefix("s3://jobs/out/").removesuffix(".out")
    assert re.fullmatch(r"[0-9a-f-]{36}", stem)  # (the server's name for its files, not the inference id)
    assert response.failure_path == f"s3://jobs/failures/{stem}-error.out"
    (uploaded,) = s3.list_objects_v2(Bucket="jobs", Prefix="in/")["Contents"]
    assert s3.head_object(Bucket="jobs", Key=uploaded["Key"])["ContentType"] == "application/x-npy"
    result = response.get_result(PATIENT)
    assert result.dtype == np.int32
    assert result.tolist() == array.tolist()
    assert response.get_result() is result


def test_a_failing_model_raises_its_error(s3_server: Any) -> None:
    """The model's error at FailureLocation raises AsyncInferenceModelError (a PredictionError) with its status and
    message, at one look once it is there and when polling."""
    with (
        client.AsyncPredictor(
            _url(s3_server), client.NumpySerializer(), client.NumpyDeserializer(), input_path="s3://jobs/in"
        ) as predictor,
        pytest.raises(client.AsyncInferenceModelError) as raised,
    ):
        predictor.predict(np.array([1.0, -1.0]), waiter_config=PATIENT)
    assert isinstance(raised.value, PredictionError)
    assert raised.value.status == 400
    assert raised.value.message == "negative features"
    assert raised.value.failure_path.startswith("s3://jobs/failures/")
    response = client.AsyncInferenceResponse(predictor, "s3://jobs/out/none.out", raised.value.failure_path)
    with pytest.raises(client.AsyncInferenceModelError, match="negative features"):
        response.get_result()


def test_get_result_before_the_answer_is_there(s3_server: Any) -> None:
    """While the model works, one look raises ObjectNotExistedError and a short poll PollingTimeoutError (both name
    the output location); a longer poll returns the answer."""
    with client.AsyncPredictor(_url(s3_server), client.JSONSerializer(), client.JSONDeserializer()) as predictor:
        response = predictor.predict_async({"sleep": 1.5})  # inline: no input_path
    with pytest.raises(client.ObjectNotExistedError, match="could still be running") as one_look:
        response.get_result()
    assert one_look.value.output_path == response.output_path
    with pytest.raises(client.PollingTimeoutError) as polled:
        response.get_result(client.WaiterConfig(max_attempts=2, delay=0.1))
    assert polled.value.seconds == pytest.approx(0.2)
    assert response.output_path in str(polled.value)
    assert response.get_result(PATIENT) == {"sleep": 1.5}


def test_predict_waits_for_the_answer(s3_server: Any) -> None:
    """predict() with a waiter blocks until the answer is there and returns it deserialized."""
    with client.AsyncPredictor(
        _url(s3_server), client.JSONSerializer(), client.JSONDeserializer(), input_path="s3://jobs/in"
    ) as predictor:
        assert predictor.predict({"sleep": 0.5, "x": [1, 2]}, waiter_config=PATIENT) == {"sleep": 0.5, "x": [1, 2]}


def test_for_endpoint_through_boto3(s3_server: Any) -> None:
    """AsyncPredictor.for_endpoint calls boto3's invoke_endpoint_async (AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME), with
    an uploaded input and with an inline Body, and passes initial_args as boto3's parameters."""
    predictor = client.AsyncPredictor.for_endpoint(
        "my-endpoint", client.NumpySerializer(), client.NumpyDeserializer(), input_path="s3://jobs/in"
    )
    array = np.array([[1.5, 2.5]])
    uploaded = predictor.predict_async(array, initial_args={"RequestTTLSeconds": 600}, inference_id="boto-1")
    assert re.fullmatch(r"s3://jobs/out/[0-9a-f-]{36}\.out", uploaded.output_path)
    assert uploaded.inference_id == "boto-1"
    assert uploaded.get_result(PATIENT).tolist() == array.tolist()
    inline = client.AsyncPredictor.for_endpoint("my-endpoint", client.NumpySerializer(), client.NumpyDeserializer())
    assert inline.predict(array, waiter_config=PATIENT).tolist() == array.tolist()


def test_local_directories(servers: Any, plugin_site: Any, tmp_path: Path) -> None:
    """With a server writing to a local directory, the input is written under a local input_path (or sent inline),
    the answer read from the local OutputLocation as the deserializer's type, an error raised from the local
    FailureLocation (status 0 when the model was not called); a request the server refuses raises PredictionError
    with its message."""
    server = _start(servers, plugin_site, tmp_path, "--async-output", str(tmp_path / "out"))
    array = np.linspace(0, 1, 5)
    with client.AsyncPredictor(
        _url(server), client.NumpySerializer(), client.NumpyDeserializer(), input_path=str(tmp_path / "in")
    ) as predictor:
        response = predictor.predict_async(array, inference_id="local-1")
        assert Path(response.output_path).parent == tmp_path / "out"
        assert response.inference_id == "local-1"
        assert np.array_equal(response.get_result(PATIENT), array)
        (written,) = (tmp_path / "in").iterdir()
        assert np.array_equal(np.load(written), array)
        given = predictor.predict(input_path=str(written), waiter_config=PATIENT)
        assert np.array_equal(given, array)
        with pytest.raises(client.AsyncInferenceModelError, match="negative features") as raised:
            predictor.predict(-array - 1, waiter_config=PATIENT)
        assert Path(raised.value.failure_path).parent == tmp_path / "out"
        with pytest.raises(client.AsyncInferenceModelError, match="cannot be read") as unread:
            predictor.predict(input_path=str(tmp_path / "missing.npy"), waiter_config=PATIENT)
        assert unread.value.status == 0  # the model was not called
        assert str(unread.value) == unread.value.message
        with pytest.raises(PredictionError, match="RequestTTLSeconds must be") as refused:
            predictor.predict_async(array, initial_args={"RequestTTLSeconds": 30})
        assert refused.value.status == 400
    uploaded = set((tmp_path / "in").iterdir())
    with client.AsyncPredictor(_url(server), client.JSONSerializer(), client.JSONDeserializer()) as inline:
        assert inline.predict({"a": [1, 2]}, waiter_config=PATIENT) == {"a": [1, 2]}
    assert set((tmp_path / "in").iterdir()) == uploaded  # inline: no input written


def test_sagemaker_sdk_async_predictor(s3_server: Any, s3: Any) -> None:
    """The SageMaker SDK v2's own AsyncPredictor, its Session's runtime client at the server and its S3 at moto's,
    with our serializers: its upload is answered (sent without ContentType, the body is taken as bytes and answered
    as octet-stream, which our JSONDeserializer reads); with ContentType in initial_args it is decoded as npy; the
    model's error raises the SDK's AsyncInferenceModelError."""
    boto_session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    runtime = boto_session.client("sagemaker-runtime", endpoint_url=_url(s3_server))
    session = sagemaker.Session(boto_session=boto_session, sagemaker_runtime_client=runtime)
    assert session.s3_client.meta.endpoint_url == s3.endpoint  # (AWS_ENDPOINT_URL_S3)
    predictor = sagemaker.predictor_async.AsyncPredictor(
        sagemaker.Predictor(
            "my-endpoint",
            sagemaker_session=session,
            serializer=client.JSONSerializer(),
            deserializer=client.JSONDeserializer(),
        )
    )
    as_bytes = predictor.predict_async({"a": [1, 2]}, input_path="s3://jobs/in/x", inference_id="sdk-1")
    assert as_bytes.output_path.startswith("s3://jobs/out/")
    predictor.serializer = client.NumpySerializer()
    npy = {"ContentType": "application/x-npy"}
    array = np.array([[1.0, 2.0]])
    decoded = predictor.predict_async(array, input_path="s3://jobs/in/y", initial_args=npy, inference_id="sdk-2")
    failing = predictor.predict_async(-array, input_path="s3://jobs/in/z", initial_args=npy, inference_id="sdk-3")
    keys = [
        location.removeprefix("s3://jobs/")
        for location in (as_bytes.output_path, decoded.output_path, failing.failure_path)
    ]
    for key in keys:
        wait_until(lambda key=key: s3.list_objects_v2(Bucket="jobs", Prefix=key).get("Contents"), 30, key)
    assert s3.head_object(Bucket="jobs", Key="in/x")["ContentType"] == "application/json"
    assert s3.head_object(Bucket="jobs", Key=keys[0])["ContentType"] == "application/octet-stream"
    assert as_bytes.get_result() == {"a": [1, 2]}  # one look

    # The SDK's waiter polls the output and the failure on two threads and leaves the one that did not find its
    # object polling to its last attempt: few attempts, and the test waits for them to end before S3 stops.
    threads = set(threading.enumerate())
    waiter = sagemaker.async_inference.WaiterConfig(max_attempts=3, delay=1)
    predictor.deserializer = client.NumpyDeserializer()
    assert decoded.get_result(waiter).tolist() == array.tolist()
    predictor.deserializer = client.JSONDeserializer()
    with pytest.raises(sagemaker.exceptions.AsyncInferenceModelError, match="negative features"):
        failing.get_result(waiter)
    wait_until(lambda: not set(threading.enumerate()) - threads, 10, "the SDK's waiters did not end")


def test_refused_before_anything_is_sent() -> None:
    """No data and no input_path, an inline body over 128,000 bytes, or an initial_args key InvokeEndpointAsync
    does not take is a ValueError before any request (nothing listens at the URL)."""
    predictor = client.AsyncPredictor("http://127.0.0.1:9", client.IdentitySerializer())
    with pytest.raises(ValueError, match="give data, or the input_path"):
        predictor.predict_async()
    with pytest.raises(ValueError, match="128000 an inline body may be"):
        predictor.predict_async(b"x" * 128_001)
    with pytest.raises(ValueError, match="not 'InputLocation'"):
        predictor.predict_async(b"x", initial_args={"InputLocation": "s3://jobs/a"})


def test_s3_without_boto3_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without boto3, an S3 input_path or for_endpoint raises ImportError naming the extra to install."""
    monkeypatch.setitem(sys.modules, "boto3", None)
    predictor = client.AsyncPredictor("http://127.0.0.1:9", input_path="s3://jobs/in")
    with pytest.raises(ImportError, match=r"pip install 'inference-server\[aws\]'"):
        predictor.predict_async(b"x")
    with pytest.raises(ImportError, match=r"pip install 'inference-server\[aws\]'"):
        client.AsyncPredictor.for_endpoint("e")
