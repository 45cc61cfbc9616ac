"""What the event-loop fronts share: the request as an environ, ``POST /invocations`` through the lifecycle on the
loop with the app's edge (request id, checks, metrics, access line, span), the other routes bridged to the WSGI app,
and sending. Each front (:mod:`._rsgi`, :mod:`._asgi`) is a thin adapter: it builds the environ from its scope and
gives an :class:`Exchange` (read the body, answer, stream); no lifecycle logic lives in it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import io
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from inference_server import _logging, _loop, codecs
from inference_server.errors import BadRequest, HTTPError, LengthRequired, PayloadTooLarge, RequestTimeout
from inference_server.wsgi._app import HEAD_BYTES, App, Route, answered, request_id_of
from inference_server.wsgi._body import _RAISE, _USE_CONTENT_LENGTH, BODY_BYTES, declared_length, decoded
from inference_server.wsgi._invoke import StreamFailed
from inference_server.wsgi._replies import PIECE, Body, Invoking, Piecewise, Request, close, compressed, error_for

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

logger = logging.getLogger("inference_server")

#: Bodies of at most this many bytes are read with one call.
_SMALL = 1 << 16
#: Threads the bridge calls the WSGI app's routes on (started only when needed).
BRIDGE_THREADS = 64


class Broken(Exception):
    """The client's connection ended before its body did."""


class Exchange(Protocol):
    """One request as a front hands it over: its environ, its body, and how to answer it."""

    environ: WSGIEnvironment
    #: The front can tell a chunked body cut short from a whole one (:class:`Broken` from :meth:`chunks`).
    verifies_chunked: bool

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's chunks as they come; :class:`Broken` if the connection ends first (where the front can tell)."""
        ...

    async def whole(self) -> bytes:
        """The whole body in one read; empty if it was cut short (for a front that cannot tell otherwise)."""
        ...

    async def answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        """Send a whole answer."""
        ...

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        """Begin an answer sent in pieces."""
        ...

    async def send(self, data: bytes) -> bool:
        """Send a piece; False once the client is gone."""
        ...

    async def end(self) -> None:
        """End an answer sent in pieces."""
        ...


