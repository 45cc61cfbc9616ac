"""Reading a request body into one buffer, within the body limit, decoded as its ``Content-Encoding`` says."""

from __future__ import annotations

import dataclasses
import io
import sys
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from inference_server.errors import BadRequest, LengthRequired, PayloadTooLarge, UnsupportedMediaType

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

_READ_BLOCK = 1 << 20
#: Bodies of at most this many bytes are read in one call, without the loop's views.
_SMALL = 1 << 16
#: The environ key under which :func:`read_body` leaves the body's length in bytes (for the metrics and logs).
BODY_BYTES = "inference_server.body_bytes"
#: The environ key of a body the front read already, as ``bytes`` (the gRPC front: a message's bytes).
GIVEN_BODY = "inference_server.given_body"
#: The environ key saying a :data:`GIVEN_BODY`'s size was bounded by whoever gave it, not by the body limit (an
#: asynchronous request's input, up to 1 GB as SageMaker's).
GIVEN_BOUNDED = "inference_server.given_bounded"


def given_environ(
    method: str, path: str, body: bytes | bytearray, server: tuple[str, int], protocol: str, remote: str
) -> dict[str, Any]:
    """The WSGI environ of a request that reaches the app through the server's own code (a gRPC message, an
    asynchronous request), its body given (:data:`GIVEN_BODY`), not read from ``wsgi.input``; the caller adds its
    headers."""
    return {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": protocol,
        "REMOTE_ADDR": remote,
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        GIVEN_BODY: body,
    }


#: The request body codings decoded (``Content-Encoding``), by name: zlib's window bits for each.
CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
#: How the operator raises the body limit, said in every 413.
_RAISE = "; the server's operator can raise it with SAGEMAKER_MAX_PAYLOAD_IN_MB or the max_payload_in_mb hook"


@dataclasses.dataclass(frozen=True)
class Reading:
    """How the HTTP server hands the app a request body (each backend of ``server/`` says)."""

    #: Sends ``100 Continue`` when the server leaves it to the app (gunicorn: only once the body is wanted).
    send_continue: Callable[[WSGIEnvironment], None] | None = None
    #: The server tells the app when a chunked body is broken (cut short, malformed chunk framing) by raising from
    #: ``read``. granian 2.8 does not: its ``wsgi.input`` turns the error into an empty read, the end of a complete
    #: body (``src/wsgi/types.rs``), so a body cut short would reach the model as whole; only its ``read()`` of the
    #: whole body tells, by answering nothing at all (it drops what it collected). On such a server a chunked body
    #: is read with that one call when bodies have no limit (``MaxPayloadInMB`` 0: SageMaker's chunked Batch
    #: Transform), an empty answer being a 400; with a limit, that call could not be bounded, so it is refused
    #: (411) before any of it is read.
    verifies_chunked: bool = True
    #: The server's exceptions for a body the client broke that are not parse errors (gunicorn's ``NoMoreData``, an
    #: ``OSError``, when the connection ends before the last chunk): a 400, not a 500.
    client_errors: tuple[type[BaseException], ...] = ()
    #: Ends a body read in progress on another thread (the read returns what came so far), for the watchdog of a
    #: body that overran ``--read-timeout``; None where the body is read before the deadline starts (granian).
    abort: Callable[[WSGIEnvironment], None] | None = None


#: A PEP 3333 server that raises from ``read`` whatever goes wrong with a body.
PEP_3333 = Reading()
#: What a server that cannot verify chunked bodies is told to use instead.
_USE_CONTENT_LENGTH = (
    "a chunked body is refused on this server while bodies have a limit (granian cannot tell the app whether a "
    "chunked body arrived whole, unless it reads it without one): send it with a Content-Length, or serve with "
    "--server gunicorn, which verifies chunked bodies"
)


def unsupported_coding(codings: str) -> str:
    """What a request whose ``Transfer-Encoding`` is not ``chunked`` alone is told (both backends say it)."""
    return (
        f"Transfer-Encoding {codings!r} is not supported: a request body is sent with a Content-Length, or with "
        "Transfer-Encoding: chunked alone"
    )


