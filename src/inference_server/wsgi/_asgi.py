"""The ASGI front: an ASGI 3 application over :class:`~inference_server.wsgi._front.Front` (granian's ASGI interface
with ``--granian-interface asgi``; any ASGI server).

What it relies on of the server, as the ASGI spec has it: an ``http.disconnect`` message when the connection ends
before the body does (so a chunked body cut short is a 400, and chunked bodies need no 411 on granian), header values
as the client's bytes (latin-1 in the environ, as PEP 3333 has them), and a connection closed without the chunked
coding's last chunk when the app raises mid-answer. A client that goes away mid-stream is seen through the
``http.disconnect`` that ``receive`` gives once the body is read (granian drops what is sent after it silently).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from inference_server.wsgi._app import App
from inference_server.wsgi._front import Broken, Front, environ_of

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

Scope = dict[str, Any]
Message = dict[str, Any]


class AsgiFront(Front):
    """The app as an ASGI 3 application; its lifespan's startup adopts the server's loop."""

    def __init__(self, app: App) -> None:
        super().__init__(app)
        self._port = str(app.settings.port)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            server = scope.get("server") or ("127.0.0.1", self._port)
            client = scope.get("client") or ("", "")
            environ = environ_of(
                scope["method"],
                scope["path"],
                scope["query_string"].decode("latin-1"),
                scope.get("http_version", "1.1"),
                scope.get("scheme", "http"),
                (str(client[0]), str(client[1])),
                (str(server[0]), str(server[1])),
                ((name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]),
            )
            await self.serve(_Exchange(environ, receive, send))
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.adopt(asyncio.get_running_loop())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


class _Exchange:
    """One request on an ASGI connection."""

    __slots__ = ("_gone", "_receive", "_send", "_watch", "environ")

    verifies_chunked = True

    def __init__(self, environ: WSGIEnvironment, receive: Any, send: Any) -> None:
        self.environ = environ
        self._receive, self._send = receive, send
        self._gone = False
        self._watch: asyncio.Task[Any] | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._gone = True
                raise Broken
            body = message.get("body", b"")
            if body:
                yield body
            if not message.get("more_body", False):
                return

    async def whole(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        await self._send({"type": "http.response.start", "status": status, "headers": _encoded(headers)})
        await self._send({"type": "http.response.body", "body": data})

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self._watch = asyncio.ensure_future(self._wait_for_disconnect())
        await self._send({"type": "http.response.start", "status": status, "headers": _encoded(headers)})

    async def _wait_for_disconnect(self) -> None:
        while not self._gone:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._gone = True

    async def send(self, data: bytes) -> bool:
        if self._gone:
            return False
        await self._send({"type": "http.response.body", "body": data, "more_body": True})
        return not self._gone

    async def end(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if not self._gone:
            await self._send({"type": "http.response.body", "body": b""})


def _encoded(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
