"""The ``application/vnd.amazon.eventstream`` framing that SageMaker Runtime's ``InvokeEndpointWithResponseStream``
answers with, so that boto3's ``invoke_endpoint_with_response_stream`` reads our responses unmodified. Pure
functions from values to the bytes of whole messages; no HTTP here.

Sources followed:

- The wire format: the Amazon Event Stream specification, https://smithy.io/2.0/aws/amazon-eventstream.html
  (``smithy-lang/smithy`` ``docs/source-2.0/aws/amazon-eventstream.rst``), and its decoder in botocore,
  ``botocore/eventstream.py`` (``EventStreamBuffer``, ``EventStreamHeaderParser``, ``_validate_checksum``). A
  message is a 12-byte prelude (total length, headers length, CRC-32 of those 8 bytes; all u32 big-endian), the
  headers, the payload, and the CRC-32 of everything before it (u32 big-endian; botocore continues the prelude's
  CRC over ``data[8:-4]``, which is the same number). A header is its name's length (u8), the UTF-8 name (1 to 255
  bytes), a type (u8) and the value: 0/1 boolean true/false (no value bytes), 4 int32, 5 int64, 6 byte array and
  7 UTF-8 string (u16 length, at most 2**15 - 1 bytes per the specification's ``<1..2^15-1>``), among others.
- The limits: 128 KiB of headers per message, and we keep payloads to 16 MiB, the limit botocore enforced before
  the specification raised it to 24 MiB (https://github.com/boto/botocore/pull/3438; botocore 1.43's
  ``_MAX_PAYLOAD_LENGTH`` is 24 MiB), so that the older botocore our ``boto3>=1.28.57`` floor admits reads them too.
- Which headers each message needs: the specification's "Amazon Event Semantics" (message events:
  ``:message-type`` = ``event``, ``:event-type`` = the union member, ``:content-type``; modeled error events:
  ``:message-type`` = ``exception``, ``:exception-type`` = the union member, ``:content-type``) and the parser
  botocore uses for the ``rest-json`` protocol, ``botocore/parsers.py``: ``RestJSONParser.EVENT_STREAM_PARSER_CLS``
  is ``EventStreamJSONParser``; ``BaseEventStreamParser._do_parse`` picks the event shape by ``:event-type`` and,
  as ``PayloadPart.Bytes`` is the blob marked ``eventpayload``, hands it the payload as-is;
  ``EventStreamMessage.to_response_dict`` (``botocore/eventstream.py``) makes ``:message-type`` ``exception`` a 400,
  for which ``EventStream._parse_event`` raises ``botocore.exceptions.EventStreamError`` with what
  ``BaseEventStreamParser._do_error_parse`` made of it: ``Code`` = ``:exception-type``, ``Message`` = the
  ``Message`` of the payload parsed as JSON with the member's shape. REST protocols have no ``initial-response``
  event (the specification's "Initial Message Events"), and botocore's ``RestJSONParser`` does not ask for one.
- The events and exceptions: the SageMaker Runtime service model, ``botocore/data/sagemaker-runtime/2017-05-13/
  service-2.json`` (``ResponseStream``, ``eventstream: true``, members ``PayloadPart`` {``Bytes``: ``PartBlob``,
  ``eventpayload: true``}, ``ModelStreamError`` {``Message``, ``ErrorCode``} and ``InternalStreamFailure``
  {``Message``}, both ``exception: true``; ``Message`` has ``max: 2048``), and the API reference,
  https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_runtime_InvokeEndpointWithResponseStream.html and
  https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_runtime_ResponseStream.html (``ErrorCode`` is
  ``ModelInvocationTimeExceeded`` or ``StreamBroken``).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator, Mapping

__all__ = [
    "MAX_HEADERS",
    "MAX_PAYLOAD",
    "MEDIA_TYPE",
    "internal_stream_failure",
    "message",
    "model_stream_error",
    "payload_parts",
]

#: The ``Content-Type`` of an HTTP response whose body is a sequence of these messages.
MEDIA_TYPE = "application/vnd.amazon.eventstream"
#: The most payload bytes one message carries (botocore's ``_MAX_PAYLOAD_LENGTH`` before 24 MiB; see above).
MAX_PAYLOAD = 16 * 1024 * 1024
#: The most bytes of encoded headers one message carries (botocore's ``_MAX_HEADERS_LENGTH``).
MAX_HEADERS = 128 * 1024

Payload = bytes | bytearray | memoryview
HeaderValue = str | bytes | bool | int

_PRELUDE = struct.Struct("!II")  # total length, headers length; then their CRC-32
_U32 = struct.Struct("!I")
_PRELUDE_LENGTH = 12
_CRC_LENGTH = 4
_MAX_NAME = 255  # the name's length is a u8
_MAX_VALUE = 2**15 - 1  # byte arrays and strings: ``<1..2^15-1>`` in the specification
_INT32 = struct.Struct("!i")
_INT64 = struct.Struct("!q")
_U16 = struct.Struct("!H")
_MESSAGE_MAX = 2048  # the ``Message`` shape's ``max`` in the service model

_TRUE, _FALSE, _INT, _LONG, _BYTES, _STRING = 0, 1, 4, 5, 6, 7


def _header(name: str, value: HeaderValue) -> bytes:
    raw_name = name.encode()
    if not 0 < len(raw_name) <= _MAX_NAME:
        raise ValueError(f"an event-stream header name is 1 to {_MAX_NAME} bytes of UTF-8, not {len(raw_name)}")
    head = bytes((len(raw_name),)) + raw_name
    # bool first: it is an int too
    if isinstance(value, bool):
        return head + bytes((_TRUE if value else _FALSE,))
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return head + bytes((_INT,)) + _INT32.pack(value)
        if -(2**63) <= value < 2**63:
            return head + bytes((_LONG,)) + _INT64.pack(value)
        raise ValueError(f"event-stream header {name!r}: {value} does not fit a signed 64-bit integer")
    if isinstance(value, str):
        kind, raw = _STRING, value.encode()
    elif isinstance(value, (bytes, bytearray)):
        kind, raw = _BYTES, bytes(value)
    else:
        raise TypeError(f"event-stream header {name!r}: no encoding for a {type(value).__name__}")
    if len(raw) > _MAX_VALUE:
        raise ValueError(f"event-stream header {name!r}: {len(raw)} bytes of value, more than {_MAX_VALUE}")
    return head + bytes((kind,)) + _U16.pack(len(raw)) + raw


def _headers(headers: Mapping[str, HeaderValue]) -> bytes:
    encoded = b"".join(_header(name, value) for name, value in headers.items())
    if len(encoded) > MAX_HEADERS:
        raise ValueError(f"{len(encoded)} bytes of event-stream headers, more than {MAX_HEADERS}")
    return encoded


def _frame(headers: bytes, payload: memoryview) -> bytes:
    """One message from encoded headers and a flat byte view: the payload is copied once, into the result, and its
    CRC-32 is carried on from the prelude's and the headers' without joining them first."""
    if payload.nbytes > MAX_PAYLOAD:
        raise ValueError(f"{payload.nbytes} bytes of event-stream payload, more than {MAX_PAYLOAD}")
    lengths = _PRELUDE.pack(_PRELUDE_LENGTH + len(headers) + payload.nbytes + _CRC_LENGTH, len(headers))
    head = lengths + _U32.pack(zlib.crc32(lengths)) + headers
    crc = zlib.crc32(payload, zlib.crc32(head))
    return b"".join((head, payload, _U32.pack(crc)))


def _flat(payload: Payload) -> memoryview:
    view = memoryview(payload)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def message(headers: Mapping[str, HeaderValue], payload: Payload) -> bytes:
    """One event-stream message. Header values are encoded by their Python type: ``str`` as a string (type 7),
    ``bytes`` as a byte array (6), ``bool`` as boolean true/false (0/1), ``int`` as an int32 (4) when it fits, else
    an int64 (5).

    :raises ValueError: a payload over :data:`MAX_PAYLOAD` bytes, headers over :data:`MAX_HEADERS` bytes encoded, a
        header name that is empty or over 255 bytes of UTF-8, a string or byte array value over 32767 bytes, or an
        ``int`` that does not fit 64 bits.
    :raises TypeError: a header value of another type.
    """
    return _frame(_headers(headers), _flat(payload))


_PAYLOAD_PART = _headers(
    {":message-type": "event", ":event-type": "PayloadPart", ":content-type": "application/octet-stream"}
)


def payload_parts(chunk: Payload) -> Iterator[bytes]:
    """The ``PayloadPart`` events that carry ``chunk``: one message, or several of at most :data:`MAX_PAYLOAD` bytes
    each when it is longer. botocore yields each as ``{"PayloadPart": {"Bytes": <its slice of chunk>}}``.

    Lazy, one message at a time, so a large chunk is not held twice over; ``chunk`` must not change meanwhile.
    """
    view = _flat(chunk)
    # An empty chunk gives no message: an empty PayloadPart tells the client nothing, and costs it an event.
    for start in range(0, view.nbytes, MAX_PAYLOAD):
        yield _frame(_PAYLOAD_PART, view[start : start + MAX_PAYLOAD])


def _exception(exception_type: str, members: Mapping[str, str]) -> bytes:
    headers = {":message-type": "exception", ":exception-type": exception_type, ":content-type": "application/json"}
    return message(headers, json.dumps(members, separators=(",", ":")).encode())


def model_stream_error(message: str, error_code: str) -> bytes:
    """The ``ModelStreamError`` exception message, payload ``{"Message": message, "ErrorCode": error_code}``; SageMaker
    documents the codes ``ModelInvocationTimeExceeded`` and ``StreamBroken``. botocore raises it as an
    ``EventStreamError`` with ``Code`` ``ModelStreamError`` and the ``Message`` (it parses ``ErrorCode`` but does not
    keep it in the error). ``message`` is cut to the model's 2048 characters."""
    return _exception("ModelStreamError", {"Message": message[:_MESSAGE_MAX], "ErrorCode": error_code})


def internal_stream_failure(message: str) -> bytes:
    """The ``InternalStreamFailure`` exception message, payload ``{"Message": message}``, which botocore raises as an
    ``EventStreamError`` with ``Code`` ``InternalStreamFailure``. ``message`` is cut to the model's 2048 characters."""
    return _exception("InternalStreamFailure", {"Message": message[:_MESSAGE_MAX]})