def environ_of(
    method: str,
    path: str,
    query: str,
    http_version: str,
    scheme: str,
    client: tuple[str, str],
    server: tuple[str, str],
    headers: Iterable[tuple[str, str]],
) -> WSGIEnvironment:
    """The request as a WSGI environ (what the app's checks and protocols read; the bridge adds the rest of PEP
    3333's keys), its headers last as granian's WSGI interface has them, repeated ones joined with commas; the size
    of its head as a client writes it under :data:`HEAD_BYTES` (what ``--max-header-bytes`` bounds)."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": server[0],
        "SERVER_PORT": server[1],
        "SERVER_PROTOCOL": f"HTTP/{http_version}",
        "REMOTE_ADDR": client[0],
        "REMOTE_PORT": client[1],
        "wsgi.url_scheme": scheme,
    }
    # "METHOD target HTTP/x.y" CRLF, each "Name: value" CRLF, and the empty line's CRLF
    size = len(method) + len(path) + (len(query) + 1 if query else 0) + len(http_version) + 11
    for name, value in headers:
        size += len(name) + len(value) + 4
        key = name.upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
        previous = environ.get(key)
        environ[key] = value if previous is None else f"{previous},{value}"
    environ[HEAD_BYTES] = size
    return environ


#: What a WSGI app is handed besides the request (PEP 3333).
_WSGI = {
    "wsgi.version": (1, 0),
    "wsgi.multithread": True,
    "wsgi.multiprocess": True,
    "wsgi.run_once": False,
}


class Front:
    """The app on an event loop: ``POST /invocations`` on the loop, the other routes on bridge threads."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.lifecycle = app.loop_lifecycle
        self._bridge = concurrent.futures.ThreadPoolExecutor(BRIDGE_THREADS, "bridge")
        self._read_timeout = app.settings.read_timeout

    def adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make the server's loop this process's (async hooks run on it)."""
        _loop.adopt(loop)

    def close(self) -> None:
        self._bridge.shutdown(wait=False)

    def serve(self, exchange: Exchange) -> Awaitable[None]:
        """Answer one request (what the front awaits: one coroutine less on every request)."""
        if not _loop.on_loop():
            _loop.adopt(asyncio.get_running_loop())
        environ = exchange.environ
        found = self.app.routes.match(environ["PATH_INFO"] or "/")
        if found is not None and type(found[1].get(environ["REQUEST_METHOD"])) is Invoking:
            return self._invocation(exchange, found)
        return self._bridged(exchange)

    async def _invocation(self, exchange: Exchange, found: tuple[str, dict[str, Route], dict[str, str]]) -> None:
        """A route that invokes the model (``POST /invocations``, SageMaker Runtime's, ``/models/{name}/invoke``,
        v2's ``infer``) on the loop: the app's checks and edge, the lifecycle on the loop."""
        app, environ = self.app, exchange.environ
        started = time.perf_counter()
        request_id = request_id_of(environ)
        _logging.REQUEST.set((request_id, environ.get("HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID")))  # (this task's own)
        tracing = app.tracing
        span = tracing.request(environ, request_id) if tracing is not None else None
        body: Iterable[codecs.Buffer] | Piecewise
        try:
            handler, params = app.resolve(environ, "POST", found)
            assert type(handler) is Invoking
            request = Request(environ, request_id, params)
            read = functools.partial(read_decoded, exchange)
            invoke = functools.partial(self.lifecycle.invoke, request, read=read)
            status, headers, body = await handler.function(request, invoke)
        except Exception as exc:
            status, headers, body = error_for(exc, request_id, environ, app.settings.debug)
        answered(headers, environ, request_id)
        if "HTTP_ACCEPT_ENCODING" in environ:
            body = compressed(environ, headers, body)
        sent = 0
        try:
            sent = await send_answer(exchange, status, headers, body, request_id)
        finally:
            if span is not None:
                span.detach()
            if app.edge:
                if not sent and isinstance(body, Piecewise):  # (a stream cut mid-way: what it sent until then)
                    sent = body.sent
                record = app.record(environ, "POST", status, headers, started, sent or None)
                app.finish(record, environ, request_id, span)

    async def _bridged(self, exchange: Exchange) -> None:
        """A route of the WSGI app, called on a bridge thread once its body is read here."""
        environ = exchange.environ
        environ.update(_WSGI)
        environ["wsgi.errors"] = sys.stderr  # (this moment's: it may have been replaced since the import)
        environ["wsgi.input"] = await self._body_for_bridge(exchange)
        loop = asyncio.get_running_loop()
        reply: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
            reply[:] = [int(status.split(" ", 1)[0]), headers]
            return _no_write

        context = contextvars.copy_context()
        call = functools.partial(context.run, _called, self.app, environ, start_response)
        items, result = await loop.run_in_executor(self._bridge, call)
        status, headers = reply
        if items is not None:
            await send_answer(exchange, status, headers, items, "")
            return
        assert result is not None
        items_of = iter(result)
        try:
            chunk = await loop.run_in_executor(self._bridge, _next_or_none, items_of)
            if chunk is None:
                await send_answer(exchange, status, headers, [], "")
                return
            await exchange.start(status, headers)
            while chunk is not None:
                if not await exchange.send(_as_bytes(chunk)):
                    return  # the client went away
                chunk = await loop.run_in_executor(self._bridge, _next_or_none, items_of)
            await exchange.end()
        finally:
            await loop.run_in_executor(self._bridge, close, result)

    async def _body_for_bridge(self, exchange: Exchange) -> io.BufferedIOBase:
        """The body, read here within ``--read-timeout``, as ``wsgi.input``; what the app refuses by its head (a
        declared length over the limit: 413) is left unread for it to refuse, and a body that stalls, breaks or
        passes the limit is an input whose read says so."""
        environ = exchange.environ
        limit = self.app.pipeline.max_body
        length = environ.get("CONTENT_LENGTH")
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if length and length.isdigit() and limit is not None and int(length) > limit:
            return io.BytesIO()
        if not (length or chunked) or (chunked and limit is not None and not exchange.verifies_chunked):
            return io.BytesIO()  # (no body; or one the app refuses with 411 on a front that cannot verify it)
        try:
            body = await asyncio.wait_for(read_body(exchange, limit), self._read_timeout)
        except asyncio.TimeoutError:
            return _Refusing(RequestTimeout(f"the request body did not arrive within {self._read_timeout} s"))
        except HTTPError as exc:
            return _Refusing(exc)
        return io.BytesIO(body)


async def read_decoded(exchange: Exchange, limit: int | None) -> bytearray | bytes:
    """The body, read (:func:`read_body`) and decoded as its ``Content-Encoding`` says (within ``limit`` too)."""
    body = await read_body(exchange, limit)
    return decoded(exchange.environ, body, limit) if "HTTP_CONTENT_ENCODING" in exchange.environ else body


async def read_body(exchange: Exchange, limit: int | None) -> bytearray:
    """The body, read into one buffer (of its declared length, allocated once), refusing one over ``limit`` bytes
    (413, before reading it when its length is declared); a body cut short or longer than declared is a 400."""
    environ = exchange.environ
    length = declared_length(environ, limit)
    if length is not None:
        if length <= _SMALL:  # one read, one copy (each chunk of a streamed read is a wake-up of the loop)
            small = await exchange.whole()
            if len(small) != length:
                raise BadRequest(f"the body ended after {len(small)} of {length} bytes (Content-Length)")
            environ[BODY_BYTES] = length
            return bytearray(small)
        buffer = bytearray(length)
        position = 0
        try:
            async for chunk in exchange.chunks():
                end = position + len(chunk)
                if end > length:
                    raise BadRequest(f"the body is longer than its Content-Length ({length} bytes)")
                buffer[position:end] = chunk
                position = end
        except Broken:
            pass
        if position < length:
            raise BadRequest(f"the body ended after {position} of {length} bytes (Content-Length)")
        environ[BODY_BYTES] = length
        return buffer
    if "chunked" not in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return bytearray()
    if not exchange.verifies_chunked:
        if limit is not None:
            raise LengthRequired(_USE_CONTENT_LENGTH)
        whole = await exchange.whole()
        if not whole:
            raise BadRequest("the chunked body is empty, cut short or malformed (this server cannot tell which)")
        environ[BODY_BYTES] = len(whole)
        return bytearray(whole)
    buffer = bytearray()
    try:
        async for chunk in exchange.chunks():
            buffer += chunk
            if limit is not None and len(buffer) > limit:
                raise PayloadTooLarge(f"the chunked body passed the limit (MaxPayloadInMB) of {limit} bytes{_RAISE}")
    except Broken:
        raise BadRequest("the chunked body ended before its last chunk (the client closed the connection?)") from None
    environ[BODY_BYTES] = len(buffer)
    return buffer


async def send_answer(
    exchange: Exchange,
    status: int,
    headers: list[tuple[str, str]],
    body: Iterable[codecs.Buffer] | Piecewise,
    request_id: str,
) -> int:
    """Send an answer; the bytes of its body sent. A large whole answer goes in pieces of :data:`PIECE` bytes. A
    stream is closed once sent or once its client is gone; one that cannot go on raises :class:`StreamFailed` to the
    front (which ends the connection without the chunked coding's last chunk where its server can)."""
    if not isinstance(body, Piecewise):
        body = body if type(body) is list else list(body)
        if len(body) == 1 and type(body[0]) is bytes:
            await exchange.answer(status, headers, body[0])
            return len(body[0])
        size = sum(memoryview(item).nbytes for item in body)
        if size <= PIECE:
            data = b"".join(_as_bytes(item) for item in body)
            await exchange.answer(status, headers, data)
            return size
        await exchange.start(status, headers)
        for item in body:
            view = memoryview(item).cast("B")
            for start in range(0, view.nbytes, PIECE):
                if not await exchange.send(view[start : start + PIECE].tobytes()):
                    return size  # (the client went away)
        await exchange.end()
        return size
    try:
        await exchange.start(status, headers)
        async for chunk in body:
            if not await exchange.send(_as_bytes(chunk)):
                break  # the client went away: the generator is closed below
        else:
            await exchange.end()
    except StreamFailed as exc:
        logger.info("Request %s: the stream is cut (%s: %s)", request_id, exc.code, exc.message)
        raise
    finally:
        await body.aclose()
    return body.sent


class _Refusing(io.BufferedIOBase):
    """A ``wsgi.input`` whose every read raises ``error`` (a body that did not arrive as it should)."""

    def __init__(self, error: HTTPError) -> None:
        self._error = error

    def read(self, size: int | None = -1) -> bytes:
        raise self._error

    def readinto(self, buffer: Any) -> int:
        raise self._error


def _no_write(data: bytes) -> None:
    raise RuntimeError("the WSGI write() callable is not supported: return the body instead")


def _called(
    app: App, environ: WSGIEnvironment, start_response: Any
) -> tuple[list[codecs.Buffer] | None, Iterable[codecs.Buffer] | None]:
    """On a bridge thread: the WSGI app's answer, whole (its items, the body closed) or to be sent as it is made."""
    result = app(environ, start_response)
    if type(result) in (list, tuple) or (isinstance(result, Body) and result.whole):
        try:
            return list(result), None
        finally:
            close(result)
    return None, result


def _next_or_none(items: Iterator[codecs.Buffer]) -> codecs.Buffer | None:
    return next(items, None)


def _as_bytes(chunk: codecs.Buffer) -> bytes:
    return chunk if type(chunk) is bytes else memoryview(chunk).cast("B").tobytes()