def declared_length(environ: WSGIEnvironment, limit: int | None) -> int | None:
    """The body's ``Content-Length`` (None without one): a 400 if it is not a byte count, a 413 over ``limit``."""
    header = environ.get("CONTENT_LENGTH")
    if not header:
        return None
    try:
        length = int(header)
        if length < 0:
            raise ValueError
    except ValueError:
        raise BadRequest(f"Content-Length {header!r} is not a byte count") from None
    if limit is not None and length > limit:
        raise PayloadTooLarge(f"the body is {length} bytes; the limit (MaxPayloadInMB) is {limit} bytes{_RAISE}")
    return length


def read_body(environ: WSGIEnvironment, limit: int | None, reading: Reading = PEP_3333) -> bytearray | bytes:
    """Read the request body into one buffer, refusing bodies over ``limit`` bytes with 413, and decode it as its
    ``Content-Encoding`` says (:func:`decoded`); a body the front holds already (:data:`GIVEN_BODY`) is taken as it
    is, not copied."""
    given = environ.get(GIVEN_BODY)
    if given is not None:
        if limit is not None and len(given) > limit and GIVEN_BOUNDED not in environ:
            raise PayloadTooLarge(
                f"the body is {len(given)} bytes; the limit (MaxPayloadInMB) is {limit} bytes{_RAISE}"
            )
        environ[BODY_BYTES] = len(given)
        return given  # type: ignore[no-any-return]
    body = _read_body(environ, limit, reading)
    return decoded(environ, body, limit) if "HTTP_CONTENT_ENCODING" in environ else body


