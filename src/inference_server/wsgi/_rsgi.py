"""The event-loop front: granian's RSGI interface over the app (``--granian-interface rsgi``, a preview).

A thin adapter: it turns granian's scope into the environ the app's checks and protocols read, reads bodies on the
loop, and sends answers. ``POST /invocations`` runs through :class:`~inference_server.wsgi._async.AsyncLifecycle` on
the loop (no thread per request, the 504 at the deadline, async hooks, streams that wait without a thread); every
other route is the WSGI app's, called on a bridge thread with its body already read on the loop (so a client that
stalls its body holds no thread there either), until its protocol moves onto the loop.

Why RSGI rather than granian's ASGI interface: RSGI hands the whole body in one call and an answer of ``bytes`` in
one call, where ASGI goes through a dict per message; the benchmarks' event-loop ceilings are RSGI apps.
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
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from inference_server import _logging, _loop, codecs
from inference_server.errors import BadRequest, HTTPError, LengthRequired, PayloadTooLarge, RequestTimeout
from inference_server.wsgi._app import App, answered, request_id_of
from inference_server.wsgi._async import AsyncLifecycle, Chunks
from inference_server.wsgi._body import _RAISE, _USE_CONTENT_LENGTH, BODY_BYTES
from inference_server.wsgi._invoke import StreamFailed
from inference_server.wsgi._replies import PIECE, Body, Request, close, error_for

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

logger = logging.getLogger("inference_server")

#: Threads the bridge calls the WSGI app's routes on (started only when needed).
BRIDGE_THREADS = 64
#: An answer up to this size is handed to granian as one ``bytes``; a larger one goes in pieces.
_WHOLE = PIECE


class Front:
    """granian's RSGI app: ``__rsgi__`` for each request, ``__rsgi_init__`` when the worker's loop starts."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.lifecycle = AsyncLifecycle(app.lifecycle)
        self._bridge = concurrent.futures.ThreadPoolExecutor(BRIDGE_THREADS, "bridge")
        self._read_timeout = app.settings.read_timeout
        self._server = ("127.0.0.1", str(app.settings.port))

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        _loop.adopt(loop)  # async hooks run on the server's own loop

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._bridge.shutdown(wait=False)

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        if scope.proto != "http":
            return  # (websockets are not served: granian closes the connection)
        environ = self._environ(scope)
        if scope.method == "POST" and scope.path == "/invocations":
            await self._invocation(environ, protocol)
        else:
            await self._bridged(environ, protocol)

    def _environ(self, scope: Any) -> WSGIEnvironment:
        """The request as a WSGI environ (what the app's checks and protocols read), its headers last as granian's
        WSGI interface has them, repeated ones joined with commas."""
        host, _, port = (scope.server or "").rpartition(":")
        client, _, client_port = (scope.client or "").rpartition(":")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": scope.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": scope.path,
            "QUERY_STRING": scope.query_string,
            "SERVER_NAME": host or self._server[0],
            "SERVER_PORT": port or self._server[1],
            "SERVER_PROTOCOL": f"HTTP/{scope.http_version}",
            "REMOTE_ADDR": client,
            "REMOTE_PORT": client_port,
            "wsgi.url_scheme": scope.scheme,
            "wsgi.version": (1, 0),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            "wsgi.input": None,  # (set by the bridge: here, so that the headers stay last)
        }
        for name, value in scope.headers.items():
            key = name.upper().replace("-", "_")
            if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                key = "HTTP_" + key
            previous = environ.get(key)
            environ[key] = value if previous is None else f"{previous},{value}"
        return environ

    async def _invocation(self, environ: WSGIEnvironment, protocol: Any) -> None:
        """``POST /invocations`` on the loop: the app's checks and edge, the lifecycle on the loop."""
        app = self.app
        started = time.perf_counter()
        request_id = request_id_of(environ)
        _logging.REQUEST.set((request_id, environ.get("HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID")))  # (this task's own)
        tracing = app.tracing
        span = tracing.request(environ, request_id) if tracing is not None else None
        body: list[codecs.Buffer] | Chunks
        try:
            app.resolve(environ, "POST")
            request = Request(environ, request_id, {})
            status, headers, body = await self.lifecycle.invoke(
                request, app.invoked(request), _reader(environ, protocol)
            )
        except Exception as exc:
            status, headers, items = error_for(exc, request_id, environ, app.settings.debug)
            body = list(items)
        answered(headers, environ, request_id)
        sent = 0
        try:
            sent = await _send(protocol, status, headers, body, request_id)
        finally:
            if span is not None:
                span.detach()
            if app.edge:
                record = app.record(environ, "POST", status, headers, started)
                app.finish((*record[:5], record[5] or sent, record[6]), environ, request_id, span)

    async def _bridged(self, environ: WSGIEnvironment, protocol: Any) -> None:
        """A route of the WSGI app, called on a bridge thread once its body is read here."""
        environ["wsgi.input"] = await self._body_for_bridge(environ, protocol)
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
            await _send(protocol, status, headers, items, "")
            return
        assert result is not None
        items_of = iter(result)
        try:
            chunk = await loop.run_in_executor(self._bridge, _next_or_none, items_of)
            if chunk is None:
                await _send(protocol, status, headers, [], "")
                return
            transport = protocol.response_stream(status, headers)
            while chunk is not None:
                try:
                    await transport.send_bytes(_as_bytes(chunk))
                except RuntimeError:  # (granian's RSGIProtocolClosed: the client went away)
                    return
                chunk = await loop.run_in_executor(self._bridge, _next_or_none, items_of)
        finally:
            await loop.run_in_executor(self._bridge, close, result)

    async def _body_for_bridge(self, environ: WSGIEnvironment, protocol: Any) -> io.BufferedIOBase:
        """The body, read here within ``--read-timeout``, as ``wsgi.input``; what the app refuses (a declared
        length over the limit: 413; a chunked body while bodies have a limit: 411) is left unread for it to
        refuse, and a body that stalls or breaks is an input whose read says so."""
        limit = self.app.pipeline.max_body
        length = environ.get("CONTENT_LENGTH")
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if length and length.isdigit() and limit is not None and int(length) > limit:
            return io.BytesIO()
        if (chunked and limit is not None) or not (length or chunked):
            return io.BytesIO()
        try:
            body = await asyncio.wait_for(protocol(), self._read_timeout)
        except asyncio.TimeoutError:
            return _Refusing(RequestTimeout(f"the request body did not arrive within {self._read_timeout} s"))
        except RuntimeError:  # (granian: the connection ended before the body did)
            return _Refusing(BadRequest("the body ended before it was whole (the client closed the connection?)"))
        if chunked and not body:
            return _Refusing(BadRequest("the chunked body is empty, cut short or malformed (this server cannot tell)"))
        return io.BytesIO(body)


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


