"""The ``application/vnd.amazon.eventstream`` encoder, checked against botocore's own decoder and parser: the bytes
(prelude, headers, payload, CRCs) through ``EventStreamBuffer``, and the events and errors through ``EventStream``
with the real ``sagemaker-runtime`` model, and through boto3's ``invoke_endpoint_with_response_stream``."""

from __future__ import annotations

import array
import http.server
import json
import random
import struct
import threading
import tracemalloc
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import boto3
import botocore.eventstream
import botocore.exceptions
import botocore.session
import pytest
from botocore.eventstream import EventStream, EventStreamBuffer, EventStreamMessage
from botocore.parsers import EventStreamJSONParser

from inference_server.wsgi import _eventstream
from inference_server.wsgi._eventstream import (
    MAX_HEADERS,
    MAX_PAYLOAD,
    MEDIA_TYPE,
    internal_stream_failure,
    message,
    model_stream_error,
    payload_parts,
)
from tests.conftest import local_aws_env

OPERATION = "InvokeEndpointWithResponseStream"
PAYLOAD_PART_HEADERS = {
    ":message-type": "event",
    ":event-type": "PayloadPart",
    ":content-type": "application/octet-stream",
}


class RawStream:
    """What botocore's ``EventStream`` reads from, as urllib3's response offers it: ``stream()`` and ``close()``."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self.pieces = list(pieces)
        self.closed = False

    def stream(self) -> Iterator[bytes]:
        yield from self.pieces

    def close(self) -> None:
        self.closed = True


def response_stream(pieces: Iterable[bytes]) -> EventStream:
    """botocore's ``EventStream`` over ``pieces``, with the ``ResponseStream`` shape of the real service model and the
    event-stream parser of the ``rest-json`` protocol, as ``RestJSONParser._create_event_stream`` builds it."""
    service = botocore.session.get_session().get_service_model("sagemaker-runtime")
    assert service.protocol == "rest-json"
    shape = service.operation_model(OPERATION).output_shape.members["Body"]
    assert shape.name == "ResponseStream"
    return EventStream(RawStream(pieces), shape, EventStreamJSONParser(), OPERATION)


def decode(pieces: Iterable[bytes]) -> list[EventStreamMessage]:
    """Every message botocore's ``EventStreamBuffer`` finds in ``pieces``, fed one piece at a time."""
    buffer = EventStreamBuffer()
    found: list[EventStreamMessage] = []
    for piece in pieces:
        buffer.add_data(piece)
        found.extend(buffer)
    assert buffer._data == b"", "bytes left over after the last message"
    return found


def splits(data: bytes, seed: int) -> list[bytes]:
    """``data`` cut at random places (into pieces of 1 to 40 bytes), as a network might deliver it."""
    rng = random.Random(seed)
    pieces, at = [], 0
    while at < len(data):
        size = rng.randint(1, 40)
        pieces.append(data[at : at + size])
        at += size
    return pieces


def test_payload_part_wire_layout() -> None:
    """A PayloadPart is prelude (lengths, CRC-32 of them), the three string headers, the payload, CRC-32 of all."""
    (raw,) = payload_parts(b"hello")
    total, headers_length, prelude_crc = struct.unpack("!III", raw[:12])
    assert total == len(raw)
    assert prelude_crc == zlib.crc32(raw[:8])
    assert struct.unpack("!I", raw[-4:])[0] == zlib.crc32(raw[:-4])
    headers = raw[12 : 12 + headers_length]
    expected = b"".join(
        bytes((len(name),)) + name.encode() + b"\x07" + struct.pack("!H", len(value)) + value.encode()
        for name, value in PAYLOAD_PART_HEADERS.items()
    )
    assert headers == expected
    assert raw[12 + headers_length : -4] == b"hello"
    (decoded,) = decode([raw])
    assert decoded.headers == PAYLOAD_PART_HEADERS
    assert decoded.payload == b"hello"
    assert decoded.prelude.total_length == total
    assert decoded.prelude.headers_length == headers_length
    assert decoded.crc == zlib.crc32(raw[:-4])


CHUNKS = [b"first", bytes(range(256)) * 3, b"{}\n", b"last"]
STREAM = b"".join(part for chunk in CHUNKS for part in payload_parts(chunk))


@pytest.mark.parametrize("seed", range(5))
def test_decodes_from_random_splits(seed: int) -> None:
    """botocore decodes a run of messages the same however the bytes are cut."""
    assert [m.payload for m in decode(splits(STREAM, seed))] == CHUNKS


def test_decodes_byte_by_byte() -> None:
    """botocore decodes a run of messages fed one byte at a time."""
    assert [m.payload for m in decode(STREAM[i : i + 1] for i in range(len(STREAM)))] == CHUNKS


