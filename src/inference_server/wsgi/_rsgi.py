"""The RSGI front: granian's RSGI interface over :class:`~inference_server.wsgi._front.Front`
(``--granian-interface rsgi``).

granian 2.8's RSGI interface cannot tell the app that a chunked body was cut short (``async for`` over it ends as if
whole; only its whole-body read raises, unbounded), ends a stream with the chunked coding's last chunk whatever the
app does (so a stream that fails mid-way reads as whole), and drops a header whose value is not UTF-8 before the
app sees it. Its ASGI interface does none of these (:mod:`._asgi`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from inference_server.wsgi._app import App
from inference_server.wsgi._front import Front, environ_of

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment


class RsgiFront(Front):
    """granian's RSGI app: ``__rsgi__`` for each request, ``__rsgi_init__`` when the worker's loop starts."""

    def __init__(self, app: App) -> None:
        super().__init__(app)
        self._port = str(app.settings.port)

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.adopt(loop)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.close()

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        if scope.proto != "http":
            return  # (websockets are not served: granian closes the connection)
        host, _, port = (scope.server or "").rpartition(":")
        client, _, client_port = (scope.client or "").rpartition(":")
        environ = environ_of(
            scope.method,
            scope.path,
            scope.query_string,
            scope.http_version,
            scope.scheme,
            (client, client_port),
            (host or "127.0.0.1", port or self._port),
            scope.headers.items(),
        )
        await self.serve(_Exchange(environ, protocol))


class _Exchange:
    """One request on granian's RSGI protocol."""

    __slots__ = ("_protocol", "_transport", "environ")

    verifies_chunked = False

    def __init__(self, environ: WSGIEnvironment, protocol: Any) -> None:
        self.environ = environ
        self._protocol = protocol
        self._transport: Any = None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._protocol:
                yield chunk
        except RuntimeError:  # (granian's RSGIProtocolClosed: the connection ended)
            return

    async def whole(self) -> bytes:
        try:
            body: bytes = await self._protocol()
        except RuntimeError:
            return b""
        return body

    async def answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self._protocol.response_bytes(status, headers, data)

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self._transport = self._protocol.response_stream(status, headers)

    async def send(self, data: bytes) -> bool:
        try:
            await self._transport.send_bytes(data)
        except RuntimeError:  # (granian's RSGIProtocolClosed: the client went away)
            return False
        return True

    async def end(self) -> None:
        return None  # (granian ends the stream when the app returns)
