"""The event-loop lifecycle under a WSGI server: the server's thread waits while the invocation runs on the worker's
event loop (:class:`~inference_server.wsgi._async.AsyncLifecycle`), as under the event-loop fronts.

gunicorn keeps its own HTTP parser (what the strict backend is for: a chunked body cut short is a 400, heads and
slow headers bounded) and its thread per request, and gets what the loop gives an invocation: the 504 at the
deadline while a sync hook still runs (its model slot given back when it returns, the worker replaced when it is
stuck), async hooks and async generators on the loop, micro-batched requests grouped there.

- **The body** is read on the server's thread (the only one that may read its socket) before the invocation is
  handed to the loop, within ``--read-timeout`` (the watchdog ends a read past it: 408); what went wrong with it (a
  413, 411, 400 or 408) is raised when the lifecycle asks for the body, after drain admission and the route's own
  checks, as before. Reading it first saves a round trip between the thread and the loop per request. A request the
  drain refuses is not read (no ``100 Continue``); one the route refuses by its head (a bad ``TargetModel``) is read
  first, ``100 Continue`` included. ``--timeout`` counts from before the read, as on the server's thread.
- **The answer** is handed back to the thread; a stream's chunks are made on the loop one at a time as the server
  asks for the next (:class:`Pulled`), and closing it closes the model's generator there.

The cost is the two hops between the thread and the loop per request (where the WSGI lifecycle has none):
measured in benchmarks/README.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from inference_server import _loop, codecs
from inference_server.wsgi._async import ARRIVED, AsyncLifecycle, Reader
from inference_server.wsgi._replies import Body, Invoking, Piecewise, Reply, Request

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment


class OnLoop:
    """Invoking routes of a WSGI app run on the worker's loop while the server's thread waits (see the module's
    text). ``limit``: the body limit; ``arrival``: when the server took the request, asked on its thread (a drain
    answers what came before)."""

    def __init__(
        self,
        lifecycle: AsyncLifecycle,
        limit: Callable[[], int | None],
        arrival: Callable[[WSGIEnvironment], float | None] | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        self._limit = limit
        self._arrival = arrival

    def dispatch(self, handler: Invoking, request: Request) -> Reply:
        """On the server's thread: the route's answer, its coroutine run on the loop (a stream: :class:`Pulled`).
        The request counts in flight for the drain from before its body is read until the server closes its answer;
        ``--timeout`` counts from before the body is read, as on the server's thread."""
        environ = request.environ
        started = time.monotonic()
        lifecycle = self.lifecycle
        if self._arrival is not None:
            environ[ARRIVED] = self._arrival(environ)
        worker = lifecycle.lifecycle.worker
        if worker is not None:
            worker.enter()
        try:
            read: Reader
            if lifecycle.refuses(environ):
                read = _unread  # (the lifecycle answers 503 first: the body is not read, no 100 Continue sent)
            else:
                try:
                    body = lifecycle.lifecycle.read_watched(environ, self._limit())
                except Exception as exc:  # (raised when the lifecycle asks for the body: after the route's checks)
                    read = functools.partial(_refused, exc)
                else:
                    read = functools.partial(_read, body)

            def invoke(target: Any, framing: Any = None) -> Any:
                return lifecycle.invoke(request, target, framing, read=read, started=started, entered=True)

            loop = _loop.started()
            try:
                status, headers, answer = asyncio.run_coroutine_threadsafe(
                    handler.function(request, invoke), loop
                ).result()
            except concurrent.futures.CancelledError:  # (not an Exception: the app would not answer it)
                raise RuntimeError("the invocation was cancelled on the event loop") from None
        except BaseException:
            if worker is not None:
                worker.leave()
            raise
        if isinstance(answer, Piecewise):
            answer = Pulled(answer, loop)
        return status, headers, answer if worker is None else Body(answer, worker.leave)


async def _unread(limit: int | None) -> bytearray | bytes:
    raise AssertionError("the body of a request the drain refuses was asked for")


async def _read(body: bytearray | bytes, limit: int | None) -> bytearray | bytes:
    return body


async def _refused(error: Exception, limit: int | None) -> bytearray | bytes:
    raise error


class Pulled(Iterator[codecs.Buffer]):
    """A stream made on the loop, as the WSGI server iterates it: each chunk made there when the server asks for it
    (its errors raised here: :class:`~inference_server.wsgi._invoke.StreamFailed` ends the connection without the
    last chunk); :meth:`close` closes the model's generator there (its ``finally`` runs)."""

    def __init__(self, stream: Piecewise, loop: asyncio.AbstractEventLoop) -> None:
        self._stream = stream
        self._loop = loop

    def __iter__(self) -> Pulled:
        return self

    def __next__(self) -> codecs.Buffer:
        try:
            return asyncio.run_coroutine_threadsafe(_next(self._stream), self._loop).result()
        except StopAsyncIteration:
            raise StopIteration from None

    @property
    def sent(self) -> int:
        return self._stream.sent

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stream.aclose(), self._loop).result()


async def _next(stream: Piecewise) -> codecs.Buffer:
    return await stream.__anext__()