def test_botocore_yields_payload_parts_in_order() -> None:
    """botocore's EventStream with the sagemaker-runtime model yields {"PayloadPart": {"Bytes": ...}} in order."""
    chunks = [b'{"outputs": ["a"]}\n', b"\x00\xff binary", b'{"outputs": [" b"]}\n']
    stream = b"".join(part for chunk in chunks for part in payload_parts(chunk))
    events = list(response_stream(splits(stream, 7)))
    assert events == [{"PayloadPart": {"Bytes": chunk}} for chunk in chunks]


def test_model_stream_error_raises_event_stream_error() -> None:
    """A ModelStreamError message makes botocore raise EventStreamError with Code and Message; ErrorCode is sent."""
    raw = model_stream_error("the model took too long", "ModelInvocationTimeExceeded")
    (decoded,) = decode([raw])
    assert decoded.headers == {
        ":message-type": "exception",
        ":exception-type": "ModelStreamError",
        ":content-type": "application/json",
    }
    assert json.loads(decoded.payload) == {
        "Message": "the model took too long",
        "ErrorCode": "ModelInvocationTimeExceeded",
    }
    events = iter(response_stream([*payload_parts(b"partial"), raw, *payload_parts(b"never seen")]))
    assert next(events) == {"PayloadPart": {"Bytes": b"partial"}}
    with pytest.raises(botocore.exceptions.EventStreamError) as raised:
        next(events)
    # botocore's _do_error_parse keeps the exception type and the Message; it parses ErrorCode but drops it
    assert raised.value.response == {"Error": {"Code": "ModelStreamError", "Message": "the model took too long"}}
    assert raised.value.operation_name == OPERATION
    assert str(raised.value) == (
        "An error occurred (ModelStreamError) when calling the InvokeEndpointWithResponseStream operation: "
        "the model took too long"
    )


def test_internal_stream_failure_raises_event_stream_error() -> None:
    """An InternalStreamFailure message makes botocore raise EventStreamError with that Code and the Message."""
    raw = internal_stream_failure('broken "pipe" \u2603')
    (decoded,) = decode([raw])
    assert decoded.headers == {
        ":message-type": "exception",
        ":exception-type": "InternalStreamFailure",
        ":content-type": "application/json",
    }
    assert json.loads(decoded.payload) == {"Message": 'broken "pipe" \u2603'}
    with pytest.raises(botocore.exceptions.EventStreamError) as raised:
        list(response_stream([raw]))
    assert raised.value.response == {"Error": {"Code": "InternalStreamFailure", "Message": 'broken "pipe" \u2603'}}


def test_exception_message_cut_to_model_maximum() -> None:
    """An exception's Message is cut to the 2048 characters the service model allows; ErrorCode is kept whole."""
    payload = json.loads(decode([model_stream_error("x" * 5000, "StreamBroken")])[0].payload)
    assert payload == {"Message": "x" * 2048, "ErrorCode": "StreamBroken"}
    assert json.loads(decode([internal_stream_failure("y" * 2049)])[0].payload) == {"Message": "y" * 2048}


def test_chunk_over_limit_splits_and_reassembles() -> None:
    """A chunk of 16 MiB + 1 bytes becomes two PayloadParts (16 MiB, 1 byte) that botocore joins back exactly."""
    chunk = random.Random(3).randbytes(MAX_PAYLOAD + 1)
    parts = list(payload_parts(chunk))
    assert len(parts) == 2
    decoded = decode(parts)
    assert [len(m.payload) for m in decoded] == [MAX_PAYLOAD, 1]
    assert all(m.headers == PAYLOAD_PART_HEADERS for m in decoded)
    events = list(response_stream(parts))
    assert b"".join(event["PayloadPart"]["Bytes"] for event in events) == chunk


def test_large_chunk_copied_once() -> None:
    """Framing a large chunk allocates about one copy of each part at a time: the message, no intermediate joins."""
    chunk = bytes(2 * MAX_PAYLOAD + 5)
    tracemalloc.start()
    try:
        for part in payload_parts(chunk):
            del part
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.1 * MAX_PAYLOAD


def test_exactly_max_payload_is_one_message() -> None:
    """A chunk of exactly 16 MiB is one message; message() refuses one byte more."""
    assert len(list(payload_parts(bytes(MAX_PAYLOAD)))) == 1
    message({}, bytes(MAX_PAYLOAD))
    with pytest.raises(ValueError, match="payload"):
        message({}, bytes(MAX_PAYLOAD + 1))


def test_empty_chunk_gives_no_message() -> None:
    """An empty chunk gives no PayloadPart at all."""
    assert list(payload_parts(b"")) == []
    assert list(payload_parts(memoryview(b""))) == []


