"""Streamed answers on real servers: a generator's chunks sent as made (both backends and granian's two event-loop
fronts), JSON Lines, server-sent events read by a real SSE client, SageMaker's event stream read by the real boto3
(parts, a 16 MiB split, a failure mid-stream), a client that goes away closing the generator, the stream and
first-chunk deadlines, a drain that lets an open stream finish, and the multi-model route."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import orjson
import pytest
import sseclient

from inference_server import client
from tests.conftest import GRANIAN_INTERFACE, local_aws_env, wait_until
from tests.test_metrics import samples, total

JSON = {"Content-Type": "application/json"}
#: Each backend, and granian's event-loop fronts (``asgi``, ``rsgi``: streams without a thread each, on the
#: worker's loop).
BACKENDS = ["granian", "gunicorn", "asgi", "rsgi"]


def _ends_failed_streams_whole(backend: str) -> bool:
    """Whether ``backend`` is granian's RSGI interface, which ends a stream that fails mid-way with the chunked
    coding's last chunk (docs/explanation/backends.md): its client cannot tell it was cut."""
    return backend == "rsgi" or (backend == "granian" and GRANIAN_INTERFACE == "rsgi")


def _serve(backend: str) -> tuple[str, ...]:
    """The ``serve`` options of a backend of :data:`BACKENDS`."""
    if backend in ("asgi", "rsgi"):
        return ("--server", "granian", "--granian-interface", backend)
    return ("--server", backend)


#: A model whose prediction is a generator: it yields ``items`` (waiting before the second for the file ``gate``
#: when given, pausing ``pause`` s before each), raises at index ``fail_at``, yields ``blob`` bytes first when
#: given, and writes how many items it made to the file ``finally`` when it is closed or ends. With ``raw``, its
#: output_fn sends those strings as the chunks of a ``type`` body (records split across chunks as it likes).
STREAMER = """
    import pathlib
    import time

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return model_dir

    @inference_server.plugin_hook
    def predict_fn(data, model):
        if "raw" in data:
            return data

        def made():
            count = 0
            try:
                if data.get("blob"):
                    yield b"\\x01" * data["blob"]
                for index, item in enumerate(data.get("items", [])):
                    if index == 1 and data.get("gate"):
                        deadline = time.monotonic() + 30
                        while not pathlib.Path(data["gate"]).exists() and time.monotonic() < deadline:
                            time.sleep(0.01)
                    if index == data.get("fail_at"):
                        raise RuntimeError("the model failed mid-stream")
                    time.sleep(data.get("pause", 0))
                    count += 1
                    yield item
            finally:
                if data.get("finally"):  # written whole, then named: the test reads it once it exists
                    written = pathlib.Path(data["finally"] + ".part")
                    written.write_text(str(count))
                    written.rename(data["finally"])
        return made()

    @inference_server.plugin_hook
    def output_fn(prediction, accept):
        if isinstance(prediction, dict):
            return (chunk.encode() for chunk in prediction["raw"]), prediction["type"]
        return None
"""


#: STREAMER's generator as an async generator predict_fn (no ``raw``): it waits with ``asyncio.sleep``.
ASYNC_STREAMER = """
    import asyncio
    import pathlib
    import time

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return model_dir

    @inference_server.plugin_hook
    async def predict_fn(data, model):
        count = 0
        try:
            for index, item in enumerate(data.get("items", [])):
                if index == 1 and data.get("gate"):
                    deadline = time.monotonic() + 30
                    while not pathlib.Path(data["gate"]).exists() and time.monotonic() < deadline:
                        await asyncio.sleep(0.01)
                if index == data.get("fail_at"):
                    raise RuntimeError("the model failed mid-stream")
                await asyncio.sleep(data.get("pause", 0))
                count += 1
                yield item
        finally:
            if data.get("finally"):
                written = pathlib.Path(data["finally"] + ".part")
                written.write_text(str(count))
                written.rename(data["finally"])
"""


_open: list[http.client.HTTPConnection] = []


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    """Close every connection :func:`post` opened, at the end of each test."""
    yield
    while _open:
        _open.pop().close()