def decoded(environ: WSGIEnvironment, body: bytearray | bytes, limit: int | None) -> bytearray | bytes:
    """``body`` decoded as its ``Content-Encoding`` says (``gzip``, ``deflate``, ``identity``, in the order they were
    applied): 415 for another coding, 400 for data that is not what it says, 413 as soon as the decoded bytes pass
    ``limit`` (a small body that inflates to gigabytes takes no more than ``limit`` bytes of memory)."""
    header = environ.get("HTTP_CONTENT_ENCODING", "")
    codings = [coding.strip().lower() for coding in header.split(",") if coding.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        bits = CODINGS.get(coding)
        if bits is None:
            raise UnsupportedMediaType(
                f"Content-Encoding {header[:100]!r} is not supported: a body may be sent as it is, or gzip or deflate "
                "compressed"
            )
        body = _inflate(body, bits, limit, coding)
    return body


def _inflate(data: bytearray | bytes, bits: int, limit: int | None, coding: str) -> bytearray:
    """``data`` decompressed (``bits``: zlib's window bits; a ``deflate`` body without zlib's header is read raw, as
    some clients send it), at most ``limit`` bytes of it."""
    try:
        return _inflated(data, bits, limit, coding)
    except zlib.error as exc:
        if bits == zlib.MAX_WBITS:
            try:
                return _inflated(data, -zlib.MAX_WBITS, limit, coding)
            except zlib.error:
                pass
        raise BadRequest(f"the body is not {coding} data: {exc}") from None


def _inflated(data: bytearray | bytes, bits: int, limit: int | None, coding: str) -> bytearray:
    inflater = zlib.decompressobj(bits)
    out = bytearray()
    pending: bytes | bytearray = data
    while True:
        room = 0 if limit is None else limit + 1 - len(out)  # (0: no bound)
        piece = inflater.decompress(pending, room)
        out += piece
        if limit is not None and len(out) > limit:
            raise PayloadTooLarge(
                f"the body, {coding} decoded, passes the limit (MaxPayloadInMB) of {limit} bytes (it was {len(data)} "
                f"bytes compressed){_RAISE}"
            )
        pending = inflater.unconsumed_tail
        if inflater.eof or (not pending and not (room and len(piece) == room)):
            break
    if not inflater.eof:
        raise BadRequest(f"the {coding} body is cut short (its compressed stream does not end)")
    if inflater.unused_data:
        raise BadRequest(f"the {coding} body has {len(inflater.unused_data)} bytes after its compressed stream")
    return out


def _read_body(environ: WSGIEnvironment, limit: int | None, reading: Reading) -> bytearray | bytes:
    """Read the request body into one buffer, refusing bodies over ``limit`` bytes with 413.

    With a ``Content-Length`` the buffer is allocated once and a body over the limit is refused before any of it is
    read; a chunked body grows in large steps and is refused as soon as it passes the limit (see
    :attr:`Reading.verifies_chunked` for servers that cannot tell the app whether it arrived whole).
    ``reading.send_continue`` is called, for a client that sent ``Expect: 100-continue``, once the body is going to
    be read (not before a 413 or 411).
    """
    stream = environ["wsgi.input"]
    length = declared_length(environ, limit)
    if length is not None:
        if reading.send_continue is not None:
            _continue(environ, reading.send_continue)
        if length <= _SMALL:  # one read and one copy (a server may return less: read on below)
            first = stream.read(length)
            if len(first) == length:
                environ[BODY_BYTES] = length
                return bytearray(first)
        else:
            first = b""
        buffer = bytearray(length)
        view = memoryview(buffer)
        readinto = getattr(stream, "readinto", None)
        position = len(first)
        view[:position] = first
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
    if chunked and not reading.verifies_chunked:
        if limit is not None:
            raise LengthRequired(_USE_CONTENT_LENGTH)
        return _read_whole(environ, stream)
    if reading.send_continue is not None:
        _continue(environ, reading.send_continue)
    if not (chunked or environ.get("wsgi.input_terminated")):
        return bytearray()  # no length and no framing: WSGI says there is no body to read
    buffer = bytearray()
    while chunk := _read(stream, _READ_BLOCK, reading.client_errors):
        buffer += chunk
        if limit is not None and len(buffer) > limit:
            raise PayloadTooLarge(f"the chunked body passed the limit (MaxPayloadInMB) of {limit} bytes{_RAISE}")
    environ[BODY_BYTES] = len(buffer)
    return buffer


def _continue(environ: WSGIEnvironment, send_continue: Callable[[WSGIEnvironment], None]) -> None:
    """Send ``100 Continue`` if the client asked for it (``Expect: 100-continue``)."""
    if environ.get("HTTP_EXPECT", "").lower() == "100-continue":
        send_continue(environ)


def _read_whole(environ: WSGIEnvironment, stream: Any) -> bytes:
    """A chunked body read with one ``read()``, on a server that answers nothing when the body is broken."""
    body: bytes = stream.read()
    if not body:
        raise BadRequest("the chunked body is empty, cut short or malformed (this server cannot tell which)")
    environ[BODY_BYTES] = len(body)
    return body


def _read(stream: Any, size: int, client_errors: tuple[type[BaseException], ...]) -> bytes:
    """``stream.read(size)``, where the server's own parse errors (a malformed chunk: its size, extension,
    terminator or trailer) and ``client_errors`` are the client's fault, a 400, not a 500; a parse error with a
    ``status`` attribute says its own message (413: a chunk larger than the body limit)."""
    try:
        return stream.read(size)  # type: ignore[no-any-return]
    except client_errors:
        raise BadRequest("the chunked body ended before its last chunk (the client closed the connection?)") from None
    except OSError:
        raise
    except Exception as exc:
        if getattr(exc, "status", None) == PayloadTooLarge.code:  # (a server's: a chunk larger than the limit)
            raise PayloadTooLarge(f"{exc}{_RAISE}") from None
        detail = str(exc) if hasattr(exc, "status") else f"{type(exc).__name__}: {exc}"
        raise BadRequest(f"the chunked body is malformed: {detail}"[:300]) from None


def read_json_object(
    environ: WSGIEnvironment, limit: int, reading: Reading, example: str = "", empty_ok: bool = False
) -> dict[str, Any]:
    """The body (at most ``limit`` bytes) as a JSON object, else 400 saying what is wrong (``example``: what the
    object looks like); an empty body is ``{}`` when ``empty_ok``."""
    body = read_body(environ, limit, reading)
    if empty_ok and not body.strip():
        return {}
    try:
        fields = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise BadRequest(f"the body must be a JSON object: {example}" if example else "the body must be a JSON object")
    return fields