def test_buffer_kinds() -> None:
    """bytearray and memoryview chunks, of any item format, are framed as their bytes."""
    ints = array.array("i", [1, 2, 3])
    for chunk in (bytearray(b"abc"), memoryview(b"xabcx")[1:4], memoryview(ints)):
        (decoded,) = decode(payload_parts(chunk))
        assert decoded.payload == bytes(chunk)


def test_header_value_types() -> None:
    """str, bytes, bool and int headers are encoded as types 7, 6, 0/1 and 4 (int32) or 5 (int64)."""
    headers: dict[str, str | bytes | bool | int] = {
        "s": "text",
        "b": b"\x00\x01",
        "t": True,
        "f": False,
        "i": -(2**31),
        "j": 2**31 - 1,
        "l": 2**31,
        "m": -(2**63),
    }
    raw = message(headers, b"")
    (decoded,) = decode([raw])
    assert decoded.headers == headers
    assert decoded.payload == b""
    wire = raw[12:-4]
    for name, kind in {"s": 7, "b": 6, "t": 0, "f": 1, "i": 4, "j": 4, "l": 5, "m": 5}.items():
        assert bytes((1,)) + name.encode() + bytes((kind,)) in wire


def test_header_limits() -> None:
    """Headers over 128 KiB, a name over 255 bytes or empty, a value over 32767 bytes or 64 bits raise ValueError."""
    big = "v" * (2**15 - 1)
    at_most = {f"h{i}": big for i in range(MAX_HEADERS // (len(big) + 6))}
    decode([message(at_most, b"")])
    with pytest.raises(ValueError, match="headers"):
        message({**at_most, "extra": big}, b"")
    decode([message({"n" * 255: 1}, b"")])
    with pytest.raises(ValueError, match="name"):
        message({"n" * 256: 1}, b"")
    with pytest.raises(ValueError, match="name"):
        message({"\u00e9" * 128: 1}, b"")  # 128 characters, 256 bytes of UTF-8
    with pytest.raises(ValueError, match="name"):
        message({"": 1}, b"")
    with pytest.raises(ValueError, match="value"):
        message({"s": big + "v"}, b"")
    with pytest.raises(ValueError, match="value"):
        message({"b": bytes(2**15)}, b"")
    with pytest.raises(ValueError, match="64-bit"):
        message({"i": 2**63}, b"")
    with pytest.raises(TypeError):
        message({"x": 1.5}, b"")  # type: ignore[dict-item]


@pytest.mark.parametrize("where", ["prelude length", "prelude crc", "header", "payload", "message crc"])
def test_corrupted_message_rejected(where: str) -> None:
    """A byte changed anywhere makes botocore reject the message on a CRC: they are the real CRC-32s."""
    raw = bytearray(next(iter(payload_parts(b"payload bytes"))))
    headers_end = 12 + struct.unpack("!I", raw[4:8])[0]
    at = {"prelude length": 7, "prelude crc": 9, "header": 14, "payload": headers_end + 2, "message crc": -1}[where]
    raw[at] ^= 0x01
    with pytest.raises(botocore.eventstream.ChecksumMismatch):
        decode([bytes(raw)])
    with pytest.raises(botocore.eventstream.ChecksumMismatch):
        list(response_stream([bytes(raw)]))


def test_media_type() -> None:
    """The body's media type is the one botocore and the SageMaker API use for event streams."""
    assert MEDIA_TYPE == "application/vnd.amazon.eventstream"
    assert _eventstream.MAX_HEADERS == 128 * 1024
    assert MAX_PAYLOAD == 16 * 1024 * 1024


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", MEDIA_TYPE)
        self.send_header("X-Amzn-SageMaker-Content-Type", "application/jsonlines")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_boto3_invoke_endpoint_with_response_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3's invoke_endpoint_with_response_stream, unmodified over HTTP, yields our parts and raises our error."""
    chunks = [b'{"token": "a"}\n', b'{"token": "b"}\n']
    body = b"".join(part for chunk in chunks for part in payload_parts(chunk))
    handler = type("Handler", (_Handler,), {"body": body + model_stream_error("reset", "StreamBroken")})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for name, value in local_aws_env(f"http://127.0.0.1:{server.server_address[1]}").items():
            monkeypatch.setenv(name, value)
        runtime = boto3.client("sagemaker-runtime")
        response = runtime.invoke_endpoint_with_response_stream(EndpointName="model", Body=b"{}")
        assert response["ContentType"] == "application/jsonlines"
        events = iter(response["Body"])
        assert [next(events), next(events)] == [{"PayloadPart": {"Bytes": chunk}} for chunk in chunks]
        with pytest.raises(botocore.exceptions.EventStreamError) as raised:
            next(events)
        assert raised.value.response["Error"] == {"Code": "ModelStreamError", "Message": "reset"}
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