def _reader(environ: WSGIEnvironment, protocol: Any) -> Callable[[int | None], Any]:
    """The body of ``POST /invocations``, read on the loop into one buffer of its declared length."""

    async def read(limit: int | None) -> bytearray | bytes:
        header = environ.get("CONTENT_LENGTH")
        if header:
            try:
                length = int(header)
                if length < 0:
                    raise ValueError
            except ValueError:
                raise BadRequest(f"Content-Length {header!r} is not a byte count") from None
            if limit is not None and length > limit:
                raise PayloadTooLarge(
                    f"the body is {length} bytes; the limit (MaxPayloadInMB) is {limit} bytes{_RAISE}"
                )
            buffer = bytearray(length)
            position = 0
            try:
                async for chunk in protocol:
                    end = position + len(chunk)
                    if end > length:
                        raise BadRequest(f"the body is longer than its Content-Length ({length} bytes)")
                    buffer[position:end] = chunk
                    position = end
            except RuntimeError:  # (granian: the connection ended)
                pass
            if position < length:
                raise BadRequest(f"the body ended after {position} of {length} bytes (Content-Length)")
            environ[BODY_BYTES] = length
            return buffer
        if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            if limit is not None:
                raise LengthRequired(_USE_CONTENT_LENGTH)
            try:
                body: bytes = await protocol()
            except RuntimeError:
                body = b""
            if not body:
                raise BadRequest("the chunked body is empty, cut short or malformed (this server cannot tell which)")
            environ[BODY_BYTES] = len(body)
            return bytearray(body)
        return bytearray()

    return read


async def _send(
    protocol: Any, status: int, headers: list[tuple[str, str]], body: list[codecs.Buffer] | Chunks, request_id: str
) -> int:
    """Send an answer; the bytes of its body sent. A stream is closed once sent or once its client is gone; one
    that cannot go on (:class:`StreamFailed`) ends the connection without the chunked coding's last chunk."""
    if not isinstance(body, Chunks):
        items = list(body)
        if len(items) == 1 and type(items[0]) is bytes:
            data = items[0]
        else:
            size = sum(memoryview(item).nbytes for item in items)
            if size > _WHOLE:
                transport = protocol.response_stream(status, headers)
                try:
                    for item in items:
                        view = memoryview(item).cast("B")
                        for start in range(0, view.nbytes, PIECE):
                            await transport.send_bytes(view[start : start + PIECE].tobytes())
                except RuntimeError:  # (the client went away)
                    pass
                return size
            data = b"".join(_as_bytes(item) for item in items)
        protocol.response_bytes(status, headers, data)
        return len(data)
    transport = protocol.response_stream(status, headers)
    try:
        async for chunk in body:
            try:
                await transport.send_bytes(_as_bytes(chunk))
            except RuntimeError:  # (granian's RSGIProtocolClosed: the client went away)
                break
    except StreamFailed as exc:
        logger.info("Request %s: the stream is cut (%s: %s)", request_id, exc.code, exc.message)
        raise  # granian ends the connection without the last chunk
    finally:
        await body.aclose()
    return body.sent