def post(server: Any, path: str, value: Any, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    """Send ``value`` as JSON and return the response with its body unread (the connection stays open)."""
    connection = server.connection()
    _open.append(connection)
    connection.request("POST", path, orjson.dumps(value), {**JSON, **(headers or {})})
    return connection.getresponse()


def chunks(response: http.client.HTTPResponse) -> Iterator[bytes]:
    """The body as it arrives."""
    while chunk := response.read1(65536):
        yield chunk


def wait_for(path: Path, deadline: float = 10) -> str:
    """What the model's generator wrote to ``path`` as it was closed."""
    wait_until(path.exists, deadline, f"{path} did not appear")
    return path.read_text()


@pytest.fixture
def streamer(plugin_site: Any) -> None:
    plugin_site.add("streamer", STREAMER)


@pytest.fixture
def async_streamer(plugin_site: Any) -> None:
    plugin_site.add("async_streamer", ASYNC_STREAMER)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``aws(server)``: boto3's SageMaker Runtime client pointed at ``server``."""

    def runtime(server: Any) -> Any:
        for name, value in local_aws_env(f"http://127.0.0.1:{server.port}").items():
            monkeypatch.setenv(name, value)
        return boto3.client("sagemaker-runtime")

    return runtime


@pytest.mark.parametrize(
    ("backend", "stream_timeout", "model"),
    [
        ("granian", "600", "sync"),
        ("gunicorn", "600", "sync"),
        ("granian", "0", "sync"),
        ("gunicorn", "0", "sync"),
        ("granian", "600", "async"),
        ("gunicorn", "0", "async"),
        ("asgi", "600", "sync"),
        ("asgi", "0", "async"),
        ("rsgi", "0", "sync"),
        ("rsgi", "600", "async"),
    ],
)
def test_a_generators_records_are_sent_as_they_are_made(
    backend: str, stream_timeout: str, model: str, plugin_site: Any, servers: Any, tmp_path: Path
) -> None:
    """The first JSON Lines record arrives while the generator (sync, or an async generator predict_fn) waits for a
    file that the test writes only after reading it; the rest follows, chunked, and the generator's finally runs at
    the end (chunks made on a helper thread under --stream-timeout, or on the server's own with --stream-timeout 0)."""
    plugin_site.add("streamer", STREAMER if model == "sync" else ASYNC_STREAMER)
    server = servers.start(*_serve(backend), "--stream-timeout", stream_timeout)
    gate, done = tmp_path / "gate", tmp_path / "done"
    items = [{"n": 0}, {"n": 1}, {"n": 2}]
    started = time.monotonic()
    response = post(server, "/invocations", {"items": items, "gate": str(gate), "finally": str(done)})
    assert response.status == 200
    assert response.getheader("Content-Type") == "application/jsonlines"
    assert response.getheader("Transfer-Encoding") == "chunked"
    assert response.getheader("Content-Length") is None
    assert response.readline() == b'{"n":0}\n'
    assert time.monotonic() - started < 30  # before the generator stops waiting for the gate (30 s) on its own
    assert not done.exists()
    gate.write_text("go")
    assert response.read() == b'{"n":1}\n{"n":2}\n'
    assert wait_for(done) == "3"


@pytest.mark.parametrize("backend", BACKENDS)
def test_server_sent_events_are_read_by_an_sse_client_as_they_come(
    backend: str, streamer: None, servers: Any, tmp_path: Path
) -> None:
    """Accept: text/event-stream gets one event per record (a str as its data, multi-line data as several data
    lines, anything else as JSON), parsed by sseclient-py, the first before the generator makes the second."""
    server = servers.start(*_serve(backend))
    gate = tmp_path / "gate"
    items = ["Hello", "two\nlines", {"token": "!", "n": 3}]
    response = post(server, "/invocations", {"items": items, "gate": str(gate)}, {"Accept": "text/event-stream"})
    assert response.getheader("Content-Type") == "text/event-stream"
    events = sseclient.SSEClient(chunks(response)).events()
    assert next(events).data == "Hello"
    gate.write_text("go")
    assert [event.data for event in events] == ["two\nlines", '{"token":"!","n":3}']


def test_a_json_client_gets_a_streamed_json_array_and_an_impossible_accept_gets_406(
    streamer: None, servers: Any
) -> None:
    """Accept: application/json gets the records as one JSON array (sent as made); an Accept that allows no
    streamed type is a 406 that names the ones there are."""
    server = servers.start()
    response = post(server, "/invocations", {"items": [1, {"a": 2}, "c"]}, {"Accept": "application/json"})
    assert (response.status, response.getheader("Content-Type")) == (200, "application/json")
    assert orjson.loads(response.read()) == [1, {"a": 2}, "c"]
    refused = post(server, "/invocations", {"items": [1]}, {"Accept": "text/csv"})
    assert refused.status == 406
    assert "application/jsonlines, text/event-stream, application/json" in orjson.loads(refused.read())["message"]
    assert server.request("POST", "/invocations", b'{"items": []}', JSON).body == b""  # nothing made, nothing sent


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", ["sync", "async"])
def test_a_client_that_goes_away_closes_the_generator(
    backend: str, model: str, plugin_site: Any, servers: Any, tmp_path: Path
) -> None:
    """A client that disconnects after the first record stops the generator, sync or async (aclose on the worker's
    loop): its finally runs long before it would have made all its records, and the server goes on serving."""
    plugin_site.add("streamer", STREAMER if model == "sync" else ASYNC_STREAMER)
    server = servers.start(*_serve(backend))
    done = tmp_path / "done"
    response = post(server, "/invocations", {"items": list(range(200)), "pause": 0.05, "finally": str(done)})
    assert response.readline() == b"0\n"
    _open.pop().close()
    assert int(wait_for(done)) < 100
    assert server.request("GET", "/ping").status == 200


@pytest.mark.parametrize("backend", BACKENDS)
def test_boto3_reads_the_event_stream_and_a_failure_mid_stream(
    backend: str, streamer: None, servers: Any, aws: Any
) -> None:
    """boto3's invoke_endpoint_with_response_stream gets one PayloadPart per record, the model's media type and
    the variant; a model failing after two records ends the stream with a ModelStreamError that botocore raises
    after those two; a failure before the first record is the usual 424 ModelError."""
    server = servers.start(*_serve(backend))
    runtime = aws(server)
    response = runtime.invoke_endpoint_with_response_stream(
        EndpointName="my-endpoint",
        Body=orjson.dumps({"items": ["a", "b", "c"]}),
        ContentType="application/json",
        Accept="text/event-stream",
        CustomAttributes="trace=on",
    )
    assert response["ContentType"] == "text/event-stream"
    assert response["InvokedProductionVariant"] == "AllTraffic"
    assert response["CustomAttributes"] == "trace=on"
    parts = [event["PayloadPart"]["Bytes"] for event in response["Body"]]
    assert parts == [b"data: a\n\n", b"data: b\n\n", b"data: c\n\n"]

    failing = runtime.invoke_endpoint_with_response_stream(
        EndpointName="my-endpoint",
        Body=orjson.dumps({"items": [1, 2, 3], "fail_at": 2}),
        ContentType="application/json",
    )
    received: list[bytes] = []

    def read_all() -> None:
        with contextlib.closing(failing["Body"]):
            received.extend(event["PayloadPart"]["Bytes"] for event in failing["Body"])

    with pytest.raises(botocore.exceptions.EventStreamError) as caught:
        read_all()
    assert received == [b"1\n", b"2\n"]
    assert caught.value.response["Error"]["Code"] == "ModelStreamError"
    assert "the response stream raised RuntimeError" in caught.value.response["Error"]["Message"]
    assert "the model failed mid-stream" in server.output()

    with pytest.raises(runtime.exceptions.ModelError) as refused:
        runtime.invoke_endpoint_with_response_stream(
            EndpointName="my-endpoint", Body=orjson.dumps({"items": [1], "fail_at": 0}), ContentType="application/json"
        )
    assert refused.value.response["OriginalStatusCode"] == 500


def test_a_chunk_over_the_event_streams_payload_limit_is_split(streamer: None, servers: Any, aws: Any) -> None:
    """A 16 MiB + 5 byte chunk reaches boto3 as a 16 MiB PayloadPart and a 5 byte one, then the next chunk."""
    server = servers.start()
    runtime = aws(server)
    response = runtime.invoke_endpoint_with_response_stream(
        EndpointName="e", Body=orjson.dumps({"blob": (16 << 20) + 5, "items": ["end"]}), ContentType="application/json"
    )
    assert response["ContentType"] == "application/octet-stream"
    parts = [event["PayloadPart"]["Bytes"] for event in response["Body"]]
    assert [len(part) for part in parts] == [16 << 20, 5, 3]
    assert parts[0] == b"\x01" * (16 << 20)
    assert parts[2] == b"end"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stream_past_the_stream_timeout_is_cut(
    backend: str, streamer: None, servers: Any, aws: Any, tmp_path: Path
) -> None:
    """--stream-timeout bounds the whole stream: a plain stream is cut short (the client sees an incomplete
    chunked body; granian's RSGI interface ends it whole, so there the records stop short), the event stream ends
    with a ModelStreamError saying so, and the generators are closed."""
    server = servers.start(*_serve(backend), "--stream-timeout", "1")
    done = tmp_path / "done"
    response = post(server, "/invocations", {"items": list(range(20)), "pause": 0.2, "finally": str(done)})
    assert response.readline() == b"0\n"
    if _ends_failed_streams_whole(backend):
        assert len(response.read().splitlines()) < 19
    else:
        with pytest.raises(http.client.IncompleteRead):
            response.read()
    assert 3 <= int(wait_for(done)) < 20
    runtime = aws(server)
    stream = runtime.invoke_endpoint_with_response_stream(
        EndpointName="e", Body=orjson.dumps({"items": list(range(20)), "pause": 0.2}), ContentType="application/json"
    )
    with pytest.raises(botocore.exceptions.EventStreamError) as caught, contextlib.closing(stream["Body"]):
        list(stream["Body"])
    assert caught.value.response["Error"]["Code"] == "ModelStreamError"
    assert "stream timeout of 1 s" in caught.value.response["Error"]["Message"]


def test_the_request_timeout_bounds_the_first_chunk(streamer: None, servers: Any) -> None:
    """--timeout applies to the time to the first chunk: a generator whose first record takes longer is a 504, and
    once that record is made (its model thread free again) the next stream is served."""
    server = servers.start("--timeout", "1")
    reply = server.request("POST", "/invocations", orjson.dumps({"items": [1], "pause": 3}), JSON)
    assert reply.status == 504
    body, headers = orjson.dumps({"items": [1, 2]}), JSON
    wait_until(lambda: server.request("POST", "/invocations", body, headers).body == b"1\n2\n", 10, "not served")


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigterm_lets_an_open_stream_finish(backend: str, streamer: None, servers: Any, tmp_path: Path) -> None:
    """A stream open when SIGTERM comes is in flight: new requests are refused while it goes on to its last
    record, then the server exits."""
    server = servers.start(*_serve(backend))
    gate = tmp_path / "gate"
    response = post(server, "/invocations", {"items": ["a", "b", "c"], "gate": str(gate)})
    assert response.readline() == b'"a"\n'
    os.kill(server.process.pid, signal.SIGTERM)
    wait_until(lambda: server.request("GET", "/ping").status == 503, 10, "/ping still healthy after SIGTERM")
    gate.write_text("go")
    assert response.read() == b'"b"\n"c"\n'
    assert server.process.wait(20) == 0


def test_a_model_of_a_multi_model_endpoint_streams(streamer: None, servers: Any, tmp_path: Path) -> None:
    """POST /models/{name}/invoke streams like /invocations: server-sent events as they are made."""
    (tmp_path / "m1").mkdir()
    server = servers.start("--multi-model", "--allow-model-dir", str(tmp_path))
    loaded = server.request("POST", "/models", orjson.dumps({"model_name": "m1", "url": str(tmp_path / "m1")}), JSON)
    assert loaded.status == 200
    gate = tmp_path / "gate"
    response = post(
        server, "/models/m1/invoke", {"items": ["x", "y"], "gate": str(gate)}, {"Accept": "text/event-stream"}
    )
    assert response.getheader("Content-Type") == "text/event-stream"
    assert response.readline() == b"data: x\n"
    gate.write_text("go")
    assert response.read() == b"\ndata: y\n\n"


@pytest.mark.parametrize("via", ["url", "boto3"])
def test_predict_stream_reassembles_records_split_across_chunks(
    via: str, streamer: None, servers: Any, aws: Any
) -> None:
    """Predictor.predict_stream yields whole records from JSON Lines and server-sent events that the server sent
    split across chunks (and several in one chunk), from a container URL and through boto3; a model failing
    mid-stream raises StreamError after the records made before."""
    server = servers.start()
    if via == "url":
        predictor = client.Predictor(f"http://127.0.0.1:{server.port}", client.JSONSerializer())
    else:
        aws(server)
        predictor = client.Predictor.for_endpoint("my-endpoint", client.JSONSerializer())
    with predictor:
        lines = ['{"a":', '1}\n{"b"', ':2}\n{"c":3}\n', '{"d":"\u00e9"}']
        records = predictor.predict_stream({"raw": lines, "type": "application/jsonlines"})
        assert list(records) == [{"a": 1}, {"b": 2}, {"c": 3}, {"d": "\u00e9"}]
        sse = ["data: he", "llo\n\nda", "ta: two\ndata: lines\n\nevent: done\ndata: {}\n", "\n"]
        events = list(predictor.predict_stream({"raw": sse, "type": "text/event-stream"}))
        assert [(event.event, event.data) for event in events] == [
            ("message", "hello"),
            ("message", "two\nlines"),
            ("done", "{}"),
        ]
        assert list(predictor.predict_stream({"items": ["x", {"y": 1}]})) == ["x", {"y": 1}]
        received = []
        failing = {"items": [1, 2, 3], "fail_at": 2}
        if via == "url" and _ends_failed_streams_whole("granian"):  # the stream reads as whole
            assert list(predictor.predict_stream(failing)) == [1, 2]
            return
        with pytest.raises(client.StreamError) as caught:
            received.extend(predictor.predict_stream(failing))
        assert received == [1, 2]
        assert caught.value.code == ("IncompleteStream" if via == "url" else "ModelStreamError")


def test_an_open_stream_is_in_flight_and_counted_with_what_it_sent_when_it_ends(
    streamer: None, servers: Any, tmp_path: Path
) -> None:
    """While a stream is open it is a request in flight; once it ends it is counted, its response size being the
    bytes it sent (there is no Content-Length to read it from)."""
    server = servers.start()
    gate = tmp_path / "gate"

    def scrape() -> dict[Any, float]:
        return samples(server.request("GET", "/metrics").body.decode())

    def scraped_when(condition: Any) -> dict[Any, float]:
        def met() -> dict[Any, float] | None:
            scraped = scrape()
            return scraped if condition(scraped) else None

        return wait_until(met, 10, "the metrics did not show it")

    response = post(server, "/invocations", {"items": ["a", "bc"], "gate": str(gate)})
    assert response.readline() == b'"a"\n'
    scraped_when(lambda scraped: total(scraped, "inference_server_requests_in_flight") == 1)
    gate.write_text("go")
    assert response.read() == b'"bc"\n'
    scraped = scraped_when(lambda scraped: total(scraped, "inference_server_requests_total", route="/invocations") == 1)
    assert total(scraped, "inference_server_response_body_bytes_sum", route="/invocations") == 9
    assert total(scraped, "inference_server_requests_in_flight") == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_async_generator_streams_server_sent_events(
    backend: str, async_streamer: None, servers: Any, tmp_path: Path
) -> None:
    """Accept: text/event-stream gets an async generator's records as events, the first before it makes the
    second."""
    server = servers.start(*_serve(backend))
    gate = tmp_path / "gate"
    items = ["Hello", {"token": "!", "n": 3}]
    response = post(server, "/invocations", {"items": items, "gate": str(gate)}, {"Accept": "text/event-stream"})
    assert response.getheader("Content-Type") == "text/event-stream"
    events = sseclient.SSEClient(chunks(response)).events()
    assert next(events).data == "Hello"
    gate.write_text("go")
    assert [event.data for event in events] == ['{"token":"!","n":3}']


@pytest.mark.parametrize("backend", BACKENDS)
def test_boto3_reads_an_async_generators_event_stream(
    backend: str, async_streamer: None, servers: Any, aws: Any
) -> None:
    """boto3's invoke_endpoint_with_response_stream gets one PayloadPart per record of an async generator, and a
    ModelStreamError after the records made before it raised."""
    server = servers.start(*_serve(backend))
    runtime = aws(server)
    response = runtime.invoke_endpoint_with_response_stream(
        EndpointName="my-endpoint",
        Body=orjson.dumps({"items": ["a", "b"]}),
        ContentType="application/json",
        Accept="text/event-stream",
    )
    assert [event["PayloadPart"]["Bytes"] for event in response["Body"]] == [b"data: a\n\n", b"data: b\n\n"]
    failing = runtime.invoke_endpoint_with_response_stream(
        EndpointName="my-endpoint",
        Body=orjson.dumps({"items": [1, 2, 3], "fail_at": 2}),
        ContentType="application/json",
    )
    received: list[bytes] = []
    with pytest.raises(botocore.exceptions.EventStreamError) as caught, contextlib.closing(failing["Body"]):
        received.extend(event["PayloadPart"]["Bytes"] for event in failing["Body"])
    assert received == [b"1\n", b"2\n"]
    assert caught.value.response["Error"]["Code"] == "ModelStreamError"
