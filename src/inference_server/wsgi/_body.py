"""Reading a request body into one buffer, within the body limit."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from inference_server.errors import BadRequest, PayloadTooLarge

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

_READ_BLOCK = 1 << 20
#: The environ key under which :func:`read_body` leaves the body's length in bytes (for the metrics and logs).
BODY_BYTES = "inference_server.body_bytes"
#: How the operator raises the body limit, said in every 413.
_RAISE = "; the server's operator can raise it with SAGEMAKER_MAX_PAYLOAD_IN_MB or the max_payload_in_mb hook"


def read_body(
    environ: WSGIEnvironment,
    limit: int | None,
    send_continue: Callable[[WSGIEnvironment], None] | None = None,
) -> bytearray:
    """Read the request body into one buffer, refusing bodies over ``limit`` bytes with 413.

    With a ``Content-Length`` the buffer is allocated once and a body over the limit is refused before any of it is
    read; a chunked body grows in large steps and is refused as soon as it passes the limit. ``send_continue`` is
    called, for a client that sent ``Expect: 100-continue``, once the body is going to be read (not before a 413).
    """
    stream = environ["wsgi.input"]
    if send_continue is not None and environ.get("HTTP_EXPECT", "").lower() == "100-continue":
        length_header = environ.get("CONTENT_LENGTH")
        if not (limit is not None and length_header and length_header.isdigit() and int(length_header) > limit):
            send_continue(environ)
    length_header = environ.get("CONTENT_LENGTH")
    if length_header:
        try:
            length = int(length_header)
            if length < 0:
                raise ValueError
        except ValueError:
            raise BadRequest(f"Content-Length {length_header!r} is not a byte count") from None
        if limit is not None and length > limit:
            raise PayloadTooLarge(f"the body is {length} bytes; the limit (MaxPayloadInMB) is {limit} bytes{_RAISE}")
        buffer = bytearray(length)
        view = memoryview(buffer)
        readinto = getattr(stream, "readinto", None)
        position = 0
        while position < length:
            end = min(length, position + _READ_BLOCK)
            if readinto is not None:
                count = readinto(view[position:end])
            else:
                chunk = stream.read(end - position)
                count = len(chunk)
                view[position : position + count] = chunk
            if not count:
                raise BadRequest(f"the body ended after {position} of {length} bytes (Content-Length)")
            position += count
        environ[BODY_BYTES] = length
        return buffer
    chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    if not (chunked or environ.get("wsgi.input_terminated")):
        return bytearray()  # no length and no framing: WSGI says there is no body to read
    buffer = bytearray()
    while chunk := _read(stream, _READ_BLOCK):
        buffer += chunk
        if limit is not None and len(buffer) > limit:
            raise PayloadTooLarge(f"the chunked body passed the limit (MaxPayloadInMB) of {limit} bytes{_RAISE}")
    environ[BODY_BYTES] = len(buffer)
    return buffer


def _read(stream: Any, size: int) -> bytes:
    """``stream.read(size)``, where the server's own parse errors (a malformed chunk: its size, extension,
    terminator or trailer) are the client's fault, a 400, not a 500."""
    try:
        return stream.read(size)  # type: ignore[no-any-return]
    except OSError:
        raise
    except Exception as exc:
        raise BadRequest(f"the chunked body is malformed: {type(exc).__name__}: {exc}"[:300]) from None


def read_json_object(environ: WSGIEnvironment, limit: int, example: str = "", empty_ok: bool = False) -> dict[str, Any]:
    """The body (at most ``limit`` bytes) as a JSON object, else 400 saying what is wrong (``example``: what the
    object looks like); an empty body is ``{}`` when ``empty_ok``."""
    body = read_body(environ, limit)
    if empty_ok and not body.strip():
        return {}
    try:
        fields = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise BadRequest(f"the body must be a JSON object: {example}" if example else "the body must be a JSON object")
    return fields
